// FSDPStrategy's contract beyond step-by-step equivalence (equivalence_test):
// what sharding leaves on each rank, the set-up order and its errors,
// activation checkpointing, bf16-mixed, and building a model sharded.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <c10/core/CPUAllocator.h>

#include <cmath>
#include <cstdlib>
#include <optional>

#include "strata/core/error.h"
#include "strata/core/module_hooks.h"
#include "strata/fabric/fabric.h"
#include "strata/models/gpt.h"
#include "strata/runtime/process.h"
#include "strata/strategies/recompute.h"
#include "strata/strategies/fsdp.h"
#include "support/checks.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;
using strata::models::BlockImpl;
using strata::models::GPT;
using strata::models::GPTConfig;
using strata::strategies::FSDPOptions;
using strata::strategies::FSDPStrategy;
using strata::strategies::ModuleTypes;
using strata::testing::Checks;
using strata::testing::contains;
using strata::testing::error_message;

GPTConfig tiny() { return GPTConfig::preset("tiny").with_block_size(16); }

std::shared_ptr<FSDPStrategy> fsdp(FSDPOptions options = FSDPOptions().with_auto_wrap_policy(ModuleTypes{"Block"}),
                                   const std::string& precision = "32-true") {
  auto s = std::make_shared<FSDPStrategy>(strata::strategies::cpu_accelerator(),
                                          strata::strategies::Precision::parse(precision), options);
  s->set_collective_timeout(std::chrono::seconds(60));
  return s;
}

// A fixed batch of random tokens, the same in every process; rank r of
// `world` takes rows [r * B/world, (r+1) * B/world).
std::pair<at::Tensor, at::Tensor> batch(int rank = 0, int world = 1, int64_t rows = 6) {
  at::Generator gen = at::detail::createCPUGenerator(11);
  at::Tensor tokens = at::randint(0, 256, {rows, 17}, gen, at::kLong);
  int64_t per = rows / world;
  tokens = tokens.narrow(0, rank * per, per);
  return {tokens.narrow(1, 0, 16).contiguous(), tokens.narrow(1, 1, 16).contiguous()};
}

at::Tensor c_attn_weight(GPT& model, int block) {
  return model->blocks[block]->as<BlockImpl>()->attn->c_attn->weight;
}

// ---- one process ------------------------------------------------------------------

TEST(FSDPTest, StateDictTypeOtherThanFullOrShardedIsRejectedAtConstruction) {
  std::string what = error_message([] { fsdp(FSDPOptions().with_state_dict_type("consolidated")); });
  EXPECT_TRUE(contains(what, "state_dict_type must be 'full' or 'sharded', got 'consolidated'")) << what;
  EXPECT_EQ(fsdp()->state_dict_type(), "sharded");
  EXPECT_FALSE(fsdp()->sequential_save());
}

TEST(FSDPTest, SetupModuleAndOptimizersAlwaysRefusesAndSaysTheOrder) {
  GPT model(tiny());
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  std::string what = error_message([&] { fsdp()->setup_module_and_optimizers(model.ptr(), {&optimizer}); });
  EXPECT_TRUE(contains(what, "setup_module_and_optimizers is not supported") &&
              contains(what, "Call setup_module(model), build the optimizer from model->parameters(), then "
                             "setup_optimizer(optimizer)"))
      << what;
  std::string early = error_message([&] { fsdp()->setup_optimizer(optimizer); });
  EXPECT_TRUE(contains(early, "setup_optimizer before setup_module")) << early;
}

TEST(FSDPTest, LowPrecisionComputeNeedsAMixedPrecision) {
  std::string what = error_message([] { fsdp(FSDPOptions().with_compute_dtype(at::kBFloat16)); });
  EXPECT_TRUE(contains(what, "needs a mixed precision")) << what;
  EXPECT_NO_THROW(fsdp(FSDPOptions().with_compute_dtype(at::kBFloat16), "bf16-mixed"));
}

