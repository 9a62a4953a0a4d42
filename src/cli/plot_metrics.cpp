// Reading metrics files for `strata plot`. Every byte is untrusted: sizes,
// line lengths, column counts and JSON nesting are bounded, a value that is
// not a number is an error naming its line and column, and NaN or inf
// values are counted and left out rather than drawn.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <system_error>

#include "cli/plot.h"
#include "strata/core/error.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

// A cell or name as it may appear in a message: printable ASCII, at most 60
// characters.
std::string shown(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (out.size() >= 60) return out + "...";
    out.push_back(c >= 0x20 && c < 0x7F ? c : '?');
  }
  return out;
}

enum class Number { kFinite, kNonFinite, kBad };

// `text` as a number: decimal (or exponent) notation, or the spellings of
// NaN and infinity that Python and C write.
Number parse_number(const std::string& text, double& value) {
  std::string t = text;
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  std::size_t start = t.find_first_not_of(" \t");
  if (start == std::string::npos || t.size() - start > 64) return Number::kBad;
  t = t.substr(start);
  std::string lower = t;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::string bare = (lower[0] == '+' || lower[0] == '-') ? lower.substr(1) : lower;
  if (bare == "nan" || bare == "inf" || bare == "infinity") return Number::kNonFinite;
  if (t.find_first_not_of("0123456789+-.eE") != std::string::npos) return Number::kBad;  // no hex, no words
  char* end = nullptr;
  errno = 0;
  value = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return Number::kBad;
  return std::isfinite(value) ? Number::kFinite : Number::kNonFinite;  // 1e999 overflows to inf
}

// Splits one CSV line (RFC 4180 quoting, no line breaks inside quotes).
std::vector<std::string> split_csv(const std::string& line, const std::string& where) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cells.back().push_back('"');
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cells.back().push_back(c);
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else {
      cells.back().push_back(c);
    }
  }
  STRATA_CHECK(!quoted, ConfigError, "[plot] ", where, ": a quoted cell is not closed on this line");
  return cells;
}

// Python's json writes NaN, Infinity and -Infinity, which are not JSON:
// outside strings they become null (and are counted). Also checks nesting.
std::string json_line(const std::string& line, const std::string& where, int max_depth, std::int64_t& nonfinite) {
  std::string out;
  out.reserve(line.size());
  bool in_string = false;
  int depth = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < line.size()) out.push_back(line[++i]);
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[' || c == '{') {
      STRATA_CHECK(++depth <= max_depth, ConfigError, "[plot] ", where, ": JSON nested deeper than ", max_depth,
                   " levels");
    }
    if (c == ']' || c == '}') --depth;
    bool replaced = false;
    for (const char* word : {"-Infinity", "Infinity", "NaN"}) {
      const std::size_t n = std::char_traits<char>::length(word);
      if (line.compare(i, n, word) == 0) {
        out += "null";
        i += n - 1;
        ++nonfinite;
        replaced = true;
        break;
      }
    }
    if (!replaced) out.push_back(c);
  }
  return out;
}

class TableBuilder {
 public:
  TableBuilder(MetricsTable& table, const MetricsLimits& limits) : table_(table), limits_(limits) {}

  // The index of `name` in table.series (added when new).
  std::size_t column(const std::string& name, const std::string& where) {
    auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    STRATA_CHECK(table_.series.size() < limits_.max_columns, ConfigError, "[plot] ", where, ": more than ",
                 limits_.max_columns, " metric names; is this a metrics file?");
    index_[name] = table_.series.size();
    table_.columns.push_back(name);
    table_.series.push_back(Series{name, {}, {}});
    return table_.series.size() - 1;
  }

 private:
  MetricsTable& table_;
  const MetricsLimits& limits_;
  std::map<std::string, std::size_t> index_;
};

using LineReader = std::function<bool(std::string&, std::int64_t&)>;

