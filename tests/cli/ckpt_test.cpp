// `strata ckpt inspect | consolidate | reshard` as users run them: the
// built `strata` binary on checkpoints written rank file by rank file with
// the library, its results read back with the library and compared with
// the original tensors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/sharded_util.h"
#include "checkpoint/test_util.h"
#include "strata/checkpoint/convert.h"
#include "strata/checkpoint/safetensors.h"
#include "strata/checkpoint/sharded.h"

extern char** environ;

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Outcome {
  int status = -1;  // exit code, or 128+signal
  std::string out, err;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class CkptCommandTest : public testing::ScratchDir {
 protected:
  // Runs `strata ARGS...` with stdout and stderr captured in files.
  Outcome strata(const std::vector<std::string>& args) {
    const char* dir = std::getenv("STRATA_BINARY_DIR");
    std::vector<std::string> argv{std::string(dir != nullptr ? dir : ".") + "/strata"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const std::string out = path(".stdout"), err = path(".stderr");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    Outcome o;
    const int rc = ::posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      ADD_FAILURE() << "cannot start " << cargv[0] << ": " << std::strerror(rc);
      return o;
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    o.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    o.out = read_text(out);
    o.err = read_text(err);
    std::filesystem::remove(out);
    std::filesystem::remove(err);
    return o;
  }

  // A small training state saved as a world-2 sharded checkpoint at "ckpt".
  void SetUp() override {
    testing::ScratchDir::SetUp();
    at::manual_seed(21);
    tensors_ = {{"model/w", at::randn({4, 3})},
                {"model/b", at::randn({3}).to(at::kBFloat16)},
                {"model/n", at::tensor({int64_t(5), int64_t(-6)})},
                {"optimizer/w.momentum_buffer", at::randn({4, 3})},
                {"rng", at::randint(0, 255, {5}, at::kByte)}};
    whole_ = {"model/n", "rng"};
    entries_ = {{"model", {{"kind", "module"}}},
                {"optimizer", {{"kind", "optimizer"}, {"state", testing::sgd_state({"w"})}}},
                {"rng", {{"kind", "tensor"}}},
                {"step", {{"kind", "value"}, {"value", 42}}}};
    testing::write_sharded_by_rank(path("ckpt"), 2, tensors_, whole_,
                                   {{"strategy", "fsdp"}, {"entries", entries_}});
  }

  // Every tensor read back from `dir` equals the original.
  void expect_original(const std::string& dir) {
    StateReader reader = StateReader::open(dir);
    ASSERT_EQ(reader.tensor_names().size(), tensors_.size());
    for (const auto& [name, original] : tensors_) {
      at::Tensor loaded = reader.full(name);
      EXPECT_EQ(loaded.scalar_type(), original.scalar_type()) << name;
      EXPECT_TRUE(at::equal(loaded, original)) << name;
    }
    EXPECT_EQ(reader.entries(), entries_);
    EXPECT_EQ(reader.metadata()["strategy"], "fsdp");
  }

  NamedTensors tensors_;
  std::set<std::string> whole_;
  nlohmann::json entries_;
};

TEST_F(CkptCommandTest, InspectPrintsLayoutEntriesAndEveryTensor) {
  Outcome o = strata({"ckpt", "inspect", path("ckpt")});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_EQ(o.err, "");
  for (const std::string line :
       {"checkpoint  " + path("ckpt") + "\n", std::string("layout      sharded (2 rank files)\n"),
        std::string("world size  2\n"), std::string("strategy    fsdp\n"),
        std::string("format      strata-checkpoint version 1\n"), std::string("entries:\n"),
        std::string("  model      module\n"), std::string("  optimizer  optimizer (sgd)\n"),
        std::string("  rng        tensor\n"), std::string("  step       value 42\n"),
        std::string("  name                         shape   dtype  storage  bytes\n"),
        std::string("  model/w                      [4, 3]  F32    sharded     48\n"),
        std::string("  model/b                      [3]     BF16   sharded      6\n"),
        std::string("  model/n                      [2]     I64    whole       16\n"),
        std::string("  optimizer/w.momentum_buffer  [4, 3]  F32    sharded     48\n"),
        std::string("  rng                          [5]     U8     whole        5\n"),
        std::string("total: 5 tensors (3 sharded, 2 whole), 123 bytes (123 B)\n")})
    EXPECT_THAT(o.out, HasSubstr(line));
}

TEST_F(CkptCommandTest, InspectStartsWithASummaryByEntryAndModule) {
  // A model whose module wraps its GPT as "model" (as a Trainer's does),
  // with a structured value entry that has a long list, a newline in a
  // string and an escape character in a key.
  NamedTensors tensors = {{"model/model.wte.weight", at::zeros({10, 4})},
                          {"model/model.h.0.w", at::zeros({4, 4})},
                          {"model/model.h.1.w", at::zeros({4, 4}).to(at::kBFloat16)},
                          {"model/model.ln_f.weight", at::zeros({4})},
                          {"rng", at::zeros({5}, at::kByte)}};
  nlohmann::json lrs = nlohmann::json::array();
  for (int i = 0; i < 1000; ++i) lrs.push_back(i);
  const nlohmann::json entries = {
      {"model", {{"kind", "module"}}},
      {"rng", {{"kind", "tensor"}}},
      {"epoch", {{"kind", "value"}, {"value", 3}}},
      {"step", {{"kind", "value"}, {"value", 120}}},
      {"history", {{"kind", "value"}, {"value", {{"lrs", lrs}, {"note", "a\nb"}, {"odd\x1bkey", 1}, {"inner", {{"k", {1, 2}}}}}}}}};
  testing::write_sharded_by_rank(path("gpt"), 2, tensors, {"rng"}, {{"strategy", "ddp"}, {"entries", entries}});
  Outcome o = strata({"ckpt", "inspect", path("gpt")});
  ASSERT_EQ(o.status, 0) << o.err;
  // Parameters: wte 40, h 16 + 16, ln_f 4: 76 in the model, 5 bytes of rng.
  const std::string summary = "summary:\n"
                              "  kind        sharded, strategy ddp\n"
                              "  step        120\n"
                              "  epoch       3\n"
                              "  world size  2\n"
                              "  by entry and module:\n"
                              "                  tensors  parameters  bytes\n"
                              "    model               4          76  272 B\n"
                              "      model.wte         1          40  160 B\n"
                              "      model.h           2          32   96 B\n"
                              "      model.ln_f        1           4   16 B\n"
                              "    rng                 1           5    5 B\n";
  EXPECT_THAT(o.out, HasSubstr(summary));
  // The summary comes before the tensor list.
  EXPECT_LT(o.out.find("summary:"), o.out.find("tensors:\n"));
  // The structured value key by key, the long list elided with its count,
  // control characters escaped or replaced.
  EXPECT_THAT(o.out, HasSubstr("  history  value:\n"
                               "    inner:\n"
                               "      k: [1, 2]\n"
                               "    lrs:\n"
                               "      [0, 1, 2, 3, 4, 5, 6, 7, ... (1000 items)]\n"
                               "    note: \"a\\nb\"\n"
                               "    odd?key: 1\n"));
  EXPECT_THAT(o.out, Not(HasSubstr("999")));
  EXPECT_LT(o.out.size(), 4000u);

  Outcome json = strata({"ckpt", "inspect", path("gpt"), "--json"});
  ASSERT_EQ(json.status, 0) << json.err;
  const nlohmann::json info = nlohmann::json::parse(json.out);
  EXPECT_EQ(info["summary"]["step"], 120);
  EXPECT_EQ(info["summary"]["epoch"], 3);
  EXPECT_EQ(info["summary"]["kind"], "sharded");
  EXPECT_EQ(info["summary"]["groups"][0]["elements"], 76);
  EXPECT_EQ(info["summary"]["groups"][0]["modules"][1],
            nlohmann::json({{"name", "model.h"}, {"tensors", 2}, {"elements", 32}, {"bytes", 96}}));
}

TEST_F(CkptCommandTest, InspectJsonIsOneObject) {
  Outcome o = strata({"ckpt", "inspect", path("ckpt"), "--json"});
  ASSERT_EQ(o.status, 0) << o.err;
  const nlohmann::json info = nlohmann::json::parse(o.out);
  EXPECT_EQ(info["layout"], "sharded");
  EXPECT_EQ(info["world_size"], 2);
  EXPECT_EQ(info["strategy"], "fsdp");
  EXPECT_EQ(info["version"], 1);
  EXPECT_EQ(info["files"], nlohmann::json({"shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"}));
  EXPECT_EQ(info["entries"]["step"], nlohmann::json({{"kind", "value"}, {"value", 42}}));
  EXPECT_EQ(info["entries"]["optimizer"], nlohmann::json({{"kind", "optimizer"}, {"type", "sgd"}}));
  ASSERT_EQ(info["tensors"].size(), 5u);
  EXPECT_EQ(info["tensors"][1], nlohmann::json({{"name", "model/b"},
                                                {"shape", {3}},
                                                {"dtype", "BF16"},
                                                {"sharded", true},
                                                {"bytes", 6}}));
  EXPECT_EQ(info["totals"], nlohmann::json({{"tensors", 5}, {"sharded", 3}, {"whole", 2}, {"bytes", 123}}));
}

TEST_F(CkptCommandTest, ConsolidateWritesOneFullFileWithEveryTensor) {
  Outcome o = strata({"ckpt", "consolidate", path("ckpt"), path("full")});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_EQ(o.out, "wrote " + path("full") + "/state.safetensors (5 tensors, 123 B)\nconsolidated " +
                       path("ckpt") + " (sharded, world size 2) into " + path("full") + " (full)\n");
  expect_original(path("full"));
  StateReader full = StateReader::open(path("full"));
  EXPECT_FALSE(full.sharded());
  EXPECT_EQ(full.metadata()["state_dict_type"], "full");
  EXPECT_EQ(full.metadata()["world_size"], 2);
  EXPECT_EQ(full.metadata()["consolidated_from"], 2);
  EXPECT_EQ(full.metadata()["files"], nlohmann::json({"state.safetensors"}));
  // Independently of StateReader: the one file holds every tensor whole.
  SafetensorsFile file = SafetensorsFile::open(path("full/state.safetensors"));
  for (const auto& [name, original] : tensors_) EXPECT_TRUE(at::equal(file.load(name), original)) << name;
}

TEST_F(CkptCommandTest, ReshardTwoToThreeToOneKeepsEveryTensor) {
  Outcome three = strata({"ckpt", "reshard", path("ckpt"), path("r3"), "--world-size", "3"});
  ASSERT_EQ(three.status, 0) << three.err;
  EXPECT_THAT(three.out, HasSubstr("wrote " + path("r3") + "/shard-00000-of-00003.safetensors (5 tensors, "));
  EXPECT_THAT(three.out, HasSubstr("wrote " + path("r3") + "/shard-00002-of-00003.safetensors (3 tensors, "));
  EXPECT_THAT(three.out, HasSubstr("resharded " + path("ckpt") + " (sharded, world size 2) into " + path("r3") +
                                   " (sharded, world size 3)\n"));
  for (int rank = 0; rank < 3; ++rank) {
    SafetensorsFile file = SafetensorsFile::open(path("r3/" + shard_file_name(rank, 3)));
    for (const auto& [name, original] : tensors_) {
      if (whole_.count(name))
        EXPECT_EQ(file.contains(name), rank == 0) << name;
      else
        EXPECT_TRUE(at::equal(file.load(name), shard_of(original, 3, rank))) << name << " rank " << rank;
    }
  }
  expect_original(path("r3"));

  Outcome one = strata({"ckpt", "reshard", path("r3"), path("r1"), "--world-size", "1"});
  ASSERT_EQ(one.status, 0) << one.err;
  StateReader r1 = StateReader::open(path("r1"));
  EXPECT_TRUE(r1.sharded());
  EXPECT_EQ(r1.world_size(), 1);
  EXPECT_EQ(r1.metadata()["resharded_from"], 3);
  expect_original(path("r1"));

  // A full checkpoint reshards too.
  ASSERT_EQ(strata({"ckpt", "consolidate", path("r1"), path("full")}).status, 0);
  ASSERT_EQ(strata({"ckpt", "reshard", path("full"), path("r2"), "--world-size", "2"}).status, 0);
  expect_original(path("r2"));
}

// The conversions behind the progress lines report after each tensor
// record, counting up to totals that are the records and bytes written.
TEST_F(CkptCommandTest, ConversionsReportEachTensorUpToTheirTotals) {
  const StateReader source = StateReader::open(path("ckpt"));
  auto recorder = [](std::vector<ConvertProgress>& seen) {
    return [&seen](const ConvertProgress& p) { seen.push_back(p); };
  };
  auto expect_counts = [](const std::vector<ConvertProgress>& seen, size_t tensors, uint64_t bytes,
                          const std::string& what) {
    ASSERT_EQ(seen.size(), tensors) << what;
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i].tensors_done, i + 1) << what;
      EXPECT_EQ(seen[i].tensors_total, tensors) << what;
      EXPECT_EQ(seen[i].bytes_total, bytes) << what;
      if (i > 0) EXPECT_GT(seen[i].bytes_done, seen[i - 1].bytes_done) << what;
    }
    EXPECT_EQ(seen.back().bytes_done, bytes) << what;
  };
  std::vector<ConvertProgress> full, three, exported;
  consolidate_checkpoint(source, path("full"), {}, recorder(full));
  expect_counts(full, 5, 123, "consolidate");
  // 3 sharded tensors in each of 3 rank files, 2 whole ones in rank 0's.
  reshard_checkpoint(source, path("r3"), 3, {}, recorder(three));
  expect_counts(three, 3 * 3 + 2, 123, "reshard");
  expect_original(path("r3"));
  export_module(source, "model", path("model.safetensors"), {}, "", recorder(exported));
  expect_counts(exported, 3, 48 + 6 + 16, "export");
}

