// Strict numeric flags (cli/flags.h).
#include "cli/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "strata/core/error.h"

namespace strata::cli {
namespace {

std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Only [+-]digits: no spaces, no 0x, no other bases.
bool is_decimal_integer(const std::string& text) {
  size_t i = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  if (i >= text.size()) return false;
  for (; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') return false;
  return true;
}

// Decimal reals: digits, one point, an exponent; no hex, inf or nan words.
bool is_decimal_real(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+')) return false;
  }
  return true;
}

[[noreturn]] void refuse(const std::string& area, const std::string& flag, const std::string& text,
                         const std::string& why, const std::string& range) {
  throw ConfigError(detail::cat("[", area, "] ", flag, " '", text, "' ", why, ": it must be ", range));
}

}  // namespace

std::string Range::text() const {
  if (integer) return detail::cat("an integer in ", static_cast<int64_t>(lo), "..", static_cast<int64_t>(hi));
  return detail::cat("a number in ", lo_open ? "(" : "[", number_text(lo), ", ", number_text(hi),
                     hi_open ? ")" : "]");
}

int64_t parse_integer(const std::string& area, const std::string& flag, const std::string& text, int64_t lo,
                      int64_t hi) {
  const std::string range = detail::cat("an integer in ", lo, "..", hi);
  if (!is_decimal_integer(text)) refuse(area, flag, text, "is not a decimal integer", range);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || v < lo || v > hi) refuse(area, flag, text, "is out of range", range);
  return v;
}

uint64_t parse_unsigned(const std::string& area, const std::string& flag, const std::string& text) {
  const std::string range = "an integer in 0..18446744073709551615";
  if (!is_decimal_integer(text)) refuse(area, flag, text, "is not a decimal integer", range);
  if (text[0] == '-') refuse(area, flag, text, "is out of range", range);
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno == ERANGE) refuse(area, flag, text, "is out of range", range);
  return v;
}

double parse_real(const std::string& area, const std::string& flag, const std::string& text, const Range& range) {
  if (!is_decimal_real(text)) refuse(area, flag, text, "is not a decimal number", range.text());
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) refuse(area, flag, text, "is not a decimal number", range.text());
  bool inside = std::isfinite(v) && errno != ERANGE && (range.lo_open ? v > range.lo : v >= range.lo) &&
                (range.hi_open ? v < range.hi : v <= range.hi);
  if (!inside) refuse(area, flag, text, "is out of range", range.text());
  return v;
}

CLI::Option* NumericFlags::add(CLI::App* app, const std::string& names, const std::string& help,
                               const std::string& range, const std::string& default_text,
                               std::function<void(const std::string&)> convert) {
  Entry e;
  e.text = std::make_shared<std::string>();
  std::string full = help + " (" + range + (default_text.empty() ? "" : "; default " + default_text) + ")";
  e.option = app->add_option(names, *e.text, full);
  e.flag = e.option->get_name(/*positional=*/false, /*all_options=*/false);
  e.convert = std::move(convert);
  entries_.push_back(e);
  return e.option;
}

CLI::Option* NumericFlags::add_integer(CLI::App* app, const std::string& names, const std::string& help, int64_t lo,
                                       int64_t hi, std::function<void(int64_t)> set, const std::string& default_text) {
  const std::string area = area_;
  size_t index = entries_.size();
  return add(app, names, help, detail::cat("integer ", lo, "..", hi), default_text,
             [this, area, lo, hi, set, index](const std::string& text) {
               set(parse_integer(area, entries_[index].flag, text, lo, hi));
             });
}

CLI::Option* NumericFlags::add_real(CLI::App* app, const std::string& names, const std::string& help, Range range,
                                    std::function<void(double)> set, const std::string& default_text) {
  range.integer = false;
  const std::string area = area_;
  size_t index = entries_.size();
  std::string shown = range.text().substr(std::string("a number in ").size());
  return add(app, names, help, shown, default_text, [this, area, range, set, index](const std::string& text) {
    set(parse_real(area, entries_[index].flag, text, range));
  });
}

CLI::Option* NumericFlags::add_unsigned(CLI::App* app, const std::string& names, const std::string& help,
                                        std::function<void(uint64_t)> set, const std::string& default_text) {
  const std::string area = area_;
  size_t index = entries_.size();
  return add(app, names, help, "integer 0..18446744073709551615", default_text,
             [this, area, set, index](const std::string& text) { set(parse_unsigned(area, entries_[index].flag, text)); });
}

void NumericFlags::apply() const {
  for (const Entry& e : entries_) {
    if (e.option->count() > 0) e.convert(*e.text);
  }
}

}  // namespace strata::cli