void read_csv(MetricsTable& table, const MetricsLimits& limits, const LineReader& next_line) {
  std::string line;
  std::int64_t number = 0;
  std::vector<std::string> header;
  while (next_line(line, number)) {
    if (line.empty()) continue;
    header = split_csv(line, table.path + " line " + std::to_string(number));
    break;
  }
  STRATA_CHECK(!header.empty(), ConfigError, "[plot] ", table.path, " is empty; expected a header line naming 'step' "
               "and the metrics, then one row per logged step");
  const std::string header_where = table.path + " line " + std::to_string(number);
  const auto step_it = std::find(header.begin(), header.end(), "step");
  STRATA_CHECK(step_it != header.end(), ConfigError, "[plot] ", header_where, ": the header names no 'step' column (",
               header.size(), " columns, starting '", shown(header[0]), "'); is this a metrics.csv?");
  const std::size_t step_col = static_cast<std::size_t>(step_it - header.begin());
  TableBuilder builder(table, limits);
  std::vector<std::size_t> by_col(header.size(), 0);
  for (std::size_t c = 0; c < header.size(); ++c) {
    if (c != step_col) by_col[c] = builder.column(header[c], header_where);
  }
  while (next_line(line, number)) {
    if (line.empty()) continue;
    const std::string where = table.path + " line " + std::to_string(number);
    const std::vector<std::string> cells = split_csv(line, where);
    STRATA_CHECK(cells.size() == header.size(), ConfigError, "[plot] ", where, ": ", cells.size(),
                 " cells, but the header names ", header.size(), " columns");
    ++table.rows;
    double step = 0;
    const Number kind = parse_number(cells[step_col], step);
    STRATA_CHECK(kind != Number::kBad, ConfigError, "[plot] ", where, ": step '", shown(cells[step_col]),
                 "' is not a number");
    if (kind == Number::kNonFinite) {
      ++table.skipped;
      continue;
    }
    for (std::size_t c = 0; c < cells.size(); ++c) {
      if (c == step_col || cells[c].find_first_not_of(" \t") == std::string::npos) continue;
      double value = 0;
      const Number k = parse_number(cells[c], value);
      STRATA_CHECK(k != Number::kBad, ConfigError, "[plot] ", where, ", column '", shown(header[c]), "': '",
                   shown(cells[c]), "' is not a number");
      if (k == Number::kNonFinite) {
        ++table.skipped;
        continue;
      }
      table.series[by_col[c]].steps.push_back(step);
      table.series[by_col[c]].values.push_back(value);
    }
  }
}

void read_jsonl(MetricsTable& table, const MetricsLimits& limits, const LineReader& next_line) {
  TableBuilder builder(table, limits);
  std::string line;
  std::int64_t number = 0;
  while (next_line(line, number)) {
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = table.path + " line " + std::to_string(number);
    std::int64_t nonfinite = 0;
    const std::string text = json_line(line, where, limits.max_depth, nonfinite);
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(detail::cat("[plot] ", where, " is not valid JSON: ", e.what()));
    }
    STRATA_CHECK(object.is_object(), ConfigError, "[plot] ", where, ": expected a JSON object such as "
                 "{\"step\": 10, \"loss\": 2.5}, got ", object.type_name());
    ++table.rows;
    table.skipped += nonfinite;
    const auto step_it = object.find("step");
    STRATA_CHECK(step_it != object.end(), ConfigError, "[plot] ", where, ": the object has no \"step\"");
    if (step_it->is_null()) {
      ++table.skipped;
      continue;
    }
    STRATA_CHECK(step_it->is_number(), ConfigError, "[plot] ", where, ": \"step\" is ", step_it->type_name(),
                 ", not a number");
    const double step = step_it->get<double>();
    for (auto it = object.begin(); it != object.end(); ++it) {
      if (it.key() == "step" || !it->is_number()) continue;  // null: missing or NaN; text: not a metric
      const double value = it->get<double>();
      Series& series = table.series[builder.column(it.key(), where)];
      if (!std::isfinite(value)) {
        ++table.skipped;
        continue;
      }
      series.steps.push_back(step);
      series.values.push_back(value);
    }
  }
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string find_metrics_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  STRATA_CHECK(fs::exists(status), ConfigError, "[plot] ", path,
               " does not exist; give a run folder or its metrics.csv / metrics.jsonl");
  if (!fs::is_directory(status)) return path;
  for (const char* name : {"metrics.csv", "metrics.jsonl"}) {
    const fs::path candidate = fs::path(path) / name;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  throw ConfigError(detail::cat("[plot] the folder ", path,
                                " holds neither metrics.csv nor metrics.jsonl; give the run's version_N folder "
                                "or the metrics file itself"));
}