TEST_F(CkptCommandTest, BadPathsAndValuesGiveClearErrors) {
  Outcome missing = strata({"ckpt", "inspect", path("nope")});
  EXPECT_EQ(missing.status, 1);
  EXPECT_EQ(missing.err, "strata: error: [checkpoint] " + path("nope") +
                             ": no such checkpoint (the directory does not exist)\n");

  std::filesystem::create_directories(path("busy"));
  std::ofstream(path("busy/keep.txt")) << "mine\n";
  Outcome busy = strata({"ckpt", "consolidate", path("ckpt"), path("busy")});
  EXPECT_EQ(busy.status, 1);
  EXPECT_EQ(busy.err, "strata: error: [checkpoint] " + path("busy") +
                          " already exists and is not empty; refusing to write over it (choose a new path, or "
                          "delete it first)\n");
  EXPECT_EQ(read_text(path("busy/keep.txt")), "mine\n");

  Outcome zero = strata({"ckpt", "reshard", path("ckpt"), path("z"), "--world-size", "0"});
  EXPECT_EQ(zero.status, 1);
  EXPECT_EQ(zero.err, "strata: error: [ckpt] --world-size must be at least 1, got 0\n");
  EXPECT_FALSE(std::filesystem::exists(path("z")));

  Outcome word = strata({"ckpt", "reshard", path("ckpt"), path("z"), "--world-size", "two"});
  EXPECT_NE(word.status, 0);
  EXPECT_THAT(word.err, HasSubstr("--world-size"));

  Outcome absent = strata({"ckpt", "reshard", path("ckpt"), path("z")});
  EXPECT_NE(absent.status, 0);
  EXPECT_THAT(absent.err, HasSubstr("--world-size is required"));

  std::filesystem::remove(path("ckpt/shard-00001-of-00002.safetensors"));
  Outcome lost = strata({"ckpt", "consolidate", path("ckpt"), path("out")});
  EXPECT_EQ(lost.status, 1);
  EXPECT_EQ(lost.err, "strata: error: [checkpoint] " + path("ckpt") +
                          ": shard-00001-of-00002.safetensors is missing (rank 1 of 2 did not save?)\n");
  EXPECT_FALSE(std::filesystem::exists(path("out")));
}

