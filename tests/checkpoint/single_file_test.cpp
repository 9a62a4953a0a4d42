// One-file checkpoints and self-describing shard files (single_file.h):
// the one file holds the metadata in its "__metadata__" and the model under
// PyTorch's names, which the `safetensors` package reads as they are; shard
// files describe themselves, so one read alone is refused; conversions
// between the layouts keep every tensor; export writes a plain model file.
#include "strata/checkpoint/single_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/sharded_util.h"
#include "checkpoint/test_util.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"
#include "strata/core/error.h"
#include "support/errors.h"
#include "support/tool.h"

namespace strata::checkpoint {
namespace {

using ::strata::testing::error_message;
using ::testing::HasSubstr;

// A model (fc + a buffer), its SGD state, a tensor entry and a value, as a
// strategy would store them in a directory.
NamedTensors directory_tensors() {
  at::manual_seed(5);
  return {{"model/fc.weight", at::randn({4, 3})},
          {"model/fc.bias", at::randn({4})},
          {"model/norm.running_mean", at::randn({3}).to(at::kBFloat16)},
          {"optimizer/fc.weight.momentum_buffer", at::randn({4, 3})},
          {"rng", at::randint(0, 255, {8}, at::kByte)}};
}

nlohmann::json directory_metadata() {
  return {{"strategy", "ddp"},
          {"world_size", 2},
          {"state_dict_type", "full"},
          {"entries",
           {{"model", {{"kind", "module"}}},
            {"optimizer", {{"kind", "optimizer"}, {"state", testing::sgd_state({"fc.weight"})}}},
            {"rng", {{"kind", "tensor"}}},
            {"step", {{"kind", "value"}, {"value", 7}}}}}};
}

class SingleFileTest : public testing::ScratchDir {
 protected:
  // A full directory checkpoint of directory_tensors(), opened.
  StateReader directory() {
    write_checkpoint_dir(path("dir"), {{kFullStateFile, directory_tensors()}}, directory_metadata());
    return StateReader::open(path("dir"));
  }
};

void expect_same_entries(const StateReader& a, const StateReader& b) {
  for (const std::string key : {"model", "optimizer"}) {
    SCOPED_TRACE(key);
    ASSERT_EQ(a.names_under(key), b.names_under(key));
    for (const std::string& name : a.names_under(key))
      EXPECT_TRUE(at::equal(a.full(a.tensor_of(key, name)), b.full(b.tensor_of(key, name)))) << name;
  }
  EXPECT_TRUE(at::equal(a.full(a.tensor_of("rng")), b.full(b.tensor_of("rng"))));
  EXPECT_EQ(a.entries()["step"], b.entries()["step"]);
}

TEST(SingleFileNames, TheModelKeepsPlainNamesEveryOtherEntryItsPrefix) {
  EXPECT_TRUE(is_single_file_path("ckpt/last.safetensors"));
  EXPECT_FALSE(is_single_file_path("ckpt/step-00000100"));
  EXPECT_FALSE(is_single_file_path(".safetensors"));
  EXPECT_EQ(primary_module({"ema", "model"}), "model");
  EXPECT_EQ(primary_module({"generator"}), "generator");
  EXPECT_EQ(primary_module({"generator", "discriminator"}), "");
  EXPECT_EQ(entry_tensor_name("model", "fc.weight", "model"), "fc.weight");
  EXPECT_EQ(entry_tensor_name("optimizer", "fc.weight.exp_avg", "model"), "optimizer/fc.weight.exp_avg");
  EXPECT_EQ(entry_tensor_name("rng", "", "model"), "rng");
  EXPECT_EQ(entry_tensor_name("model", "fc.weight", ""), "model/fc.weight");
}

TEST_F(SingleFileTest, ConsolidatingToOneFileKeepsEveryTensorAndTheMetadataInside) {
  const StateReader dir = directory();
  consolidate_checkpoint(dir, path("one.safetensors"));
  const StateReader one = StateReader::open(path("one.safetensors"));
  EXPECT_TRUE(one.single_file());
  EXPECT_FALSE(one.sharded());
  EXPECT_EQ(one.world_size(), 2);
  EXPECT_EQ(one.tensor_of("model", "fc.weight"), "fc.weight");
  EXPECT_EQ(one.tensor_of("optimizer", "fc.weight.momentum_buffer"), "optimizer/fc.weight.momentum_buffer");
  EXPECT_EQ(one.names_under("model"), (std::vector<std::string>{"fc.weight", "fc.bias", "norm.running_mean"}));
  expect_same_entries(dir, one);
  EXPECT_EQ(one.verify_checksums(), 5u);

  // And back: a directory again, and sharded for 3 ranks, under "<key>/" names.
  consolidate_checkpoint(one, path("back"));
  const StateReader back = StateReader::open(path("back"));
  EXPECT_FALSE(back.single_file());
  EXPECT_TRUE(back.contains("model/fc.weight"));
  EXPECT_FALSE(back.entries()["model"].contains("prefix"));
  expect_same_entries(dir, back);
  reshard_checkpoint(one, path("three"), 3);
  expect_same_entries(dir, StateReader::open(path("three")));
}

TEST_F(SingleFileTest, TheSafetensorsPackageReadsTheModelUnderPyTorchNames) {
  ASSERT_FALSE(strata::testing::project_python().empty()) << "STRATA_PYTHON is not set: run through scripts/test.sh";
  const StateReader dir = directory();
  consolidate_checkpoint(dir, path("one.safetensors"));
  const auto read = strata::testing::run_python("tests/checkpoint/read_with_safetensors.py", {path("one.safetensors")});
  ASSERT_EQ(read.status, 0) << read.err;
  const nlohmann::json seen = nlohmann::json::parse(read.out);
  EXPECT_EQ(seen["keys"], nlohmann::json({"fc.bias", "fc.weight", "norm.running_mean",
                                          "optimizer/fc.weight.momentum_buffer", "rng"}));
  const nlohmann::json meta = nlohmann::json::parse(seen["metadata"]["strata"].get<std::string>());
  EXPECT_EQ(meta["format"], "strata-checkpoint");
  EXPECT_EQ(meta["layout"], "file");
  EXPECT_EQ(meta["entries"]["model"]["prefix"], "");
  EXPECT_EQ(meta["entries"]["step"]["value"], 7);
  const at::Tensor weight = dir.full("model/fc.weight").to(at::kDouble).reshape({-1});
  const auto values = seen["tensors"]["fc.weight"]["values"].get<std::vector<double>>();
  ASSERT_EQ(values.size(), 12u);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(values[i], weight[i].item<double>());
  EXPECT_EQ(seen["tensors"]["norm.running_mean"]["dtype"], "bfloat16");
}

TEST_F(SingleFileTest, AShardFileDescribesItselfAndIsRefusedOnItsOwn) {
  ASSERT_FALSE(strata::testing::project_python().empty()) << "STRATA_PYTHON is not set: run through scripts/test.sh";
  reshard_checkpoint(directory(), path("sharded"), 2);
  const std::string rank1 = path("sharded") + "/" + shard_file_name(1, 2);

  const auto read = strata::testing::run_python("tests/checkpoint/read_with_safetensors.py", {rank1});
  ASSERT_EQ(read.status, 0) << read.err;
  const nlohmann::json seen = nlohmann::json::parse(read.out);
  const nlohmann::json shard = nlohmann::json::parse(seen["metadata"]["strata.shard"].get<std::string>());
  EXPECT_EQ(shard["rank"], 1);
  EXPECT_EQ(shard["world_size"], 2);
  // fc.weight has 12 elements: rank 1 holds the flat slice [6, 12).
  EXPECT_EQ(shard["tensors"]["model/fc.weight"], nlohmann::json({{"shape", {4, 3}}, {"offset", 6}}));
  EXPECT_EQ(seen["tensors"]["model/fc.weight"]["shape"], nlohmann::json({6}));
  EXPECT_FALSE(shard["tensors"].contains("rng"));  // whole tensors are what they say

  EXPECT_THAT(error_message([&] { StateReader::open(rank1); }),
              HasSubstr("is one rank's file of a sharded checkpoint (rank 1 of 2); its tensors are flat slices"));
}

TEST_F(SingleFileTest, AShardFileFromAnotherRankIsNamed) {
  reshard_checkpoint(directory(), path("sharded"), 2);
  // Rank 1's file rewritten with rank 0's description: same tensors, wrong claim.
  const std::string rank1 = path("sharded") + "/" + shard_file_name(1, 2);
  const SafetensorsFile file = SafetensorsFile::open(rank1);
  Metadata claim = shard_file_metadata(0, 2, StateReader::open(path("sharded")).metadata()["tensors"]);
  write_safetensors(rank1, file.load_all(), claim);
  EXPECT_THAT(error_message([&] { StateReader::open(path("sharded")); }),
              HasSubstr("describes rank 0 of 2, but the file is rank 1 of 2"));
}

TEST_F(SingleFileTest, APlainFileAndAHostileDescriptionAreRefusedWithWhatTheyAre) {
  write_safetensors(path("plain.safetensors"), {{"fc.weight", at::ones({2, 2})}});
  EXPECT_THAT(error_message([&] { StateReader::open(path("plain.safetensors")); }),
              HasSubstr("it is a plain safetensors file, not a strata checkpoint"));
  write_safetensors(path("bad.safetensors"), {{"w", at::ones({2})}}, {{kFileMetadataKey, "{\"format\": 3"}});
  EXPECT_THAT(error_message([&] { StateReader::open(path("bad.safetensors")); }), HasSubstr("is not valid JSON"));
  write_safetensors(path("odd.safetensors"), {{"w", at::ones({2})}}, {{kShardMetadataKey, "[\"rank\"]"}});
  EXPECT_THAT(error_message([&] { StateReader::open(path("odd.safetensors")); }),
              HasSubstr("(rank -1 of -1)"));
  // A prefix on anything but the model of a one-file checkpoint.
  nlohmann::json meta = directory_metadata();
  meta["entries"]["optimizer"]["prefix"] = "";
  write_checkpoint_dir(path("prefixed"), {{kFullStateFile, directory_tensors()}}, meta);
  EXPECT_THAT(error_message([&] { StateReader::open(path("prefixed")); }),
              HasSubstr("entries['optimizer'].prefix is \"\"; only one module entry of a one-file checkpoint"));
}

TEST_F(SingleFileTest, APlainStateDictOpensAsOneModelEntry) {
  write_safetensors(path("plain.safetensors"), {{"fc.weight", at::ones({2, 2})}, {"fc.bias", at::zeros({2})}});
  const StateReader plain = StateReader::open_plain(path("plain.safetensors"));
  EXPECT_EQ(plain.entries(), nlohmann::json({{"model", {{"kind", "module"}, {"prefix", ""}}}}));
  EXPECT_EQ(plain.names_under("model"), (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_TRUE(at::equal(plain.full(plain.tensor_of("model", "fc.weight")), at::ones({2, 2})));
  // A strata file opens as open() opens it; a folder or a shard file is refused.
  consolidate_checkpoint(directory(), path("one.safetensors"));
  EXPECT_EQ(StateReader::open_plain(path("one.safetensors")).entries(),
            StateReader::open(path("one.safetensors")).entries());
  EXPECT_THAT(error_message([&] { StateReader::open_plain(path("dir")); }),
              HasSubstr("is a directory; a plain state dict is one .safetensors file"));
  reshard_checkpoint(StateReader::open(path("dir")), path("sharded"), 2);
  EXPECT_THAT(error_message([&] { StateReader::open_plain(path("sharded") + "/" + shard_file_name(0, 2)); }),
              HasSubstr("is one rank's file of a sharded checkpoint (rank 0 of 2)"));
}

TEST_F(SingleFileTest, ExportWritesThePlainModelWithATiedCopy) {
  const StateReader dir = directory();
  export_module(dir, "model", path("model.safetensors"), {{"head.weight", "fc.weight"}, {"fc.bias", "fc.weight"}});
  const SafetensorsFile file = SafetensorsFile::open(path("model.safetensors"));
  EXPECT_EQ(file.keys(), (std::vector<std::string>{"fc.weight", "fc.bias", "norm.running_mean", "head.weight"}));
  EXPECT_TRUE(at::equal(file.load("head.weight"), dir.full("model/fc.weight")));
  EXPECT_TRUE(at::equal(file.load("fc.bias"), dir.full("model/fc.bias")));  // the module's own wins
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_THAT(error_message([&] { export_module(dir, "optimizer", path("x.safetensors")); }),
              HasSubstr("has no module entry 'optimizer'"));
  EXPECT_THAT(error_message([&] { export_module(dir, "model", path("x.safetensors"), {{"a", "nope"}}); }),
              HasSubstr("module 'model' has no tensor 'nope'"));
}

TEST_F(SingleFileTest, OneFileIsWrittenOnlyWhereAFileBelongs) {
  std::filesystem::create_directories(path("taken.safetensors"));
  EXPECT_THAT(error_message([&] { begin_checkpoint_file(path("taken.safetensors"), {}, nlohmann::json::object()); }),
              HasSubstr("is a directory; a one-file checkpoint is a file"));
  EXPECT_THAT(error_message([&] { reshard_checkpoint(directory(), path("s.safetensors"), 2); }),
              HasSubstr("a sharded checkpoint is a directory"));
}

}  // namespace
}  // namespace strata::checkpoint
