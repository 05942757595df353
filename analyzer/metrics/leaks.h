// Leaks: what is still live when the log ends, counted per device, the largest listed.
#pragma once

#include "metrics/metric.h"

namespace gpumem::analysis {

class leaks : public metric {
public:
    using metric::metric;
    void finish();
};

}  // namespace gpumem::analysis
