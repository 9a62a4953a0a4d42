// TorchFileWriter writes what torch.load(weights_only=True) reads back
// (tests/checkpoint/read_torch_file.py): every value type a Lightning
// checkpoint holds, tensors of several dtypes loaded lazily, one storage
// for a placeholder used twice; and a tensor whose loaded shape differs
// from its placeholder's is refused with no file left behind.
#include "strata/checkpoint/torch_file.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "checkpoint/test_util.h"
#include "strata/core/error.h"
#include "support/tool.h"

namespace strata::checkpoint {
namespace {

class TorchFileTest : public testing::ScratchDir {};

TEST_F(TorchFileTest, TorchLoadWithWeightsOnlyReadsEveryValueBack) {
  ASSERT_FALSE(strata::testing::project_python().empty()) << "STRATA_PYTHON is not set: run through scripts/test.sh";
  TorchFileWriter writer;
  int loads = 0;
  const at::Tensor w = writer.lazy_tensor(at::kFloat, {2, 3}, [&] {
    ++loads;
    return at::arange(6, at::kFloat).view({2, 3});
  });
  const at::Tensor b = writer.lazy_tensor(at::kBFloat16, {3}, [&] {
    ++loads;
    return at::full({3}, 0.5, at::kBFloat16);
  });
  const at::Tensor step = writer.lazy_tensor(at::kFloat, {}, [&] {
    ++loads;
    return at::scalar_tensor(3.0, at::kFloat);
  });
  c10::impl::GenericDict state = any_dict();
  state.insert("w", w);
  state.insert("b", b);
  state.insert("tied", w);  // one storage, as a tied weight
  c10::impl::GenericDict by_index = any_dict();
  by_index.insert(int64_t{0}, step);
  c10::impl::GenericList list = any_list();
  list.push_back(int64_t{1});
  list.push_back(std::string("x"));
  list.push_back(2.5);
  c10::impl::GenericDict value = any_dict();
  value.insert("state_dict", state);
  value.insert("by_index", by_index);
  value.insert("list", list);
  value.insert("tuple", c10::ivalue::Tuple::create(std::vector<c10::IValue>{0.9, 0.95}));
  value.insert("none", c10::IValue());
  value.insert("flag", true);
  value.insert("big", int64_t{1} << 40);
  value.insert("text", std::string("h\xc3\xa9llo"));
  std::vector<size_t> progress;
  writer.write(path("out.ckpt"), value, [&](const TorchFileProgress& p) { progress.push_back(p.tensors_done); });
  EXPECT_EQ(loads, 3);  // each storage once
  EXPECT_EQ(progress, (std::vector<size_t>{1, 2, 3}));

  const auto read = strata::testing::run_python("tests/checkpoint/read_torch_file.py", {path("out.ckpt")});
  ASSERT_EQ(read.status, 0) << read.err;
  nlohmann::json seen = nlohmann::json::parse(read.out);
  const nlohmann::json& sd = seen["state_dict"];
  EXPECT_EQ(sd["w"]["tensor"], "float32");
  EXPECT_EQ(sd["w"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(sd["w"]["values"], nlohmann::json({0.0, 1.0, 2.0, 3.0, 4.0, 5.0}));
  EXPECT_EQ(sd["b"]["tensor"], "bfloat16");
  EXPECT_EQ(sd["b"]["values"], nlohmann::json({0.5, 0.5, 0.5}));
  EXPECT_EQ(sd["tied"]["storage"], sd["w"]["storage"]);
  EXPECT_NE(sd["b"]["storage"], sd["w"]["storage"]);
  EXPECT_EQ(seen["by_index"]["int:0"]["shape"], nlohmann::json::array());
  EXPECT_EQ(seen["by_index"]["int:0"]["values"], nlohmann::json({3.0}));
  EXPECT_EQ(seen["list"], nlohmann::json({1, "x", 2.5}));
  EXPECT_EQ(seen["tuple"], nlohmann::json({{"tuple", {0.9, 0.95}}}));
  EXPECT_TRUE(seen["none"].is_null());
  EXPECT_EQ(seen["flag"], true);
  EXPECT_EQ(seen["big"], int64_t{1} << 40);
  EXPECT_EQ(seen["text"], "h\xc3\xa9llo");
}

TEST_F(TorchFileTest, ATensorThatLoadsWithAnotherShapeLeavesNoFile) {
  TorchFileWriter writer;
  c10::impl::GenericDict value = any_dict();
  value.insert("w", writer.lazy_tensor(at::kFloat, {2, 3}, [] { return at::zeros({3, 2}); }));
  try {
    writer.write(path("out.ckpt"), value);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("not the Float[2, 3] of its placeholder"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(listing().empty());
}

}  // namespace
}  // namespace strata::checkpoint
