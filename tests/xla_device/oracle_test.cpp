// Every program the xla device emits for the example models' training steps
// also parses and runs on a second XLA: JAX's CPU backend
// (tests/xla/jax_oracle.py). The steps run with STRATA_XLA_DUMP_DIR set
// (Note [Dumping programs] in src/xla/lazy_graph.cpp): the GPT in f32 with
// clipping, under bf16-mixed autocast, with dropout, and the MLP with
// AdamW, amsgrad Adam and Nesterov SGD. Each dumped program is then fed the
// same made-up inputs on JAX and on the CPU plugin through strata's own
// runtime, and the two must agree. (That each op computes what LibTorch
// computes is the per-op tests' work; this one proves that what strata
// prints is StableHLO another XLA reads the same way.) Skips without the
// plugin, and without jax.
#include <gtest/gtest.h>
#include <torch/nn.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "strata/models/gpt.h"
#include "strata/xla/client.h"
#include "xla/torch_util.h"
#include "xla/xla_test_util.h"
#include "xla_device/xla_device_test.h"

namespace strata::testing {
namespace {

namespace fs = std::filesystem;
using strata::xla::metrics;

class XlaOracleTest : public XlaDeviceFixture {};


// The steps whose programs are checked: two of each (step 0 makes the
// optimizer's state, step 1 is the steady one).
void run_the_example_steps(const c10::Device& device) {
  auto gpt_steps = [&](const strata::models::GPTConfig& config, bool autocast, bool clip) {
    torch::manual_seed(1);
    strata::models::GPT model(config);
    model->to(device);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      const at::Tensor x = torch::randint(config.vocab_size, {2, 16}, torch::kLong).to(device);
      const at::Tensor y = torch::randint(config.vocab_size, {2, 16}, torch::kLong).to(device);
      at::Tensor loss;
      if (autocast) {
        Autocast guard(device.type());
        loss = model->loss(x, y);
      } else {
        loss = model->loss(x, y);
      }
      loss.backward();
      if (clip) torch::nn::utils::clip_grad_norm_(model->parameters(), 0.5);
      opt.step();
      strata::xla::mark_step();
    }
  };
  const auto tiny = strata::models::GPTConfig::preset("tiny");
  gpt_steps(tiny, false, true);
  gpt_steps(tiny, true, false);
  gpt_steps(strata::models::GPTConfig::preset("tiny").with_dropout(0.1), false, false);

  auto mlp_steps = [&](auto make_optimizer) {
    torch::manual_seed(2);
    auto model = std::make_shared<Mlp>();
    model->to(device);
    auto opt = make_optimizer(model->parameters());
    for (int step = 0; step < 2; ++step) {
      opt->zero_grad();
      at::Tensor loss = torch::mse_loss(model->forward(torch::randn({8, 6}).to(device)), torch::randn({8, 3}).to(device));
      loss.backward();
      opt->step();
      strata::xla::mark_step();
    }
  };
  mlp_steps([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2));
  });
  mlp_steps([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2).amsgrad(true));
  });
  mlp_steps([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true));
  });
}

// Made-up inputs of a program's argument types: floats in [0.5, 1.5) (so a
// square root or a logarithm of one stays finite), integers in [0, 8) (in
// range as token ids and indices), random bools and u32 keys.
nlohmann::json made_up(const nlohmann::json& type) {
  const std::string dtype = type.at("dtype");
  const auto dims = type.at("dims").get<std::vector<int64_t>>();
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  at::Tensor values;
  if (dtype[0] == 'f' || dtype == "bf16") {
    values = torch::rand({n}, torch::kDouble) + 0.5;
    if (dtype == "bf16") values = values.to(at::kBFloat16).to(at::kDouble);
    if (dtype == "f32") values = values.to(at::kFloat).to(at::kDouble);
  } else if (dtype == "i1") {
    values = torch::randint(2, {n}, torch::kDouble);
  } else if (dtype == "ui32") {
    values = torch::randint(1LL << 31, {n}, torch::kDouble);
  } else {
    values = torch::randint(8, {n}, torch::kDouble);
  }
  const double* v = values.data_ptr<double>();
  return {{"dtype", dtype}, {"dims", dims}, {"values", std::vector<double>(v, v + n)}};
}

