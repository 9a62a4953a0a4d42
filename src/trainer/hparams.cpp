// Hyperparameters in Lightning's two outputs (trainer/hparams.h):
// hparams.yaml as PyYAML's emitter lays it out, and TensorBoard's flat
// hparams.
//
// Note [PyYAML's string styles]
// yaml.dump (PyYAML 6, allow_unicode=False) picks for each string the first
// style its Emitter.analyze_scalar allows: plain, when the YAML 1.1
// resolvers read the plain text back as a string (not as a bool such as
// "yes", a number such as "0.003" or "1_000", null, a timestamp) and no
// indicator or whitespace rule forbids it; else single-quoted, unless the
// text holds line breaks after/before spaces or "special" characters
// (control characters, and every non-ASCII one, since allow_unicode is off);
// else double-quoted with escapes. hparams_yaml follows those rules, except
// that text with line breaks goes double-quoted (PyYAML single-quotes it
// with folded line breaks), no line is folded at 80 columns, and text over
// 256 bytes is never plain.
#include "strata/trainer/hparams.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <regex>

namespace strata::trainer {
namespace {

using json = nlohmann::json;

// Code points of `text` (a byte that is not UTF-8 becomes U+FFFD).
std::vector<char32_t> code_points(const std::string& text) {
  std::vector<char32_t> out;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_sequence_length(text, i);
    if (n == 0) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    const unsigned char c = static_cast<unsigned char>(text[i]);
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// PyYAML's YAML 1.1 implicit resolvers (resolver.py): a plain scalar
// matching one of them is read as that type, not as a string.
bool resolves_to_other_type(const std::string& text) {
  static const std::regex kOther(
      // bool
      "yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF"
      // float
      "|[-+]?(?:[0-9][0-9_]*)\\.[0-9_]*(?:[eE][-+][0-9]+)?|\\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
      "|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(?:inf|Inf|INF)|\\.(?:nan|NaN|NAN)"
      // int
      "|[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+"
      "|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+"
      // merge, null, value, yaml
      "|<<|~|null|Null|NULL|=|!|&|\\*"
      // timestamp
      "|[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"
      "|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \\t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9]"
      "(?:\\.[0-9]*)?(?:[ \\t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?");
  // std::regex recurses per character: a long text is quoted without
  // asking (quoting plain-safe text still reads back as the same string).
  if (text.size() > 256) return true;
  return text.empty() || std::regex_match(text, kOther);
}

bool is_break(char32_t c) { return c == '\n' || c == 0x85 || c == 0x2028 || c == 0x2029; }
bool is_space_or_break(char32_t c) { return c == 0 || c == ' ' || c == '\t' || c == '\r' || is_break(c); }

enum class Style { kPlain, kSingle, kDouble };

// Emitter.analyze_scalar and choose_scalar_style for a string in block
// context (Note [PyYAML's string styles]).
Style choose_style(const std::string& text, const std::vector<char32_t>& s) {
  if (s.empty()) return Style::kSingle;  // '' (plain would read as null)
  bool block_indicators = false, line_breaks = false, special = false;
  bool leading_space = false, leading_break = false, trailing_space = false, trailing_break = false;
  bool break_space = false, space_break = false;
  if (text.rfind("---", 0) == 0 || text.rfind("...", 0) == 0) block_indicators = true;
  bool preceded_by_ws = true;
  bool followed_by_ws = s.size() == 1 || is_space_or_break(s[1]);
  bool previous_space = false, previous_break = false;
  const std::u32string first_indicators = U"#,[]{}&*!|>'\"%@`";
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char32_t ch = s[i];
    if (i == 0) {
      if (first_indicators.find(ch) != std::u32string::npos) block_indicators = true;
      if ((ch == '?' || ch == ':') && followed_by_ws) block_indicators = true;
      if (ch == '-' && followed_by_ws) block_indicators = true;
    } else {
      if (ch == ':' && followed_by_ws) block_indicators = true;
      if (ch == '#' && preceded_by_ws) block_indicators = true;
    }
    if (is_break(ch)) line_breaks = true;
    if (!(ch == '\n' || (ch >= 0x20 && ch <= 0x7E))) special = true;  // allow_unicode=False
    if (ch == ' ') {
      if (i == 0) leading_space = true;
      if (i + 1 == s.size()) trailing_space = true;
      if (previous_break) break_space = true;
      previous_space = true;
      previous_break = false;
    } else if (is_break(ch)) {
      if (i == 0) leading_break = true;
      if (i + 1 == s.size()) trailing_break = true;
      if (previous_space) space_break = true;
      previous_space = false;
      previous_break = true;
    } else {
      previous_space = previous_break = false;
    }
    preceded_by_ws = is_space_or_break(ch);
    followed_by_ws = i + 2 >= s.size() || is_space_or_break(s[i + 2]);
  }
  bool plain = !(leading_space || leading_break || trailing_space || trailing_break);
  bool single = true;
  if (break_space) plain = single = false;
  if (space_break || special) plain = single = false;
  if (line_breaks) plain = false;
  if (block_indicators) plain = false;
  if (plain && !resolves_to_other_type(text)) return Style::kPlain;
  if (single && !line_breaks) return Style::kSingle;
  return Style::kDouble;
}

std::string double_quoted(const std::vector<char32_t>& s) {
  std::string out = "\"";
  for (const char32_t ch : s) {
    const char* named = nullptr;
    switch (ch) {
      case 0: named = "0"; break;
      case 0x07: named = "a"; break;
      case 0x08: named = "b"; break;
      case 0x09: named = "t"; break;
      case 0x0A: named = "n"; break;
      case 0x0B: named = "v"; break;
      case 0x0C: named = "f"; break;
      case 0x0D: named = "r"; break;
      case 0x1B: named = "e"; break;
      case '"': named = "\""; break;
      case '\\': named = "\\"; break;
      case 0x85: named = "N"; break;
      case 0xA0: named = "_"; break;
      case 0x2028: named = "L"; break;
      case 0x2029: named = "P"; break;
      default: break;
    }
    if (named) {
      out += '\\';
      out += named;
    } else if (ch >= 0x20 && ch <= 0x7E) {
      out.push_back(static_cast<char>(ch));
    } else {
      char buf[16];
      if (ch <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned>(ch));
      else if (ch <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(ch));
      else std::snprintf(buf, sizeof buf, "\\U%08X", static_cast<unsigned>(ch));
      out += buf;
    }
  }
  return out + "\"";
}

std::string yaml_string(const std::string& text) {
  const std::vector<char32_t> s = code_points(text);
  switch (choose_style(text, s)) {
    case Style::kPlain: {
      std::string out;
      for (char32_t c : s) append_utf8(out, c);  // ASCII: plain text holds no other
      return out;
    }
    case Style::kSingle: {
      std::string out = "'";
      for (char32_t c : s) {
        if (c == '\'') out += '\'';
        append_utf8(out, c);
      }
      return out + "'";
    }
    case Style::kDouble: break;
  }
  return double_quoted(s);
}

// PyYAML's represent_float: repr, lower-cased, ".0" before a bare exponent.
std::string yaml_float(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  std::string text = python_float_repr(v);
  if (text.find('.') == std::string::npos) {
    const std::size_t e = text.find('e');
    if (e != std::string::npos) text.insert(e, ".0");
  }
  return text;
}

// A scalar, or an empty list or map (PyYAML writes those in flow style).
std::string yaml_scalar(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return v.get<bool>() ? "true" : "false";
    case json::value_t::number_integer: return std::to_string(v.get<int64_t>());
    case json::value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case json::value_t::number_float: return yaml_float(v.get<double>());
    case json::value_t::string: return yaml_string(v.get_ref<const std::string&>());
    case json::value_t::array: return "[]";
    case json::value_t::object: return "{}";
    default: return "null";  // binary and discarded values are not hyperparameters
  }
}

bool is_block(const json& v) { return (v.is_object() || v.is_array()) && !v.empty(); }

// One node in block style at `indent`; `inline_first`: the first line's
// prefix ("- ") is already written.
void emit(std::string& out, const json& v, int indent, bool inline_first) {
  bool first = true;
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!(first && inline_first)) out.append(static_cast<std::size_t>(indent), ' ');
      first = false;
      const std::string key = yaml_string(it.key());
      // PyYAML writes a key of 128 characters or more as an explicit key.
      if (key.size() >= 128) {
        out += "? " + key + "\n";
        out.append(static_cast<std::size_t>(indent), ' ');
      } else {
        out += key;
      }
      out += ":";
      if (!is_block(it.value())) {
        out += " " + yaml_scalar(it.value()) + "\n";
      } else {
        out += "\n";
        // A list inside a map is not indented (PyYAML's indentless sequence).
        emit(out, it.value(), it.value().is_object() ? indent + 2 : indent, false);
      }
    }
  } else {
    for (const json& item : v) {
      if (!(first && inline_first)) out.append(static_cast<std::size_t>(indent), ' ');
      first = false;
      out += "- ";
      if (!is_block(item)) out += yaml_scalar(item) + "\n";
      else emit(out, item, indent + 2, true);
    }
  }
}

