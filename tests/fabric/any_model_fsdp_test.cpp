// Models written as their authors would, with no strata call in them,
// under `fsdp` with a unit per block type: a ModuleList of blocks called
// `layers->ptr<Block>(i)->forward(x)`, a ModuleDict, nested units, a block
// used twice, an LSTM as a unit, each with an Embedding and a head at the
// root. At 2 workers each trains as one process does on the whole batch,
// and each rank holds 1/N of every unit. Then, in one process, what FSDP
// refuses and the errors of a parameter read when its values are gone.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/rnn.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "strata/core/error.h"
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
using strata::testing::Checks;
using strata::testing::contains;
using strata::testing::error_message;

constexpr int64_t kVocab = 16, kDim = 8, kBatch = 4, kTime = 5;

// ---- the models ----------------------------------------------------------------------

struct BlockImpl : torch::nn::Module {
  BlockImpl() : torch::nn::Module("Block") {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    fc = register_module("fc", torch::nn::Linear(kDim, kDim));
  }
  at::Tensor forward(const at::Tensor& x) { return x + torch::gelu(fc->forward(norm->forward(x))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Block);

// An Embedding and a head at the root, a body in between.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(std::string name) : torch::nn::Module(std::move(name)) {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kDim));
    head = register_module("head", torch::nn::Linear(kDim, 1));
  }
  virtual at::Tensor body(at::Tensor h) = 0;
  at::Tensor forward(const at::Tensor& tokens) { return head->forward(body(embed->forward(tokens))); }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear head{nullptr};
};

struct ListNet : NetImpl {
  ListNet() : NetImpl("ListNet") {
    layers = register_module("layers", torch::nn::ModuleList(Block(), Block(), Block()));
  }
  at::Tensor body(at::Tensor h) override {
    for (size_t i = 0; i < layers->size(); ++i) h = layers->ptr<BlockImpl>(i)->forward(h);
    return h;
  }
  torch::nn::ModuleList layers{nullptr};
};

struct DictNet : NetImpl {
  DictNet() : NetImpl("DictNet") {
    stages = register_module("stages", torch::nn::ModuleDict(torch::OrderedDict<std::string, std::shared_ptr<Module>>{
                                           {"encoder", Block().ptr()}, {"decoder", Block().ptr()}}));
  }
  at::Tensor body(at::Tensor h) override {
    h = stages["encoder"]->as<BlockImpl>()->forward(h);
    return stages["decoder"]->as<BlockImpl>()->forward(h);
  }
  torch::nn::ModuleDict stages{nullptr};
};

// A unit holding units, whose own parameters are used before and after
// its children.
struct StageImpl : torch::nn::Module {
  StageImpl() : torch::nn::Module("Stage") {
    mix = register_module("mix", torch::nn::Linear(kDim, kDim));
    first = register_module("first", Block());
    second = register_module("second", Block());
  }
  at::Tensor forward(const at::Tensor& x) { return mix->forward(second->forward(first->forward(mix->forward(x)))); }
  torch::nn::Linear mix{nullptr};
  Block first{nullptr}, second{nullptr};
};
TORCH_MODULE(Stage);

struct NestedNet : NetImpl {
  NestedNet() : NetImpl("NestedNet") {
    outer = register_module("outer", Stage());
    holder = register_module("holder", std::make_shared<torch::nn::Module>("Holder"));
    inner = holder->register_module("inner", Block());
  }
  at::Tensor body(at::Tensor h) override { return inner->forward(outer->forward(h)); }
  Stage outer{nullptr};
  std::shared_ptr<torch::nn::Module> holder;
  Block inner{nullptr};
};

// One block called twice in a forward, another once in between.
struct TwiceNet : NetImpl {
  TwiceNet() : NetImpl("TwiceNet") {
    shared = register_module("shared", Block());
    middle = register_module("middle", Block());
  }
  at::Tensor body(at::Tensor h) override { return shared->forward(middle->forward(shared->forward(h))); }
  Block shared{nullptr}, middle{nullptr};
};

