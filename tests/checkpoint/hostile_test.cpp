// Hostile and damaged checkpoints: one test per class of the audit (deep
// JSON, huge and negative numbers, FIFOs, symbolic links, traversal paths,
// bad optimizer state, orphaned state, wrong dtypes, bad RNG bytes, huge
// shapes, transposed records, flipped bytes, leftover staging folders, a
// Trainer state with a field missing or renamed). Each asserts the tagged "[checkpoint] <file>: <field>: ..." error and that
// the checkpoint folder is exactly as it was before.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <filesystem>
#include <map>

#include "checkpoint/sharded_util.h"
#include "checkpoint/test_util.h"
#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/checksum.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/input.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/trainer/trainer_state.h"
#include "support/errors.h"

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;
using testing::dead_pid;
namespace fs = std::filesystem;

class HostileCheckpointTest : public testing::ScratchDir {
 protected:
  void SetUp() override {
    testing::ScratchDir::SetUp();
    ckpt_ = path("ckpt");
    entries_ = {{"model", {{"kind", "module"}}},
                {"optimizer", {{"kind", "optimizer"}, {"state", testing::sgd_state({"w"})}}},
                {"rng", {{"kind", "tensor"}}},
                {"step", {{"kind", "value"}, {"value", 42}}},
                {"loader", {{"kind", "value"}, {"value", {{"epoch", 1}, {"position", 3}}}}}};
    write_checkpoint_dir(ckpt_,
                         {{kFullStateFile,
                           {{"model/w", at::arange(6, at::kFloat).reshape({2, 3})},
                            {"optimizer/w.momentum_buffer", at::ones({2, 3})},
                            {"rng", at::arange(5, at::kByte)}}}},
                         {{"strategy", "ddp"}, {"world_size", 1}, {"state_dict_type", "full"}, {"entries", entries_}});
    meta_path_ = ckpt_ + "/" + kMetadataFile;
    meta_ = nlohmann::json::parse(testing::read_bytes(meta_path_));
  }

  // Every entry under the scratch folder with its bytes (links: "->target").
  std::map<std::string, std::string> snapshot() const {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      const std::string p = e.path().string();
      if (e.is_symlink()) out[p] = "->" + fs::read_symlink(e.path()).string();
      else if (e.is_regular_file()) out[p] = testing::read_bytes(p);
      else out[p] = e.is_directory() ? "<dir>" : "<special>";
    }
    return out;
  }

  // Writes `meta` as metadata.json, opens the checkpoint, and returns the
  // error; checks that the folder did not change.
  std::string open_error(const nlohmann::json& meta) {
    testing::write_bytes(meta_path_, meta.dump());
    return open_error();
  }
  std::string open_error() {
    const auto before = snapshot();
    const std::string message =
        strata::testing::error_message<CheckpointError>([&] { StateReader::open(ckpt_).verify_checksums(); });
    EXPECT_EQ(snapshot(), before) << "reading a checkpoint must not change it";
    return message;
  }

  std::string ckpt_, meta_path_;
  nlohmann::json entries_, meta_;
};

TEST_F(HostileCheckpointTest, TheValidCheckpointLoads) {
  const StateReader reader = StateReader::open(ckpt_);
  EXPECT_EQ(reader.verify_checksums(), 3u);
  EXPECT_TRUE(reader.files()[0].has_checksums());
  EXPECT_TRUE(reader.full("model/w").equal(at::arange(6, at::kFloat).reshape({2, 3})));
}