TEST(FSDPTest, EmptyInitBuildsOnTheMetaDeviceAndSetupMaterialisesZeroShards) {
  auto strategy = fsdp();
  std::optional<GPT> model;
  {
    auto scope = strategy->module_init_context(/*empty_init=*/true);
    model.emplace(tiny());
    at::Tensor outside_a_module = at::ones({3});
    EXPECT_TRUE(outside_a_module.is_meta()) << "every tensor made in the scope is on the meta device";
  }
  for (const auto& p : (*model)->named_parameters()) EXPECT_TRUE(p.value().is_meta()) << p.key();
  EXPECT_FALSE(at::ones({3}).is_meta()) << "and none after it";

  strategy->setup_module(model->ptr());
  for (const auto& p : (*model)->named_parameters()) {
    EXPECT_TRUE(p.value().device().is_cpu()) << p.key();
    EXPECT_EQ(p.value().abs().sum().item<double>(), 0.0) << p.key() << ": materialised as zeros, to be loaded";
  }
  // The zero model runs and trains: every logit is 0, every shard gets a
  // gradient, and the layers' own tensors (LinearImpl::weight) took part.
  at::Tensor x = at::randint(0, 256, {2, 8}, at::kLong);
  at::Tensor logits = (*model)->forward(x);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 8, 256}));
  EXPECT_EQ(logits.abs().sum().item<double>(), 0.0);
  strategy->backward((*model)->loss(x, x));
  for (const auto& p : (*model)->named_parameters()) EXPECT_TRUE(p.value().grad().defined()) << p.key();
  EXPECT_EQ((*model)->blocks[0]->as<BlockImpl>()->attn->c_attn->weight.storage().nbytes(), 0u)
      << "a unit's full tensors are empty again between steps";
}

TEST(FSDPTest, NameResolvesAndShardedContextNeedsTheProcessGroup) {
  auto strategy = strata::strategies::make_strategy("fsdp", strata::strategies::cpu_accelerator(),
                                                    strata::strategies::Precision::parse("32-true"), 2);
  EXPECT_EQ(strategy->name(), "fsdp");
  std::string what = error_message([] { fsdp()->module_sharded_context(); });
  EXPECT_TRUE(contains(what, "module_sharded_context needs the process group")) << what;
}

TEST(FSDPTest, WrapPolicyPredicateChoosesUnitsBottomUp) {
  // Before launch the strategy runs as one rank, enough to see the units.
  auto by_size = [](const torch::nn::Module&, bool recurse, int64_t nonwrapped_numel) {
    return recurse || nonwrapped_numel >= 20000;  // descend everywhere; wrap big enough modules
  };
  auto strategy = fsdp(FSDPOptions().with_auto_wrap_policy(strata::strategies::WrapPredicate(by_size)));
  GPT model(tiny());
  const at::Tensor x = at::randint(0, 256, {1, 8}, at::kLong);
  const at::Tensor expected = model->forward(x).detach();
  strategy->setup_module(model.ptr());
  std::vector<std::string> names;
  for (const auto& unit : strategy->units()) names.push_back(unit.name);
  // c_attn (64*192+192 = 12480) and each c_proj are too small alone; the
  // MLP's c_fc (64*256+256 = 16640) too; an MLPBlock (33088) is not; what is
  // left of a Block (attention + norms, 16896) is small, but what is left
  // of the ModuleList holding both blocks (33792) is not:
  EXPECT_EQ(names, (std::vector<std::string>{"blocks.0.mlp", "blocks.1.mlp", "blocks", ""}))
      << ::testing::PrintToString(names);
  // A ModuleList has no forward, but its parameters (the blocks' norms,
  // here) are gathered on their first use (Note [Gather on first use]).
  EXPECT_TRUE(at::allclose(model->forward(x), expected, 1e-6, 1e-6));

  // recurse=false everywhere: nothing below the root is visited.
  auto none = [](const torch::nn::Module&, bool, int64_t) { return false; };
  auto flat = fsdp(FSDPOptions().with_auto_wrap_policy(strata::strategies::WrapPredicate(none)));
  GPT other(tiny());
  flat->setup_module(other.ptr());
  ASSERT_EQ(flat->units().size(), 1u);
  EXPECT_EQ(flat->units()[0].params.size(), other->named_parameters().size());
}

