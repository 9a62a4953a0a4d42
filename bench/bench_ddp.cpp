// Data-parallel training benchmark: strata's DDPStrategy (or, with
// --strategy fsdp, FSDPStrategy) through Fabric, the counterpart of
// bench/ddp_peer.py (PyTorch's DistributedDataParallel). Both train the
// same model (a GPT preset or the 512-2048-512 MLP) with AdamW on the same
// fixed random batches, with the same per-rank batch, warm-up and timed
// steps, and print one JSON line on rank 0:
//
//   {"impl":"strata","strategy":"ddp","model":"gpt-small","world":2,
//    "threads":1,"batch":16,"step_ms_median":..,"step_ms_mean":..,
//    "tokens_per_s":..,"peak_rss_mb_per_rank":[..,..],"loss_after_k":..,
//    "k":..,"memory":{..}}
//
// (MLP runs report "samples_per_s" instead of "tokens_per_s"; "memory" is
// described in Note [Memory figures].)
//
// Started plainly it launches --devices copies of itself (Fabric); under
// `strata launch -n N` it joins. bench/run_ddp.sh runs both sides and
// prints the table; bench/run_fsdp.sh compares FSDP with DDP;
// bench/run_peers.sh runs strata beside PyTorch DDP / FSDP2 and Lightning
// Fabric.
//
// Note [Same data and initial weights as the peer]
// The venv's torch (2.13.0, $STRATA_PYTHON) and strata use the same
// libtorch_cpu, with the same CPU generator. The batches come from a private generator seeded
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
//
// Note [Memory figures]
// Each rank reports, in MB ("memory" of the result, one value per rank):
// - "baseline": VmRSS when the worker starts, before the model exists
//   (LibTorch, OpenBLAS and Gloo already loaded);
// - "setup_peak": VmHWM right after the model is built and set up
//   (plainly then setup_module, or, with --sharded-init, inside FSDP's
//   module_sharded_context then setup_module);
// - "train_peak": VmHWM at the end of the run, after resetting the
//   high-water mark to the current RSS once set-up is done (writing "5" to
//   /proc/self/clear_refs; "hwm_reset" says whether the kernel allowed it:
//   without it, train_peak includes set-up). Memory freed after set-up
//   but kept in malloc's heap still counts (strata's workers keep their
//   heap, Note [Allocator settings]);
// - "state": the bytes of the tensors that hold the training state, summed
//   after the run: model->parameters() (FSDP: this rank's shards), their
//   gradients and AdamW's exp_avg / exp_avg_sq. The run ends with
//   zero_grad(), which since LibTorch 2.0 sets the gradients to undefined
//   (set_to_none), so with LibTorch 2 this is parameters + moments (3x the
//   parameters' bytes; LibTorch 1.13's zeroed gradients made it 4x).
//   bench/ddp_peer.py measures the same way. DDP's gradient buckets and
//   FSDP's gathered units are transient or internal and not counted here;
//   "largest_unit_mb" gives the size of FSDP's largest unit, in full.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/xla.h"
#include "strata/models/gpt.h"
#include "strata/models/mlp.h"
#include "strata/optim/fused.h"
#include "strata/runtime/env.h"
#include "strata/runtime/process.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"

namespace {

using Clock = std::chrono::steady_clock;

/// What to run, from the command line (the same flags as ddp_peer.py).
struct BenchConfig {
  std::string model = "gpt";  ///< "gpt" or "mlp"
  std::string size = "small"; ///< GPT preset
  int64_t seq_len = 0;         ///< GPT context (block_size); 0: the preset's
  std::string strategy = "ddp";  ///< "ddp" or "fsdp" (each GPT Block a unit)
  bool activation_checkpointing = false;  ///< FSDP: recompute each Block in backward
  bool sharded_init = false;  ///< FSDP: build the model inside module_sharded_context
  std::string overlap_backward = "auto";  ///< FSDP: FSDPOptions::overlap_backward (auto: the device's default)
  int devices = 2;
  int threads = 1;
  int64_t batch = 16;  ///< per rank
  int64_t steps = 30;  ///< timed steps
  int64_t warmup = 5;  ///< untimed steps before
  int64_t pool = 8;    ///< distinct batches, cycled
  uint64_t seed = 1234;
  double lr = 1e-3;
  std::string optimizer = "adamw";      ///< or "adamw-fused" (strata::optim::AdamW)
  std::string attention = "explicit";  ///< or "sdpa" (GPTConfig::attention)
  int64_t bucket_cap_mb = 25;
  bool phases = false;  ///< also report forward / backward / optimizer times
  int64_t memory_trace = 0;  ///< steps to trace memory phase by phase (Note [Per-phase memory trace])
  std::string impl = "strata";  ///< the "impl" field of the result (run_ddp.sh tags variants)
  std::string precision = "32-true";  ///< or "bf16-mixed": forward (and loss) under bf16 autocast