TEST_F(HostileCheckpointTest, JsonNestedAMillionLevelsDeep) {
  const std::string deep(1'000'000, '[');
  testing::write_bytes(meta_path_, deep);
  EXPECT_THAT(open_error(), HasSubstr("[checkpoint] " + meta_path_ +
                                      ": metadata.json is nested deeper than the limit of 64 levels"));
  // Inside a field of an otherwise valid document.
  std::string text = meta_.dump();
  text.insert(text.size() - 1, ",\"x\":" + std::string(100'000, '[') + std::string(100'000, ']'));
  testing::write_bytes(meta_path_, text);
  EXPECT_THAT(open_error(), HasSubstr("nested deeper than the limit of 64 levels"));

  const std::string file = path("deep.safetensors");
  testing::write_bytes(file, testing::raw_safetensors(std::string(1'000'000, '{'), ""));
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { SafetensorsFile::open(file); }),
              HasSubstr("[checkpoint] " + file + ": the header is not valid JSON"));
  testing::write_bytes(file, testing::raw_safetensors("{\"a\":" + std::string(1'000'000, '['), ""));
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { SafetensorsFile::open(file); }),
              HasSubstr("[checkpoint] " + file + ": the header is nested deeper than the limit of 64 levels"));
}

TEST_F(HostileCheckpointTest, JsonLimitsOnSizeValuesNumbersAndRepeatedKeys) {
  JsonLimits small;
  small.max_numbers = 3;
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { parse_json_limited("[1,2,3,4]", small, "f", "doc"); }),
              HasSubstr("[checkpoint] f: doc holds more than the limit of 3 numbers"));
  small.max_values = 4;
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { parse_json_limited("[\"a\",\"b\",\"c\",\"d\"]", small, "f", "doc"); }),
              HasSubstr("[checkpoint] f: doc holds more than the limit of 4 values"));
  small.max_bytes = 5;
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { parse_json_limited("[1,2,3]", small, "f", "doc"); }),
              HasSubstr("[checkpoint] f: doc is 7 bytes, more than the limit of 5 bytes"));
  // A repeated key deep inside metadata.json would hide a second value.
  std::string text = meta_.dump();
  text.insert(text.size() - 1, ",\"deep\":{\"k\":1,\"k\":2}");
  testing::write_bytes(meta_path_, text);
  EXPECT_THAT(open_error(), HasSubstr(meta_path_ + ": metadata.json names 'k' twice in one object"));
  // metadata.json larger than its limit is not read at all.
  ASSERT_EQ(::truncate(meta_path_.c_str(), (64 << 20) + 1), 0);
  EXPECT_THAT(open_error(), HasSubstr(meta_path_ + ": 67108865 bytes exceed the limit of 67108864 bytes"));
}

TEST_F(HostileCheckpointTest, HugeNegativeAndFractionalCounters) {
  const std::string range = "; expected an integer from 0 to 9007199254740991";
  for (const auto& [value, shown] : std::vector<std::pair<nlohmann::json, std::string>>{
           {1e30, "1e+30"},
           {uint64_t(1) << 63, "9223372036854775808"},
           {-5, "-5"},
           {1.5, "1.5"},
           {"7", "\"7\""}}) {
    nlohmann::json meta = meta_;
    meta["entries"]["step"]["value"] = value;
    EXPECT_THAT(open_error(meta), HasSubstr("[checkpoint] " + meta_path_ + ": entries['step'].value is " +
                                            shown + range));
  }
  nlohmann::json meta = meta_;
  meta["entries"]["loader"]["value"]["epoch"] = -1;
  EXPECT_THAT(open_error(meta), HasSubstr(meta_path_ + ": entries['loader'].value.epoch is -1" + range));
  meta = meta_;
  meta["world_size"] = uint64_t(1) << 63;
  EXPECT_THAT(open_error(meta), HasSubstr(meta_path_ + ": \"world_size\" is 9223372036854775808, expected an "
                                          "integer from 1 to 99999"));
}

TEST_F(HostileCheckpointTest, FifosAreRefusedWithoutWaiting) {
  for (const std::string file : {std::string(kMetadataFile), std::string(kFullStateFile)}) {
    const std::string target = ckpt_ + "/" + file;
    const std::string bytes = testing::read_bytes(target);
    fs::remove(target);
    ASSERT_EQ(::mkfifo(target.c_str(), 0644), 0);
    EXPECT_THAT(open_error(), HasSubstr("[checkpoint] " + target + ": is a FIFO, not a regular file"));
    fs::remove(target);
    testing::write_bytes(target, bytes);
  }
  // A shard file of a sharded checkpoint.
  const std::string sharded = path("sharded");
  reshard_checkpoint(StateReader::open(ckpt_), sharded, 2);
  const std::string shard = sharded + "/" + shard_file_name(1, 2);
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0644), 0);
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { StateReader::open(sharded); }),
              HasSubstr("[checkpoint] " + shard + ": is a FIFO, not a regular file"));
}

