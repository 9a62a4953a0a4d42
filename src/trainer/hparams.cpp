// Hyperparameters in Lightning's two outputs (trainer/hparams.h):
// hparams.yaml, written by yaml-cpp so that any YAML reader (Lightning's
// load_hparams_from_yaml, PyYAML) reads back the same values, and
// TensorBoard's flat hparams with Python's repr where Lightning hands
// TensorBoard str(value).
#include "strata/trainer/hparams.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>

#include "strata/core/error.h"

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

// Note [Strings in hparams.yaml]
// yaml-cpp quotes a string only when plain text could not be parsed back at
// all; it does not ask whether a reader would take the plain text for a
// number, a boolean or null ("0.003", "yes", "1e-4", "2024-01-02" under
// PyYAML's YAML 1.1 rules). So a string goes plain only when it is a word no
// YAML reader takes for anything else: a letter first, then letters, digits
// and "_-./", and none of YAML 1.1's boolean or null words. Every other
// string is double-quoted, with non-ASCII characters escaped, so the file is
// ASCII and reads the same under any locale (as PyYAML's default
// allow_unicode=False writes it).
bool plain_is_safe(const std::string& text) {
  if (text.empty() || !std::isalpha(static_cast<unsigned char>(text[0]))) return false;
  std::string lower;
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '_' || c == '-' || c == '.' || c == '/')) return false;
    lower.push_back(static_cast<char>(std::tolower(u)));
  }
  static const std::set<std::string> kWords = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"};
  return kWords.count(lower) == 0;
}

void emit_string(YAML::Emitter& out, const std::string& text) {
  if (plain_is_safe(text)) out << text;
  else out << YAML::DoubleQuoted << text;
}

// A float as Python's repr made YAML 1.1 (PyYAML's represent_float): a float
// needs a '.' to be read as one there, so "1e-05" is written "1.0e-05";
// .nan, .inf and -.inf for the others. yaml-cpp's own double output has
// neither the shortest digits nor the '.', so the text is made here and
// written as a plain scalar.
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

void emit(YAML::Emitter& out, const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      if (v.empty()) out << YAML::Flow;  // "{}" beside its key, as PyYAML writes it
      out << YAML::BeginMap;
      for (auto it = v.begin(); it != v.end(); ++it) {  // sorted, as PyYAML's yaml.dump sorts them
        out << YAML::Key;
        emit_string(out, it.key());
        out << YAML::Value;
        emit(out, it.value());
      }
      out << YAML::EndMap;
      break;
    case json::value_t::array:
      if (v.empty()) out << YAML::Flow;  // "[]"
      out << YAML::BeginSeq;
      for (const json& item : v) emit(out, item);
      out << YAML::EndSeq;
      break;
    case json::value_t::boolean: out << v.get<bool>(); break;
    case json::value_t::number_integer: out << v.get<int64_t>(); break;
    case json::value_t::number_unsigned: out << v.get<uint64_t>(); break;
    case json::value_t::number_float: out << yaml_float(v.get<double>()); break;
    case json::value_t::string: emit_string(out, v.get_ref<const std::string&>()); break;
    default: out << YAML::Null; break;  // null (binary and discarded values are not hyperparameters)
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
  YAML::Emitter out;
  out.SetOutputCharset(YAML::EscapeNonAscii);  // Note [Strings in hparams.yaml]
  out.SetNullFormat(YAML::LowerNull);
  out.SetBoolFormat(YAML::TrueFalseBool);
  emit(out, json(params));
  STRATA_ASSERT(out.good(), "yaml-cpp could not write the hyperparameters: ", out.GetLastError());
  return std::string(out.c_str(), out.size()) + "\n";
}

std::vector<HparamValue> tensorboard_hparams(const Hyperparams& params) {
  std::vector<HparamValue> out;
  for (const auto& [key, value] : params) flatten(value, key, out);
  return out;
}

}  // namespace strata::trainer