TEST_F(CkptCommandTest, VerifyChecksEveryTensorAndNamesTheDamagedOne) {
  Outcome good = strata({"ckpt", "verify", path("ckpt")});
  EXPECT_EQ(good.status, 0) << good.err;
  EXPECT_EQ(good.out, "verified " + path("ckpt") + " (sharded, world size 2): 2 files, 8 tensors, every "
                      "checksum matches\n");

  const std::string file = path("ckpt/shard-00001-of-00002.safetensors");
  std::string bytes = read_text(file);
  bytes[bytes.size() - 1] ^= 0x20;  // the last data byte of rank 1's file
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  const std::string before = read_text(file);
  Outcome bad = strata({"ckpt", "verify", path("ckpt")});
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("strata: error: [checkpoint] " + file + ": tensor 'optimizer/w.momentum_buffer': "
                                 "checksum mismatch: the file records xxh64 "));
  EXPECT_EQ(read_text(file), before);
}

TEST_F(CkptCommandTest, AFifoInPlaceOfMetadataIsRefusedNotWaitedOn) {
  const std::string meta = path("ckpt/metadata.json");
  std::filesystem::remove(meta);
  ASSERT_EQ(::mkfifo(meta.c_str(), 0644), 0);
  for (const char* command : {"inspect", "verify"}) {
    Outcome fifo = strata({"ckpt", command, path("ckpt")});
    EXPECT_EQ(fifo.status, 1);
    EXPECT_EQ(fifo.err, "strata: error: [checkpoint] " + meta +
                            ": is a FIFO, not a regular file; checkpoint files must be regular files\n");
  }
}

TEST_F(CkptCommandTest, HelpDescribesEachCommand) {
  Outcome ckpt = strata({"ckpt", "--help"});
  EXPECT_EQ(ckpt.status, 0);
  for (const char* word : {"inspect", "consolidate", "reshard", "Examples:"})
    EXPECT_THAT(ckpt.out, HasSubstr(word));
  Outcome reshard = strata({"ckpt", "reshard", "--help"});
  EXPECT_EQ(reshard.status, 0);
  for (const char* word : {"--world-size", "shard-RRRRR-of-NNNNN.safetensors", "OUT", "Example:"})
    EXPECT_THAT(reshard.out, HasSubstr(word));
  Outcome inspect = strata({"ckpt", "inspect", "--help"});
  EXPECT_THAT(inspect.out, HasSubstr("--json"));
  Outcome consolidate = strata({"ckpt", "consolidate", "--help"});
  EXPECT_THAT(consolidate.out, HasSubstr("state.safetensors"));
  EXPECT_NE(strata({"ckpt"}).status, 0);
}

}  // namespace
}  // namespace strata::checkpoint
