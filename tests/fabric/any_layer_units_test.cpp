// Any layer of an ordinary LibTorch model as an FSDP unit or recomputed in
// backward, without strata::hooked_forward in the model: a Sequential of
// LibTorch's own layers (the root included) trains on 2 ranks as it does
// in one process, under several wrap policies and with activation
// checkpointing; parameter names stay what they were; and a unit called
// through its typed forward is gathered on the first use of its parameters.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "strata/core/container_calls.h"
#include "strata/core/error.h"
#include "strata/core/module_hooks.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/fsdp.h"
#include "support/checks.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;
using strata::strategies::FSDPOptions;
using strata::strategies::FSDPStrategy;
using strata::strategies::ModuleTypes;
using strata::strategies::WrapPredicate;
using strata::testing::Checks;
using strata::testing::contains;
using strata::testing::error_message;

// Only LibTorch's built-in layers.
torch::nn::Sequential make_model() {
  at::manual_seed(21);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})),
                               torch::nn::ReLU(), torch::nn::Linear(16, 16), torch::nn::GELU(),
                               torch::nn::Linear(16, 1));
}

std::pair<at::Tensor, at::Tensor> data() {
  at::Generator gen = at::detail::createCPUGenerator(3);
  at::Tensor x = at::randn({8, 8}, gen);
  return {x, x.sum(1, true).sin()};
}

std::vector<std::string> names_of(torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters()) names.push_back(item.key());
  for (const auto& item : module.named_buffers()) names.push_back(item.key());
  return names;
}

struct Trained {
  std::vector<double> losses;
  std::vector<at::Tensor> params;
  at::Tensor evaluated;  // the trained model's output, without grad
};

// Trains `model` 5 steps on this rank's rows, calling it as `forward`
// does; the losses (mean over ranks), the final full parameters and an
// evaluation.
template <class Holder, class Forward>
Trained train_model(Holder model, Forward forward, Fabric* fabric, Checks* c) {
  std::vector<std::string> before = names_of(*model);
  FSDPStrategy* fsdp = nullptr;
  if (fabric) {
    fabric->setup_module(model);
    fsdp = dynamic_cast<FSDPStrategy*>(&fabric->strategy());
    c->expect(names_of(*model) == before, "parameter and buffer names unchanged by setup_module");
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.3).momentum(0.9));
  if (fabric) fabric->setup_optimizer(optimizer);
  auto [x, y] = data();
  int world = fabric ? fabric->world_size() : 1, rank = fabric ? fabric->global_rank() : 0;
  at::Tensor mine = x.chunk(world)[rank], target = y.chunk(world)[rank];
  Trained out;
  for (int step = 0; step < 5; ++step) {
    at::Tensor loss = (forward(model, mine) - target).pow(2).mean();
    if (fabric) {
      fabric->backward(loss);
      loss = fabric->all_reduce(loss.detach());
    } else {
      loss.backward();
    }
    optimizer.step();
    optimizer.zero_grad();
    out.losses.push_back(loss.item<double>());
  }
  {
    torch::NoGradGuard no_grad;
    out.evaluated = forward(model, x);
  }
  for (const auto& item : model->named_parameters()) {
    out.params.push_back(fsdp ? fsdp->full_parameter(item.key()) : item.value().detach().clone());
  }
  return out;
}

// The Sequential of LibTorch layers, called as users call it. `children`,
// when given, receives its children before setup_module (for a policy
// that names them).
Trained train(Fabric* fabric, Checks* c = nullptr, std::set<const torch::nn::Module*>* children = nullptr) {
  torch::nn::Sequential model = make_model();
  if (children) {
    for (const auto& child : model->children()) children->insert(child.get());
  }
  return train_model(model, [](torch::nn::Sequential& m, const at::Tensor& x) { return m->forward(x); }, fabric, c);
}

