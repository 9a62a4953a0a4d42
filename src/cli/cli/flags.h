// Numeric flags with a stated range. CLI11 takes the text as typed; these
// turn it into a number or a ConfigError that names the flag, the value and
// the range: empty strings, signs where none fit, hex and other bases,
// overflow, NaN and inf are all refused the same way.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace strata::cli {

/// A flag's accepted values: integers lo..hi, or reals in [lo, hi]
/// ((lo, hi] when lo_open, [lo, hi) when hi_open).
struct Range {
  bool integer = true;
  double lo = 0, hi = 0;
  bool lo_open = false;
  bool hi_open = false;
  /// "an integer in 1..4096", "a number in (0, 10]", "a number in [0, 1)".
  std::string text() const;
};

/// Parses decimal `text` as an integer in [lo, hi]; throws ConfigError
/// "[area] FLAG 'TEXT' ...: it must be an integer in LO..HI".
int64_t parse_integer(const std::string& area, const std::string& flag, const std::string& text, int64_t lo,
                      int64_t hi);
/// The same for unsigned 64-bit values (seeds: 0..18446744073709551615).
uint64_t parse_unsigned(const std::string& area, const std::string& flag, const std::string& text);
/// Parses a finite decimal real in `range`.
double parse_real(const std::string& area, const std::string& flag, const std::string& text, const Range& range);

/// Numeric flags registered as text and converted after parsing, so that
/// errors are strata's (exit status 1, "strata: error: ...").
class NumericFlags {
 public:
  explicit NumericFlags(std::string area) : area_(std::move(area)) {}
  /// Registers an integer flag; `set` receives the value when given.
  CLI::Option* add_integer(CLI::App* app, const std::string& names, const std::string& help, int64_t lo, int64_t hi,
                           std::function<void(int64_t)> set, const std::string& default_text = "");
  CLI::Option* add_real(CLI::App* app, const std::string& names, const std::string& help, Range range,
                        std::function<void(double)> set, const std::string& default_text = "");
  CLI::Option* add_unsigned(CLI::App* app, const std::string& names, const std::string& help,
                            std::function<void(uint64_t)> set, const std::string& default_text = "");
  /// Converts every flag that was given; throws ConfigError at the first bad one.
  void apply() const;

 private:
  struct Entry {
    std::string flag;
    std::shared_ptr<std::string> text;
    CLI::Option* option = nullptr;
    std::function<void(const std::string&)> convert;
  };
  CLI::Option* add(CLI::App* app, const std::string& names, const std::string& help, const std::string& range,
                   const std::string& default_text, std::function<void(const std::string&)> convert);
  std::string area_;
  std::vector<Entry> entries_;
};

}  // namespace strata::cli
