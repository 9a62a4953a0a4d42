// comm::CommStats: the per-operation counters of a Group and their summary.
#include <iomanip>
#include <sstream>

#include "strata/comm/group.h"

namespace strata::comm {
namespace {

std::string human_bytes(int64_t b) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (b >= (int64_t(1) << 30)) out << b / double(int64_t(1) << 30) << " GB";
  else if (b >= (1 << 20)) out << b / double(1 << 20) << " MB";
  else if (b >= (1 << 10)) out << b / double(1 << 10) << " KB";
  else out << b << " B";
  return out.str();
}

}  // namespace

CommStats::Entry CommStats::total() const {
  Entry t;
  for (const Entry* e : {&all_reduce, &all_gather, &reduce_scatter, &broadcast, &barrier}) {
    t.calls += e->calls;
    t.bytes += e->bytes;
    t.seconds += e->seconds;
  }
  return t;
}

std::string CommStats::summary() const {
  std::ostringstream out;
  const std::pair<const char*, const Entry*> entries[] = {{"all_reduce", &all_reduce},
                                                          {"all_gather", &all_gather},
                                                          {"reduce_scatter", &reduce_scatter},
                                                          {"broadcast", &broadcast},
                                                          {"barrier", &barrier}};
  for (const auto& [name, e] : entries) {
    if (e->calls == 0) continue;
    if (out.tellp() > 0) out << " | ";
    out << name << " " << e->calls << "x " << human_bytes(e->bytes) << " " << std::fixed
        << std::setprecision(1) << e->seconds * 1e3 << " ms";
  }
  return out.tellp() > 0 ? out.str() : "no collectives";
}

}  // namespace strata::comm
