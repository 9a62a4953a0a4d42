// Hyperparameters as Lightning writes them: hparams.yaml read back by
// Lightning 2.6.6's own reader (load_hparams_from_yaml, through
// tests/trainer/read_hparams_yaml.py) as the same values with the same
// Python types, Python's repr where Lightning hands TensorBoard str(value),
// and the flattening Lightning's TensorBoardLogger does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "strata/trainer/hparams.h"
#include "support/tool.h"

namespace strata::trainer {
namespace {

using json = nlohmann::json;

// `value` as read_hparams_yaml.py prints what Python read: every scalar as
// [Python type, value], non-finite floats as their repr.
json typed(const json& value) {
  switch (value.type()) {
    case json::value_t::object: {
      json out = json::object();
      for (auto it = value.begin(); it != value.end(); ++it) out[it.key()] = typed(it.value());
      return out;
    }
    case json::value_t::array: {
      json out = json::array();
      for (const json& item : value) out.push_back(typed(item));
      return out;
    }
    case json::value_t::null: return {"NoneType", nullptr};
    case json::value_t::boolean: return {"bool", value};
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return {"int", value};
    case json::value_t::number_float: {
      const double v = value.get<double>();
      if (std::isnan(v)) return {"float", "nan"};
      if (std::isinf(v)) return {"float", v > 0 ? "inf" : "-inf"};
      return {"float", value};
    }
    default: return {"str", value};
  }
}

// What Lightning's load_hparams_from_yaml reads from hparams_yaml(params),
// typed; null (after a failure) when it could not.
json read_with_lightning(const Hyperparams& params) {
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("strata-hparams-" + std::to_string(::getpid()) + ".yaml")).string();
  std::ofstream(file, std::ios::binary) << hparams_yaml(params);
  const strata::testing::Outcome o = strata::testing::run_python("tests/trainer/read_hparams_yaml.py", {file});
  std::filesystem::remove(file);
  if (o.status != 0) {
    ADD_FAILURE() << "read_hparams_yaml.py failed (" << o.status << "): " << o.err << "\n" << hparams_yaml(params);
    return nullptr;
  }
  return json::parse(o.out);
}

#define SKIP_WITHOUT_PYTHON()                                    \
  if (strata::testing::project_python().empty())                 \
  GTEST_SKIP() << "STRATA_PYTHON is not set: run the suite through scripts/test.sh"

TEST(HparamsTest, LightningReadsBackEveryValueWithItsType) {
  SKIP_WITHOUT_PYTHON();
  const double inf = std::numeric_limits<double>::infinity();
  const Hyperparams h = {{"lr", 0.01},
                         {"n_layer", 2},
                         {"name", "gpt"},
                         {"compile", false},
                         {"model", {{"n_embd", 8}, {"bias", true}, {"inner", {{"x", -1}, {"deeper", {{"y", "z"}}}}}}},
                         {"betas", {0.9, 0.95}},
                         {"small", 1e-4},
                         {"smaller", 1e-05},
                         {"tiny", 1.5e-7},
                         {"big", 1e16},
                         {"exp15", 1e15},
                         {"whole", 3.0},
                         {"negative_zero", -0.0},
                         {"third", 1.0 / 3},
                         {"inf", inf},
                         {"ninf", -inf},
                         {"nan", std::numeric_limits<double>::quiet_NaN()},
                         {"neg", -7},
                         {"huge_int", std::numeric_limits<std::int64_t>::min()},
                         {"max_uint", std::numeric_limits<std::uint64_t>::max()},
                         {"none", nullptr},
                         {"empty_map", json::object()},
                         {"empty_list", json::array()},
                         {"nested", {{1, 2}, {3}, json::array()}},
                         {"maps", json::array({{{"a", 1}, {"b", "x"}}, {{"c", nullptr}}})},
                         // Strings a YAML reader would take for something else unquoted.
                         {"text", "0.003"},
                         {"sci", "1e-4"},
                         {"int_text", "42"},
                         {"hex", "0x1F"},
                         {"octal", "012"},
                         {"under", "1_000"},
                         {"sexagesimal", "1:30"},
                         {"date", "2024-01-02"},
                         {"timestamp", "2024-01-02 10:00:00"},
                         {"bool_text", "True"},
                         {"yes", "yes"},
                         {"No", "no"},
                         {"on", "ON"},
                         {"y", "n"},
                         {"null_text", "null"},
                         {"tilde", "~"},
                         {"inf_text", ".inf"},
                         {"nan_text", "NaN"},
                         {"blank", ""},
                         {"spaces", " lead and trail "},
                         // Strings with YAML's indicators and escapes.
                         {"note", "a: b # c"},
                         {"dash", "-x"},
                         {"list_like", "[1, 2]"},
                         {"map_like", "{a: 1}"},
                         {"anchor", "&a *b !tag %x @y `z"},
                         {"quote", "it's \"quoted\" \\ back"},
                         {"lines", "a\n b \nc\n"},
                         {"tab", "a\tb"},
                         {"control", std::string("a\x01\x1b\x7f" "b")},
                         {"document", "--- x"},
                         {"path", "/usr/share"},
                         {"url", "https://example.com/a?b=c#d"},
                         // Unicode, and bytes that are not UTF-8.
                         {"unicode", "h\xc3\xa9llo \xe2\x80\xa8 \xf0\x9f\x98\x80 \xe4\xb8\xad"},
                         {"bad_utf8", "x\xff"},
                         // Keys that need quoting too.
                         {"needs quote", "x"},
                         {"1.5", "float key"},
                         {"true", "bool key"},
                         {"", "empty key"},
                         {"k\xc3\xa9y", "unicode key"},
                         {std::string(200, 'k'), "long key"},
                         {"long", std::string(300, 'a') + " " + std::string(100, 'b')}};
  json want = typed(json(h));
  want["bad_utf8"] = {"str", "x\xef\xbf\xbd"};  // U+FFFD
  EXPECT_EQ(read_with_lightning(h), want);
}

TEST(HparamsTest, EmptyHyperparametersAreAnEmptyMap) { EXPECT_EQ(hparams_yaml({}), "{}\n"); }

// Plain where it is safe, so the file reads as Lightning's does.
TEST(HparamsTest, SimpleValuesAreWrittenPlainAndSorted) {
  EXPECT_EQ(hparams_yaml({{"optimizer", "AdamW"},
                          {"lr", 0.003},
                          {"small", 1e-5},
                          {"model", {{"n_layer", 2}, {"bias", true}}},
                          {"betas", {0.9, 0.95}},
                          {"none", nullptr},
                          {"text", "0.003"}}),
            "betas:\n  - 0.9\n  - 0.95\nlr: 0.003\nmodel:\n  bias: true\n  n_layer: 2\nnone: null\n"
            "optimizer: AdamW\nsmall: 1.0e-05\ntext: \"0.003\"\n");
}

// Python's repr, as Lightning's TensorBoardLogger turns lists and None
// into text (str(value)).
TEST(HparamsTest, PythonReprIsPythons) {
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(python_float_repr(2.5e-300), "2.5e-300");
  EXPECT_EQ(python_repr(nlohmann::json::parse(R"([0.9, 0.95, 1, true, null, "it's", "a'b\"c", {"k": [2.0]}])")),
            R"([0.9, 0.95, 1, True, None, "it's", 'a\'b"c', {'k': [2.0]}])");
}

// Lightning's _flatten_dict and _sanitize_params: nested maps joined with
// '/', an empty map gives nothing, bools become numbers.
TEST(HparamsTest, TensorBoardValuesAreFlattenedAsLightnings) {
  const std::vector<HparamValue> values =
      tensorboard_hparams({{"a", {{"b", {{"c", true}}}, {"empty", nlohmann::json::object()}}}, {"list", {1, "x"}}});
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[0].name, "a/b/c");
  EXPECT_EQ(values[0].kind, HparamValue::Kind::kNumber);
  EXPECT_EQ(values[0].number, 1.0);
  EXPECT_EQ(values[1].name, "list");
  EXPECT_EQ(values[1].kind, HparamValue::Kind::kText);
  EXPECT_EQ(values[1].text, "[1, 'x']");
}

}  // namespace
}  // namespace strata::trainer
