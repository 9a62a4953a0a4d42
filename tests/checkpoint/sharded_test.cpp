// Sharded checkpoints: the shard arithmetic, StateReader over sharded and
// full checkpoints written rank file by rank file, resharding and
// consolidation round trips, and the errors for damaged or mismatched
// shard files.
#include "strata/checkpoint/sharded.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/sharded_util.h"
#include "checkpoint/test_util.h"
#include "strata/checkpoint/directory.h"
#include "strata/core/error.h"
#include "support/errors.h"

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;
using ::strata::testing::error_message;
using testing::write_sharded_by_rank;

// ---- shard arithmetic -------------------------------------------------------------

std::vector<std::pair<int64_t, int64_t>> slices(int64_t numel, int world) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int rank = 0; rank < world; ++rank) {
    FlatSlice s = shard_slice(numel, world, rank);
    out.emplace_back(s.begin, s.end);
  }
  return out;
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

TEST(ShardMathTest, SlicesCoverTheTensorInRankOrder) {
  EXPECT_EQ(shard_chunk(10, 4), 3);
  EXPECT_EQ(slices(10, 4), (Ranges{{0, 3}, {3, 6}, {6, 9}, {9, 10}}));
  // Exact multiple: equal slices, no padding.
  EXPECT_EQ(shard_chunk(12, 4), 3);
  EXPECT_EQ(slices(12, 4), (Ranges{{0, 3}, {3, 6}, {6, 9}, {9, 12}}));
  // Fewer elements than ranks: the last ranks own nothing.
  EXPECT_EQ(shard_chunk(2, 4), 1);
  EXPECT_EQ(slices(2, 4), (Ranges{{0, 1}, {1, 2}, {2, 2}, {2, 2}}));
  // ceil(7/4) = 2: the last rank's slice is clipped, not padded.
  EXPECT_EQ(slices(7, 4), (Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 7}}));
  // 5 elements on 4 ranks: chunk 2, so rank 3 owns nothing.
  EXPECT_EQ(slices(5, 4), (Ranges{{0, 2}, {2, 4}, {4, 5}, {5, 5}}));
  // Empty tensors: empty everywhere.
  EXPECT_EQ(shard_chunk(0, 3), 0);
  EXPECT_EQ(slices(0, 3), (Ranges{{0, 0}, {0, 0}, {0, 0}}));
  EXPECT_EQ(slices(9, 1), (Ranges{{0, 9}}));
  EXPECT_EQ(shard_slice(10, 4, 3).size(), 1);
}

TEST(ShardMathTest, BadWorldOrRankIsAConfigError) {
  EXPECT_EQ(error_message<ConfigError>([] { shard_chunk(4, 0); }),
            "[checkpoint] world size must be at least 1, got 0");
  EXPECT_EQ(error_message<ConfigError>([] { shard_slice(4, 2, 2); }),
            "[checkpoint] rank 2 is not in [0, 2)");
  EXPECT_THROW(shard_slice(4, 2, -1), ConfigError);
  EXPECT_THROW(shard_chunk(-1, 2), ConfigError);
}

TEST(ShardMathTest, FileNamesAndRecords) {
  EXPECT_EQ(shard_file_name(1, 4), "shard-00001-of-00004.safetensors");
  EXPECT_EQ(shard_file_name(0, 1), "shard-00000-of-00001.safetensors");
  EXPECT_EQ(shard_file_name(12344, 12345), "shard-12344-of-12345.safetensors");
  EXPECT_EQ(tensor_record({3, 4}, at::kBFloat16, true),
            nlohmann::json({{"shape", {3, 4}}, {"dtype", "BF16"}, {"sharded", true}}));
  EXPECT_EQ(tensor_record({}, at::kLong, false),
            nlohmann::json({{"shape", nlohmann::json::array()}, {"dtype", "I64"}, {"sharded", false}}));
}

