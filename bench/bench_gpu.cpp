// One-device training benchmark for a GPU: strata's single-device, DDP and
// FSDP strategies at world size 1, each training a GPT preset with AdamW on
// fixed random batches, in this one process, one run after another. Prints
// one JSON line per run:
//
//   {"impl":"strata","strategy":"fsdp","model":"gpt-large","device":"cuda:0",
//    "precision":"32-true","batch":32,"seq_len":256,"steps":10,
//    "step_ms_median":..,"tokens_per_s":..,"peak_mem_mb":..,"loss_after_k":..,"k":..}
//
// bench/gpu_peer.py prints the same lines for PyTorch (plain, DDP, FSDP2)
// and Lightning Fabric (DDP, FSDP) on the same GPU; scripts/gpu-check.sh
// runs both and prints the table (bench/gpu_table.py).
//
// Note [GPU step times and memory]
// A step is forward + backward + optimizer step + zero_grad, timed from
// the host with the device synchronised at both ends (kernels run
// asynchronously, so without it the host would time only their launch).
// The median over the timed steps gives tokens/s. Peak memory is the
// caching allocator's peak of allocated bytes on the device (what
// torch.cuda.max_memory_allocated reports), reset when the run starts, so
// it covers set-up and training; on the CPU (the --accelerator cpu dry
// run) it is the process's peak RSS instead. World size 1: strata's group
// is then the one-rank identity backend, where PyTorch's DDP and FSDP2 run
// NCCL collectives over one rank.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/models/gpt.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "strata/strategies/single_device.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  std::string accelerator = "cuda";
  std::vector<std::string> sizes{"medium", "large"};
  std::vector<std::string> strategies{"single_device", "ddp", "fsdp"};
  std::string precision = "32-true";
  int64_t batch = 32;
  int64_t steps = 10;
  int64_t warmup = 3;
  int64_t pool = 4;
  uint64_t seed = 1234;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

void synchronize(c10::Device device) {
  if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
}

void reset_peak(c10::Device device) {
  if (!device.is_cuda()) return;
  // An allocation first: LibTorch 2.11's caching allocator refuses stats
  // calls before it has been initialised ("Invalid device argument").
  (void)at::empty({1}, at::TensorOptions().device(device));
  c10::getDeviceAllocator(c10::kCUDA)->resetPeakStats(device.index());
}

double peak_mb(c10::Device device) {
  if (device.is_cuda()) {
    const auto stats = c10::getDeviceAllocator(c10::kCUDA)->getDeviceStats(device.index());
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1024.0 * 1024.0);
  }
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

std::shared_ptr<strata::strategies::Strategy> make_strategy(const std::string& kind, const Config& c) {
  using namespace strata::strategies;
  auto accelerator = make_accelerator(c.accelerator);
  Precision precision = Precision::parse(c.precision, accelerator->name());
  if (kind == "single_device") return std::make_shared<SingleDeviceStrategy>(accelerator, precision);
  if (kind == "ddp") return std::make_shared<DDPStrategy>(accelerator, precision);
  STRATA_CHECK(kind == "fsdp", ConfigError, "[bench] unknown strategy '", kind,
               "'; use single_device, ddp or fsdp");
  FSDPOptions options;
  options.with_auto_wrap_policy(ModuleTypes{"Block"});
  return std::make_shared<FSDPStrategy>(accelerator, precision, options);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json run(strata::Fabric& fabric, const std::string& kind, const std::string& size, const Config& c) {
  const c10::Device device = fabric.device();
  synchronize(device);
  reset_peak(device);
  const strata::models::GPTConfig config = strata::models::GPTConfig::preset(size);
  const int64_t seq_len = config.block_size;
  at::Generator gen = at::detail::createCPUGenerator(c.seed);
  at::Tensor pool = at::randint(0, config.vocab_size, {c.pool, c.batch, seq_len + 1}, gen, at::kLong);
  std::vector<at::Tensor> inputs, targets;
  for (int64_t i = 0; i < c.pool; ++i) {
    inputs.push_back(pool[i].narrow(1, 0, seq_len).contiguous().to(device));
    targets.push_back(pool[i].narrow(1, 1, seq_len).contiguous().to(device));
  }
  strata::Fabric::seed_everything(c.seed);
  strata::models::GPT gpt(config);
  fabric.setup_module(gpt);
  torch::optim::AdamW optimizer(gpt->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  fabric.setup_optimizer(optimizer);
  std::vector<double> step_ms;
  double last_loss = 0.0;
  for (int64_t i = 0; i < c.warmup + c.steps; ++i) {
    synchronize(device);
    const auto start = Clock::now();
    at::Tensor loss;
    {
      auto autocast = fabric.autocast();
      loss = gpt->loss(inputs[i % c.pool], targets[i % c.pool]);
    }
    fabric.backward(loss);
    fabric.strategy().optimizer_step(optimizer);
    optimizer.zero_grad();
    synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    last_loss = loss.item<double>();
    if (i >= c.warmup) step_ms.push_back(ms);
  }
  const double step = median(step_ms);
  int64_t params = 0;
  if (auto* fsdp = dynamic_cast<strata::strategies::FSDPStrategy*>(&fabric.strategy())) {
    for (const auto& unit : fsdp->units()) params += unit.numel;
  } else {
    for (const at::Tensor& p : gpt->parameters()) params += p.numel();
  }
  return {{"impl", "strata"},
          {"strategy", kind},
          {"model", "gpt-" + size},
          {"params", params},
          {"device", device.str()},
          {"precision", c.precision},
          {"batch", c.batch},
          {"seq_len", seq_len},
          {"steps", c.steps},
          {"step_ms_median", step},
          {"tokens_per_s", static_cast<double>(c.batch * seq_len) / (step / 1000.0)},
          {"peak_mem_mb", peak_mb(device)},
          {"loss_after_k", last_loss},
          {"k", c.warmup + c.steps}};
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  std::string sizes = "medium,large", strategies = "single_device,ddp,fsdp";
  CLI::App app{"strata on one device: single-device, DDP and FSDP at world size 1 (one JSON line per run)"};
  app.add_option("--accelerator", c.accelerator, "cuda, or cpu for a dry run")->capture_default_str();
  app.add_option("--sizes", sizes, "GPT presets, comma-separated (tiny, small, medium, large)")->capture_default_str();
  app.add_option("--strategies", strategies, "single_device, ddp, fsdp, comma-separated")->capture_default_str();
  app.add_option("--precision", c.precision, "32-true or bf16-mixed")->capture_default_str();
  app.add_option("--batch", c.batch, "Sequences per step")->capture_default_str();
  app.add_option("--steps", c.steps, "Timed steps")->capture_default_str();
  app.add_option("--warmup", c.warmup, "Untimed steps before")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    c.sizes = split(sizes);
    c.strategies = split(strategies);
    STRATA_CHECK(c.batch >= 1 && c.steps >= 1 && c.warmup >= 0 && !c.sizes.empty() && !c.strategies.empty(),
                 ConfigError, "[bench] --batch and --steps must be >= 1, --warmup >= 0, and --sizes and "
                 "--strategies non-empty");
    for (const std::string& size : c.sizes) {
      for (const std::string& kind : c.strategies) {
        strata::Fabric fabric(strata::FabricOptions().with_accelerator(c.accelerator).with_strategy(
            make_strategy(kind, c)));
        nlohmann::json line;
        fabric.launch([&](strata::Fabric& f) { line = run(f, kind, size, c); });
        std::cout << line.dump() << std::endl;
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_gpu: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
