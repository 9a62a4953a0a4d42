// Module, optimizer and RNG state by name: resuming from a checkpoint gives
// exactly the parameters of an uninterrupted run, and mismatches are
// errors that list the keys.
#include "strata/checkpoint/state_dict.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <functional>

#include "checkpoint/test_util.h"
#include "strata/checkpoint/directory.h"
#include "strata/core/error.h"
#include "support/errors.h"

namespace strata::checkpoint {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A small network with nested names, a buffer of another dtype (int64
// num_batches_tracked) and state that changes in training (running stats).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    norm = register_module("norm", torch::nn::BatchNorm1d(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::tanh(norm(fc1(x)))); }
  torch::nn::Linear fc1{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(Net);

Net make_net(uint64_t seed) {
  at::manual_seed(seed);
  return Net();
}

class StateTest : public testing::ScratchDir {};

TEST_F(StateTest, ModuleStateNamesParametersThenBuffers) {
  Net net = make_net(1);
  std::vector<std::string> names;
  for (const auto& [name, tensor] : module_state(*net)) names.push_back(name);
  EXPECT_THAT(names, ElementsAre("fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight",
                                 "fc2.bias", "norm.running_mean", "norm.running_var",
                                 "norm.num_batches_tracked"));
}

TEST_F(StateTest, LoadedModuleMatchesTheSavedOneInPlace) {
  Net saved = make_net(1);
  saved->norm->running_mean.fill_(0.5);
  saved->norm->num_batches_tracked.fill_(9);
  write_safetensors(path("model.safetensors"), module_state(*saved));

  Net loaded = make_net(2);
  const void* weight_storage = loaded->fc1->weight.data_ptr();
  const LoadReport report = load_module_state(
      *loaded, SafetensorsFile::open(path("model.safetensors")).load_all(), /*strict=*/true);
  EXPECT_TRUE(report.ok());
  for (const auto& [name, tensor] : module_state(*saved)) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(at::equal(tensor, loaded->named_parameters().contains(name)
                                      ? loaded->named_parameters()[name]
                                      : loaded->named_buffers()[name]));
  }
  EXPECT_EQ(loaded->fc1->weight.data_ptr(), weight_storage);  // same storage: optimizers stay valid
  EXPECT_TRUE(loaded->fc1->weight.requires_grad());
}

TEST_F(StateTest, StrictLoadListsMissingAndUnexpectedKeysAndChangesNothing) {
  NamedTensors state = module_state(*make_net(1));
  state.erase(state.begin() + 5);  // fc2.bias
  state.emplace_back("extra.weight", at::zeros({1}));
  Net net = make_net(2);
  const at::Tensor before = net->fc1->weight.clone();
  const std::string message =
      strata::testing::error_message<CheckpointError>([&] { load_module_state(*net, state, /*strict=*/true, "model.safetensors"); });
  EXPECT_THAT(message, HasSubstr("[checkpoint] model.safetensors: the module's keys do not match "
                                 "(strict load): 1 missing key: 'fc2.bias'; 1 unexpected key: "
                                 "'extra.weight'. Load with strict=false"));
  EXPECT_TRUE(at::equal(net->fc1->weight, before));

  const LoadReport report = load_module_state(*net, state, /*strict=*/false);
  EXPECT_THAT(report.missing, ElementsAre("fc2.bias"));
  EXPECT_THAT(report.unexpected, ElementsAre("extra.weight"));
  EXPECT_TRUE(at::equal(net->fc1->weight, state[0].second));
}

TEST_F(StateTest, LongKeyListsAreCutAfterTen) {
  NamedTensors state;
  for (int i = 0; i < 13; ++i) state.emplace_back("layer" + std::to_string(i) + ".w", at::zeros({1}));
  const std::string message = strata::testing::error_message<CheckpointError>([&] { load_module_state(*make_net(1), state); });
  EXPECT_THAT(message, HasSubstr("9 missing keys: 'fc1.weight'"));
  EXPECT_THAT(message, HasSubstr("13 unexpected keys: 'layer0.w', 'layer1.w'"));
  EXPECT_THAT(message, HasSubstr("'layer9.w' and 3 more"));
}

TEST_F(StateTest, ShapeOrDtypeMismatchNamesTheKeyAndBoth) {
  NamedTensors state = module_state(*make_net(1));
  state[0].second = at::zeros({8, 5});
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { load_module_state(*make_net(2), state, true, "m.safetensors"); }),
              HasSubstr("[checkpoint] m.safetensors: key 'fc1.weight' has shape [8, 5] but the "
                        "module's has shape [8, 4]"));
  state = module_state(*make_net(1));
  state[1].second = state[1].second.to(at::kDouble);
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { load_module_state(*make_net(2), state, /*strict=*/false); }),
              HasSubstr("key 'fc1.bias' has dtype Double but the module's has dtype Float"));
}