TEST_F(HostileCheckpointTest, SymbolicLinksAreNotFollowed) {
  // A tensor file linked to a file outside the checkpoint folder.
  const std::string outside = path("outside.safetensors");
  fs::copy_file(ckpt_ + "/" + kFullStateFile, outside);
  fs::remove(ckpt_ + "/" + kFullStateFile);
  fs::create_symlink(outside, ckpt_ + "/" + kFullStateFile);
  EXPECT_THAT(open_error(), HasSubstr("[checkpoint] " + ckpt_ + "/" + kFullStateFile +
                                      ": is a symbolic link; checkpoint files must be regular files"));
  // metadata.json linked to /dev/zero.
  fs::remove(meta_path_);
  fs::create_symlink("/dev/zero", meta_path_);
  EXPECT_THAT(open_error(), HasSubstr("[checkpoint] " + meta_path_ + ": is a symbolic link"));
  // The completion marker as a link does not count.
  fs::remove(ckpt_ + "/" + kCompleteMarker);
  fs::create_symlink(outside, ckpt_ + "/" + kCompleteMarker);
  EXPECT_FALSE(is_complete(ckpt_));
}

TEST_F(HostileCheckpointTest, TraversalPathsInFiles) {
  for (const std::string name : {"../../../etc/passwd", "..", "/etc/passwd", "a/b.safetensors"}) {
    nlohmann::json meta = meta_;
    meta["files"] = {name};
    EXPECT_THAT(open_error(meta), HasSubstr("[checkpoint] " + meta_path_ + ": \"files\" names '" + name +
                                            "', which is not a plain file name inside the checkpoint folder"));
  }
  nlohmann::json meta = meta_;
  meta["files"] = {"passwd"};
  EXPECT_THAT(open_error(meta), HasSubstr(": \"files\" names 'passwd', not a .safetensors file"));
  meta["files"] = nlohmann::json::array();
  EXPECT_THAT(open_error(meta), HasSubstr(meta_path_ + ": \"files\" does not list state.safetensors"));
}

TEST_F(HostileCheckpointTest, OptimizerHyperparametersOutOfRange) {
  const std::string field = meta_path_ + ": entries['optimizer'].state.param_groups[0].options.";
  for (const auto& [name, value, expected] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"lr", -1, "lr: is -1; expected a number in [0, 1e+30]"},
           {"momentum", "fast", "momentum: is \"fast\"; expected a number"},
           {"weight_decay", -0.5, "weight_decay: is -0.5"}}) {
    nlohmann::json meta = meta_;
    meta["entries"]["optimizer"]["state"]["param_groups"][0]["options"][name] = value;
    EXPECT_THAT(open_error(meta), HasSubstr(field + expected));
  }
  // Adam: betas in [0, 1), a per-parameter step that is a counter.
  auto adam = [](nlohmann::json betas, nlohmann::json step) {
    return nlohmann::json{{"type", "adam"},
                          {"param_groups",
                           {{{"params", {"w"}},
                             {"options", {{"lr", 0.001}, {"betas", betas}, {"eps", 1e-8}, {"weight_decay", 0.0}, {"amsgrad", false}}}}}},
                          {"state", {{"w", {{"step", step}, {"tensors", {"exp_avg", "exp_avg_sq"}}}}}}};
  };
  const std::vector<std::string> tensors = {"w.exp_avg", "w.exp_avg_sq"};
  EXPECT_NO_THROW(validate_optimizer_state(adam({0.9, 0.999}, 3), tensors, "f", "opt"));
  EXPECT_THAT(strata::testing::error_message<CheckpointError>(
                  [&] { validate_optimizer_state(adam({2, 3}, 3), tensors, "f", "opt"); }),
              HasSubstr("[checkpoint] f: opt.param_groups[0].options.betas[0]: is 2; expected a number in [0, 1)"));
  EXPECT_THAT(strata::testing::error_message<CheckpointError>(
                  [&] { validate_optimizer_state(adam({0.9, 0.999}, -100), tensors, "f", "opt"); }),
              HasSubstr("[checkpoint] f: opt.state['w'].step is -100; expected an integer from 0 to"));
}

