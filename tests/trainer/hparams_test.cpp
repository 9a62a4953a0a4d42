// Hyperparameters as Lightning writes them: hparams.yaml byte for byte as
// Lightning 2.6.6's save_hparams_to_yaml (PyYAML 6) writes the same values,
// Python's repr where Lightning hands TensorBoard str(value), and the
// flattening Lightning's TensorBoardLogger does.
#include <gtest/gtest.h>

#include <limits>

#include "strata/trainer/hparams.h"

namespace strata::trainer {
namespace {

// Made in the venv with Lightning 2.6.6:
//   from lightning.pytorch.core.saving import save_hparams_to_yaml
//   save_hparams_to_yaml("gold.yaml", {"lr": 0.01, "n_layer": 2, ...})
// with the values of LightningsYamlIsWrittenByteForByte below.
const char* const kLightningYaml =
    "betas:\n- 0.9\n- 0.95\nbig: 1.0e+16\nblank: ''\nbool_text: 'True'\ncompile: false\ndash: -x\n"
    "date: '2024-01-02'\nempty_list: []\nempty_map: {}\nexp16: 1000000000000000.0\ninf: .inf\nlr: 0.01\n"
    "maps:\n- a: 1\n  b: x\nmodel:\n  bias: true\n  inner:\n    x: -1\n  n_embd: 8\nn_layer: 2\nname: gpt\n"
    "nan: .nan\nneeds quote: x\nneg: -7\nnested:\n- - 1\n  - 2\n- - 3\nninf: -.inf\nnone: null\n"
    "note: 'a: b # c'\npath: /usr/share\nquote: it's\nsci: 1e3\nsmall: 1.0e-05\ntab: \"a\\tb\"\ntenth: 0.1\n"
    "text: '0.003'\nthousand: 1000.0\ntilde: '~'\ntiny: 1.5e-07\nunder_1: '1_000'\nuni: \"h\\xE9llo\"\n"
    "whole: 3.0\n'yes': 'yes'\n";

TEST(HparamsTest, LightningsYamlIsWrittenByteForByte) {
  const double inf = std::numeric_limits<double>::infinity();
  const Hyperparams h = {{"lr", 0.01},
                         {"n_layer", 2},
                         {"name", "gpt"},
                         {"compile", false},
                         {"model", {{"n_embd", 8}, {"bias", true}, {"inner", {{"x", -1}}}}},
                         {"betas", {0.9, 0.95}},
                         {"small", 1e-05},
                         {"big", 1e16},
                         {"whole", 3.0},
                         {"none", nullptr},
                         {"text", "0.003"},
                         {"yes", "yes"},
                         {"uni", "h\xc3\xa9llo"},
                         {"empty_map", nlohmann::json::object()},
                         {"empty_list", nlohmann::json::array()},
                         {"nested", {{1, 2}, {3}}},
                         {"maps", nlohmann::json::array({{{"a", 1}, {"b", "x"}}})},
                         {"sci", "1e3"},
                         {"blank", ""},
                         {"tilde", "~"},
                         {"date", "2024-01-02"},
                         {"note", "a: b # c"},
                         {"dash", "-x"},
                         {"quote", "it's"},
                         {"needs quote", "x"},
                         {"neg", -7},
                         {"tiny", 1.5e-7},
                         {"tenth", 0.1},
                         {"thousand", 1000.0},
                         {"exp16", 1e15},
                         {"inf", inf},
                         {"ninf", -inf},
                         {"nan", std::numeric_limits<double>::quiet_NaN()},
                         {"tab", "a\tb"},
                         {"path", "/usr/share"},
                         {"under_1", "1_000"},
                         {"bool_text", "True"}};
  EXPECT_EQ(hparams_yaml(h), kLightningYaml);
  EXPECT_EQ(hparams_yaml({}), "{}\n");
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