// ---- optimizer round trips -----------------------------------------------------

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(Net&)>;

// Trains `net` for `steps` steps on fixed batches starting at batch `first`.
void train(Net& net, torch::optim::Optimizer& optimizer, int first, int steps) {
  net->train();
  for (int s = first; s < first + steps; ++s) {
    at::manual_seed(1000 + s);
    const at::Tensor x = at::randn({16, 4});
    const at::Tensor y = at::randn({16, 3});
    optimizer.zero_grad();
    at::mse_loss(net->forward(x), y).backward();
    optimizer.step();
  }
}

// Trains 3 steps, saves model + optimizer + lr change to a checkpoint
// directory, loads into a fresh model and optimizer built differently, trains
// 3 more; the result must equal 6 uninterrupted steps bit for bit.
void expect_exact_resume(const std::string& dir, const MakeOptimizer& make_optimizer) {
  Net reference = make_net(1);
  auto reference_opt = make_optimizer(reference);
  train(reference, *reference_opt, 0, 3);
  reference_opt->param_groups()[0].options().set_lr(0.02);
  train(reference, *reference_opt, 3, 3);

  Net first = make_net(1);
  auto first_opt = make_optimizer(first);
  train(first, *first_opt, 0, 3);
  first_opt->param_groups()[0].options().set_lr(0.02);
  const OptimizerState saved = optimizer_state(*first_opt, param_names(*first));
  write_checkpoint_dir(dir,
                       {{"model.safetensors", module_state(*first)},
                        {"optimizer.safetensors", saved.tensors}},
                       {{"optimizer", saved.json}});

  Net resumed = make_net(2);  // different initial weights
  auto resumed_opt = make_optimizer(resumed);
  const CheckpointReader reader = CheckpointReader::open(dir);
  load_module_state(*resumed, reader.open_file("model.safetensors").load_all());
  const OptimizerState loaded{reader.open_file("optimizer.safetensors").load_all(),
                              reader.metadata()["optimizer"]};
  EXPECT_TRUE(load_optimizer_state(*resumed_opt, param_names(*resumed), loaded).ok());
  EXPECT_EQ(resumed_opt->param_groups()[0].options().get_lr(), 0.02);
  train(resumed, *resumed_opt, 3, 3);

  const NamedTensors expected = module_state(*reference);
  const NamedTensors actual = module_state(*resumed);
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].first);
    EXPECT_TRUE(at::equal(expected[i].second, actual[i].second));
  }
}

std::vector<at::Tensor> params_of(Net& net) { return net->parameters(); }

TEST_F(StateTest, AdamResumesExactlyAsAnUninterruptedRun) {
  expect_exact_resume(path("adam"), [](Net& net) {
    return std::make_unique<torch::optim::Adam>(params_of(net),
                                                torch::optim::AdamOptions(0.01).weight_decay(0.1));
  });
}

TEST_F(StateTest, AdamWWithAmsgradResumesExactlyAsAnUninterruptedRun) {
  expect_exact_resume(path("adamw"), [](Net& net) {
    return std::make_unique<torch::optim::AdamW>(
        params_of(net), torch::optim::AdamWOptions(0.01).amsgrad(true).betas({0.8, 0.99}));
  });
}