TEST_F(HostileCheckpointTest, AnUnknownOptimizerTypeNamesTheKnownOnes) {
  nlohmann::json meta = meta_;
  meta["entries"]["optimizer"]["state"]["type"] = "lamb";
  EXPECT_THAT(open_error(meta), HasSubstr(meta_path_ + ": entries['optimizer'].state.type: is 'lamb'; expected "
                                          "'sgd', 'adam' or 'adamw'"));
}

TEST_F(HostileCheckpointTest, RenamedOrOrphanedOptimizerStateIsAnError) {
  nlohmann::json meta = meta_;
  auto& state = meta["entries"]["optimizer"]["state"]["state"];
  state["w_renamed"] = state["w"];
  state.erase("w");
  EXPECT_THAT(open_error(meta), HasSubstr(meta_path_ + ": entries['optimizer'].state.state['w_renamed']: names no "
                                          "parameter of param_groups"));
  // The state entry removed: its stored tensor is orphaned.
  meta = meta_;
  meta["entries"]["optimizer"]["state"]["state"].erase("w");
  EXPECT_THAT(open_error(meta), HasSubstr(meta_path_ + ": entries['optimizer'].state.state: 1 stored tensor match no "
                                          "parameter's state: 'w.momentum_buffer' (orphaned optimizer state)"));
}

TEST_F(HostileCheckpointTest, OptimizerTensorDtypeAndShapeAreCheckedAgainstTheParameter) {
  torch::nn::Linear net(3, 2);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  net->forward(at::ones({1, 3})).sum().backward();
  adam.step();
  ParamNames names = param_names(*net);
  OptimizerState state = optimizer_state(adam, names);
  for (auto& [name, tensor] : state.tensors)
    if (name == "weight.exp_avg") tensor = tensor.to(at::kDouble);
  const auto before = adam.state().size();
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { load_optimizer_state(adam, names, state, true, "opt"); }),
              HasSubstr("[checkpoint] opt: tensor 'weight.exp_avg' has dtype Double but parameter 'weight' has dtype Float"));
  EXPECT_EQ(adam.state().size(), before);
  // An extra tensor matching no parameter's state is an error, not dropped.
  state = optimizer_state(adam, names);
  state.tensors.emplace_back("weight.stray", at::zeros({2, 3}));
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { load_optimizer_state(adam, names, state, false, "opt"); }),
              HasSubstr("'weight.stray' (orphaned optimizer state)"));
}

TEST_F(HostileCheckpointTest, AllZeroRngBytesAreACheckpointError) {
  const int64_t size = cpu_rng_state().numel();
  const at::Tensor before = cpu_rng_state();
  EXPECT_THAT(strata::testing::error_message<CheckpointError>(
                  [&] { set_cpu_rng_state(at::zeros({size}, at::kByte), "ckpt entry 'rng'"); }),
              HasSubstr("[checkpoint] ckpt entry 'rng': not a valid CPU generator state"));
  EXPECT_TRUE(cpu_rng_state().equal(before));
}

