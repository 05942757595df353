// stub
#include "report_output.h"
namespace gpumem::analysis { void write_perfetto(std::ostream&, const std::vector<process_report>&) {} }