TEST(ShardMathTest, ShardOfIsTheFlatSlice) {
  at::Tensor t = at::arange(10, at::kFloat).reshape({2, 5});
  EXPECT_TRUE(at::equal(shard_of(t, 4, 1), at::tensor({3.f, 4.f, 5.f})));
  EXPECT_TRUE(at::equal(shard_of(t, 4, 3), at::tensor({9.f})));
  EXPECT_EQ(shard_of(t.t(), 2, 0).numel(), 5);  // non-contiguous: row-major of its own shape
  EXPECT_TRUE(at::equal(shard_of(t.t(), 2, 0), at::tensor({0.f, 5.f, 1.f, 6.f, 2.f})));
  EXPECT_EQ(shard_of(at::scalar_tensor(2.0), 3, 2).numel(), 0);
}

// ---- a small training state -------------------------------------------------------

// Parameters (sharded), optimizer state (sharded like its parameter),
// buffers and a user tensor (whole), in several dtypes, including a 0-d
// tensor, a 1-element tensor and an empty one.
struct Fixture {
  NamedTensors tensors;
  std::set<std::string> whole;
  nlohmann::json extra;
};

Fixture training_state() {
  at::manual_seed(11);
  Fixture f;
  f.tensors = {{"model/fc.weight", at::randn({5, 3})},
               {"model/fc.bias", at::randn({5})},
               {"model/scale", at::scalar_tensor(1.75)},
               {"model/one", at::tensor({0.5f}).to(at::kBFloat16)},
               {"model/emb", at::randn({7, 2}).to(at::kBFloat16)},
               {"model/empty", at::empty({0, 4})},
               {"model/counts", at::tensor({int64_t(1) << 40, int64_t(-3), int64_t(0), int64_t(9)})},
               {"model/running_mean", at::randn({5})},
               {"optimizer/fc.weight.momentum_buffer", at::randn({5, 3})},
               {"optimizer/steps.momentum_buffer", at::arange(11, at::kLong)},
               {"rng", at::randint(0, 255, {16}, at::kByte)}};
  f.whole = {"model/counts", "model/running_mean", "rng"};
  f.extra = {{"strategy", "fsdp"},
             {"entries",
              {{"model", {{"kind", "module"}}},
               {"optimizer", {{"kind", "optimizer"}, {"state", testing::sgd_state({"fc.weight", "steps"})}}},
               {"rng", {{"kind", "tensor"}}},
               {"step", {{"kind", "value"}, {"value", 42}}}}}};
  return f;
}

std::vector<std::string> names_of(const NamedTensors& tensors) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors) names.push_back(name);
  return names;
}

// Every tensor of `reader` equals the original: dtype, shape and bits.
void expect_same_state(const StateReader& reader, const Fixture& f) {
  EXPECT_EQ(reader.tensor_names(), names_of(f.tensors));
  for (const auto& [name, original] : f.tensors) {
    SCOPED_TRACE(name);
    EXPECT_EQ(reader.shape(name), original.sizes().vec());
    EXPECT_EQ(reader.dtype(name), original.scalar_type());
    at::Tensor loaded = reader.full(name);
    EXPECT_EQ(loaded.scalar_type(), original.scalar_type());
    EXPECT_EQ(loaded.sizes(), original.sizes());
    EXPECT_TRUE(at::equal(loaded, original));
  }
}

class ShardedCheckpointTest : public testing::ScratchDir, public ::testing::WithParamInterface<int> {};