TEST_F(HostileCheckpointTest, ShapesTooLargeToExist) {
  const std::string file = path("huge.safetensors");
  testing::write_bytes(file, testing::raw_safetensors(
                                 R"({"t":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", ""));
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { SafetensorsFile::open(file); }),
              HasSubstr("[checkpoint] " + file + ": tensor 't' has shape [0,18446744073709551615], too large to exist"));
  const std::string sharded = path("sharded");
  reshard_checkpoint(StateReader::open(ckpt_), sharded, 2);
  nlohmann::json meta = nlohmann::json::parse(testing::read_bytes(sharded + "/" + kMetadataFile));
  meta["tensors"]["model/w"]["shape"] = {0, uint64_t(1) << 63};
  testing::write_bytes(sharded + "/" + kMetadataFile, meta.dump());
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { StateReader::open(sharded); }),
              HasSubstr(": \"tensors\" entry 'model/w' has shape [0,9223372036854775808]; expected non-negative sizes"));
}

TEST_F(HostileCheckpointTest, TransposedShardRecord) {
  const std::string sharded = path("sharded");
  reshard_checkpoint(StateReader::open(ckpt_), sharded, 2);
  const std::string meta_path = sharded + "/" + kMetadataFile;
  nlohmann::json meta = nlohmann::json::parse(testing::read_bytes(meta_path));
  meta["tensors"]["optimizer/w.momentum_buffer"]["shape"] = {3, 2};
  testing::write_bytes(meta_path, meta.dump());
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { StateReader::open(sharded); }),
              HasSubstr("[checkpoint] " + sharded + ": tensor 'optimizer/w.momentum_buffer' has shape [3, 2] but its "
                        "parameter 'model/w' has shape [2, 3]"));
}

TEST_F(HostileCheckpointTest, AFlippedDataByteIsCaughtByItsChecksum) {
  const std::string file = ckpt_ + "/" + kFullStateFile;
  std::string bytes = testing::read_bytes(file);
  bytes[bytes.size() - 2] ^= 0x01;  // rng[3]: 'rng' is the last tensor, 5 bytes
  testing::write_bytes(file, bytes);
  EXPECT_THAT(open_error(), HasSubstr("[checkpoint] " + file + ": tensor 'rng': checksum mismatch: the file records xxh64 "));
  const StateReader reader = StateReader::open(ckpt_);
  EXPECT_NO_THROW(reader.full("model/w"));
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { reader.full("rng"); }),
              HasSubstr(file + ": tensor 'rng': checksum mismatch"));
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { reader.flat_slice("rng", 1, 2); }),
              HasSubstr(file + ": tensor 'rng': checksum mismatch"));
  // The check can be skipped.
  ReadOptions skip;
  skip.verify_checksums = false;
  EXPECT_EQ(StateReader::open(ckpt_, skip).full("rng")[3].item<uint8_t>(), uint8_t(3 ^ 0x01));
}

