// FSDP checkpoints across layouts, world sizes and strategies: resuming
// equals an uninterrupted run; a sharded save reloaded at another world
// size and saved again is bit-for-bit the same checkpoint; and the errors a
// user meets (a missing rank file, a truncated file, another model).
#include <gtest/gtest.h>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>

#include "strata/checkpoint/sharded.h"
#include "strata/fabric/fabric.h"
#include "strata/models/gpt.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "strata/strategies/xla.h"
#include "strata/xla_device/device.h"
#include "support/checks.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

namespace fs = std::filesystem;
using strata::Fabric;
using strata::FabricOptions;
using strata::checkpoint::StateReader;
using strata::models::GPT;
using strata::models::GPTConfig;
using strata::strategies::FSDPOptions;
using strata::strategies::FSDPStrategy;
using strata::strategies::ModuleTypes;
using strata::testing::Checks;
using strata::testing::contains;

// "ddp", "fsdp-sharded", "fsdp-full", "fsdp-sequential" (sharded, local
// ranks writing one after another); on 2 xla devices, ranks as threads of
// one process: "xla", "xla_fsdp" (sharded).
bool on_xla(const std::string& spec) { return spec.rfind("xla", 0) == 0; }

std::shared_ptr<strata::strategies::Strategy> make(const std::string& spec) {
  std::shared_ptr<strata::strategies::Strategy> s;
  if (spec == "ddp") {
    s = std::make_shared<strata::strategies::DDPStrategy>();
  } else if (spec == "xla") {
    s = std::make_shared<strata::strategies::XlaStrategy>(strata::strategies::make_accelerator("xla"));
  } else if (spec == "xla_fsdp") {
    s = std::make_shared<strata::strategies::XlaFSDPStrategy>(
        strata::strategies::make_accelerator("xla"), std::nullopt,
        FSDPOptions().with_auto_wrap_policy(ModuleTypes{"Block"}));
  } else {
    FSDPOptions options;
    options.with_auto_wrap_policy(ModuleTypes{"Block"})
        .with_state_dict_type(spec == "fsdp-full" ? "full" : "sharded")
        .with_sequential_save(spec == "fsdp-sequential");
    s = std::make_shared<FSDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt, options);
  }
  s->set_collective_timeout(std::chrono::seconds(60));
  return s;
}

GPTConfig config(const std::string& model) {
  GPTConfig c = GPTConfig::preset("tiny").with_block_size(16);
  if (model == "untied") c.tie_weights = false;
  if (model == "wide") c.with_n_embd(96).with_n_head(2);
  return c;
}

std::pair<at::Tensor, at::Tensor> batch(int rank, int world) {
  at::Generator gen = at::detail::createCPUGenerator(11);
  at::Tensor tokens = at::randint(0, 256, {6, 17}, gen, at::kLong).narrow(0, rank * (6 / world), 6 / world);
  return {tokens.narrow(1, 0, 16).contiguous(), tokens.narrow(1, 1, 16).contiguous()};
}

// args: spec, optimizer (sgd|adamw), load path or "-", steps, mid save path
// or "-", mid step, final save path or "-", losses path or "-".
STRATA_WORKER(ckpt_job) {
  const std::string spec = args.at(0), optim_name = args.at(1), load = args.at(2);
  const int steps = std::stoi(args.at(3)), mid = std::stoi(args.at(5));
  FabricOptions options = FabricOptions().with_strategy(make(spec));
  if (on_xla(spec)) options.with_accelerator("xla").with_devices(2);
  Fabric fabric(options);
  fabric.launch([&](Fabric& f) {
    Fabric::seed_everything(load == "-" ? 5 : 77);  // a loaded run starts from other values
    GPT model(config("tiny"));
    f.setup_module(model);
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (optim_name == "sgd") {
      optimizer = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
    } else {
      optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-2));
    }
    f.setup_optimizer(*optimizer);
    int step = 0;
    if (load != "-") {
      strata::strategies::State state{{"model", model}, {"optim", *optimizer}, {"step", 0}};
      f.load(load, state);
      step = state.at("step").get<int>();
    }
    auto [input, target] = batch(f.global_rank(), f.world_size());
    input = input.to(f.device());
    target = target.to(f.device());
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i) {
      at::Tensor loss = model->loss(input, target);
      f.backward(loss);
      optimizer->step();
      optimizer->zero_grad();
      losses.push_back(f.all_reduce(loss.detach()).item<double>());
      ++step;
      if (args.at(4) != "-" && i + 1 == mid) f.save(args.at(4), {{"model", model}, {"optim", *optimizer}, {"step", step}});
    }
    if (args.at(6) != "-") f.save(args.at(6), {{"model", model}, {"optim", *optimizer}, {"step", step}});
    if (args.at(7) != "-" && f.is_global_zero()) std::ofstream(args.at(7)) << nlohmann::json(losses).dump();
  });
  return 0;
}

class FSDPCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata-fsdp-ckpt-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  void job(int world, const std::string& spec, const std::string& optim, const std::string& load, int steps,
           const std::string& mid_save, int mid, const std::string& final_save, const std::string& losses) {
    auto run = strata::testing::run_workers(world, "ckpt_job",
                                            {spec, optim, load, std::to_string(steps), mid_save, std::to_string(mid),
                                             final_save, losses});
    ASSERT_TRUE(run.ok()) << spec << " at " << world << " ranks: " << run.launch.summary << "\n" << run.output;
  }

  std::vector<double> losses(const std::string& name) const {
    return nlohmann::json::parse(std::ifstream(path(name))).get<std::vector<double>>();
  }

  // Every tensor of `a` equals `b`'s (as whole tensors), within `tolerance`
  // (0: bit for bit), and both hold the same names.
  static void expect_same_tensors(const std::string& a, const std::string& b, double tolerance,
                                  const std::string& only_prefix = "") {
    StateReader x = StateReader::open(a), y = StateReader::open(b);
    size_t compared = 0;
    for (const std::string& name : x.tensor_names()) {
      if (name.rfind(only_prefix, 0) != 0) continue;
      ASSERT_TRUE(y.contains(name)) << b << " lacks " << name;
      at::Tensor u = x.full(name), v = y.full(name);
      ASSERT_EQ(u.sizes(), v.sizes()) << name;
      if (tolerance == 0) {
        EXPECT_TRUE(at::equal(u, v)) << name << " differs between " << a << " and " << b;
      } else {
        EXPECT_TRUE(at::allclose(u, v, tolerance, tolerance)) << name << " differs by " << (u - v).abs().max().item<double>();
      }
      ++compared;
    }
    EXPECT_GT(compared, 10u);
  }

  fs::path dir_;
};

