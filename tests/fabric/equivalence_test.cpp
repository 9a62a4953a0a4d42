// DDP and FSDP through Fabric match single-process training step for step:
// the same GPT, data and global batch trained on 2 and 3 worker processes
// (over Gloo on loopback) and in this process alone; FSDP with and without
// activation checkpointing, gradient accumulation and clipping.
#include <gtest/gtest.h>

#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "strata/checkpoint/safetensors.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/data/dataset.h"
#include "strata/data/loader.h"
#include "strata/fabric/fabric.h"
#include "strata/models/gpt.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;

// What one training run produced.
struct RunResult {
  std::vector<double> losses;
  strata::checkpoint::NamedTensors params;
};

struct RunConfig {
  int64_t steps = 20;
  int64_t batch = 12;  // global
  int64_t grad_accum = 1;
  double clip_norm = 0.0;
  double clip_value = 0.0;
};

RunConfig parse(const std::vector<std::string>& args) {
  RunConfig c;
  c.steps = std::stoll(args.at(1));
  c.batch = std::stoll(args.at(2));
  c.grad_accum = std::stoll(args.at(3));
  c.clip_norm = std::stod(args.at(4));
  c.clip_value = std::stod(args.at(5));
  return c;
}

std::vector<std::string> to_args(const std::string& out, const RunConfig& c, const std::string& strategy) {
  return {out, std::to_string(c.steps), std::to_string(c.batch), std::to_string(c.grad_accum),
          std::to_string(c.clip_norm), std::to_string(c.clip_value), strategy};
}

// Random byte "text": 96 windows of 16 tokens, the same in every process.
std::shared_ptr<strata::data::TensorDataset> make_dataset() {
  at::Generator gen = at::detail::createCPUGenerator(7);
  at::Tensor tokens = at::randint(0, 256, {96, 17}, gen, at::kLong);
  return std::make_shared<strata::data::TensorDataset>(tokens.narrow(1, 0, 16).contiguous(),
                                                       tokens.narrow(1, 1, 16).contiguous());
}

RunResult train(Fabric& fabric, const RunConfig& c) {
  Fabric::seed_everything(1234);
  strata::models::GPT model(strata::models::GPTConfig::preset("tiny").with_block_size(16));
  fabric.setup_module(model);
  // Note: SGD with momentum, not Adam: Adam divides by sqrt(v), which turns
  // the rounding noise of a gradient that is mathematically zero (the key
  // bias of attention) into full-size steps of random sign, in any two runs
  // that sum in a different order, distributed or not.
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(0.5).momentum(0.9).weight_decay(1e-4));
  fabric.setup_optimizer(optimizer);
  auto dataset = make_dataset();
  int world = fabric.world_size();
  strata::data::DistributedSampler sampler(dataset->size(), world, fabric.global_rank(), true, 99);
  auto loader = std::make_shared<strata::data::DataLoader>(dataset, sampler, c.batch / (world * c.grad_accum), true);
  auto batches = fabric.setup_dataloader(loader);
  batches->reset();
  RunResult result;
  for (int64_t step = 0; step < c.steps; ++step) {
    at::Tensor step_loss = at::zeros({});
    for (int64_t micro = 0; micro < c.grad_accum; ++micro) {
      std::optional<strata::data::Batch> batch = batches->next();
      if (!batch) {
        batches->reset();
        batch = batches->next();
      }
      auto no_sync = fabric.no_backward_sync(*model, micro + 1 < c.grad_accum);
      at::Tensor loss = model->loss(batch->input, batch->target) / static_cast<double>(c.grad_accum);
      fabric.backward(loss);
      step_loss += loss.detach();
    }
    if (c.clip_norm > 0) fabric.clip_gradients(*model, optimizer, c.clip_norm);
    if (c.clip_value > 0) fabric.clip_gradients(*model, optimizer, std::nullopt, c.clip_value);
    optimizer.step();
    optimizer.zero_grad();
    result.losses.push_back(fabric.all_reduce(step_loss).item<double>());
  }
  auto* fsdp = dynamic_cast<strata::strategies::FSDPStrategy*>(&fabric.strategy());
  for (auto& [name, tensor] : strata::checkpoint::module_state(*model)) {
    // FSDP's module holds this rank's shards: gather the full values.
    bool is_param = model->named_parameters().contains(name);
    result.params.emplace_back(name, fsdp && is_param ? fsdp->full_parameter(name) : tensor.detach().clone());
  }
  return result;
}

// "ddp", "fsdp" (each Block a unit), "fsdp-ac" (and each Block
// recomputed in backward), "fsdp-ac-nowrap" (one unit, Blocks recomputed),
// "fsdp-keep" (units stay gathered from forward to backward, no prefetch),
// "fsdp-overlap" (backward overlaps its collectives, as on a GPU; the CPU's
// default runs them in order, Note [Overlap in backward]).
std::shared_ptr<strata::strategies::Strategy> make_strategy(const std::string& spec) {
  using strata::strategies::FSDPOptions;
  using strata::strategies::ModuleTypes;
  if (spec == "ddp") return std::make_shared<strata::strategies::DDPStrategy>();
  FSDPOptions options;
  if (spec != "fsdp-ac-nowrap") options.with_auto_wrap_policy(ModuleTypes{"Block"});
  if (spec.rfind("fsdp-ac", 0) == 0) options.with_activation_checkpointing_policy({"Block"});
  if (spec == "fsdp-keep") options.with_reshard_after_forward(false).with_prefetch(false);
  if (spec == "fsdp-overlap") options.with_overlap_backward(true);
  return std::make_shared<strata::strategies::FSDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt,
                                                           options);
}