TEST_P(ShardedCheckpointTest, FullReassemblesEveryTensorWrittenByTheRanks) {
  const int world = GetParam();
  const Fixture f = training_state();
  write_sharded_by_rank(path("ckpt"), world, f.tensors, f.whole, f.extra);

  StateReader reader = StateReader::open(path("ckpt"));
  EXPECT_TRUE(reader.sharded());
  EXPECT_EQ(reader.world_size(), world);
  EXPECT_EQ(reader.entries(), f.extra["entries"]);
  EXPECT_EQ(reader.metadata()["strategy"], "fsdp");
  expect_same_state(reader, f);
  for (const auto& [name, tensor] : f.tensors) EXPECT_EQ(reader.is_sharded(name), !f.whole.count(name)) << name;
  EXPECT_EQ(reader.names_under("model"),
            (std::vector<std::string>{"fc.weight", "fc.bias", "scale", "one", "emb", "empty", "counts",
                                      "running_mean"}));
  EXPECT_EQ(reader.names_under("optimizer"), (std::vector<std::string>{"fc.weight.momentum_buffer", "steps.momentum_buffer"}));
  EXPECT_TRUE(reader.names_under("step").empty());
  EXPECT_TRUE(reader.contains("rng"));
  EXPECT_FALSE(reader.contains("model"));

  // The files hold what the layout says: slices in every rank, whole tensors in rank 0.
  for (int rank = 0; rank < world; ++rank) {
    SafetensorsFile file = SafetensorsFile::open(path("ckpt/" + shard_file_name(rank, world)));
    EXPECT_EQ(file.contains("rng"), rank == 0);
    EXPECT_EQ(file.info("model/fc.weight").spec.shape,
              (std::vector<int64_t>{shard_slice(15, world, rank).size()}));
  }
}

TEST_P(ShardedCheckpointTest, FlatSliceOverEveryBoundaryEqualsTheFlatOriginal) {
  const int world = GetParam();
  const Fixture f = training_state();
  write_sharded_by_rank(path("ckpt"), world, f.tensors, f.whole, f.extra);
  StateReader reader = StateReader::open(path("ckpt"));
  for (const auto& [name, original] : f.tensors) {
    const at::Tensor flat = original.reshape({-1});
    for (int64_t begin = 0; begin <= flat.numel(); ++begin) {
      for (int64_t end = begin; end <= flat.numel(); ++end) {
        at::Tensor got = reader.flat_slice(name, begin, end);
        ASSERT_EQ(got.dim(), 1);
        ASSERT_TRUE(at::equal(got, flat.slice(0, begin, end))) << name << " [" << begin << ", " << end << ")";
      }
    }
  }
  EXPECT_EQ(error_message<CheckpointError>([&] { reader.flat_slice("model/fc.bias", 2, 6); }),
            "[checkpoint] " + path("ckpt") + ": tensor 'model/fc.bias' has 5 elements; elements [2, 6) are "
            "out of range");
}