// Two submodules registering one tensor (tied weights), each its own unit.
struct HolderImpl : torch::nn::Module {
  explicit HolderImpl(at::Tensor shared) : torch::nn::Module("Holder") { w = register_parameter("w", shared); }
  at::Tensor forward(const at::Tensor& x) {
    return strata::hooked_forward(*this, x, [this](const at::Tensor& in) { return at::matmul(in, w); });
  }
  at::Tensor w;
};
TORCH_MODULE(Holder);

struct TiedImpl : torch::nn::Module {
  TiedImpl() : torch::nn::Module("Tied") {
    at::Tensor shared = at::randn({4, 4});
    h1 = register_module("h1", Holder(shared));
    h2 = register_module("h2", Holder(shared));
  }
  at::Tensor forward(const at::Tensor& x) {
    return strata::hooked_forward(*this, x, [this](const at::Tensor& in) { return h2->forward(h1->forward(in)); });
  }
  Holder h1{nullptr}, h2{nullptr};
};
TORCH_MODULE(Tied);

TEST(FSDPTest, TiedParameterIsShardedOnceInTheRootAndGetsBothGradients) {
  Tied model;
  at::Tensor w = model->h1->w.detach().clone().requires_grad_(true);
  at::Tensor x = at::randn({3, 4});
  at::matmul(at::matmul(x, w), w).sum().backward();  // the reference gradient: both uses
  auto strategy = fsdp(FSDPOptions().with_auto_wrap_policy(ModuleTypes{"Holder"}));
  strategy->setup_module(model.ptr());
  std::vector<strata::strategies::FSDPUnitInfo> units = strategy->units();
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[2].name, "");
  EXPECT_EQ(units[2].params, std::vector<std::string>{"h1.w"}) << "the tied tensor belongs to the root, once";
  EXPECT_TRUE(units[0].params.empty() && units[1].params.empty());
  EXPECT_TRUE(model->named_parameters()["h1.w"].is_same(model->named_parameters()["h2.w"]));
  strategy->backward(model->forward(x).sum());
  at::Tensor grad = model->named_parameters()["h1.w"].grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_TRUE(at::allclose(grad.view({4, 4}), w.grad(), 1e-5, 1e-6)) << grad << w.grad();
}

// A small computation with dropout, so the recomputation must replay the
// random numbers to give the same gradients.
struct Body {
  torch::nn::Linear a{8, 16}, b{16, 4};
  int calls = 0;
  at::Tensor operator()(const at::Tensor& x) {
    ++calls;
    return b->forward(at::dropout(at::gelu(a->forward(x)), 0.3, /*train=*/true));
  }
};

TEST(RecomputeTest, GradientsAreIdenticalAndTheBodyRunsAgainInBackward) {
  Body body;
  at::Tensor x = at::randn({5, 8}).requires_grad_(true);
  auto run = [&](bool recomputed) {
    x.mutable_grad() = at::Tensor();
    for (auto& p : body.a->parameters()) p.mutable_grad() = at::Tensor();
    for (auto& p : body.b->parameters()) p.mutable_grad() = at::Tensor();
    at::manual_seed(3);
    auto fn = [&](const at::Tensor& in) { return body(in); };
    at::Tensor y = recomputed ? strata::strategies::recomputed_forward(fn, x) : fn(x);
    y.pow(2).sum().backward();
    return std::vector<at::Tensor>{y.detach(), x.grad(), body.a->weight.grad(), body.b->bias.grad()};
  };
  std::vector<at::Tensor> plain = run(false);
  body.calls = 0;
  std::vector<at::Tensor> recomputed = run(true);
  EXPECT_EQ(body.calls, 2) << "forward once without the graph, once more in backward";
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], recomputed[i])) << "tensor " << i;
}