struct LstmNet : NetImpl {
  LstmNet() : NetImpl("LstmNet") {
    lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(kDim, kDim).num_layers(2).batch_first(true)));
  }
  at::Tensor body(at::Tensor h) override { return std::get<0>(lstm->forward(h)); }
  torch::nn::LSTM lstm{nullptr};
};

std::shared_ptr<NetImpl> make_net(const std::string& kind) {
  at::manual_seed(11);
  if (kind == "list") return std::make_shared<ListNet>();
  if (kind == "dict") return std::make_shared<DictNet>();
  if (kind == "nested") return std::make_shared<NestedNet>();
  if (kind == "twice") return std::make_shared<TwiceNet>();
  return std::make_shared<LstmNet>();
}

FSDPOptions options_for(const std::string& kind, bool checkpointing) {
  FSDPOptions options;
  if (kind == "nested") {
    options.with_auto_wrap_policy(ModuleTypes{"Block", "Stage"});
  } else if (kind == "lstm") {
    options.with_auto_wrap_policy(ModuleTypes{"LSTM"});
  } else {
    options.with_auto_wrap_policy(ModuleTypes{"Block"});
  }
  if (checkpointing) options.with_activation_checkpointing_policy({"Block"});
  return options;
}

std::vector<std::string> expected_units(const std::string& kind) {
  if (kind == "list") return {"", "layers.0", "layers.1", "layers.2"};
  if (kind == "dict") return {"", "stages.decoder", "stages.encoder"};
  if (kind == "nested") return {"", "holder.inner", "outer", "outer.first", "outer.second"};
  if (kind == "twice") return {"", "middle", "shared"};
  return {"", "lstm"};
}

// ---- training ------------------------------------------------------------------------

struct Trained {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;  // full values after training
  at::Tensor evaluated;                      // on the whole batch, without grad
};

std::pair<at::Tensor, at::Tensor> data() {
  at::Generator gen = at::detail::createCPUGenerator(7);
  at::Tensor tokens = at::randint(0, kVocab, {kBatch, kTime}, gen, at::kLong);
  return {tokens, at::randn({kBatch, kTime, 1}, gen)};
}

// Trains 4 steps on this rank's rows (all of them without `fabric`).
Trained train(const std::string& kind, Fabric* fabric, bool checkpointing, Checks* c) {
  std::shared_ptr<NetImpl> model = make_net(kind);
  std::map<std::string, int64_t> full_numel;
  for (const auto& item : model->named_parameters()) full_numel[item.key()] = item.value().numel();
  FSDPStrategy* fsdp = nullptr;
  if (fabric) {
    fabric->setup_module(model);
    fsdp = dynamic_cast<FSDPStrategy*>(&fabric->strategy());
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.2).momentum(0.9));
  if (fabric) fabric->setup_optimizer(optimizer);
  auto [tokens, target] = data();
  const int world = fabric ? fabric->world_size() : 1, rank = fabric ? fabric->global_rank() : 0;
  at::Tensor mine = tokens.chunk(world)[rank], wanted = target.chunk(world)[rank];
  Trained out;
  for (int step = 0; step < 4; ++step) {
    at::Tensor loss = (model->forward(mine) - wanted).pow(2).mean();
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
    out.evaluated = model->forward(tokens);
  }
  for (const auto& item : model->named_parameters()) {
    out.params[item.key()] = fsdp ? fsdp->full_parameter(item.key()) : item.value().detach().clone();
  }
  if (fsdp) {
    std::vector<std::string> units;
    for (const auto& unit : fsdp->units()) {
      units.push_back(unit.name);
      // 1/N of each of the unit's parameters on this rank.
      for (const std::string& name : unit.params) {
        const int64_t held = model->named_parameters()[name].numel();
        c->expect(held == (full_numel[name] + world - 1) / world,
                  kind + ": " + name + " holds " + std::to_string(held) + " of " + std::to_string(full_numel[name]));
      }
    }
    std::sort(units.begin(), units.end());
    c->expect(units == expected_units(kind), kind + ": units " + ::testing::PrintToString(units));
  }
  return out;
}

