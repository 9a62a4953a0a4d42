// Small text helpers shared by every area (messages, reports, parsing).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <c10/util/ArrayRef.h>

namespace strata {

/// `s` in lower case (ASCII).
std::string lower(std::string s);

/// The items joined by `separator`; past `max_items` (0: no limit) the rest
/// is summarised as " and N more".
std::string join(const std::vector<std::string>& items, const std::string& separator = ", ", size_t max_items = 0);
std::string join(const std::set<std::string>& items, const std::string& separator = ", ", size_t max_items = 0);

/// "[2, 3]" for a shape.
std::string shape_string(c10::IntArrayRef shape);

/// "1.5 MiB" for a byte count (B, KiB, MiB, GiB, TiB).
std::string human_bytes(uint64_t bytes);

}  // namespace strata
