// Helpers shared by the StableHLO builder's sources (stablehlo.cpp,
// stablehlo_ops.cpp, stablehlo_gather.cpp); private to src/xla/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/xla/stablehlo.h"

namespace strata::xla::stablehlo::detail {

/// "1, 2, 3".
inline std::string join(const std::vector<int64_t>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out;
}

/// "array<i64: 1, 2>" ("array<i64>" when empty).
inline std::string array_attr(const std::vector<int64_t>& values) {
  return values.empty() ? "array<i64>" : "array<i64: " + join(values) + ">";
}

/// "[1, 2]".
inline std::string shape_text(const std::vector<int64_t>& dims) { return "[" + join(dims) + "]"; }

inline bool contains(const std::vector<int64_t>& values, int64_t v) {
  return std::find(values.begin(), values.end(), v) != values.end();
}

inline int64_t rank(const Value& v) { return static_cast<int64_t>(v.type.dims.size()); }

/// Throws unless every entry of `dims` is a distinct dimension of a
/// rank-`rank` tensor.
inline void check_dims(const char* op, const std::vector<int64_t>& dims, size_t rank) {
  std::vector<int64_t> seen;
  for (int64_t d : dims) {
    STRATA_CHECK(d >= 0 && static_cast<size_t>(d) < rank, ConfigError, "[stablehlo] ", op, ": dimension ", d,
                 " is out of range for rank ", rank);
    STRATA_CHECK(!contains(seen, d), ConfigError, "[stablehlo] ", op, ": dimension ", d, " is listed twice");
    seen.push_back(d);
  }
}

inline bool is_integer(ElementType t) { return t != ElementType::kPred && !is_floating(t) && !is_complex(t); }

/// Throws unless `v` is a tensor of integers (the indices of gather,
/// scatter and the dynamic slices).
inline void check_integer(const char* op, const char* what, const Value& v) {
  STRATA_CHECK(is_integer(v.type.dtype), ConfigError, "[stablehlo] ", op, ": ", what,
               " must be integers, got ", v.type.text());
}

}  // namespace strata::xla::stablehlo::detail