// A ModuleList of Sequentials, the root calling each through its typed
// forward: the Sequentials are routed, and the root opts in with
// strata::call at the one place it is called.
struct ListNetImpl : torch::nn::Module {
  ListNetImpl() : torch::nn::Module("ListNet") {
    blocks = register_module(
        "blocks", torch::nn::ModuleList(
                      torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU()),
                      torch::nn::Sequential(torch::nn::Linear(16, 16),
                                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})), torch::nn::GELU()),
                      torch::nn::Sequential(torch::nn::Linear(16, 1))));
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& block : *blocks) x = block->as<torch::nn::Sequential>()->forward(x);
    return x;
  }
  torch::nn::ModuleList blocks{nullptr};
};
TORCH_MODULE(ListNet);

Trained train_list(Fabric* fabric, Checks* c = nullptr) {
  at::manual_seed(21);
  ListNet model;
  return train_model(model, [](ListNet& m, const at::Tensor& x) { return strata::call(m, x); }, fabric, c);
}

// The policies under test, by name. `children`: the Sequential's children,
// filled by train() before setup_module.
FSDPOptions options_for(const std::string& policy, std::shared_ptr<std::set<const torch::nn::Module*>> children) {
  FSDPOptions options;
  if (policy == "linear") options.with_auto_wrap_policy(ModuleTypes{"Linear"});
  if (policy == "leaf") options.with_auto_wrap_policy(strata::strategies::wrap_every_leaf());
  if (policy == "children") {
    // Every child of the Sequential that holds parameters.
    options.with_auto_wrap_policy(WrapPredicate([children](const torch::nn::Module& m, bool recurse, int64_t numel) {
      return recurse || (children->count(&m) > 0 && numel > 0);
    }));
  }
  if (policy == "linear+checkpoint") {
    options.with_auto_wrap_policy(ModuleTypes{"Linear"}).with_activation_checkpointing_policy({"Linear"});
  }
  if (policy == "checkpoint") options.with_activation_checkpointing_policy({"LayerNorm", "torch::nn::LinearImpl"});
  if (policy == "list-sequential") options.with_auto_wrap_policy(ModuleTypes{"Sequential"});
  if (policy == "list-sequential+checkpoint") {
    options.with_auto_wrap_policy(ModuleTypes{"Sequential"}).with_activation_checkpointing_policy({"Sequential"});
  }
  return options;
}

// Units each policy makes.
std::vector<std::string> expected_units(const std::string& policy) {
  if (policy == "linear" || policy == "linear+checkpoint") return {"", "0", "3", "5"};
  if (policy == "leaf" || policy == "children") return {"", "0", "1", "3", "5"};
  if (policy.starts_with("list-")) return {"", "blocks.0", "blocks.1", "blocks.2"};
  return {""};
}

STRATA_WORKER(fsdp_builtin_layers) {
  const std::string policy = args.at(0);
  const bool list = policy.starts_with("list-");
  Trained reference = list ? train_list(nullptr) : train(nullptr);
  auto children = std::make_shared<std::set<const torch::nn::Module*>>();
  auto strategy = std::make_shared<FSDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt,
                                                 options_for(policy, children));
  strategy->set_collective_timeout(std::chrono::seconds(60));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    Trained got = list ? train_list(&f, &c) : train(&f, &c, children.get());
    std::vector<std::string> units;
    for (const auto& unit : strategy->units()) units.push_back(unit.name);
    std::sort(units.begin(), units.end());
    c.expect(units == expected_units(policy), "units: " + ::testing::PrintToString(units));
    for (size_t i = 0; i < got.losses.size(); ++i) {
      c.expect(std::abs(got.losses[i] - reference.losses[i]) < 1e-5,
               "step " + std::to_string(i) + ": loss " + std::to_string(got.losses[i]) + " vs " +
                   std::to_string(reference.losses[i]));
    }
    c.expect(got.params.size() == reference.params.size(), "the same parameters");
    for (size_t i = 0; i < got.params.size() && i < reference.params.size(); ++i) {
      c.expect(at::allclose(got.params[i], reference.params[i], 1e-5, 1e-5), "parameter " + std::to_string(i));
    }
    c.expect(at::allclose(got.evaluated, reference.evaluated, 1e-5, 1e-5), "evaluation after training");
  });
  return c.result();
}