TEST_F(XlaOracleTest, EveryProgramOfTheExampleStepsRunsOnJaxAsOnThePlugin) {
  const std::string python = test_python();
  if (python.empty()) GTEST_SKIP() << "STRATA_PYTHON is not set: no Python to run jax with";
  const fs::path dir = fs::temp_directory_path() / ("strata-xla-programs-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ::setenv("STRATA_XLA_DUMP_DIR", dir.c_str(), 1);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  run_the_example_steps(device_);
  ::unsetenv("STRATA_XLA_DUMP_DIR");
  const auto m = metrics();
  EXPECT_EQ(m.fallback_calls(), 0);

  // The dumped programs, each with made-up inputs.
  torch::manual_seed(17);
  std::vector<std::string> modules;
  nlohmann::json request = {{"cases", nlohmann::json::array()}};
  std::vector<nlohmann::json> inputs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    const nlohmann::json types = nlohmann::json::parse(std::ifstream(entry.path()));
    std::ifstream text(dir / types.at("module").get<std::string>());
    modules.emplace_back(std::istreambuf_iterator<char>(text), std::istreambuf_iterator<char>());
    nlohmann::json args = nlohmann::json::array();
    for (const nlohmann::json& type : types.at("arguments")) args.push_back(made_up(type));
    inputs.push_back(args);
    request["cases"].push_back({{"name", entry.path().stem().string()},
                                {"module", modules.back()},
                                {"replicas", 1},
                                {"inputs", nlohmann::json::array({args})}});
  }
  std::printf("%zu distinct programs from %lld executions\n", modules.size(), static_cast<long long>(m.executions));
  // Two programs a clipped GPT step, one a step otherwise; step 0 and step
  // 1 differ (the optimizer's state is made in step 0).
  EXPECT_GE(modules.size(), 10u);
  std::ofstream(dir / "request.json") << request.dump();
  std::string output;
  const std::string command = python + " " + xla_test_file("jax_oracle.py") + " " + (dir / "request.json").string() +
                              " " + (dir / "result.json").string() + " 2>&1";
  ASSERT_EQ(run_command(command, output), 0) << output;
  const nlohmann::json result = nlohmann::json::parse(std::ifstream(dir / "result.json"));
  if (result.contains("skip")) {
    fs::remove_all(dir);
    GTEST_SKIP() << result["skip"].get<std::string>();
  }

  auto plugin = xla::Plugin::load(cpu_plugin_path());
  xla::Client client = xla::Client::create(plugin);
  const xla::Device target = client.addressable_devices().at(0);
  ASSERT_EQ(result["cases"].size(), modules.size());
  for (size_t i = 0; i < modules.size(); ++i) {
    const nlohmann::json& got = result["cases"][i];
    SCOPED_TRACE(got["name"].get<std::string>() + " (jax " + result["jax"].get<std::string>() + ")");
    ASSERT_FALSE(got.contains("error")) << got["error"];
    xla::CompileOptions options;
    options.with_device_assignment({{target.id}});
    const xla::LoadedExecutable exe = client.compile(modules[i], options);
    std::vector<xla::Buffer> buffers;
    std::vector<const xla::Buffer*> arguments;
    for (const nlohmann::json& arg : inputs[i]) {
      const at::Tensor t = tensor_from_json(arg).contiguous();
      buffers.push_back(client.buffer_from_host(t.data_ptr(), t.nbytes(),
                                                element_type_named(arg["dtype"].get<std::string>()),
                                                arg["dims"].get<std::vector<int64_t>>(), target));
    }
    for (const xla::Buffer& b : buffers) arguments.push_back(&b);
    const auto outputs = exe.execute({arguments});
    ASSERT_EQ(got["outputs"][0].size(), outputs[0].size());
    for (size_t o = 0; o < outputs[0].size(); ++o) {
      const at::Tensor mine = to_tensor(outputs[0][o]);
      const at::Tensor jax = tensor_from_json(got["outputs"][0][o]);
      ASSERT_EQ(mine.scalar_type(), jax.scalar_type()) << "output " << o;
      ASSERT_EQ(mine.sizes(), jax.sizes()) << "output " << o;
      // Two builds of XLA's CPU compiler may fuse and order sums
      // differently: f32 within 1e-4 of the output's largest value, bf16
      // within 2 of its ulps there; integers and bools exactly.
      if (at::isFloatingType(jax.scalar_type())) {
        const at::Tensor a = mine.to(at::kDouble), b = jax.to(at::kDouble);
        const double scale = std::max(1.0, b.nan_to_num(0, 0, 0).abs().max().item<double>());
        const double tol = (jax.scalar_type() == at::kBFloat16 ? 1.6e-2 : 1e-4) * scale;
        EXPECT_TRUE(at::allclose(a, b, 0, tol, /*equal_nan=*/true))
            << "output " << o << ": max difference " << (a - b).abs().nan_to_num(0).max().item<double>()
            << " over " << tol;
      } else {
        EXPECT_TRUE(at::equal(mine, jax)) << "output " << o;
      }
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata::testing