STRATA_WORKER(fsdp_any_model) {
  const std::string kind = args.at(0);
  const bool checkpointing = args.size() > 1 && args.at(1) == "checkpoint";
  Trained reference = train(kind, nullptr, false, nullptr);
  auto strategy = std::make_shared<FSDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt,
                                                 options_for(kind, checkpointing));
  strategy->set_collective_timeout(std::chrono::seconds(60));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    Trained got = train(kind, &f, checkpointing, &c);
    for (size_t i = 0; i < got.losses.size(); ++i) {
      c.expect(std::abs(got.losses[i] - reference.losses[i]) < 1e-5,
               kind + " step " + std::to_string(i) + ": loss " + std::to_string(got.losses[i]) + " vs " +
                   std::to_string(reference.losses[i]));
    }
    c.expect(got.params.size() == reference.params.size(), kind + ": the same parameters");
    for (const auto& [name, value] : reference.params) {
      c.expect(got.params.count(name) && at::allclose(got.params[name], value, 1e-5, 1e-5), kind + ": " + name);
    }
    c.expect(at::allclose(got.evaluated, reference.evaluated, 1e-5, 1e-5), kind + ": evaluation after training");
  });
  return c.result();
}

void expect_equal_to_one_process(const std::string& kind, const std::string& extra = "") {
  std::vector<std::string> args{kind};
  if (!extra.empty()) args.push_back(extra);
  auto run = strata::testing::run_workers(2, "fsdp_any_model", args);
  EXPECT_TRUE(run.ok()) << kind << ": " << run.launch.summary << "\n" << run.output;
}

TEST(AnyModelFSDPTest, BlocksOfAModuleListCalledDirectlyTrainAsOneProcessDoes) { expect_equal_to_one_process("list"); }

TEST(AnyModelFSDPTest, BlocksOfAModuleDictTrainAsOneProcessDoes) { expect_equal_to_one_process("dict"); }

TEST(AnyModelFSDPTest, NestedUnitsAndAUnitInAPlainHolderTrainAsOneProcessDoes) {
  expect_equal_to_one_process("nested");
}

TEST(AnyModelFSDPTest, ABlockCalledTwiceInAForwardTrainsAsOneProcessDoes) { expect_equal_to_one_process("twice"); }

TEST(AnyModelFSDPTest, AnLstmUnitTrainsAsOneProcessDoes) { expect_equal_to_one_process("lstm"); }

// Activation checkpointing needs the block's forward seen whole (hooks):
// called directly, the blocks train unrecomputed, still equal to one process.
TEST(AnyModelFSDPTest, CheckpointedBlocksCalledDirectlyTrainAsOneProcessDoes) {
  expect_equal_to_one_process("list", "checkpoint");
}

// ---- one process: refusals and errors ---------------------------------------------------

std::shared_ptr<FSDPStrategy> one_rank(FSDPOptions options = FSDPOptions()) {
  return std::make_shared<FSDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt, std::move(options));
}

TEST(AnyModelFSDPTest, ACheckpointedBlockCalledDirectlyIsNamedByItsPathInAWarning) {
  auto strategy = one_rank(options_for("list", /*checkpointing=*/true));
  std::shared_ptr<NetImpl> model = make_net("list");
  strategy->setup_module(model);
  ::testing::internal::CaptureStderr();
  strategy->backward(model->forward(data().first).sum());
  std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(warned, "the forward of 'layers.0' (Block), 'layers.1' (Block), 'layers.2' (Block) was not seen "
                               "in the first step")) << warned;
  EXPECT_TRUE(contains(warned, "where the model calls 'layers.0', call it as strata::call(layers[0], x) instead of "
                               "layers[0]->forward(x)")) << warned;
  strategy->teardown();
}