  std::string label() const {
    if (model != "gpt") return "mlp-512-2048-512";
    return "gpt-" + size + (seq_len > 0 ? "-T" + std::to_string(seq_len) : "");
  }
};

double peak_rss_mb() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

/// A "VmRSS" / "VmHWM" line of /proc/self/status, in MB (-1 if absent).
double proc_status_mb(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;  // in kB
  }
  return -1.0;
}

/// Sets VmHWM back to the current RSS; false where the kernel refuses.
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

// Note [Per-phase memory trace]
// With --memory-trace N, every rank records at each phase boundary of the
// first N steps (after forward, backward, optimizer step, zero_grad):
// - "rss": VmRSS at the boundary;
// - "peak": VmHWM since the previous boundary (the mark is reset to the
//   current RSS at each boundary), so the largest transient of the phase;
// - "heap_in_use": bytes malloc has handed out and not yet had back
//   (mallinfo2: arena in use + mmapped blocks): live tensors and everything
//   else allocated;
// - "heap_free": bytes freed into malloc's arenas and kept there. Pages of
//   it that were touched stay in RSS until glibc trims them;
// - "pool_in_use", "pool_committed": under the tensor pool (STRATA_HEAP
//   unset or pool, Note [The tensor pool]), the bytes of the live tensors
//   it serves and the bytes it holds from the kernel; malloc's figures then
//   leave tensors out;
// - "fsdp_held", "fsdp_idle": of heap_in_use, FSDP's buffer cache, all of
//   it and what waits for the units' next gathers and reductions
//   (FSDPStrategy::buffer_bytes).
// The gap between rss and heap_in_use is kept heap plus the libraries'
// own memory; the gap between peak and rss is the phase's transients.
struct MemoryTrace {
  int64_t steps = 0;
  nlohmann::json rows = nlohmann::json::array();
  double max_peak = 0.0;  ///< VmHWM over the traced phases (each mark resets it)

  void mark(int64_t step, const char* phase) {
    if (step >= steps) return;
    struct mallinfo2 info = ::mallinfo2();
    constexpr double mb = 1024.0 * 1024.0;
    const double peak = proc_status_mb("VmHWM");
    const auto fsdp_buffers = strata::strategies::FSDPStrategy::buffer_bytes();
    const auto pool = strata::runtime::tensor_heap_stats();
    max_peak = std::max(max_peak, peak);
    rows.push_back({{"step", step},
                    {"phase", phase},
                    {"rss", proc_status_mb("VmRSS")},
                    {"peak", peak},
                    {"heap_in_use", static_cast<double>(info.uordblks + info.hblkhd) / mb},
                    {"heap_free", static_cast<double>(info.fordblks) / mb},
                    {"pool_in_use", static_cast<double>(pool.in_use) / mb},
                    {"pool_committed", static_cast<double>(pool.committed) / mb},
                    {"fsdp_held", static_cast<double>(fsdp_buffers.held) / mb},
                    {"fsdp_idle", static_cast<double>(fsdp_buffers.idle) / mb}});
    reset_peak_rss();
  }
};

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