void expect_equal_to_one_process(const std::string& policy) {
  auto run = strata::testing::run_workers(2, "fsdp_builtin_layers", {policy});
  EXPECT_TRUE(run.ok()) << policy << ": " << run.launch.summary << "\n" << run.output;
}

TEST(AnyLayerUnitsTest, LinearLayersOfASequentialAreUnitsAndTrainAsOneProcessDoes) {
  expect_equal_to_one_process("linear");
}

TEST(AnyLayerUnitsTest, EveryLeafIsAUnitAndTrainsAsOneProcessDoes) { expect_equal_to_one_process("leaf"); }

TEST(AnyLayerUnitsTest, TheSequentialsChildrenAreUnitsAndTrainAsOneProcessDoes) {
  expect_equal_to_one_process("children");
}

TEST(AnyLayerUnitsTest, RecomputedLinearUnitsTrainAsOneProcessDoes) {
  expect_equal_to_one_process("linear+checkpoint");
}

TEST(AnyLayerUnitsTest, RecomputedChildrenOfTheRootTrainAsOneProcessDoes) { expect_equal_to_one_process("checkpoint"); }

TEST(AnyLayerUnitsTest, SequentialsInAModuleListAreUnitsAndTrainAsOneProcessDoes) {
  expect_equal_to_one_process("list-sequential");
}

TEST(AnyLayerUnitsTest, RecomputedSequentialUnitsTrainAsOneProcessDoes) {
  expect_equal_to_one_process("list-sequential+checkpoint");
}

// ---- one process: routing and the typed-call error ---------------------------------

struct TypedNetImpl : torch::nn::Module {
  TypedNetImpl() : torch::nn::Module("TypedNet") {
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 1));
  }
  // The model's own forward is opted in; its layers are called directly.
  at::Tensor forward(const at::Tensor& x) {
    return strata::hooked_forward(*this, x, [this](const at::Tensor& in) { return fc2->forward(fc1->forward(in)); });
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TypedNet);

std::shared_ptr<FSDPStrategy> one_rank(FSDPOptions options) {
  return std::make_shared<FSDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt, std::move(options));
}

TEST(AnyLayerUnitsTest, AUnitCalledThroughItsTypedForwardIsGatheredOnFirstUse) {
  at::manual_seed(5);
  TypedNet model;
  at::Tensor x = at::randn({2, 4});
  at::Tensor expected = model->forward(x).detach();
  auto strategy = one_rank(FSDPOptions().with_auto_wrap_policy(ModuleTypes{"Linear"}));
  strategy->setup_module(model.ptr());
  at::Tensor got = model->forward(x);
  EXPECT_TRUE(at::allclose(got, expected)) << got << expected;
  // fc2 started after fc1, so fc1 was freed (Note [Free when the next unit
  // starts]); fc2 stays gathered for the backward.
  EXPECT_EQ(model->fc1->weight.storage().nbytes(), 0u);
  EXPECT_GT(model->fc2->weight.storage().nbytes(), 0u);
  strategy->backward(got.sum());
  EXPECT_TRUE(model->named_parameters()["fc1.weight"].grad().defined());
  EXPECT_EQ(model->fc2->weight.storage().nbytes(), 0u) << "sharded again after the step";
  strategy->teardown();
}