// Resume equals an uninterrupted run, whatever layout, world size or
// strategy saved and loads: sharded at 2 -> FSDP at 3 and 1 and DDP at 2;
// full at 2 -> FSDP at 3 and DDP at 2; DDP at 2 -> FSDP at 2.
TEST_F(FSDPCheckpointTest, ResumeEqualsAnUninterruptedRunAcrossWorldSizesLayoutsAndStrategies) {
  job(2, "fsdp-sharded", "sgd", "-", 6, path("sharded2"), 3, path("reference-end"), path("reference.losses"));
  job(2, "fsdp-full", "sgd", "-", 3, "-", 0, path("full2"), "-");
  job(2, "ddp", "sgd", "-", 3, "-", 0, path("ddp2"), "-");
  std::vector<double> reference = losses("reference.losses");
  struct Resume {
    int world;
    std::string spec, from;
  };
  for (const Resume& r : {Resume{3, "fsdp-sharded", "sharded2"}, Resume{1, "fsdp-sharded", "sharded2"},
                          Resume{2, "ddp", "sharded2"}, Resume{3, "fsdp-full", "full2"}, Resume{2, "ddp", "full2"},
                          Resume{2, "fsdp-sharded", "ddp2"}}) {
    SCOPED_TRACE(r.from + " resumed by " + r.spec + " at " + std::to_string(r.world) + " ranks");
    std::string name = r.from + "-" + r.spec + std::to_string(r.world);
    job(r.world, r.spec, "sgd", path(r.from), 3, "-", 0, path(name), path(name + ".losses"));
    std::vector<double> resumed = losses(name + ".losses");
    ASSERT_EQ(resumed.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(resumed[i], reference[3 + i], 1e-4) << "step " << 4 + i;
    expect_same_tensors(path("reference-end"), path(name), 1e-4, "model/");
    EXPECT_EQ(StateReader::open(path(name)).entries()["step"]["value"], 6);
  }
  // The folders say what they are.
  EXPECT_TRUE(StateReader::open(path("sharded2")).sharded());
  EXPECT_TRUE(fs::exists(path("sharded2") + "/shard-00001-of-00002.safetensors"));
  EXPECT_FALSE(StateReader::open(path("full2")).sharded());
}

// The xla strategies write the CPU's checkpoints: xla_fsdp at 2 devices
// (sharded) resumes as fsdp at 3 CPU workers, whose checkpoint resumes as
// xla_fsdp at 2 again; xla at 2 resumes as ddp at 2. Each resumed run
// continues as the uninterrupted one did.
TEST_F(FSDPCheckpointTest, XlaCheckpointsResumeOnCpuWorkersAndBack) {
  try {
    strata::xla::find_plugin();
  } catch (const strata::ConfigError& e) {
    GTEST_SKIP() << e.what();
  }
  // One process drives both xla devices (its ranks are threads). SGD with
  // momentum, as above: Adam would turn the rounding noise of the key
  // bias's zero gradient into steps of random sign.
  auto xla_job = [&](const std::string& spec, const std::string& load, int steps, const std::string& mid_save,
                     int mid, const std::string& final_save, const std::string& losses_file) {
    job(1, spec, "sgd", load, steps, mid_save, mid, final_save, losses_file);
  };
  xla_job("xla_fsdp", "-", 6, path("xla_fsdp2"), 3, path("xla-reference-end"), path("xla-reference.losses"));
  const std::vector<double> reference = losses("xla-reference.losses");
  ASSERT_EQ(reference.size(), 6u);
  EXPECT_TRUE(StateReader::open(path("xla_fsdp2")).sharded());
  EXPECT_TRUE(fs::exists(path("xla_fsdp2") + "/shard-00001-of-00002.safetensors"));
  // fsdp at 3 CPU workers: steps 4 and 5, saving after step 4.
  job(3, "fsdp-sharded", "sgd", path("xla_fsdp2"), 2, path("fsdp3"), 1, "-", path("fsdp3.losses"));
  const std::vector<double> on_cpu = losses("fsdp3.losses");
  ASSERT_EQ(on_cpu.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(on_cpu[i], reference[3 + i], 1e-4) << "step " << 4 + i << " on the cpu";
  // Back on xla_fsdp at 2: steps 5 and 6.
  xla_job("xla_fsdp", path("fsdp3"), 2, "-", 0, path("back"), path("back.losses"));
  const std::vector<double> back = losses("back.losses");
  ASSERT_EQ(back.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(back[i], reference[4 + i], 1e-4) << "step " << 5 + i << " back on xla";
  expect_same_tensors(path("xla-reference-end"), path("back"), 1e-4, "model/");
  EXPECT_EQ(StateReader::open(path("back")).entries()["step"]["value"], 6);

  // xla at 2 -> ddp at 2.
  xla_job("xla", "-", 4, path("xla2"), 2, "-", path("xla.losses"));
  const std::vector<double> xla_reference = losses("xla.losses");
  job(2, "ddp", "sgd", path("xla2"), 2, "-", 0, "-", path("ddp2.losses"));
  const std::vector<double> ddp = losses("ddp2.losses");
  ASSERT_EQ(ddp.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(ddp[i], xla_reference[2 + i], 1e-4) << "step " << 3 + i << " as ddp";
  EXPECT_FALSE(StateReader::open(path("xla2")).sharded());
}

// Model and AdamW state survive resharding exactly: saved sharded at 2,
// loaded at 3 (FSDP, saving sequentially) / 1 (FSDP, full) / 2 (DDP) and
// saved again at once.
TEST_F(FSDPCheckpointTest, ReshardingOnLoadIsExactForModelAndOptimizerState) {
  job(2, "fsdp-sharded", "adamw", "-", 2, "-", 0, path("saved"), "-");
  job(3, "fsdp-sequential", "adamw", path("saved"), 0, "-", 0, path("at3"), "-");
  job(1, "fsdp-full", "adamw", path("saved"), 0, "-", 0, path("at1"), "-");
  job(2, "ddp", "adamw", path("saved"), 0, "-", 0, path("ddp"), "-");
  for (const char* copy : {"at3", "at1", "ddp"}) {
    SCOPED_TRACE(copy);
    expect_same_tensors(path("saved"), path(copy), 0);
    EXPECT_EQ(StateReader::open(path(copy)).entries()["optim"]["state"],
              StateReader::open(path("saved")).entries()["optim"]["state"]);
  }
  EXPECT_EQ(StateReader::open(path("at3")).world_size(), 3);
}

// A checkpoint saved to PATH.safetensors is one file: the model under its
// own names, the rest under "<key>/", the metadata inside. FSDP (full) and
// DDP write the same file, and FSDP at another world size resumes from it
// exactly.
TEST_F(FSDPCheckpointTest, OneFileCheckpointsHoldTheModelUnderItsOwnNamesAndLoadAnywhere) {
  job(2, "fsdp-full", "adamw", "-", 2, "-", 0, path("fsdp.safetensors"), "-");
  job(2, "ddp", "adamw", "-", 2, "-", 0, path("ddp.safetensors"), "-");
  const StateReader one = StateReader::open(path("fsdp.safetensors"));
  ASSERT_TRUE(fs::is_regular_file(path("fsdp.safetensors")));
  EXPECT_TRUE(one.single_file());
  EXPECT_TRUE(one.contains("wte.weight"));
  EXPECT_TRUE(one.contains("optim/wte.weight.exp_avg"));
  EXPECT_EQ(one.entries()["model"]["prefix"], "");
  EXPECT_EQ(one.entries()["step"]["value"], 2);
  expect_same_tensors(path("fsdp.safetensors"), path("ddp.safetensors"), 1e-4);

  job(3, "fsdp-sharded", "adamw", path("fsdp.safetensors"), 0, "-", 0, path("again"), "-");
  const StateReader again = StateReader::open(path("again"));
  ASSERT_TRUE(again.sharded());
  for (const std::string key : {"model", "optim"}) {
    ASSERT_EQ(one.names_under(key), again.names_under(key)) << key;
    for (const std::string& name : one.names_under(key))
      EXPECT_TRUE(at::equal(one.full(one.tensor_of(key, name)), again.full(key + "/" + name))) << key << " " << name;
  }
  EXPECT_EQ(again.entries()["optim"]["state"], one.entries()["optim"]["state"]);
}

// Loads `path` into a model variant; with an expected message the load must
// fail with it, without one it must succeed and restore wte.weight.
// args: model variant, path, strict (0|1), expected message or "".
STRATA_WORKER(ckpt_load_case) {
  const std::string variant = args.at(0), from = args.at(1), expected = args.at(3);
  const bool strict = args.at(2) == "1";
  Fabric fabric(FabricOptions().with_strategy(make("fsdp-sharded")));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    GPT model(config(variant));
    f.setup_module(model);
    strata::strategies::State state{{"model", model}};
    if (expected.empty()) {
      f.load(from, state, strict);
      at::Tensor saved = StateReader::open(from).full("model/wte.weight");
      c.expect(at::equal(dynamic_cast<FSDPStrategy&>(f.strategy()).full_parameter("wte.weight"), saved),
               "matching tensors are restored");
    } else {
      std::string what = strata::testing::error_message([&] { f.load(from, state, strict); });
      c.expect(contains(what, expected), "expected '" + expected + "' in: " + what);
    }
  });
  return c.result();
}

TEST_F(FSDPCheckpointTest, MissingAndDamagedFilesAndOtherModelsAreClearErrors) {
  job(2, "fsdp-sharded", "sgd", "-", 1, "-", 0, path("saved"), "-");
  fs::copy(path("saved"), path("missing"), fs::copy_options::recursive);
  fs::remove(path("missing") + "/shard-00001-of-00002.safetensors");
  fs::copy(path("saved"), path("truncated"), fs::copy_options::recursive);
  std::string file = path("truncated") + "/shard-00000-of-00002.safetensors";
  fs::resize_file(file, fs::file_size(file) / 2);
  struct Case {
    std::string variant, from;
    bool strict;
    std::string expected;
  };
  for (const Case& k : {Case{"tiny", "missing", true, "shard-00001-of-00002.safetensors is missing"},
                        Case{"tiny", "truncated", true, "shard-00000-of-00002.safetensors"},
                        Case{"wide", "saved", true, "in the checkpoint but [256, 96] in the model"},
                        Case{"wide", "saved", false, "in the checkpoint but [256, 96] in the model"},
                        Case{"untied", "saved", true, "missing lm_head.weight"},
                        Case{"untied", "saved", false, ""}}) {
    SCOPED_TRACE(k.variant + " from " + k.from + (k.strict ? " strict" : " non-strict"));
    auto run = strata::testing::run_workers(2, "ckpt_load_case", {k.variant, path(k.from), k.strict ? "1" : "0", k.expected});
    EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
  }
}

}  // namespace