TEST(RecomputeTest, ParametersGetGradientsWhenTheInputNeedsNone) {
  Body body;
  at::Tensor x = at::randn({5, 8});
  at::Tensor y = strata::strategies::recomputed_forward([&](const at::Tensor& in) { return body(in); }, x);
  y.sum().backward();
  ASSERT_TRUE(body.a->weight.grad().defined());
  EXPECT_GT(body.a->weight.grad().abs().sum().item<double>(), 0.0);
  torch::NoGradGuard no_grad;
  body.calls = 0;
  strata::strategies::recomputed_forward([&](const at::Tensor& in) { return body(in); }, x);
  EXPECT_EQ(body.calls, 1) << "without grad mode there is nothing to recompute";
}

// ---- workers ------------------------------------------------------------------------

// Sharding, idle parameters between steps, the set-up order, evaluation.
STRATA_WORKER(fsdp_contract) {
  Fabric fabric(FabricOptions().with_strategy(fsdp()));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    auto& strategy = dynamic_cast<FSDPStrategy&>(f.strategy());
    int world = f.world_size();
    Fabric::seed_everything(5);
    GPT model(tiny());
    std::map<std::string, std::vector<int64_t>> full_shapes;
    for (const auto& item : model->named_parameters()) full_shapes[item.key()] = item.value().sizes().vec();
    torch::optim::SGD early(model->parameters(), 0.1);
    f.setup_module(model);

    std::string what = error_message([&] { f.setup_optimizer(early); });
    c.expect(contains(what, "create the optimizer after setup_module"), "an optimizer made too early is refused: " + what);
    for (const auto& item : model->named_parameters()) {
      int64_t numel = 1;
      for (int64_t d : full_shapes[item.key()]) numel *= d;
      c.expect(item.value().dim() == 1 && item.value().numel() == (numel + world - 1) / world,
               item.key() + " is a 1-D shard of ceil(numel / world) elements");
    }
    std::vector<std::string> unit_names;
    for (const auto& unit : strategy.units()) unit_names.push_back(unit.name);
    c.expect(unit_names == std::vector<std::string>{"blocks.0", "blocks.1", ""}, "units: each Block, then the root");
    c.expect(c_attn_weight(model, 0).storage().nbytes() == 0, "a unit's parameters are not gathered while idle");

    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
    f.setup_optimizer(optimizer);
    GPT stranger(tiny());
    what = error_message([&] { f.clip_gradients(*stranger, optimizer, 1.0); });
    c.expect(contains(what, "[fsdp] clip_gradients got a module that was not set up") &&
                 contains(what, "pass the module returned by setup_module"),
             "clipping a module FSDP did not set up is refused (its norm would be summed over ranks): " + what);
    what = error_message([&] { f.no_backward_sync(*stranger); });
    c.expect(contains(what, "[fsdp] no_backward_sync got a module that was not set up"),
             "no_backward_sync of another module is refused: " + what);
    c.expect(!strategy.overlaps_backward(*model),
             "on CPU workers backward runs its collectives in order by default (Note [Overlap in backward])");
    what = error_message([&] { strategy.overlaps_backward(*stranger); });
    c.expect(contains(what, "[fsdp] overlaps_backward: the module was not set up by this strategy"),
             "overlaps_backward of another module is refused: " + what);
    auto [input, target] = batch(f.global_rank(), world);
    std::vector<double> losses;
    for (int step = 0; step < 6; ++step) {
      f.strategy().group().reset_stats();
      at::Tensor loss = model->loss(input, target);
      if (step >= 1) {
        // Note [The last unit stays gathered]: from the second step on, the
        // block whose forward ran last keeps its values for the backward
        // that comes next; the first block's storage is freed.
        c.expect(c_attn_weight(model, 1).storage().nbytes() > 0 && c_attn_weight(model, 0).storage().nbytes() == 0,
                 "after forward the last block stays gathered and the first is freed");
      }
      f.backward(loss);
      if (step == 0 || step == 1) {
        // Forward gathers the root and both blocks; backward gathers again
        // the blocks that were freed: both in the first step, the first
        // block only afterwards. Each of the three units reduce-scatters once.
        strata::comm::CommStats stats = f.strategy().group().stats();
        const int64_t gathers = step == 0 ? 5 : 4;
        c.expect(stats.all_gather.calls == gathers && stats.reduce_scatter.calls == 3,
                 "step " + std::to_string(step) + ": " + std::to_string(gathers) +
                     " all-gathers and 3 reduce-scatters, got " + stats.summary());
      }
      optimizer.step();
      optimizer.zero_grad();
      losses.push_back(f.all_reduce(loss.detach()).item<double>());
      c.expect(c_attn_weight(model, 1).storage().nbytes() == 0 && model->wte->weight.storage().nbytes() == 0,
               "every unit, the root included, is idle after a step");
    }
    c.expect(losses.back() < losses.front() - 0.1, "the loss goes down");
    c.expect(strategy.full_parameter("wte.weight").sizes() == at::IntArrayRef({256, 64}), "full_parameter gathers");
    // Forward order was recorded: units are reported in it.
    c.expect(strategy.units().front().name.empty(), "after a step the root (first to run) is listed first");

    {
      torch::NoGradGuard no_grad;
      at::Tensor logits = model->forward(input);
      c.expect(logits.sizes() == at::IntArrayRef({input.size(0), 16, 256}), "evaluation forward works");
      c.expect(c_attn_weight(model, 0).storage().nbytes() == 0, "and leaves the units idle");
    }
    f.setup_module(model);  // already sharded: returned as it is
    c.expect(model->named_parameters()["wte.weight"].dim() == 1, "a second setup_module does not shard again");

    // A backward outside fabric.backward is caught at the next forward.
    model->loss(input, target).backward();
    what = error_message([&] { model->loss(input, target); });
    c.expect(contains(what, "instead of fabric.backward()"), "loss.backward() outside fabric is named: " + what);
  });
  return c.result();
}