STRATA_WORKER(parallel_train) {
  RunConfig c = parse(args);
  Fabric fabric(FabricOptions().with_strategy(make_strategy(args.at(6))).with_collective_timeout(std::chrono::seconds(60)));
  RunResult r;
  fabric.launch([&](Fabric& f) { r = train(f, c); });
  if (fabric.is_global_zero()) {
    std::ofstream(args.at(0) + ".losses") << nlohmann::json(r.losses).dump();
    strata::checkpoint::write_safetensors(args.at(0) + ".params", r.params);
  }
  return 0;
}

class EquivalenceTest : public ::testing::TestWithParam<std::tuple<std::string, int, int64_t, double, double>> {};

TEST_P(EquivalenceTest, MatchesSingleProcessTrainingStepByStep) {
  auto [strategy, world, grad_accum, clip_norm, clip_value] = GetParam();
  RunConfig c;
  c.grad_accum = grad_accum;
  c.clip_norm = clip_norm;
  c.clip_value = clip_value;

  Fabric single(FabricOptions().with_strategy("single_device"));
  RunResult reference;
  single.launch([&](Fabric& f) { reference = train(f, c); });

  std::string out = (std::filesystem::temp_directory_path() /
                     ("strata-eq-" + std::to_string(::getpid()) + "-" + strategy + "-" + std::to_string(world)))
                        .string();
  auto run = strata::testing::run_workers(world, "parallel_train", to_args(out, c, strategy));
  ASSERT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;

  std::vector<double> losses = nlohmann::json::parse(std::ifstream(out + ".losses")).get<std::vector<double>>();
  ASSERT_EQ(losses.size(), reference.losses.size());
  // Tolerance: fp32 sums in another order (per-rank means, then the mean
  // of means) differ in the last bits; 20 AdamW steps keep that below 1e-4.
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], reference.losses[i], 1e-4) << "step " << i + 1;
  }
  EXPECT_GT(std::abs(reference.losses.back() - reference.losses.front()), 1e-3) << "the reference run did not train";
  auto file = strata::checkpoint::SafetensorsFile::open(out + ".params");
  for (const auto& [name, expected] : reference.params) {
    at::Tensor got = file.load(name);
    EXPECT_TRUE(at::allclose(got, expected, 1e-4, 1e-5))
        << name << " differs by " << (got - expected).abs().max().item<double>();
  }
  std::filesystem::remove(out + ".losses");
  std::filesystem::remove(out + ".params");
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, EquivalenceTest,
    ::testing::Values(std::make_tuple("ddp", 2, int64_t{1}, 0.0, 0.0),   // plain
                      std::make_tuple("ddp", 3, int64_t{1}, 0.0, 0.0),   // three ranks
                      std::make_tuple("ddp", 2, int64_t{2}, 0.0, 0.0),   // gradient accumulation
                      std::make_tuple("ddp", 3, int64_t{2}, 0.5, 0.0),   // accumulation + clip by norm
                      std::make_tuple("ddp", 2, int64_t{1}, 0.0, 0.01),  // clip by value
                      std::make_tuple("fsdp", 2, int64_t{1}, 0.0, 0.0),
                      std::make_tuple("fsdp", 3, int64_t{1}, 0.0, 0.0),
                      std::make_tuple("fsdp-ac", 2, int64_t{1}, 0.0, 0.0),
                      std::make_tuple("fsdp-ac-nowrap", 3, int64_t{1}, 0.0, 0.0),
                      std::make_tuple("fsdp", 2, int64_t{2}, 0.0, 0.0),
                      std::make_tuple("fsdp-keep", 2, int64_t{1}, 0.0, 0.0),
                      std::make_tuple("fsdp-overlap", 2, int64_t{1}, 0.0, 0.0),
                      std::make_tuple("fsdp-overlap", 3, int64_t{2}, 0.5, 0.0),
                      std::make_tuple("fsdp", 3, int64_t{2}, 0.5, 0.0),
                      std::make_tuple("fsdp-ac", 3, int64_t{1}, 0.0, 0.01)),
    [](const auto& info) {
      std::string name = std::get<0>(info.param);
      std::replace(name.begin(), name.end(), '-', '_');
      return name + "_world" + std::to_string(std::get<1>(info.param)) + "_accum" +
             std::to_string(std::get<2>(info.param)) + (std::get<3>(info.param) > 0 ? "_clipnorm" : "") +
             (std::get<4>(info.param) > 0 ? "_clipvalue" : "");
    });

}  // namespace