TEST(AnyModelFSDPTest, ParametersSharingMemoryAreRefusedAtSetupByTheirPaths) {
  struct TiedViewImpl : torch::nn::Module {
    TiedViewImpl() : torch::nn::Module("TiedView") {
      a = register_module("a", torch::nn::Linear(4, 4));
      b = register_module("b", std::make_shared<torch::nn::Module>("Holder"));
      b->register_parameter("alias", a->weight.detach().view(-1));
    }
    torch::nn::Linear a{nullptr};
    std::shared_ptr<torch::nn::Module> b;
  };
  auto strategy = one_rank();
  std::string what = error_message<strata::ConfigError>([&] { strategy->setup_module(std::make_shared<TiedViewImpl>()); });
  EXPECT_TRUE(contains(what, "[fsdp] parameters 'a.weight' (of 'a', torch::nn::LinearImpl) and 'b.alias' (of 'b', "
                             "Holder) share memory")) << what;
  EXPECT_TRUE(contains(what, "Register the same tensor in both places")) << what;
}

TEST(AnyModelFSDPTest, AParameterShardedByAnotherModuleSetUpIsRefusedByItsPath) {
  torch::nn::Linear shared(4, 4);
  auto first = std::make_shared<torch::nn::Module>("First");
  first->register_module("proj", shared);
  auto second = std::make_shared<torch::nn::Module>("Second");
  auto holder = second->register_module("holder", std::make_shared<torch::nn::Module>("Holder"));
  holder->register_module("proj", shared);
  auto strategy = one_rank();
  strategy->setup_module(first);
  std::string what = error_message<strata::ConfigError>([&] { strategy->setup_module(second); });
  EXPECT_TRUE(contains(what, "[fsdp] parameter 'holder.proj.weight' (of 'holder.proj', torch::nn::LinearImpl) is "
                             "sharded already by another module set up with this strategy")) << what;
  strategy->teardown();
}

TEST(AnyModelFSDPTest, AViewKeptAfterItsValuesAreGoneIsAnError) {
  auto strategy = one_rank(options_for("list", false));
  std::shared_ptr<NetImpl> model = make_net("list");
  auto list = std::dynamic_pointer_cast<ListNet>(model);
  strategy->setup_module(model);
  at::Tensor kept = list->layers->ptr<BlockImpl>(0)->fc->weight.view(-1);  // gathers layers.0
  // layers.1's forward frees layers.0; nothing in the backward reads it.
  at::Tensor out = list->layers->ptr<BlockImpl>(1)->forward(at::randn({2, kDim}));
  strategy->backward(out.sum());
  std::string what = error_message<strata::ConfigError>([&] { kept.sum(); });
  EXPECT_TRUE(contains(what, "[fsdp] an operator read a view of a parameter of unit 'layers.0' (Block) that was taken "
                             "while the unit was gathered")) << what;
  strategy->teardown();
}

TEST(AnyModelFSDPTest, AParameterReadAfterTeardownIsAnErrorNotACrash) {
  std::shared_ptr<NetImpl> model = make_net("list");
  {
    auto strategy = one_rank(options_for("list", false));
    strategy->setup_module(model);
    strategy->teardown();
  }
  Block block = std::dynamic_pointer_cast<ListNet>(model)->layers->ptr<BlockImpl>(0);
  EXPECT_EQ(block->fc->weight.sizes(), at::IntArrayRef({kDim, kDim}));
  std::string what = error_message<strata::ConfigError>([&] { block->forward(at::randn({1, kDim})); });
  EXPECT_TRUE(contains(what, "[fsdp] an operator used parameter 'layers.0.") &&
              contains(what, "after its FSDP strategy was torn down")) << what;
}

}  // namespace
