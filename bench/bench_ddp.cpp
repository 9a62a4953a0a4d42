// Data-parallel training benchmark: strata's DDPStrategy through Fabric,
// the counterpart of bench/ddp_peer.py (PyTorch's DistributedDataParallel).
// Both train the same model (a GPT preset or the 512-2048-512 MLP) with
// AdamW on the same fixed random batches, with the same per-rank batch,
// warm-up and timed steps, and print one JSON line on rank 0:
//
//   {"impl":"strata","model":"gpt-small","world":2,"threads":1,"batch":16,
//    "step_ms_median":..,"step_ms_mean":..,"tokens_per_s":..,
//    "peak_rss_mb_per_rank":[..,..],"loss_after_k":..,"k":..}
//
// (MLP runs report "samples_per_s" instead of "tokens_per_s".)
//
// Started plainly it launches --devices copies of itself (Fabric); under
// `strata launch -n N` it joins. bench/run_ddp.sh runs both sides and
// prints the table.
//
// Note [Same data and initial weights as the peer]
// Debian's python3-torch and LibTorch are the same libtorch_cpu, with the
// same CPU generator. The batches come from a private generator seeded
// with --seed (one pool of shape [pool, world * batch, ...], rank r takes
// its slice), and the model is built right after manual_seed(--seed) with
// its layers created in the same order as the peer's, so both sides start
// from the same weights and see the same batches; the losses after K steps
// agree to float rounding, which checks that both train the same thing.
//
// Note [What a step time is]
// Each rank times forward + backward (with the gradient all-reduce) +
// optimizer step + zero_grad of every timed step. The per-step times are
// reduced with MAX across ranks at the end (the slowest rank sets the
// pace), so no extra collective runs inside the timed region.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/models/gpt.h"
#include "strata/models/mlp.h"
#include "strata/runtime/env.h"
#include "strata/strategies/ddp.h"

namespace {

using Clock = std::chrono::steady_clock;

/// What to run, from the command line (the same flags as ddp_peer.py).
struct BenchConfig {
  std::string model = "gpt";  ///< "gpt" or "mlp"
  std::string size = "small"; ///< GPT preset
  int devices = 2;
  int threads = 1;
  int64_t batch = 16;  ///< per rank
  int64_t steps = 30;  ///< timed steps
  int64_t warmup = 5;  ///< untimed steps before
  int64_t pool = 8;    ///< distinct batches, cycled
  uint64_t seed = 1234;
  double lr = 1e-3;
  int64_t bucket_cap_mb = 25;
  bool phases = false;  ///< also report forward / backward / optimizer times
  std::string impl = "strata";  ///< the "impl" field of the result (run_ddp.sh tags variants)

  std::string label() const { return model == "gpt" ? "gpt-" + size : "mlp-512-2048-512"; }
};

double peak_rss_mb() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); }