std::string run_name(const std::string& input, const std::string& metrics_file) {
  // The folder: `input` itself when it is one, else the file's parent.
  fs::path folder = input == metrics_file ? fs::path(metrics_file).parent_path() : fs::path(input);
  folder = folder.lexically_normal();
  if (!folder.empty() && !folder.has_filename()) folder = folder.parent_path();  // "run/" -> "run"
  if (folder.empty() || folder == ".") {
    std::error_code ec;
    const fs::path absolute = fs::absolute(metrics_file, ec).parent_path();
    folder = ec ? fs::path() : absolute;
  }
  std::string name = folder.filename().string();
  if (name.empty() || name == "." || name == "..") return metrics_file;
  const bool version = name.rfind("version_", 0) == 0 && name.size() > 8 &&
                       name.find_first_not_of("0123456789", 8) == std::string::npos;
  const std::string parent = folder.parent_path().filename().string();
  if (version && !parent.empty() && parent != "." && parent != "..") name = parent + "/" + name;
  return name;
}

MetricsTable read_metrics(const std::string& file, const MetricsLimits& limits) {
  MetricsTable table;
  table.path = file;
  std::error_code ec;
  STRATA_CHECK(fs::is_regular_file(file, ec), ConfigError, "[plot] ", file,
               " is not a regular file; give a metrics.csv or metrics.jsonl");
  const std::uintmax_t size = fs::file_size(file, ec);
  STRATA_CHECK(!ec, ConfigError, "[plot] cannot read the size of ", file, ": ", ec.message());
  STRATA_CHECK(size <= limits.max_bytes, ConfigError, "[plot] ", file, " is ", size, " bytes; the limit is ",
               limits.max_bytes, " bytes");
  std::ifstream in(file, std::ios::binary);
  STRATA_CHECK(in.good(), ConfigError, "[plot] cannot open ", file);

  // Lines are read in bounded pieces: a line past max_line is an error, not
  // an allocation as large as the file.
  std::uint64_t total = 0;
  const auto next_line = [&](std::string& line, std::int64_t& number) -> bool {
    line.clear();
    bool any = false;
    for (int c; (c = in.get()) != EOF;) {
      any = true;
      if (++total > limits.max_bytes) break;  // the file grew while being read
      if (c == '\n') break;
      line.push_back(static_cast<char>(c));
      STRATA_CHECK(line.size() <= limits.max_line, ConfigError, "[plot] ", file, " line ", number + 1,
                   " is longer than ", limits.max_line, " bytes; is this a metrics file?");
    }
    if (!any) return false;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    ++number;
    return true;
  };

  bool jsonl = ends_with(file, ".jsonl") || ends_with(file, ".json");
  if (!jsonl && !ends_with(file, ".csv")) {
    const int first = (in >> std::ws).peek();
    jsonl = first == '{';
    in.clear();
    in.seekg(0);
  }
  if (jsonl) {
    read_jsonl(table, limits, next_line);
  } else {
    read_csv(table, limits, next_line);
  }
  for (Series& series : table.series) {
    // A resumed run may log a step twice or out of order: draw by step.
    std::vector<std::size_t> order(series.steps.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return series.steps[a] < series.steps[b]; });
    Series sorted{series.name, {}, {}};
    for (std::size_t i : order) {
      sorted.steps.push_back(series.steps[i]);
      sorted.values.push_back(series.values[i]);
    }
    series = std::move(sorted);
  }
  return table;
}

}  // namespace strata::cli