TEST(FSDPTest, ShardsAreOneNthAndUnitsAreIdleBetweenSteps) {
  for (int world : {2, 3}) {
    auto run = strata::testing::run_workers(world, "fsdp_contract");
    EXPECT_TRUE(run.ok()) << "world " << world << ": " << run.launch.summary << "\n" << run.output;
  }
}

// bf16-mixed: bf16 gathers and compute, fp32 shards and optimizer state;
// the losses follow single-process fp32 training closely.
STRATA_WORKER(fsdp_bf16) {
  Checks c;
  std::vector<double> reference;
  {
    Fabric::seed_everything(5);
    GPT model(tiny());
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
    auto [input, target] = batch();
    for (int step = 0; step < 8; ++step) {
      at::Tensor loss = model->loss(input, target);
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      reference.push_back(loss.item<double>());
    }
  }
  Fabric fabric(FabricOptions().with_precision("bf16-mixed").with_strategy(
      fsdp(FSDPOptions().with_auto_wrap_policy(ModuleTypes{"Block"}), "bf16-mixed")));
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    Fabric::seed_everything(5);
    GPT model(tiny());
    f.setup_module(model);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
    f.setup_optimizer(optimizer);
    auto [input, target] = batch(f.global_rank(), f.world_size());
    at::ScalarType seen = at::kFloat;
    // Records the dtype the block computes with, from inside its forward.
    struct Probe : strata::ForwardHooks {
      std::shared_ptr<strata::ForwardHooks> inner;
      at::ScalarType* seen;
      strata::TensorList run(torch::nn::Module& m, const strata::TensorList& x,
                             const strata::ForwardFn& body) override {
        return inner->run(m, x, [&](const strata::TensorList& in) {
          *seen = m.as<BlockImpl>()->attn->c_attn->weight.scalar_type();
          return body(in);
        });
      }
    };
    auto probe = std::make_shared<Probe>();
    probe->inner = strata::forward_hooks(*model->blocks[0]);
    probe->seen = &seen;
    strata::set_forward_hooks(*model->blocks[0], probe);
    for (int step = 0; step < 8; ++step) {
      at::Tensor loss;
      {
        auto autocast = f.autocast();
        loss = model->loss(input, target);
      }
      f.backward(loss);
      optimizer.step();
      optimizer.zero_grad();
      double mean = f.all_reduce(loss.detach()).item<double>();
      c.expect(std::abs(mean - reference[step]) < 0.05,
               "step " + std::to_string(step) + ": bf16 loss " + std::to_string(mean) + " vs fp32 " +
                   std::to_string(reference[step]));
    }
    strata::set_forward_hooks(*model->blocks[0], probe->inner);
    c.expect(seen == at::kBFloat16, "units compute with bf16 parameters");
    for (const auto& p : model->parameters()) c.expect(p.scalar_type() == at::kFloat, "shards stay fp32");
  });
  return c.result();
}

