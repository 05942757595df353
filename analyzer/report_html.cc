// stub
#include "report_output.h"
namespace gpumem::analysis { void write_html(std::ostream&, const std::vector<process_report>&, const combined_report&, const output_options&) {} }