// Python's repr of a str: single quotes unless the text holds ' and no ".
std::string python_str_repr(const std::string& text) {
  const std::vector<char32_t> s = code_points(text);
  bool has_single = false, has_double = false;
  for (char32_t c : s) {
    has_single |= c == '\'';
    has_double |= c == '"';
  }
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : s) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      append_utf8(out, c);
    }
  }
  return out + quote;
}

void flatten(const json& value, const std::string& prefix, std::vector<HparamValue>& out) {
  if (value.is_object()) {  // Lightning's _flatten_dict: an empty map gives no entry
    for (auto it = value.begin(); it != value.end(); ++it) flatten(it.value(), prefix + "/" + it.key(), out);
    return;
  }
  HparamValue h;
  h.name = prefix;
  if (value.is_number()) {
    h.kind = HparamValue::Kind::kNumber;
    h.number = value.get<double>();
  } else if (value.is_boolean()) {
    h.kind = HparamValue::Kind::kNumber;  // Note: Lightning's TensorBoard values are numbers for bools
    h.number = value.get<bool>() ? 1.0 : 0.0;
  } else if (value.is_string()) {
    h.text = value.get<std::string>();
  } else {
    h.text = python_repr(value);  // Lightning's _sanitize_params: str(value)
  }
  out.push_back(std::move(h));
}

}  // namespace

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string sci(buf, result.ptr);  // "-1.2345e-05": the shortest round-trip digits
  const std::size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exponent = std::stoi(sci.substr(e + 1));
  const int point = exponent + 1;  // digits d1 d2 ... read as 0.d1d2... x 10^point
  std::string out = negative ? "-" : "";
  if (point > -4 && point <= 16) {
    const int n = static_cast<int>(digits.size());
    if (point <= 0) out += "0." + std::string(static_cast<std::size_t>(-point), '0') + digits;
    else if (point >= n) out += digits + std::string(static_cast<std::size_t>(point - n), '0') + ".0";
    else out += digits.substr(0, static_cast<std::size_t>(point)) + "." +
                digits.substr(static_cast<std::size_t>(point));
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

std::string python_repr(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "None";
    case json::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case json::value_t::number_integer: return std::to_string(v.get<int64_t>());
    case json::value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case json::value_t::number_float: return python_float_repr(v.get<double>());
    case json::value_t::string: return python_str_repr(v.get_ref<const std::string&>());
    case json::value_t::array: {
      std::string out = "[";
      for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_repr(v[i]);
      return out + "]";
    }
    case json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        out += (first ? "" : ", ") + python_str_repr(it.key()) + ": " + python_repr(it.value());
        first = false;
      }
      return out + "}";
    }
    default: return "None";
  }
}

std::string hparams_yaml(const Hyperparams& params) {
  if (params.empty()) return "{}\n";
  std::string out;
  emit(out, json(params), 0, false);
  return out;
}

std::vector<HparamValue> tensorboard_hparams(const Hyperparams& params) {
  std::vector<HparamValue> out;
  for (const auto& [key, value] : params) flatten(value, key, out);
  return out;
}

}  // namespace strata::trainer