TEST_F(StateTest, SgdWithMomentumResumesExactlyAsAnUninterruptedRun) {
  expect_exact_resume(path("sgd"), [](Net& net) {
    return std::make_unique<torch::optim::SGD>(
        params_of(net), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
  });
}

TEST_F(StateTest, OptimizerStateIsKeyedByParameterName) {
  Net net = make_net(1);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  train(net, adam, 0, 2);
  const OptimizerState state = optimizer_state(adam, param_names(*net));
  EXPECT_EQ(state.json["type"], "adam");
  EXPECT_EQ(state.json["param_groups"][0]["params"][0], "fc1.weight");
  EXPECT_EQ(state.json["param_groups"][0]["options"]["lr"], 0.01);
  EXPECT_EQ(state.json["state"]["fc2.bias"]["step"], 2);
  EXPECT_EQ(state.tensors[0].first, "fc1.weight.exp_avg");
  EXPECT_EQ(state.tensors[1].first, "fc1.weight.exp_avg_sq");
  EXPECT_EQ(state.tensors.size(), 2 * net->parameters().size());
}

TEST_F(StateTest, OptimizerMismatchesAreErrors) {
  Net net = make_net(1);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  train(net, adam, 0, 1);
  OptimizerState state = optimizer_state(adam, param_names(*net));

  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { load_optimizer_state(sgd, param_names(*net), state); }),
              HasSubstr("holds 'adam' optimizer state but the optimizer is 'sgd'"));

  torch::optim::RMSprop rmsprop(net->parameters());
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { optimizer_state(rmsprop, param_names(*net)); }),
              HasSubstr("optimizer type torch::optim::RMSprop is not supported; supported: "
                        "torch::optim::SGD, Adam, AdamW"));

  // An optimizer over fewer, differently named parameters.
  Net other = make_net(2);
  torch::optim::Adam partial(other->fc1->parameters(), torch::optim::AdamOptions(0.01));
  ParamNames names;
  names[other->fc1->weight.unsafeGetTensorImpl()] = "fc1.weight";
  names[other->fc1->bias.unsafeGetTensorImpl()] = "fc1.renamed_bias";
  const std::string message =
      strata::testing::error_message<CheckpointError>([&] { load_optimizer_state(partial, names, state, true, "opt.safetensors"); });
  EXPECT_THAT(message, HasSubstr("[checkpoint] opt.safetensors: the optimizer's parameter names "
                                 "do not match (strict load): 1 missing key: 'fc1.renamed_bias'; "
                                 "5 unexpected keys: 'fc1.bias', 'fc2.bias'"));
  const LoadReport report = load_optimizer_state(partial, names, state, /*strict=*/false);
  EXPECT_THAT(report.missing, ElementsAre("fc1.renamed_bias"));
  EXPECT_EQ(report.unexpected.size(), 5u);
  EXPECT_EQ(partial.state().size(), 1u);  // fc1.weight's state only

  state.tensors.erase(state.tensors.begin());  // fc1.weight.exp_avg
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { load_optimizer_state(adam, param_names(*net), state); }),
              HasSubstr("tensor 'fc1.weight.exp_avg' is listed in the state but missing"));

  names.clear();
  EXPECT_THAT(strata::testing::error_message<CheckpointError>([&] { optimizer_state(adam, names); }),
              HasSubstr("parameter #0 of param group 0 (shape [8, 4]) has no name"));
}

// ---- RNG ------------------------------------------------------------------------

TEST_F(StateTest, CpuRngStateRoundTripsThroughAFile) {
  at::manual_seed(42);
  write_safetensors(path("rng.safetensors"), {{"cpu", cpu_rng_state()}});
  const at::Tensor first = at::randn({5});
  at::randn({100});  // move the generator on
  set_cpu_rng_state(SafetensorsFile::open(path("rng.safetensors")).load("cpu"));
  EXPECT_TRUE(at::equal(at::randn({5}), first));

  EXPECT_THAT(strata::testing::error_message<CheckpointError>([] { set_cpu_rng_state(at::zeros({3})); }),
              HasSubstr("CPU RNG state must be a 1-D uint8 tensor of"));
}

}  // namespace
}  // namespace strata::checkpoint