TEST(AnyLayerUnitsTest, StrataCallOptsATypedCallIn) {
  // The same model with its layers called through strata::call computes
  // what the plain model computes.
  struct OptedInImpl : TypedNetImpl {
    at::Tensor forward(const at::Tensor& x) {
      return strata::call(fc2, strata::call(fc1, x));
    }
  };
  at::manual_seed(5);
  auto plain = std::make_shared<OptedInImpl>();
  at::Tensor x = at::randn({3, 4});
  at::Tensor expected = plain->forward(x).detach();
  auto strategy = one_rank(FSDPOptions().with_auto_wrap_policy(ModuleTypes{"Linear"}));
  strategy->setup_module(plain);
  at::Tensor got = strata::call(plain, x);
  EXPECT_TRUE(at::allclose(got, expected)) << got << expected;
  strategy->backward(got.sum());
  strategy->teardown();
}

// Counts its calls and doubles every output, so a test sees where it ran.
struct Doubling : strata::ForwardHooks {
  int calls = 0;
  strata::TensorList run(torch::nn::Module&, const strata::TensorList& inputs, const strata::ForwardFn& body) override {
    ++calls;
    strata::TensorList out = body(inputs);
    for (at::Tensor& t : out) t = t * 2;
    return out;
  }
};

TEST(ContainerCallsTest, ASequentialRunsItsChildrenAndItselfThroughTheirHooksOnce) {
  torch::nn::Sequential seq(torch::nn::Linear(3, 3), torch::nn::ReLU(), torch::nn::Linear(3, 2));
  at::Tensor x = at::randn({4, 3});
  at::Tensor plain = seq->forward(x).detach();
  auto child = std::make_shared<Doubling>(), whole = std::make_shared<Doubling>();
  strata::set_forward_hooks(*seq[2], child);
  strata::set_forward_hooks(*seq, whole);
  std::vector<std::string> names = names_of(*seq);
  auto routes = strata::route_container_calls(*seq);
  EXPECT_EQ(routes->size(), 1u);
  EXPECT_EQ(names_of(*seq), names);
  EXPECT_NE(seq[2]->as<torch::nn::Linear>(), nullptr);  // seq[i] is still the child
  // The last child doubles, then the whole Sequential doubles: 4x.
  EXPECT_TRUE(at::allclose(seq->forward(x), plain * 4));
  EXPECT_EQ(child->calls, 1);
  EXPECT_EQ(whole->calls, 1);
  // Called through strata::call, the Sequential's hooks still run once.
  EXPECT_TRUE(at::allclose(strata::call(seq, x), plain * 4));
  EXPECT_EQ(whole->calls, 2);
  routes->restore();
  EXPECT_TRUE(at::allclose(seq->forward(x), plain));
  EXPECT_EQ(child->calls, 2);
  EXPECT_NO_THROW(seq->at<torch::nn::LinearImpl>(0));
}

TEST(AnyLayerUnitsTest, ARecomputedModuleCalledThroughItsTypedForwardIsNamedInAWarning) {
  // Not a unit, so the typed call works, but it is not recomputed: the
  // first backward says so.
  auto strategy = one_rank(FSDPOptions().with_activation_checkpointing_policy({"Linear"}));
  TypedNet model;
  strategy->setup_module(model.ptr());
  ::testing::internal::CaptureStderr();
  strategy->backward(model->forward(at::randn({2, 4})).sum());
  std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(warned, "the forward of 'fc1' (torch::nn::LinearImpl), 'fc2' (torch::nn::LinearImpl) was not "
                               "seen in the first step")) << warned;
  EXPECT_TRUE(contains(warned, "call it as strata::call(fc1, x) instead of fc1->forward(x)")) << warned;
  strategy->teardown();
}

TEST(AnyLayerUnitsTest, TeardownPutsTheSequentialsOwnEntriesBack) {
  torch::nn::Sequential model = make_model();
  auto strategy = one_rank(FSDPOptions().with_auto_wrap_policy(ModuleTypes{"Linear"}));
  strategy->setup_module(model.ptr());
  // Routed: LibTorch's typed getter refuses the routed entry.
  EXPECT_THROW(model->at<torch::nn::LinearImpl>(0), c10::Error);
  strategy->teardown();
  EXPECT_NO_THROW(model->at<torch::nn::LinearImpl>(0));
}

}  // namespace