TEST_F(HostileCheckpointTest, FilesWithoutChecksumsStillLoad) {
  const std::string file = path("old.safetensors");
  testing::write_bytes(file, testing::raw_safetensors(
                                 R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"));
  const SafetensorsFile old = SafetensorsFile::open(file);
  EXPECT_FALSE(old.has_checksums());
  EXPECT_EQ(old.load("t")[1].item<uint8_t>(), 2);
  EXPECT_NO_THROW(old.verify("t"));
  // The checksums are XXH64 (the reference values of the specification).
  EXPECT_EQ(hex64(xxh64("", 0)), "ef46db3751d8e999");
  EXPECT_EQ(hex64(xxh64("abc", 3)), "44bc2cf5ad770999");
  EXPECT_EQ(hex64(xxh64("Nobody inspects the spammish repetition", 39)), "fbcea83c8a378bf1");
  // A tampered checksum list is refused.
  std::string bytes = testing::read_bytes(ckpt_ + "/" + kFullStateFile);
  const auto at = bytes.find("strata.xxh64\":\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 15] = 'Z';
  testing::write_bytes(ckpt_ + "/" + kFullStateFile, bytes);
  EXPECT_THAT(open_error(), HasSubstr(": __metadata__ 'strata.xxh64' holds 'Z', not a lowercase hex digit"));
}


std::string host() {
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

TEST_F(HostileCheckpointTest, LeftoverStagingFoldersAreRemovedByTheNextSave) {
  const std::string dir = path("run");
  fs::create_directories(dir);
  auto staging = [&](const std::string& name, long pid, bool owner) {
    const std::string p = dir + "/" + name;
    fs::create_directories(p);
    testing::write_bytes(p + "/model.safetensors", "partial");
    if (owner) testing::write_bytes(p + "/" + kStagingOwner, "host " + host() + "\npid " + std::to_string(pid) + "\n");
    return p;
  };
  const pid_t gone = dead_pid();
  const std::string killed = staging("step-1.tmp-" + std::to_string(gone) + "-0", gone, true);
  const std::string live = staging("step-2.tmp-1-0", 1, true);           // pid 1 runs
  const std::string unknown = staging("step-3.tmp-" + std::to_string(gone) + "-1", gone, false);  // no owner file
  const std::string elsewhere = dir + "/step-4.tmp-" + std::to_string(gone) + "-2";
  fs::create_directories(elsewhere);
  testing::write_bytes(elsewhere + "/" + kStagingOwner, "host another-host\npid " + std::to_string(gone) + "\n");

  write_checkpoint_dir(dir + "/step-5", {{"a.safetensors", {{"x", at::ones({2})}}}});
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(unknown));
  EXPECT_TRUE(fs::exists(elsewhere));
  EXPECT_TRUE(is_complete(dir + "/step-5"));
  EXPECT_FALSE(fs::exists(dir + "/step-5/" + kStagingOwner)) << "the owner file is not published";

  // A save killed mid-way leaves its staging folder with an owner file.
  const pid_t child = ::fork();
  if (child == 0) {
    CheckpointWriter writer = CheckpointWriter::begin(dir + "/step-6");
    writer.write_file("a.safetensors", {{"x", at::ones({2})}});
    ::kill(::getpid(), SIGKILL);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("step-6.tmp-", 0) == 0) left.push_back(e.path().string());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(remove_stale_staging(dir), left);
  EXPECT_FALSE(fs::exists(left[0]));
  EXPECT_TRUE(remove_stale_staging(dir).empty());
}

// ---- the Trainer state (trainer/trainer_state.h) ---------------------------------
// tests/trainer/hostile_state_test.cpp rewrites real Trainer checkpoints;
// these check the validator on the fuzz corpus's Trainer seed, which holds
// every field, so that the fuzzer starts from a state that passes.

nlohmann::json trainer_seed() {
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  EXPECT_NE(source, nullptr);
  return nlohmann::json::parse(
      testing::read_bytes(std::string(source ? source : ".") + "/fuzz/corpus/metadata/trainer.json"));
}

TEST_F(HostileCheckpointTest, TheFuzzCorpusTrainerSeedOpensAndHoldsAValidTrainerState) {
  const nlohmann::json meta = trainer_seed();
  // As metadata.json of the fixture's checkpoint (the same tensors the
  // metadata fuzz target writes beside it): the reader takes it.
  testing::write_bytes(meta_path_, meta.dump());
  const StateReader reader = StateReader::open(ckpt_);
  EXPECT_EQ(reader.verify_checksums(), 3u);
  EXPECT_NO_THROW(trainer::validate_trainer_entry(reader.entries(), "seed"));
  EXPECT_NO_THROW(trainer::validate_trainer_state(meta["entries"]["trainer"]["value"], "seed"));
}

TEST(HostileTrainerStateValidatorTest, EveryFieldTheTrainerWritesIsRequired) {
  const nlohmann::json value = trainer_seed()["entries"]["trainer"]["value"];
  const std::string mc = "ModelCheckpoint{monitor=val_loss, mode=min, every_n_train_steps=0, every_n_epochs=-1}";
  const std::string es = "EarlyStopping{monitor=val_loss, mode=min}";
  // JSON pointer of the field, and its name in messages.
  std::vector<std::pair<std::string, std::string>> fields = {
      {"/format", "format"}, {"/version", "version"}, {"/epoch", "epoch"}, {"/global_step", "global_step"},
      {"/loops", "loops"}, {"/loops/fit", "loops.fit"}, {"/loops/fit/batches_done", "loops.fit.batches_done"},
      {"/loops/fit/epoch_done", "loops.fit.epoch_done"}, {"/loops/fit/world_size", "loops.fit.world_size"},
      {"/lr_schedulers", "lr_schedulers"}, {"/lr_schedulers/0/type", "lr_schedulers[0].type"},
      {"/lr_schedulers/0/last_epoch", "lr_schedulers[0].last_epoch"},
      {"/lr_schedulers/0/base_lrs", "lr_schedulers[0].base_lrs"}, {"/callbacks", "callbacks"},
      {"/callbacks/Timer/time_elapsed", "callbacks[\"Timer\"].time_elapsed"},
      {"/module_extra", "module_extra"}, {"/hparams", "hparams"}};
  for (const char* f : {"monitor", "best_model_score", "best_model_path", "last_model_path", "best_k_models",
                        "dirpath", "last_saved_step"}) {
    fields.emplace_back("/callbacks/" + mc + "/" + f, "callbacks[\"" + mc + "\"]." + f);
  }
  for (const char* f : {"wait_count", "best_score", "stopped_step"}) {
    fields.emplace_back("/callbacks/" + es + "/" + f, "callbacks[\"" + es + "\"]." + f);
  }
  for (const char* f : {"on_step", "sync_dist", "prog_bar", "logger", "reduce", "total", "weight"}) {
    fields.emplace_back(std::string("/loops/fit/results/train_loss/") + f,
                        std::string("loops.fit.results[\"train_loss\"].") + f);
  }
  for (const auto& [pointer, name] : fields) {
    SCOPED_TRACE(pointer);
    nlohmann::json removed = value;
    const nlohmann::json::json_pointer at(pointer);
    removed[at.parent_pointer()].erase(at.back());
    EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { trainer::validate_trainer_state(removed, "seed"); }),
                ::testing::StartsWith("[trainer] seed: trainer state " + name + " is missing; expected "));
    // Renamed: an unknown field, named with the object it is in.
    nlohmann::json renamed = value;
    renamed[at.parent_pointer()][at.back() + "_"] = renamed[at];
    renamed[at.parent_pointer()].erase(at.back());
    EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { trainer::validate_trainer_state(renamed, "seed"); }),
                HasSubstr("has an unknown field \"" + at.back() + "_\"; expected only the fields "));
  }
  // The epoch's logged values are optional (checkpoints from before they existed).
  nlohmann::json old = value;
  old["loops"]["fit"].erase("results");
  EXPECT_NO_THROW(trainer::validate_trainer_state(old, "seed"));
}

TEST(HostileTrainerStateValidatorTest, PathsAreDirectChildrenLexically) {
  using trainer::is_direct_child;
  EXPECT_TRUE(is_direct_child("ckpt/a.ckpt", "ckpt"));
  EXPECT_TRUE(is_direct_child("ckpt/./a.ckpt", "ckpt/"));
  EXPECT_TRUE(is_direct_child("/abs/ckpt/a", "/abs//ckpt"));
  EXPECT_TRUE(is_direct_child("a", "."));
  EXPECT_FALSE(is_direct_child("ckpt/../victim", "."));
  EXPECT_FALSE(is_direct_child("ckpt/x/../a", "ckpt"));
  EXPECT_FALSE(is_direct_child("ckpt", "ckpt"));
  EXPECT_FALSE(is_direct_child("ckpt/.", "ckpt"));
  EXPECT_FALSE(is_direct_child("ckpt/sub/a", "ckpt"));
  EXPECT_FALSE(is_direct_child("/ckpt/a", "ckpt"));
  EXPECT_FALSE(is_direct_child("", "ckpt"));
  EXPECT_FALSE(is_direct_child("/", "/"));
}

}  // namespace
}  // namespace strata::checkpoint