TEST(FSDPTest, Bf16MixedComputesInBf16AndFollowsFp32Training) {
  auto run = strata::testing::run_workers(2, "fsdp_bf16");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

// module_sharded_context: each block is sharded as soon as it is built.
STRATA_WORKER(fsdp_sharded_context) {
  Fabric fabric(FabricOptions().with_strategy(fsdp()));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    auto& strategy = dynamic_cast<FSDPStrategy&>(f.strategy());
    Fabric::seed_everything(5);
    std::optional<GPT> built;
    {
      auto scope = strategy.module_sharded_context();
      built.emplace(tiny().with_n_layer(3));
    }
    GPT model = *built;
    c.expect(c_attn_weight(model, 0).storage().nbytes() == 0 && c_attn_weight(model, 2).storage().nbytes() == 0,
             "blocks hold no full parameters right after construction");
    c.expect(model->named_parameters()["blocks.1.mlp.c_fc.weight"].dim() == 1, "their parameters are shards");
    c.expect(model->wte->weight.numel() == 256 * 64, "the root's own parameters are built whole");
    f.setup_module(model);
    at::Tensor w = strategy.full_parameter("blocks.2.attn.c_attn.weight");
    double std = w.std().item<double>();
    c.expect(std > 0.015 && std < 0.025, "blocks got the GPT initialisation (std 0.02), got " + std::to_string(std));
    c.expect(strategy.full_parameter("blocks.2.attn.c_attn.bias").abs().max().item<double>() == 0.0, "zero biases");
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
    f.setup_optimizer(optimizer);
    auto [input, target] = batch(f.global_rank(), f.world_size());
    double first = 0, last = 0;
    for (int step = 0; step < 6; ++step) {
      at::Tensor loss = model->loss(input, target);
      f.backward(loss);
      optimizer.step();
      optimizer.zero_grad();
      (step == 0 ? first : last) = f.all_reduce(loss.detach()).item<double>();
    }
    c.expect(last < first - 0.1, "a model built sharded trains");
  });
  return c.result();
}

// Both scopes at once: the model is built on the meta device and each block
// sharded as it is built; setup_module materialises zero shards everywhere
// (the weights are to be loaded), and the model runs a training step.
STRATA_WORKER(fsdp_sharded_meta) {
  Fabric fabric(FabricOptions().with_strategy(fsdp()));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    auto& strategy = dynamic_cast<FSDPStrategy&>(f.strategy());
    std::optional<GPT> built;
    {
      auto empty = f.init_module(/*empty_init=*/true);
      auto sharded = strategy.module_sharded_context();
      built.emplace(tiny());
    }
    GPT model = *built;
    c.expect(model->wte->weight.is_meta(), "outside the blocks, tensors are on the meta device");
    c.expect(c_attn_weight(model, 0).storage().nbytes() == 0, "blocks hold no full parameters");
    c.expect(model->named_parameters()["blocks.1.mlp.c_fc.weight"].abs().sum().item<double>() == 0.0,
             "block shards are zeros");
    f.setup_module(model);
    bool all_zero_cpu = true;
    for (const auto& p : model->named_parameters()) {
      all_zero_cpu = all_zero_cpu && p.value().device().is_cpu() && p.value().abs().sum().item<double>() == 0.0;
    }
    c.expect(all_zero_cpu, "after setup_module every shard is a CPU tensor of zeros");
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5));
    f.setup_optimizer(optimizer);
    auto [input, target] = batch(f.global_rank(), f.world_size());
    at::Tensor loss = model->loss(input, target);
    f.backward(loss);
    optimizer.step();
    c.expect(std::abs(loss.item<double>() - std::log(256.0)) < 1e-5,
             "the zero model runs a training step (uniform logits: loss log 256), got " +
                 std::to_string(loss.item<double>()));
  });
  return c.result();
}

