#include "strata/core/error.h"

#include <cstring>

namespace strata::detail {

void throw_internal(const char* file, int line, const std::string& what) {
  throw Error(cat("[strata] ", what, " (", file, ":", line, ")"));
}

std::string errno_string(int err) {
  return cat(std::strerror(err), " (errno ", err, ")");
}

}  // namespace strata::detail
