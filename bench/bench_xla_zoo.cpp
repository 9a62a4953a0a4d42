// The model zoo (tests/support/zoo/) on one xla device beside LibTorch
// eager on the CPU (bench/run_xla.sh -z): each model trained with its own
// loop, from the same weights and batch on both sides, the sides taking
// turns step by step in one process. For each model: the median step time
// of each side after the first two steps, their ratio, the programs an xla
// step runs and compiles, and the CPU fallbacks (none expected).
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/xla_device/device.h"
#include "support/zoo/dcgan.h"
#include "support/zoo/fnet.h"
#include "support/zoo/llama.h"
#include "support/zoo/mnist.h"
#include "support/zoo/resnet.h"
#include "support/zoo/rnn_lm.h"
#include "support/zoo/vit.h"

namespace {

using Clock = std::chrono::steady_clock;
/// One training step of a model on one device.
using Step = std::function<at::Tensor()>;  // returns the step's loss
/// Builds a model, its optimizer and batch on a device (from the seed),
/// returning its step.
using MakeStep = std::function<Step(c10::Device)>;

struct Config {
  int64_t steps = 20;
  int64_t batch = 16;
  int threads = 0;
  std::vector<std::string> models{"mnist", "dcgan", "llama", "resnet", "vit", "lstm", "gru", "fnet"};
  std::string json;
};

template <class T>
void move_batch(T& pair, c10::Device device) {
  pair.first = pair.first.to(device);
  pair.second = pair.second.to(device);
}

// A classifier's step: forward, loss, backward, optimizer step.
template <class Model, class Optimizer, class Options, class Loss>
Step classifier(std::shared_ptr<Model> model, Options options, std::pair<at::Tensor, at::Tensor> batch, Loss loss,
                c10::Device device) {
  (*model)->to(device);
  auto optimizer = std::make_shared<Optimizer>((*model)->parameters(), options);
  move_batch(batch, device);
  return [=] {
    optimizer->zero_grad();
    at::Tensor l = loss((*model)->forward(batch.first), batch.second);
    l.backward();
    optimizer->step();
    return l.detach();
  };
}

MakeStep make_step(const std::string& name, int64_t n) {
  if (name == "mnist") {
    return [n](c10::Device device) -> Step {
      torch::manual_seed(11);
      auto model = std::make_shared<zoo::mnist::Net>();
      model->to(device);
      auto optimizer =
          std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));
      auto batch = zoo::mnist::batch(n);
      move_batch(batch, device);
      return [=] {
        optimizer->zero_grad();
        at::Tensor l = zoo::mnist::loss(model->forward(batch.first), batch.second);
        l.backward();
        optimizer->step();
        return l.detach();
      };
    };
  }
  if (name == "dcgan") {
    return [n](c10::Device device) -> Step {
      torch::manual_seed(11);
      const int64_t noise = 16;
      const zoo::dcgan::Example e = zoo::dcgan::example(noise, device);
      const zoo::dcgan::Batch b = zoo::dcgan::to(zoo::dcgan::batch(noise, n), device);
      return [=] {
        return zoo::dcgan::train_step(*e.generator, *e.discriminator, *e.generator_optimizer,
                                      *e.discriminator_optimizer, b)
            .g_loss.detach();
      };
    };
  }
  if (name == "llama") {
    return [n](c10::Device device) {
      torch::manual_seed(11);
      const zoo::llama::ModelArgs args;
      return classifier<zoo::llama::Transformer, torch::optim::AdamW>(
          std::make_shared<zoo::llama::Transformer>(args), torch::optim::AdamWOptions(1e-3),
          zoo::llama::batch(args, n), zoo::llama::loss, device);
    };
  }
  if (name == "resnet") {
    return [n](c10::Device device) {
      torch::manual_seed(11);
      return classifier<zoo::resnet::ResNet, torch::optim::SGD>(
          std::make_shared<zoo::resnet::ResNet>(std::vector<int64_t>{1, 1}),
          torch::optim::SGDOptions(0.05).momentum(0.9), zoo::resnet::batch(n), zoo::resnet::loss, device);
    };
  }
  if (name == "vit") {
    return [n](c10::Device device) {
      torch::manual_seed(11);
      const zoo::vit::ViTConfig config;
      return classifier<zoo::vit::VisionTransformer, torch::optim::AdamW>(
          std::make_shared<zoo::vit::VisionTransformer>(config), torch::optim::AdamWOptions(1e-3),
          zoo::vit::batch(config, n), zoo::vit::loss, device);
    };
  }
  if (name == "fnet") {
    return [n](c10::Device device) {
      torch::manual_seed(11);
      const zoo::fnet::FNetConfig config;
      return classifier<zoo::fnet::FNetForSequenceClassification, torch::optim::AdamW>(
          std::make_shared<zoo::fnet::FNetForSequenceClassification>(config), torch::optim::AdamWOptions(1e-3),
          zoo::fnet::batch(config, n), zoo::fnet::loss, device);
    };
  }
  if (name == "lstm" || name == "gru") {
    return [n, name](c10::Device device) {
      torch::manual_seed(11);
      const zoo::rnn_lm::RNNConfig config;
      const auto options = torch::optim::SGDOptions(0.05).momentum(0.9);
      if (name == "lstm") {
        return classifier<zoo::rnn_lm::LSTMModel, torch::optim::SGD>(std::make_shared<zoo::rnn_lm::LSTMModel>(config),
                                                                     options, zoo::rnn_lm::batch(config, n),
                                                                     zoo::rnn_lm::loss, device);
      }
      return classifier<zoo::rnn_lm::GRUModel, torch::optim::SGD>(std::make_shared<zoo::rnn_lm::GRUModel>(config),
                                                                  options, zoo::rnn_lm::batch(config, n),
                                                                  zoo::rnn_lm::loss, device);
    };
  }
  throw std::invalid_argument("unknown model '" + name +
                              "': expected mnist, dcgan, llama, resnet, vit, lstm, gru or fnet");
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string read_first_line(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

nlohmann::json bench_model(const std::string& name, const Config& c) {
  const MakeStep make = make_step(name, c.batch);
  Step eager = make(c10::kCPU);
  Step xla = make(strata::xla::device(0));
  strata::xla::mark_step();  // the weights' upload is not step 0's
  strata::xla::reset_metrics();
  std::vector<double> eager_ms, xla_ms;
  std::vector<int64_t> programs, compiles;
  for (int64_t step = 0; step < c.steps; ++step) {
    // Alternate which side goes first.
    for (int k = 0; k < 2; ++k) {
      if ((k + step) % 2 == 0) {
        const auto start = Clock::now();
        (void)eager().item<double>();
        eager_ms.push_back(ms_since(start));
      } else {
        const strata::xla::Metrics before = strata::xla::metrics();
        const auto start = Clock::now();
        const at::Tensor loss = xla();
        strata::xla::mark_step();
        (void)loss.item<double>();  // the step's program has run
        xla_ms.push_back(ms_since(start));
        const strata::xla::Metrics after = strata::xla::metrics();
        programs.push_back(after.executions - before.executions);
        compiles.push_back(after.compiles - before.compiles);
      }
    }
  }
  const strata::xla::Metrics m = strata::xla::metrics();
  const std::vector<double> eager_timed(eager_ms.begin() + 2, eager_ms.end());
  const std::vector<double> xla_timed(xla_ms.begin() + 2, xla_ms.end());
  int64_t most_programs = 0, late_compiles = 0;
  for (size_t i = 0; i < programs.size(); ++i) {
    most_programs = std::max(most_programs, programs[i]);
    if (i >= 2) late_compiles += compiles[i];
  }
  return {{"model", name},
          {"eager_ms", median(eager_timed)},
          {"xla_ms", median(xla_timed)},
          {"ratio", median(xla_timed) / median(eager_timed)},
          {"programs_per_step", most_programs},
          {"compiles_after_step_2", late_compiles},
          {"fallback_calls", m.fallback_calls()}};
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"The model zoo on one xla device (CPU plugin) beside LibTorch eager"};
  app.add_option("--steps", c.steps, "Steps per side (at least 3; the median skips the first two)")
      ->check(CLI::Range(3, 100000))
      ->capture_default_str();
  app.add_option("--batch", c.batch, "Examples per batch")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--threads", c.threads, "LibTorch intra-op threads; 0: LibTorch's default")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--models", c.models, "Models to run: mnist dcgan llama resnet vit lstm gru fnet");
  app.add_option("--json", c.json, "Also write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    if (c.threads > 0) at::set_num_threads(c.threads);
    strata::xla::init();  // before any backward (docs/xla.md)
    std::printf("machine: %s; LibTorch threads %d; batch %lld, %lld steps a side (median after the first two)\n",
                read_first_line("/proc/cpuinfo", "model name").c_str(), at::get_num_threads(),
                static_cast<long long>(c.batch), static_cast<long long>(c.steps));
    std::printf("%-8s %12s %12s %10s %16s %12s %10s\n", "model", "eager ms", "xla ms", "xla/eager", "programs/step",
                "late compiles", "fallbacks");
    nlohmann::json all = nlohmann::json::array();
    for (const std::string& name : c.models) {
      const nlohmann::json r = bench_model(name, c);
      std::printf("%-8s %12.2f %12.2f %10.2f %16lld %12lld %10lld\n", name.c_str(), r["eager_ms"].get<double>(),
                  r["xla_ms"].get<double>(), r["ratio"].get<double>(),
                  static_cast<long long>(r["programs_per_step"].get<int64_t>()),
                  static_cast<long long>(r["compiles_after_step_2"].get<int64_t>()),
                  static_cast<long long>(r["fallback_calls"].get<int64_t>()));
      std::fflush(stdout);
      all.push_back(r);
    }
    if (!c.json.empty()) std::ofstream(c.json) << all.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_xla_zoo: %s\n", e.what());
    return 1;
  }
  return 0;
}