/// Per-step times reduced with MAX across ranks (see Note [What a step time is]).
std::vector<double> slowest_rank(strata::Fabric& fabric, const std::vector<double>& ms) {
  at::Tensor t = at::tensor(ms, at::kDouble);
  t = fabric.all_reduce(t, strata::comm::ReduceOp::kMax);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

nlohmann::json run_worker(strata::Fabric& fabric, const BenchConfig& c) {
  at::set_num_threads(c.threads);
  const int world = fabric.world_size();
  const int rank = fabric.global_rank();

  // The batches: see Note [Same data and initial weights as the peer].
  at::Generator gen = at::detail::createCPUGenerator(c.seed);
  std::vector<at::Tensor> inputs, targets;
  int64_t seq_len = 0;
  strata::models::GPT gpt{nullptr};
  strata::models::MLP mlp{nullptr};
  if (c.model == "gpt") {
    strata::models::GPTConfig config = strata::models::GPTConfig::preset(c.size);
    seq_len = config.block_size();
    at::Tensor pool = at::randint(0, config.vocab_size(), {c.pool, world * c.batch, seq_len + 1}, gen, at::kLong);
    for (int64_t i = 0; i < c.pool; ++i) {
      at::Tensor mine = pool[i].narrow(0, rank * c.batch, c.batch);
      inputs.push_back(mine.narrow(1, 0, seq_len).contiguous());
      targets.push_back(mine.narrow(1, 1, seq_len).contiguous());
    }
    strata::Fabric::seed_everything(c.seed);
    gpt = strata::models::GPT(config);
    fabric.setup_module(gpt);
  } else {
    at::Tensor x = at::randn({c.pool, world * c.batch, 512}, gen);
    at::Tensor y = at::randn({c.pool, world * c.batch, 512}, gen);
    for (int64_t i = 0; i < c.pool; ++i) {
      inputs.push_back(x[i].narrow(0, rank * c.batch, c.batch).contiguous());
      targets.push_back(y[i].narrow(0, rank * c.batch, c.batch).contiguous());
    }
    strata::Fabric::seed_everything(c.seed);
    mlp = strata::models::MLP(512, 2048, 512, 1);
    fabric.setup_module(mlp);
  }
  torch::nn::Module& module = gpt ? static_cast<torch::nn::Module&>(*gpt) : static_cast<torch::nn::Module&>(*mlp);
  torch::optim::AdamW optimizer(module.parameters(), torch::optim::AdamWOptions(c.lr).weight_decay(0.01));
  fabric.setup_optimizer(optimizer);

  auto loss_of = [&](int64_t i) {
    const at::Tensor& x = inputs[i % c.pool];
    const at::Tensor& y = targets[i % c.pool];
    return gpt ? gpt->loss(x, y) : torch::nn::functional::mse_loss(mlp->forward(x), y);
  };

  std::vector<double> step_ms, fwd_ms, bwd_ms, opt_ms;
  double last_loss = 0.0;
  for (int64_t i = 0; i < c.warmup + c.steps; ++i) {
    if (i == c.warmup) fabric.barrier("timed steps");
    auto start = Clock::now();
    at::Tensor loss = loss_of(i);
    double t_fwd = ms_since(start);
    fabric.backward(loss);
    double t_bwd = ms_since(start);
    fabric.strategy().optimizer_step(optimizer);
    optimizer.zero_grad();
    double t_all = ms_since(start);
    last_loss = loss.item<double>();
    if (i >= c.warmup) {
      step_ms.push_back(t_all);
      fwd_ms.push_back(t_fwd);
      bwd_ms.push_back(t_bwd - t_fwd);
      opt_ms.push_back(t_all - t_bwd);
    }
  }

  step_ms = slowest_rank(fabric, step_ms);
  at::Tensor rss = fabric.all_gather(at::full({1}, peak_rss_mb(), at::kDouble)).reshape({-1});
  double loss_after_k = fabric.all_reduce(at::full({}, last_loss, at::kDouble), "mean").item<double>();

  const double step_s = median(step_ms) / 1000.0;
  nlohmann::json out = {{"impl", c.impl},
                        {"model", c.label()},
                        {"world", world},
                        {"threads", c.threads},
                        {"batch", c.batch},
                        {"steps", c.steps},
                        {"step_ms_median", median(step_ms)},
                        {"step_ms_mean", mean(step_ms)}};
  if (gpt) {
    out["tokens_per_s"] = static_cast<double>(world * c.batch * seq_len) / step_s;
  } else {
    out["samples_per_s"] = static_cast<double>(world * c.batch) / step_s;
  }
  out["peak_rss_mb_per_rank"] = std::vector<double>(rss.data_ptr<double>(), rss.data_ptr<double>() + rss.numel());
  out["loss_after_k"] = loss_after_k;
  out["k"] = c.warmup + c.steps;
  if (c.phases) {
    // Rank-local medians (not reduced): where a step's time goes.
    out["phases_ms_median"] = {{"forward", median(fwd_ms)},
                               {"backward_and_allreduce", median(bwd_ms)},
                               {"optimizer", median(opt_ms)}};
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  BenchConfig c;
  CLI::App app{"strata DDP benchmark: trains a model with DDPStrategy and prints one JSON line of timings"};
  app.add_option("--model", c.model, "gpt or mlp (512-2048-512)")->check(CLI::IsMember({"gpt", "mlp"}))->capture_default_str();
  app.add_option("--size", c.size, "GPT preset: tiny, small, medium, large")->capture_default_str();
  app.add_option("--devices", c.devices, "Workers to launch (ignored under strata launch)")->capture_default_str();
  app.add_option("--threads", c.threads, "Intra-op threads per rank")->capture_default_str();
  app.add_option("--batch", c.batch, "Batch per rank")->capture_default_str();
  app.add_option("--steps", c.steps, "Timed steps")->capture_default_str();
  app.add_option("--warmup", c.warmup, "Untimed steps before the timed ones")->capture_default_str();
  app.add_option("--pool", c.pool, "Distinct random batches, cycled")->capture_default_str();
  app.add_option("--seed", c.seed, "Seed of the data and the initial weights")->capture_default_str();
  app.add_option("--lr", c.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--bucket-cap-mb", c.bucket_cap_mb, "DDP gradient bucket size")->capture_default_str();
  app.add_option("--impl-label", c.impl, "The \"impl\" field of the result")->capture_default_str();
  app.add_flag("--phases", c.phases, "Also report forward / backward / optimizer medians of rank 0");
  CLI11_PARSE(app, argc, argv);

  try {
    STRATA_CHECK(c.threads >= 1 && c.batch >= 1 && c.steps >= 1 && c.warmup >= 0 && c.pool >= 1,
                 ConfigError, "[bench] --threads, --batch, --steps and --pool must be >= 1, --warmup >= 0");
    auto strategy = std::make_shared<strata::strategies::DDPStrategy>(
        strata::strategies::cpu_accelerator(), std::nullopt,
        strata::strategies::DDPOptions().with_bucket_cap_mb(c.bucket_cap_mb));
    strata::Fabric fabric(strata::FabricOptions().with_devices(c.devices).with_strategy(strategy));
    nlohmann::json result = fabric.launch([&](strata::Fabric& f) { return run_worker(f, c); });
    // Fabric's own workers end inside launch(); here is either the process
    // that launched them, or every rank of an outside launcher's job.
    strata::runtime::Environment env = strata::runtime::Environment::from_env();
    if (!env.launched() || env.rank == 0) std::cout << result.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