/// Parameters, their gradients and AdamW's moments, in bytes (Note [Memory figures]).
int64_t training_state_bytes(torch::nn::Module& module, torch::optim::AdamW& optimizer) {
  int64_t total = 0;
  for (const at::Tensor& p : module.parameters()) total += bytes_of(p) + bytes_of(p.grad());
  for (const auto& item : optimizer.state()) {
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*item.second);
    total += bytes_of(state.exp_avg()) + bytes_of(state.exp_avg_sq()) + bytes_of(state.max_exp_avg_sq());
  }
  return total;
}

/// Elements of the model's parameters in full (FSDP's module holds shards).
int64_t full_numel(torch::nn::Module& module, const strata::strategies::FSDPStrategy* fsdp) {
  int64_t total = 0;
  if (fsdp) {
    for (const auto& unit : fsdp->units()) total += unit.numel;
  } else {
    for (const at::Tensor& p : module.parameters()) total += p.numel();
  }
  return total;
}

bool on_xla(const BenchConfig& c) { return c.strategy.rfind("xla", 0) == 0; }

std::shared_ptr<strata::strategies::Strategy> make_strategy(const BenchConfig& c) {
  using namespace strata::strategies;
  // Note [The xla strategies in the benchmark]: xla and xla_fsdp run the
  // same code on the xla devices of the PJRT plugin, one process whose
  // ranks are threads; each step ends with mark_step (the compiled step
  // runs there, inside the timed region).
  std::shared_ptr<Accelerator> accelerator = on_xla(c) ? make_accelerator("xla") : cpu_accelerator();
  Precision precision = Precision::parse(c.precision, accelerator->name());
  DDPOptions ddp = DDPOptions().with_bucket_cap_mb(c.bucket_cap_mb);
  if (c.strategy == "ddp") return std::make_shared<DDPStrategy>(accelerator, precision, ddp);
  if (c.strategy == "xla") return std::make_shared<XlaStrategy>(accelerator, precision, ddp);
  FSDPOptions options;
  options.with_auto_wrap_policy(ModuleTypes{"Block"});
  if (c.activation_checkpointing) options.with_activation_checkpointing_policy({"Block"});
  if (c.overlap_backward != "auto") options.with_overlap_backward(c.overlap_backward == "on");
  if (c.strategy == "xla_fsdp") return std::make_shared<XlaFSDPStrategy>(accelerator, precision, options);
  return std::make_shared<FSDPStrategy>(accelerator, precision, options);
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
  const double baseline_mb = proc_status_mb("VmRSS");
  auto* fsdp = dynamic_cast<strata::strategies::FSDPStrategy*>(&fabric.strategy());

  // The batches: see Note [Same data and initial weights as the peer].
  at::Generator gen = at::detail::createCPUGenerator(c.seed);
  std::vector<at::Tensor> inputs, targets;
  int64_t seq_len = 0;
  strata::models::GPT gpt{nullptr};
  strata::models::MLP mlp{nullptr};
  if (c.model == "gpt") {
    strata::models::GPTConfig config = strata::models::GPTConfig::preset(c.size);
    if (c.seq_len > 0) config.block_size = c.seq_len;
    config.attention = c.attention;
    seq_len = config.block_size;
    at::Tensor pool = at::randint(0, config.vocab_size, {c.pool, world * c.batch, seq_len + 1}, gen, at::kLong);
    for (int64_t i = 0; i < c.pool; ++i) {
      at::Tensor mine = pool[i].narrow(0, rank * c.batch, c.batch);
      inputs.push_back(mine.narrow(1, 0, seq_len).contiguous());
      targets.push_back(mine.narrow(1, 1, seq_len).contiguous());
    }
    strata::Fabric::seed_everything(c.seed);
    if (c.sharded_init) {
      // Each Block is sharded as soon as it is built (other initial values
      // than a plain build: Note [Sharded construction] in gpt.cpp).
      strata::strategies::Scope sharded = fsdp->module_sharded_context();
      gpt = strata::models::GPT(config);
    } else {
      gpt = strata::models::GPT(config);
    }
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
  const double setup_peak_mb = proc_status_mb("VmHWM");
  const double setup_maxrss_mb = peak_rss_mb();  // the reset below also resets ru_maxrss
  const bool hwm_reset = reset_peak_rss();
  // --optimizer adamw-fused: strata::optim::AdamW (ATen's fused kernel),
  // as the peers' --fused.
  const auto adamw_options = torch::optim::AdamWOptions(c.lr).weight_decay(0.01);
  std::unique_ptr<torch::optim::AdamW> optimizer_holder =
      c.optimizer == "adamw-fused"
          ? std::make_unique<strata::optim::AdamW>(module.parameters(), adamw_options)
          : std::make_unique<torch::optim::AdamW>(module.parameters(), adamw_options);
  torch::optim::AdamW& optimizer = *optimizer_holder;
  fabric.setup_optimizer(optimizer);

  auto loss_of = [&](int64_t i) {
    auto autocast = fabric.autocast();  // bf16-mixed: forward and loss under autocast, as the peers
    const at::Tensor x = inputs[i % c.pool].to(fabric.device());
    const at::Tensor y = targets[i % c.pool].to(fabric.device());
    return gpt ? gpt->loss(x, y) : torch::nn::functional::mse_loss(mlp->forward(x), y);
  };

  std::vector<double> step_ms, fwd_ms, bwd_ms, opt_ms;
  double last_loss = 0.0;
  MemoryTrace trace{c.memory_trace};
  trace.mark(0, "start");
  for (int64_t i = 0; i < c.warmup + c.steps; ++i) {
    if (i == c.warmup) fabric.barrier("timed steps");
    auto start = Clock::now();
    at::Tensor loss = loss_of(i);
    double t_fwd = ms_since(start);
    trace.mark(i, "forward");
    fabric.backward(loss);
    double t_bwd = ms_since(start);
    trace.mark(i, "backward");
    fabric.strategy().optimizer_step(optimizer);
    trace.mark(i, "optimizer_step");
    optimizer.zero_grad();
    fabric.strategy().mark_step();  // on xla: the step runs here
    double t_all = ms_since(start);
    trace.mark(i, "zero_grad");
    last_loss = loss.item<double>();
    if (i >= c.warmup) {
      step_ms.push_back(t_all);
      fwd_ms.push_back(t_fwd);
      bwd_ms.push_back(t_bwd - t_fwd);
      opt_ms.push_back(t_all - t_bwd);
    }
  }

  step_ms = slowest_rank(fabric, step_ms);
  const double maxrss_mb = std::max(setup_maxrss_mb, peak_rss_mb());
  at::Tensor rss = fabric.all_gather(at::full({1}, maxrss_mb, at::kDouble)).reshape({-1});
  const double state_mb = static_cast<double>(training_state_bytes(module, optimizer)) / (1024.0 * 1024.0);
  at::Tensor mine = at::tensor({baseline_mb, setup_peak_mb, std::max(proc_status_mb("VmHWM"), trace.max_peak), state_mb}, at::kDouble);
  at::Tensor memory = fabric.all_gather(mine).reshape({world, -1}).t().contiguous();
  auto per_rank = [&](int64_t i) {
    return std::vector<double>(memory[i].data_ptr<double>(), memory[i].data_ptr<double>() + world);
  };
  double loss_after_k = fabric.all_reduce(at::full({}, last_loss, at::kDouble), "mean").item<double>();

  const double step_s = median(step_ms) / 1000.0;
  nlohmann::json out = {{"impl", c.impl},
                        {"strategy", c.strategy + (c.activation_checkpointing ? "+ac" : "")},
                        {"init", c.sharded_init ? "sharded" : "plain"},
                        {"overlap_backward", c.overlap_backward},
                        {"precision", fabric.strategy().precision().name()},
                        {"optimizer", c.optimizer},
                        {"attention", c.attention},
                        {"model", c.label()},
                        {"params", full_numel(module, fsdp)},
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
  out["memory"] = {{"baseline", per_rank(0)}, {"setup_peak", per_rank(1)}, {"train_peak", per_rank(2)},
                   {"state", per_rank(3)}, {"hwm_reset", hwm_reset}};
  if (fsdp) {
    int64_t largest = 0;
    for (const auto& unit : fsdp->units()) largest = std::max(largest, unit.numel);
    out["largest_unit_mb"] = static_cast<double>(largest) * 4.0 / (1024.0 * 1024.0);
  }
  if (c.memory_trace > 0) out["memory_trace_rank0"] = trace.rows;  // rank 0's (Note [Per-phase memory trace])
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
  CLI::App app{"strata data-parallel benchmark: trains a model with DDPStrategy or FSDPStrategy and prints one JSON "
               "line of timings and memory"};
  app.add_option("--model", c.model, "gpt or mlp (512-2048-512)")->check(CLI::IsMember({"gpt", "mlp"}))->capture_default_str();
  app.add_option("--size", c.size, "GPT preset: tiny, small, medium, large")->capture_default_str();
  app.add_option("--seq-len", c.seq_len, "GPT context length (block_size); 0: the preset's")->capture_default_str();
  app.add_option("--strategy", c.strategy,
                 "ddp, fsdp (each GPT Block a unit), or xla / xla_fsdp (the same on the xla devices of the PJRT "
                 "plugin, one process)")
      ->check(CLI::IsMember({"ddp", "fsdp", "xla", "xla_fsdp"}))
      ->capture_default_str();
  app.add_flag("--activation-checkpointing", c.activation_checkpointing, "FSDP: recompute each Block in backward");
  app.add_flag("--sharded-init", c.sharded_init, "FSDP: build the model inside module_sharded_context");
  app.add_option("--overlap-backward", c.overlap_backward,
                 "FSDP: on (prefetch in backward, one reduce-scatter in flight), off (in order), or auto (off on CPU "
                 "workers, on elsewhere)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--devices", c.devices, "Workers to launch (ignored under strata launch)")->capture_default_str();
  app.add_option("--threads", c.threads, "Intra-op threads per rank")->capture_default_str();
  app.add_option("--batch", c.batch, "Batch per rank")->capture_default_str();
  app.add_option("--steps", c.steps, "Timed steps")->capture_default_str();
  app.add_option("--warmup", c.warmup, "Untimed steps before the timed ones")->capture_default_str();
  app.add_option("--pool", c.pool, "Distinct random batches, cycled")->capture_default_str();
  app.add_option("--seed", c.seed, "Seed of the data and the initial weights")->capture_default_str();
  app.add_option("--lr", c.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "adamw (torch::optim's loop) or adamw-fused (strata::optim::AdamW)")
      ->check(CLI::IsMember({"adamw", "adamw-fused"}))
      ->capture_default_str();
  app.add_option("--attention", c.attention, "GPT attention: explicit or sdpa")
      ->check(CLI::IsMember({"explicit", "sdpa"}))
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", c.bucket_cap_mb, "DDP gradient bucket size")->capture_default_str();
  app.add_option("--precision", c.precision, "32-true, or bf16-mixed (fp32 weights, forward under bf16 autocast)")
      ->check(CLI::IsMember({"32-true", "bf16-mixed"}))
      ->capture_default_str();
  app.add_option("--impl-label", c.impl, "The \"impl\" field of the result")->capture_default_str();
  app.add_option("--memory-trace", c.memory_trace,
                 "Record RSS, peak and malloc's heap at each phase of the first N steps (times include it)")
      ->capture_default_str();
  app.add_flag("--phases", c.phases, "Also report forward / backward / optimizer medians of rank 0");
  CLI11_PARSE(app, argc, argv);

  try {
    STRATA_CHECK(c.threads >= 1 && c.batch >= 1 && c.steps >= 1 && c.warmup >= 0 && c.pool >= 1,
                 ConfigError, "[bench] --threads, --batch, --steps and --pool must be >= 1, --warmup >= 0");
    STRATA_CHECK(c.strategy == "fsdp" || c.strategy == "xla_fsdp" ||
                     (!c.activation_checkpointing && !c.sharded_init && c.overlap_backward == "auto"),
                 ConfigError,
                 "[bench] --activation-checkpointing, --sharded-init and --overlap-backward need --strategy fsdp (got "
                 "--strategy ", c.strategy, ")");
    strata::FabricOptions options = strata::FabricOptions().with_devices(c.devices).with_strategy(make_strategy(c));
    if (on_xla(c)) options.with_accelerator("xla");
    strata::Fabric fabric(options);
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