TEST_P(ShardedCheckpointTest, ReshardRoundTripKeepsEveryTensor) {
  const int world = GetParam();
  const Fixture f = training_state();
  write_sharded_by_rank(path("src"), world, f.tensors, f.whole, f.extra);
  const StateReader source = StateReader::open(path("src"));

  std::vector<WrittenFile> written;
  reshard_checkpoint(source, path("r5"), 5, [&](const WrittenFile& w) { written.push_back(w); });
  ASSERT_EQ(written.size(), 5u);
  EXPECT_EQ(written[0].name, "shard-00000-of-00005.safetensors");
  EXPECT_EQ(written[0].tensors, f.tensors.size());
  EXPECT_EQ(written[4].tensors, f.tensors.size() - f.whole.size());
  // Rank 4 of 5 owns [12, 15) of fc.weight and its momentum, [4, 5) of
  // fc.bias, [12, 14) of emb (bf16) and nothing of the others.
  EXPECT_EQ(written[4].bytes, 3 * 4 + 1 * 4 + 2 * 2 + 3 * 4);

  StateReader five = StateReader::open(path("r5"));
  EXPECT_EQ(five.world_size(), 5);
  EXPECT_EQ(five.metadata()["resharded_from"], world);
  EXPECT_EQ(five.metadata()["strategy"], "fsdp");
  EXPECT_EQ(five.entries(), f.extra["entries"]);
  expect_same_state(five, f);
  // An independent look at one target file: each slice is shard_of the original.
  SafetensorsFile rank3 = SafetensorsFile::open(path("r5/shard-00003-of-00005.safetensors"));
  for (const auto& [name, original] : f.tensors) {
    if (f.whole.count(name)) {
      EXPECT_FALSE(rank3.contains(name)) << name;
    } else {
      EXPECT_TRUE(at::equal(rank3.load(name), shard_of(original, 5, 3))) << name;
    }
  }

  reshard_checkpoint(five, path("r1"), 1);
  StateReader one = StateReader::open(path("r1"));
  EXPECT_EQ(one.world_size(), 1);
  expect_same_state(one, f);

  consolidate_checkpoint(one, path("full"));
  StateReader full = StateReader::open(path("full"));
  EXPECT_FALSE(full.sharded());
  EXPECT_EQ(full.metadata()["state_dict_type"], "full");
  EXPECT_EQ(full.metadata()["consolidated_from"], 1);
  EXPECT_FALSE(full.metadata().contains("resharded_from"));
  EXPECT_FALSE(full.metadata().contains("tensors"));
  expect_same_state(full, f);
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShardedCheckpointTest, ::testing::Values(2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

class StateReaderTest : public testing::ScratchDir {};

TEST_F(StateReaderTest, ReadsAFullCheckpointAndReshardsIt) {
  const Fixture f = training_state();
  nlohmann::json meta = f.extra;
  meta["state_dict_type"] = "full";
  meta["world_size"] = 4;
  write_checkpoint_dir(path("full"), {{kFullStateFile, f.tensors}}, meta);

  StateReader reader = StateReader::open(path("full"));
  EXPECT_FALSE(reader.sharded());
  EXPECT_EQ(reader.world_size(), 4);
  expect_same_state(reader, f);
  EXPECT_TRUE(at::equal(reader.flat_slice("model/fc.weight", 4, 9), f.tensors[0].second.reshape({-1}).slice(0, 4, 9)));

  // From a full source, module and optimizer tensors are sharded; tensor entries stay whole.
  reshard_checkpoint(reader, path("sharded"), 2);
  StateReader two = StateReader::open(path("sharded"));
  EXPECT_TRUE(two.sharded());
  EXPECT_EQ(two.metadata()["resharded_from"], 4);
  expect_same_state(two, f);
  EXPECT_TRUE(two.is_sharded("model/running_mean"));
  EXPECT_TRUE(two.is_sharded("optimizer/steps.momentum_buffer"));
  EXPECT_FALSE(two.is_sharded("rng"));

  // A checkpoint without metadata fields reads as full, world 1.
  write_checkpoint_dir(path("bare"), {{kFullStateFile, {{"w", at::ones({2})}}}});
  StateReader bare = StateReader::open(path("bare"));
  EXPECT_EQ(bare.world_size(), 1);
  EXPECT_TRUE(bare.entries().empty());
  EXPECT_EQ(bare.tensor_names(), std::vector<std::string>{"w"});
}

TEST_F(StateReaderTest, ConversionsRefuseAnOutputThatIsNotEmpty) {
  const Fixture f = training_state();
  write_sharded_by_rank(path("src"), 2, f.tensors, f.whole, f.extra);
  const StateReader source = StateReader::open(path("src"));
  std::filesystem::create_directories(path("out"));
  std::ofstream(path("out/notes.txt")) << "mine\n";
  const std::string expected = "[checkpoint] " + path("out") +
                               " already exists and is not empty; refusing to write over it (choose a new "
                               "path, or delete it first)";
  EXPECT_EQ(error_message<CheckpointError>([&] { consolidate_checkpoint(source, path("out")); }), expected);
  EXPECT_EQ(error_message<CheckpointError>([&] { reshard_checkpoint(source, path("out"), 3); }), expected);
  EXPECT_EQ(error_message<CheckpointError>([&] { reshard_checkpoint(source, path("src"), 3); }),
            "[checkpoint] " + path("src") +
                " already exists and is not empty; refusing to write over it (choose a new path, or delete "
                "it first)");
  EXPECT_EQ(error_message<ConfigError>([&] { reshard_checkpoint(source, path("new"), 0); }),
            "[checkpoint] the target world size must be from 1 to 99999 (shard file names have 5 digits), "
            "got 0");
  std::ofstream(path("file")) << "x";
  EXPECT_EQ(error_message<CheckpointError>([&] { consolidate_checkpoint(source, path("file")); }),
            "[checkpoint] " + path("file") + " already exists and is not a directory; choose a new path for "
            "the checkpoint");
  EXPECT_FALSE(std::filesystem::exists(path("new")));
  // An empty directory is fine.
  std::filesystem::create_directories(path("empty"));
  consolidate_checkpoint(source, path("empty"));
  expect_same_state(StateReader::open(path("empty")), f);
}

// ---- damaged and mismatched checkpoints --------------------------------------------

TEST_F(StateReaderTest, MissingRankFileIsNamed) {
  const Fixture f = training_state();
  write_sharded_by_rank(path("ckpt"), 2, f.tensors, f.whole, f.extra);
  std::filesystem::remove(path("ckpt/shard-00001-of-00002.safetensors"));
  EXPECT_EQ(error_message<CheckpointError>([&] { StateReader::open(path("ckpt")); }),
            "[checkpoint] " + path("ckpt") +
                ": shard-00001-of-00002.safetensors is missing (rank 1 of 2 did not save?)");
}

TEST_F(StateReaderTest, TruncatedShardFileIsNamed) {
  const Fixture f = training_state();
  write_sharded_by_rank(path("ckpt"), 3, f.tensors, f.whole, f.extra);
  const std::string file = path("ckpt/shard-00002-of-00003.safetensors");
  ASSERT_EQ(::truncate(file.c_str(), std::filesystem::file_size(file) - 5), 0);
  const std::string what = error_message<CheckpointError>([&] { StateReader::open(path("ckpt")); });
  EXPECT_THAT(what, HasSubstr("[checkpoint] " + file + ": tensor '"));
  EXPECT_THAT(what, HasSubstr("(truncated?)"));
}

TEST_F(StateReaderTest, SliceOfTheWrongSizeIsNamedWithWhatTheRankOwns) {
  const Fixture f = training_state();
  // Rank 1 wrote its file for a world of 3 while the metadata says 2.
  CheckpointWriter writer = CheckpointWriter::begin(path("ckpt"));
  writer.write_file(shard_file_name(0, 2), testing::rank_file_tensors(f.tensors, f.whole, 2, 0));
  writer.write_file(shard_file_name(1, 2), testing::rank_file_tensors(f.tensors, f.whole, 3, 1));
  writer.commit(testing::sharded_metadata(f.tensors, f.whole, 2, f.extra));
  EXPECT_EQ(error_message<CheckpointError>([&] { StateReader::open(path("ckpt")); }),
            "[checkpoint] " + path("ckpt") +
                ": shard-00001-of-00002.safetensors holds sharded tensor 'model/fc.weight' with shape [5] but "
                "rank 1 of 2 owns 7 elements ([8, 15) of 15, full shape [5, 3]); the file was written for "
                "another world size or another model");
}

// Writes a world-2 checkpoint whose rank files are `rank0` and `rank1`
// and whose metadata describes `f`.
void write_pair(const std::string& path, const Fixture& f, const NamedTensors& rank0, const NamedTensors& rank1) {
  CheckpointWriter writer = CheckpointWriter::begin(path);
  writer.write_file(shard_file_name(0, 2), rank0);
  writer.write_file(shard_file_name(1, 2), rank1);
  writer.commit(testing::sharded_metadata(f.tensors, f.whole, 2, f.extra));
}

TEST_F(StateReaderTest, FilesThatDisagreeWithTheMetadataAreErrors) {
  const Fixture f = training_state();
  const NamedTensors rank0 = testing::rank_file_tensors(f.tensors, f.whole, 2, 0);
  const NamedTensors rank1 = testing::rank_file_tensors(f.tensors, f.whole, 2, 1);

  NamedTensors lacking(rank1.begin() + 1, rank1.end());  // without model/fc.weight
  write_pair(path("lacks"), f, rank0, lacking);
  EXPECT_EQ(error_message<CheckpointError>([&] { StateReader::open(path("lacks")); }),
            "[checkpoint] " + path("lacks") +
                ": shard-00001-of-00002.safetensors lacks sharded tensor 'model/fc.weight' (metadata.json lists "
                "it; rank 1 of 2 saved something else?)");

  NamedTensors extra = rank1;
  extra.emplace_back("model/stray", at::ones({2}));
  write_pair(path("stray"), f, rank0, extra);
  EXPECT_EQ(error_message<CheckpointError>([&] { StateReader::open(path("stray")); }),
            "[checkpoint] " + path("stray") +
                ": shard-00001-of-00002.safetensors holds tensor 'model/stray' that metadata.json \"tensors\" "
                "does not list (a file from another save?)");

  NamedTensors with_whole = rank1;
  with_whole.emplace_back("rng", f.tensors.back().second);
  write_pair(path("whole"), f, rank0, with_whole);
  EXPECT_EQ(error_message<CheckpointError>([&] { StateReader::open(path("whole")); }),
            "[checkpoint] " + path("whole") +
                ": shard-00001-of-00002.safetensors holds whole tensor 'rng', which belongs only in rank 0's "
                "file (a file from another save?)");

  NamedTensors retyped = rank1;
  retyped[0].second = retyped[0].second.to(at::kDouble);
  write_pair(path("dtype"), f, rank0, retyped);
  EXPECT_EQ(error_message<CheckpointError>([&] { StateReader::open(path("dtype")); }),
            "[checkpoint] " + path("dtype") +
                ": shard-00001-of-00002.safetensors holds tensor 'model/fc.weight' as F64 but metadata.json says "
                "F32");

  // metadata without "tensors".
  CheckpointWriter writer = CheckpointWriter::begin(path("notensors"));
  writer.write_file(shard_file_name(0, 1), rank0);
  writer.commit({{"state_dict_type", "sharded"}, {"world_size", 1}});
  EXPECT_THAT(error_message<CheckpointError>([&] { StateReader::open(path("notensors")); }),
              HasSubstr("metadata.json: a sharded checkpoint needs a \"tensors\" object"));

  // An unknown layout.
  write_checkpoint_dir(path("odd"), {{kFullStateFile, {}}}, {{"state_dict_type", "local"}});
  EXPECT_THAT(error_message<CheckpointError>([&] { StateReader::open(path("odd")); }),
              HasSubstr("\"state_dict_type\" is 'local', expected 'full' or 'sharded'"));

  // A full checkpoint without state.safetensors.
  write_checkpoint_dir(path("other"), {{"model.safetensors", {}}});
  EXPECT_EQ(error_message<CheckpointError>([&] { StateReader::open(path("other")); }),
            "[checkpoint] " + path("other") +
                " has no state.safetensors (written by another strategy's sharded layout?)");
}

TEST_F(StateReaderTest, UnknownTensorNameIsAnErrorNamingPathAndName) {
  const Fixture f = training_state();
  write_sharded_by_rank(path("ckpt"), 2, f.tensors, f.whole, f.extra);
  StateReader reader = StateReader::open(path("ckpt"));
  EXPECT_EQ(error_message<CheckpointError>([&] { reader.full("model/nope"); }),
            "[checkpoint] " + path("ckpt") + ": has no tensor named 'model/nope' (it holds 11 tensors)");
  EXPECT_THROW(reader.shape("nope"), CheckpointError);
}

}  // namespace
}  // namespace strata::checkpoint
