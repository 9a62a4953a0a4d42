// Small text helpers shared by every area.
#include "strata/core/strings.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace strata {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string join(const std::vector<std::string>& items, const std::string& separator, size_t max_items) {
  std::string out;
  const size_t shown = max_items == 0 ? items.size() : std::min(items.size(), max_items);
  for (size_t i = 0; i < shown; ++i) out += (i ? separator : "") + items[i];
  if (shown < items.size()) out += " and " + std::to_string(items.size() - shown) + " more";
  return out;
}

std::string join(const std::set<std::string>& items, const std::string& separator, size_t max_items) {
  return join(std::vector<std::string>(items.begin(), items.end()), separator, max_items);
}

std::string shape_string(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  if (unit == 0) {
    std::snprintf(buffer, sizeof buffer, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buffer, sizeof buffer, "%.1f %s", value, units[unit]);
  }
  return buffer;
}

}  // namespace strata
