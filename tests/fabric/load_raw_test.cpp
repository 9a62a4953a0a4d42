// Fabric::load_raw (a plain state dict, an exported folder, a strata
// checkpoint's optimizer entry) under DDP and FSDP at 2 ranks, and FSDP's
// full views: summon_full_params (values, gradients, write-back) and the
// full optimizer state on rank 0, each against one process training the
// whole model.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

#include "strata/checkpoint/safetensors.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "support/checks.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

namespace fs = std::filesystem;
using strata::Fabric;
using strata::FabricOptions;
using strata::strategies::FSDPOptions;
using strata::strategies::FSDPStrategy;
using strata::strategies::ModuleTypes;
using strata::testing::Checks;
using strata::testing::contains;
using strata::testing::error_message;

torch::nn::Sequential make_model(uint64_t seed) {
  at::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
}

std::map<std::string, at::Tensor> plain_values(torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

std::shared_ptr<strata::strategies::Strategy> strategy_named(const std::string& name) {
  std::shared_ptr<strata::strategies::Strategy> s;
  if (name == "fsdp") {
    s = std::make_shared<FSDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt,
                                       FSDPOptions().with_auto_wrap_policy(ModuleTypes{"Linear"}));
  } else {
    s = std::make_shared<strata::strategies::DDPStrategy>();
  }
  s->set_collective_timeout(std::chrono::seconds(60));
  return s;
}

// The module's parameters as whole tensors on every rank.
std::map<std::string, at::Tensor> full_values(Fabric& f, torch::nn::Module& module) {
  auto* fsdp = dynamic_cast<FSDPStrategy*>(&f.strategy());
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_parameters()) {
    out[item.key()] = fsdp ? fsdp->full_parameter(module, item.key()) : item.value().detach().clone();
  }
  return out;
}

bool same(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b, double tol = 0) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || !at::allclose(t, it->second, tol, tol)) return false;
  }
  return true;
}

// args: strategy, scratch folder.
STRATA_WORKER(load_raw) {
  const std::string strategy = args.at(0);
  const fs::path dir = args.at(1);
  Checks c;
  Fabric fabric(FabricOptions().with_strategy(strategy_named(strategy)));
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    // A plain state dict (what safetensors.torch.save_file writes), and a
    // folder as `strata ckpt export` writes it.
    torch::nn::Sequential source = make_model(1);
    std::map<std::string, at::Tensor> expected = plain_values(*source);
    if (f.is_global_zero()) {
      strata::checkpoint::NamedTensors tensors;
      for (const auto& [name, t] : expected) tensors.emplace_back(name, t);
      strata::checkpoint::write_safetensors((dir / "plain.safetensors").string(), tensors, {{"format", "pt"}});
      fs::create_directories(dir / "export");
      strata::checkpoint::write_safetensors((dir / "export" / "model.safetensors").string(), tensors,
                                            {{"format", "pt"}});
      std::ofstream(dir / "export" / "config.json") << "{}";
      tensors.pop_back();
      strata::checkpoint::write_safetensors((dir / "partial.safetensors").string(), tensors, {{"format", "pt"}});
    }
    f.barrier("files written");

    torch::nn::Sequential model = make_model(2);
    f.setup_module(model);
    f.load_raw((dir / "plain.safetensors").string(), model);
    c.expect(same(full_values(f, *model), expected), "the plain file's values on the module set up");

    torch::nn::Sequential other = make_model(3);  // not set up: loaded whole
    f.load_raw((dir / "export").string(), other);
    c.expect(same(plain_values(*other), expected), "the exported folder's values on a module not set up");

    std::string what = error_message<strata::CheckpointError>(
        [&] { f.load_raw((dir / "partial.safetensors").string(), model); });
    c.expect(contains(what, "2.weight"), "strict names the missing key: " + what);
    f.load_raw((dir / "partial.safetensors").string(), model, /*strict=*/false);

    // The optimizer's state from a strata checkpoint, into a fresh optimizer
    // of a fresh module.
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
    f.setup_optimizer(adam);
    at::Tensor x = at::randn({4, 4}, at::detail::createCPUGenerator(5));
    f.backward(model->forward(x).pow(2).mean());
    adam.step();
    f.save((dir / "ckpt").string(), {{"model", model}, {"optimizer", adam}});

    torch::nn::Sequential restored = make_model(4);
    f.setup_module(restored);
    torch::optim::Adam restored_adam(restored->parameters(), torch::optim::AdamOptions(0.5));
    f.setup_optimizer(restored_adam);
    f.load_raw((dir / "ckpt").string(), restored);
    f.load_raw((dir / "ckpt").string(), restored_adam);
    c.expect(same(full_values(f, *restored), full_values(f, *model)), "the module entry of a strata checkpoint");
    auto* fsdp = dynamic_cast<FSDPStrategy*>(&f.strategy());
    if (fsdp) {
      auto a = fsdp->full_optimizer_state(adam), b = fsdp->full_optimizer_state(restored_adam);
      c.expect(a.json == b.json, "optimizer JSON restored");
      c.expect(a.tensors.size() == b.tensors.size(), "optimizer tensors restored");
      for (size_t i = 0; i < a.tensors.size() && i < b.tensors.size(); ++i) {
        c.expect(a.tensors[i].first == b.tensors[i].first && at::equal(a.tensors[i].second, b.tensors[i].second),
                 "optimizer tensor " + a.tensors[i].first);
      }
    } else {
      auto names_a = strata::checkpoint::param_names(*model), names_b = strata::checkpoint::param_names(*restored);
      auto a = strata::checkpoint::optimizer_state(adam, names_a);
      auto b = strata::checkpoint::optimizer_state(restored_adam, names_b);
      c.expect(a.json == b.json, "optimizer JSON restored");
      for (size_t i = 0; i < a.tensors.size() && i < b.tensors.size(); ++i) {
        c.expect(at::equal(a.tensors[i].second, b.tensors[i].second), "optimizer tensor " + a.tensors[i].first);
      }
    }
  });
  return c.result();
}

class LoadRawTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata-load-raw-" + GetParam() + "-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(LoadRawTest, PlainFilesExportsAndOptimizerEntriesLoadIntoModulesAndOptimizers) {
  auto run = strata::testing::run_workers(2, "load_raw", {GetParam(), dir_.string()});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

INSTANTIATE_TEST_SUITE_P(Strategies, LoadRawTest, ::testing::Values("ddp", "fsdp"));

// ---- FSDP's full views, against one process ---------------------------------------

// One process: the gradients of the whole batch and Adam's state after one step.
struct Reference {
  std::map<std::string, at::Tensor> grads;
  std::map<std::string, at::Tensor> exp_avg_sq;
};

Reference one_process(const at::Tensor& x) {
  torch::nn::Sequential model = make_model(7);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
  model->forward(x).pow(2).mean().backward();
  Reference r;
  for (const auto& item : model->named_parameters()) r.grads[item.key()] = item.value().grad().clone();
  adam.step();
  auto state = strata::checkpoint::optimizer_state(adam, strata::checkpoint::param_names(*model));
  for (const auto& [name, t] : state.tensors) {
    if (name.ends_with(".exp_avg_sq")) r.exp_avg_sq[name.substr(0, name.size() - 11)] = t.clone();
  }
  return r;
}

STRATA_WORKER(fsdp_full_views) {
  at::Tensor x = at::randn({8, 4}, at::detail::createCPUGenerator(9));
  Reference reference = one_process(x);
  auto strategy = std::dynamic_pointer_cast<FSDPStrategy>(strategy_named("fsdp"));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    torch::nn::Sequential model = make_model(7);
    f.setup_module(model);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
    f.setup_optimizer(adam);
    f.backward(model->forward(x.chunk(2)[f.global_rank()]).pow(2).mean());
    {
      auto full = strategy->summon_full_params(*model, /*writeback=*/true, /*with_grads=*/true);
      for (const auto& item : model->named_parameters()) {
        const at::Tensor& expected = reference.grads.at(item.key());
        c.expect(item.value().sizes() == expected.sizes(), item.key() + " is whole inside the scope");
        c.expect(item.value().grad().defined() && at::allclose(item.value().grad(), expected, 1e-6, 1e-6),
                 item.key() + ": the full gradient");
      }
      c.expect(model[0]->as<torch::nn::Linear>()->weight.sizes() == at::IntArrayRef({8, 4}),
               "the typed member is whole too");
    }
    adam.step();
    auto state = strategy->full_optimizer_state(adam);
    size_t compared = 0;
    for (const auto& [name, t] : state.tensors) {
      if (!name.ends_with(".exp_avg_sq")) continue;
      const at::Tensor& expected = reference.exp_avg_sq.at(name.substr(0, name.size() - 11));
      c.expect(at::allclose(t, expected, 1e-6, 1e-9), name + ": the full optimizer state");
      ++compared;
    }
    c.expect(f.global_rank() == 0 ? compared == 4 : state.tensors.empty(), "the state is on rank 0 only");

    // Written back: doubling inside the scope doubles the shards.
    at::Tensor before = strategy->full_parameter(*model, "2.weight");
    {
      auto full = strategy->summon_full_params(*model);
      torch::NoGradGuard no_grad;
      model[2]->as<torch::nn::Linear>()->weight.mul_(2);
    }
    c.expect(at::allclose(strategy->full_parameter(*model, "2.weight"), before * 2), "written back to the shards");
    c.expect(model->named_parameters()["2.weight"].dim() == 1, "the shards are back in the module");
  });
  return c.result();
}

TEST(FSDPFullViewsTest, SummonedParametersAndGradientsAndTheFullOptimizerStateEqualOneProcess) {
  auto run = strata::testing::run_workers(2, "fsdp_full_views");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

}  // namespace