TEST(FSDPTest, EmptyInitAndShardedContextTogetherBuildOnMetaAndTrain) {
  auto run = strata::testing::run_workers(2, "fsdp_sharded_meta");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(FSDPTest, ShardedContextShardsEachBlockAsSoonAsItIsBuilt) {
  auto run = strata::testing::run_workers(2, "fsdp_sharded_context");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

// A model whose own forward does not run through hooked_forward, while its
// blocks are units: the root's parameters are gathered on their first use.
struct UnhookedImpl : torch::nn::Module {
  UnhookedImpl() {
    block = register_module("block", strata::models::Block(tiny()));
    head = register_module("head", torch::nn::Linear(64, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return head->forward(block->forward(x)); }
  strata::models::Block block{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Unhooked);

STRATA_WORKER(fsdp_unhooked_root) {
  Fabric fabric(FabricOptions().with_strategy(fsdp()));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    Fabric::seed_everything(3);
    Unhooked model;
    at::Tensor x = at::randn({2, 4, 64});
    at::Tensor expected = model->forward(x).detach();
    f.setup_module(model);
    c.expect(model->head->weight.storage().nbytes() == 0 && model->head->weight.sizes() == at::IntArrayRef({4, 64}),
             "the root's own parameters keep their shapes and hold no memory before the forward");
    at::Tensor got = model->forward(x);
    c.expect(at::allclose(got, expected, 1e-6, 1e-6), "the forward computes what the model did before set-up");
    f.backward(got.pow(2).mean());
    c.expect(model->named_parameters()["head.weight"].grad().defined(), "the root's shard got its gradient");
    c.expect(model->head->weight.storage().nbytes() == 0, "and the root is sharded again after the step");
  });
  return c.result();
}

TEST(FSDPTest, RootForwardWithoutHooksGathersTheRootOnFirstUse) {
  auto run = strata::testing::run_workers(2, "fsdp_unhooked_root");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

}  // namespace

// Note [FSDP's buffer cache]: units large enough for the cache (here 3 MB
// gathered) train as one process does whether the optimizer drops the
// gradients (set_to_none) or zeroes them in place (the shards' gradients
// share the reduce-scatter's buffer without being autograd views), and
// the cache reaches a steady size instead of growing step after step.
STRATA_WORKER(fsdp_buffer_cache) {
  Checks c;
  const GPTConfig config = GPTConfig().with_n_layer(2).with_n_head(4).with_n_embd(256).with_block_size(16);
  auto train = [&](GPT& model, torch::optim::Optimizer& optimizer, int step, auto&& backward) {
    auto [input, target] = batch();
    at::Tensor loss = model->loss(input, target);
    backward(loss);
    optimizer.step();
    optimizer.zero_grad(/*set_to_none=*/step % 2 == 0);
    return loss.item<double>();
  };
  std::vector<double> reference;
  {
    Fabric::seed_everything(5);
    GPT model(config);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    for (int step = 0; step < 6; ++step) {
      reference.push_back(train(model, optimizer, step, [](const at::Tensor& loss) { loss.backward(); }));
    }
  }
  Fabric fabric(FabricOptions().with_strategy(fsdp()));
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    Fabric::seed_everything(5);
    GPT model(config);
    f.setup_module(model);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    f.setup_optimizer(optimizer);
    std::vector<size_t> held;
    for (int step = 0; step < 6; ++step) {
      // Every rank trains on the whole batch: the mean over ranks is it.
      double loss = train(model, optimizer, step, [&](const at::Tensor& l) { f.backward(l); });
      c.expect(std::abs(loss - reference[step]) < 1e-5 * std::abs(reference[step]),
               "step " + std::to_string(step) + ": loss " + std::to_string(loss) + " vs one process " +
                   std::to_string(reference[step]));
      if (step % 2 == 1) {
        for (const at::Tensor& p : model->parameters()) {
          c.expect(p.grad().defined() && p.grad().abs().max().item<float>() == 0.0f,
                   "zero_grad(false) zeroes each shard's gradient in place");
        }
      }
      held.push_back(FSDPStrategy::buffer_bytes().held);
    }
    c.expect(FSDPStrategy::buffer_bytes().idle >= (size_t{1} << 20),
             "the units' buffers are kept between steps (" + std::to_string(FSDPStrategy::buffer_bytes().idle) +
                 " bytes idle)");
    // How many buffers are alive at once depends on when the communication
    // thread lets go of them, so the cache may take a block more in a later
    // step, but it must not grow with the steps.
    std::string sizes;
    for (size_t h : held) sizes += std::to_string(h) + " ";
    c.expect(held[5] <= held[1] + held[1] / 4, "the cache stops growing after the first steps; held: " + sizes);
    // Once zero_grad drops the shards' gradients, every block is idle, but
    // only two of the largest keep their pages; the rest wait in the cache
    // without counting in the resident set.
    optimizer.zero_grad(/*set_to_none=*/true);
    size_t largest = 0;
    for (const auto& unit : dynamic_cast<FSDPStrategy&>(f.strategy()).units()) {
      const size_t bytes = static_cast<size_t>(f.world_size() * unit.shard_numel) * sizeof(float);
      largest = std::max(largest, (bytes + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20));
    }
    const FSDPStrategy::BufferBytes idle = FSDPStrategy::buffer_bytes();
    c.expect(idle.idle <= 2 * largest && idle.held == idle.idle,
             "after zero_grad(set_to_none) at most two of the largest blocks (" + std::to_string(largest) +
                 " bytes) stay resident, all idle; idle " + std::to_string(idle.idle) + ", held " +
                 std::to_string(idle.held));
    // Where the shards' gradients live (Note [FSDP's buffer cache]): in the
    // tensor pool when it is installed (a unit's block of them of 1 MB or
    // more would come from the cache otherwise).
    const bool pooled = strata::runtime::tensor_pool_installed();
    c.expect(pooled == (std::getenv("STRATA_HEAP") == nullptr), "the tensor pool is installed by default only");
    if (pooled) {
      train(model, optimizer, /*step=*/1, [&](const at::Tensor& l) { f.backward(l); });
      const c10::DeleterFnPtr pool_deleter = c10::GetCPUAllocator()->raw_deleter();
      size_t over_cache_minimum = 0;
      for (const at::Tensor& p : model->parameters()) {
        c.expect(p.grad().storage().data_ptr().get_deleter() == pool_deleter,
                 "each shard's gradient comes from the tensor pool");
        if (p.grad().storage().nbytes() >= (size_t{1} << 20)) ++over_cache_minimum;
      }
      c.expect(over_cache_minimum > 0, "some units' gradient blocks are large enough for the cache");
    } else {
      c.expect(held[5] > 2 * largest, "with the gradients zeroed in place the cache held more than two blocks (" +
                                          std::to_string(held[5]) + " bytes), so the bound above means something");
    }
  });
  return c.result();
}

TEST(FSDPTest, BufferCacheKeepsTrainingExactAndStaysSteady) {
  ::setenv("STRATA_HEAP", "keep", 1);
  auto kept = strata::testing::run_workers(2, "fsdp_buffer_cache");
  ::unsetenv("STRATA_HEAP");
  EXPECT_TRUE(kept.ok()) << kept.launch.summary << "\n" << kept.output;
  auto pooled = strata::testing::run_workers(2, "fsdp_buffer_cache");
  EXPECT_TRUE(pooled.ok()) << pooled.launch.summary << "\n" << pooled.output;
}
