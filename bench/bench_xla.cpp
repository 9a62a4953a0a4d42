// One xla device beside LibTorch eager: the example GPT trained with AdamW
// and clip_grad_norm_ on `xla:0` (the PJRT plugin strata::xla::find_plugin()
// picks: the CPU plugin of the project's environment, or STRATA_PJRT_PLUGIN)
// and on an eager LibTorch device (--eager-device cpu, or cuda with a CUDA
// LibTorch), from the same initial weights and batches, in one process.
// The two sides take turns step by step (the first side alternates), so a
// noisy machine slows both alike. bench/run_xla.sh runs it;
// docs/benchmarks.md, "One xla device (CPU plugin) beside LibTorch eager",
// has the figures and where the time goes.
//
// Prints a table (and with --json FILE one JSON object): the median step
// time after the first two steps on each side and their ratio, steps 0 and
// 1 (the compiles), and for xla the split of a step from
// strata::xla::metrics() (Note [Where an xla step's time is counted]).
//
// Note [What an xla step is]
// zero_grad, forward and loss, backward, clip_grad_norm_ (which returns
// the norm as a double: its .item() runs the recorded forward, backward
// and clipping as one program), AdamW's step, then mark_step() (a second
// program: the optimizer), then the loss read on the host. The eager step
// is the same calls without the mark; its loss read (and, on cuda, a
// device synchronize) ends the step, so both step times cover the work
// finished, not just queued.
//
// Note [Where an xla step's time is counted]
// Per step, from the difference of metrics() around it: trace (the lowered
// kernels recording nodes, their meta-tensor shape inference included,
// and emitting each program's text), compile, execute (running programs,
// host scalars fed included) and transfer (uploads and downloads of
// storages). "rest" is the step's wall time minus those four: LibTorch's
// dispatcher and autograd engine around the kernels, the optimizer's and
// clipping's per-parameter loops, the executor's cache lookup of the
// program text, and binding results to storages.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <dlfcn.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/models/gpt.h"
#include "strata/optim/fused.h"
#include "strata/runtime/process.h"
#include "strata/xla_device/device.h"

namespace {

using Clock = std::chrono::steady_clock;

/// What to run, from the command line.
struct BenchConfig {
  std::string size = "small";        ///< GPT preset
  int64_t seq_len = 0;               ///< context (block_size); 0: the preset's
  int64_t batch = 16;
  int64_t steps = 30;                ///< steps per side; the median skips the first two
  int64_t pool = 4;                  ///< distinct random batches, cycled
  uint64_t seed = 1234;
  double lr = 1e-3;
  double clip = 1.0;                 ///< max gradient norm
  int threads = 0;                   ///< LibTorch intra-op threads; 0: LibTorch's default
  std::string eager_device = "cpu";  ///< "cpu", or "cuda" with a CUDA LibTorch
  std::string sides = "both";        ///< "both", "xla" or "eager" (one side alone, for a profiler)
  std::string optimizer = "loop";    ///< "loop": torch::optim::AdamW; "fused": strata::optim::AdamW
  std::string json;                  ///< file for the JSON result; empty: none
};

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

std::string cpu_model() {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

std::string load_average() {
  std::ifstream load("/proc/loadavg");
  std::string one, five, fifteen;
  load >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

/// The malloc calls counted so far (main thread's, or all threads'), where
/// bench/malloc_count.cc is preloaded and serves malloc; -1 otherwise.
int64_t mallocs(bool main_only) {
  using Count = long (*)(int);
  static const auto count = reinterpret_cast<Count>(::dlsym(RTLD_DEFAULT, "strata_bench_malloc_count"));
  if (count == nullptr) return -1;
  const long n = count(main_only ? 1 : 0);
  return n > 0 ? n : -1;  // none counted: another preloaded malloc serves the process
}

/// What strata::xla::metrics() counted during one step (Note [Where an xla
/// step's time is counted]).
struct XlaStep {
  double ms = 0;
  double trace_ms = 0, compile_ms = 0, execute_ms = 0, transfer_ms = 0;
  double emit_ms = 0, lookup_ms = 0;  ///< of trace_ms, the programs' text; the compile cache's lookup
  int64_t h2d_bytes = 0, d2h_bytes = 0, h2d_count = 0, d2h_count = 0;
  int64_t executions = 0, compiles = 0, cache_hits = 0, fallbacks = 0;
  int64_t nodes_recorded = 0, nodes_executed = 0;
  double first_execute_ms = 0;  ///< of execute_ms, the program clipping's .item() ran
  int64_t minor_faults = 0;     ///< the process's minor page faults during the step (getrusage)
  int64_t mallocs_main = -1, mallocs_all = -1;  ///< malloc calls, with bench/malloc_count.cc preloaded

  double rest_ms() const { return ms - trace_ms - lookup_ms - compile_ms - execute_ms - transfer_ms; }
  /// The host's own time: recording, emitting, the lookup and the rest
  /// (what a faster device would not shorten).
  double host_ms() const { return ms - compile_ms - execute_ms - transfer_ms; }
};

XlaStep difference(const strata::xla::Metrics& after, const strata::xla::Metrics& before, double ms) {
  XlaStep s;
  s.ms = ms;
  s.trace_ms = 1e3 * (after.trace_seconds - before.trace_seconds);
  s.emit_ms = 1e3 * (after.emit_seconds - before.emit_seconds);
  s.lookup_ms = 1e3 * (after.lookup_seconds - before.lookup_seconds);
  s.compile_ms = 1e3 * (after.compile_seconds - before.compile_seconds);
  s.execute_ms = 1e3 * (after.execute_seconds - before.execute_seconds);
  s.transfer_ms = 1e3 * (after.transfer_seconds - before.transfer_seconds);
  s.h2d_bytes = after.host_to_device_bytes - before.host_to_device_bytes;
  s.d2h_bytes = after.device_to_host_bytes - before.device_to_host_bytes;
  s.h2d_count = after.host_to_device_count - before.host_to_device_count;
  s.d2h_count = after.device_to_host_count - before.device_to_host_count;
  s.executions = after.executions - before.executions;
  s.compiles = after.compiles - before.compiles;
  s.cache_hits = after.cache_hits - before.cache_hits;
  s.fallbacks = after.fallback_calls() - before.fallback_calls();
  s.nodes_recorded = after.nodes_recorded - before.nodes_recorded;
  s.nodes_executed = after.nodes_executed - before.nodes_executed;
  return s;
}

/// One side's model, optimizer and record of its steps.
struct Side {
  std::string name;
  c10::Device device;
  strata::models::GPT model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<double> step_ms, losses, norms;
  std::vector<double> to_clip_ms;  ///< from the step's start to clip_grad_norm_'s return
  /// xla: execute time up to clipping (the first program); the rest is the second.
  std::vector<double> to_clip_execute_ms;
};

/// One training step (Note [What an xla step is]).
void train_step(Side& side, const at::Tensor& x, const at::Tensor& y, double clip) {
  const bool xla = side.device.type() == c10::DeviceType::PrivateUse1;
  const auto start = Clock::now();
  side.optimizer->zero_grad();
  at::Tensor loss = side.model->loss(x.to(side.device), y.to(side.device));
  loss.backward();
  const double norm = torch::nn::utils::clip_grad_norm_(side.model->parameters(), clip);
  side.to_clip_ms.push_back(ms_since(start));
  if (xla) side.to_clip_execute_ms.push_back(1e3 * strata::xla::metrics().execute_seconds);
  side.optimizer->step();
  if (xla) strata::xla::mark_step();
  const double value = loss.item<double>();
  if (side.device.is_cuda()) torch::cuda::synchronize();
  side.step_ms.push_back(ms_since(start));
  side.losses.push_back(value);
  side.norms.push_back(norm);
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

/// The steps after the first two (the timed ones).
template <class T>
std::vector<T> timed(const std::vector<T>& v) {
  return v.size() > 2 ? std::vector<T>(v.begin() + 2, v.end()) : std::vector<T>{};
}

template <class F>
double mean_of(const std::vector<XlaStep>& steps, F&& field) {
  std::vector<double> v;
  for (const XlaStep& s : steps) v.push_back(static_cast<double>(field(s)));
  return mean(v);
}

nlohmann::json run(const BenchConfig& c) {
  const std::string load_before = load_average();
  if (c.threads > 0) at::set_num_threads(c.threads);
  const bool run_xla = c.sides != "eager", run_eager = c.sides != "xla";
  // Before any backward (docs/xla.md): autograd counts each device's threads once.
  if (run_xla) strata::xla::init();
  const std::string plugin = run_xla ? strata::xla::find_plugin().path : "";

  strata::models::GPTConfig config = strata::models::GPTConfig::preset(c.size);
  if (c.seq_len > 0) config.block_size = c.seq_len;
  at::Generator gen = at::detail::createCPUGenerator(c.seed);
  at::Tensor pool = at::randint(0, config.vocab_size, {c.pool, c.batch, config.block_size + 1}, gen, at::kLong);
  std::vector<at::Tensor> xs, ys;
  for (int64_t i = 0; i < c.pool; ++i) {
    xs.push_back(pool[i].narrow(1, 0, config.block_size).contiguous());
    ys.push_back(pool[i].narrow(1, 1, config.block_size).contiguous());
  }

  // The same initial weights on both sides: one model built after the
  // seed, copied into the other before either moves.
  torch::manual_seed(c.seed);
  strata::models::GPT reference(config);
  const int64_t params = reference->num_parameters();
  std::vector<Side> sides;
  if (run_eager) sides.push_back(Side{"eager", c10::Device(c.eager_device)});
  if (run_xla) sides.push_back(Side{"xla", strata::xla::device(0)});
  for (Side& side : sides) {
    side.model = strata::models::GPT(config);
    {
      torch::NoGradGuard no_grad;
      auto from = reference->parameters();
      auto to = side.model->parameters();
      for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    }
    side.model->to(side.device);
    const auto options = torch::optim::AdamWOptions(c.lr).weight_decay(0.1);
    if (c.optimizer == "fused") {
      side.optimizer = std::make_unique<strata::optim::AdamW>(side.model->parameters(), options);
    } else {
      side.optimizer = std::make_unique<torch::optim::AdamW>(side.model->parameters(), options);
    }
  }
  if (run_xla) {
    strata::xla::mark_step();  // the weights' upload is not step 0's
    strata::xla::reset_metrics();
  }

  std::vector<XlaStep> xla_steps;
  std::vector<std::string> compile_reasons;
  for (int64_t step = 0; step < c.steps; ++step) {
    const at::Tensor& x = xs[step % c.pool];
    const at::Tensor& y = ys[step % c.pool];
    // Alternate which side goes first.
    for (size_t k = 0; k < sides.size(); ++k) {
      Side& side = sides[(k + static_cast<size_t>(step)) % sides.size()];
      if (side.name != "xla") {
        train_step(side, x, y, c.clip);
        continue;
      }
      const strata::xla::Metrics before = strata::xla::metrics();
      const int64_t faults_before = minor_faults();
      const int64_t main_before = mallocs(true), all_before = mallocs(false);
      train_step(side, x, y, c.clip);
      const strata::xla::Metrics after = strata::xla::metrics();
      xla_steps.push_back(difference(after, before, side.step_ms.back()));
      xla_steps.back().minor_faults = minor_faults() - faults_before;
      if (main_before >= 0) {
        xla_steps.back().mallocs_main = mallocs(true) - main_before;
        xla_steps.back().mallocs_all = mallocs(false) - all_before;
      }
      xla_steps.back().first_execute_ms = side.to_clip_execute_ms.back() - 1e3 * before.execute_seconds;
      if (step < 2) compile_reasons = after.compile_reasons;
    }
  }

  nlohmann::json out = {{"model", "gpt-" + c.size},
                        {"params", params},
                        {"batch", c.batch},
                        {"seq_len", config.block_size},
                        {"steps", c.steps},
                        {"clip", c.clip},
                        {"optimizer", c.optimizer},
                        {"lr", c.lr},
                        {"cpu", cpu_model()},
                        {"malloc", strata::runtime::process_malloc()},
                        {"torch_threads", at::get_num_threads()},
                        {"load_before", load_before},
                        {"load_after", load_average()},
                        {"xla_flags", std::getenv("XLA_FLAGS") ? std::getenv("XLA_FLAGS") : ""},
                        {"plugin", plugin}};
  for (const Side& side : sides) {
    std::vector<double> after_clip;
    for (size_t i = 0; i < side.step_ms.size(); ++i) after_clip.push_back(side.step_ms[i] - side.to_clip_ms[i]);
    out[side.name] = {{"device", side.device.str()},
                      {"step_ms_median", median(timed(side.step_ms))},
                      {"to_clip_ms_median", median(timed(side.to_clip_ms))},
                      {"after_clip_ms_median", median(timed(after_clip))},
                      {"step_ms", side.step_ms},
                      {"loss", side.losses},
                      {"grad_norm", side.norms}};
  }
  if (run_xla) {
    const std::vector<XlaStep> t = timed(xla_steps);
    nlohmann::json& x = out["xla"];
    x["compile_ms_steps_0_1"] = {xla_steps[0].compile_ms, xla_steps.size() > 1 ? xla_steps[1].compile_ms : 0.0};
    x["compiles_steps_0_1"] = xla_steps[0].compiles + (xla_steps.size() > 1 ? xla_steps[1].compiles : 0);
    int64_t late_compiles = 0, fallbacks = 0;
    for (const XlaStep& s : t) late_compiles += s.compiles;
    for (const XlaStep& s : xla_steps) fallbacks += s.fallbacks;
    x["compiles_after_warmup"] = late_compiles;
    x["fallback_calls"] = fallbacks;
    nlohmann::json by_op = nlohmann::json::object();
    for (const auto& [op, n] : strata::xla::metrics().fallbacks) by_op[op] = n;
    x["fallbacks"] = by_op;
    x["compile_reasons"] = compile_reasons;
    // Means over the timed steps, so the parts add up to the mean step.
    x["per_timed_step_mean"] = {
        {"step_ms", mean_of(t, [](const XlaStep& s) { return s.ms; })},
        {"trace_ms", mean_of(t, [](const XlaStep& s) { return s.trace_ms; })},
        {"record_ms", mean_of(t, [](const XlaStep& s) { return s.trace_ms - s.emit_ms; })},
        {"emit_ms", mean_of(t, [](const XlaStep& s) { return s.emit_ms; })},
        {"lookup_ms", mean_of(t, [](const XlaStep& s) { return s.lookup_ms; })},
        {"host_ms", mean_of(t, [](const XlaStep& s) { return s.host_ms(); })},
        {"compile_ms", mean_of(t, [](const XlaStep& s) { return s.compile_ms; })},
        {"execute_ms", mean_of(t, [](const XlaStep& s) { return s.execute_ms; })},
        {"first_program_execute_ms", mean_of(t, [](const XlaStep& s) { return s.first_execute_ms; })},
        {"second_program_execute_ms",
         mean_of(t, [](const XlaStep& s) { return s.execute_ms - s.first_execute_ms; })},
        {"transfer_ms", mean_of(t, [](const XlaStep& s) { return s.transfer_ms; })},
        {"rest_ms", mean_of(t, [](const XlaStep& s) { return s.rest_ms(); })},
        {"host_to_device_bytes", mean_of(t, [](const XlaStep& s) { return s.h2d_bytes; })},
        {"device_to_host_bytes", mean_of(t, [](const XlaStep& s) { return s.d2h_bytes; })},
        {"host_to_device_count", mean_of(t, [](const XlaStep& s) { return s.h2d_count; })},
        {"device_to_host_count", mean_of(t, [](const XlaStep& s) { return s.d2h_count; })},
        {"executions", mean_of(t, [](const XlaStep& s) { return s.executions; })},
        {"nodes_recorded", mean_of(t, [](const XlaStep& s) { return s.nodes_recorded; })},
        {"nodes_executed", mean_of(t, [](const XlaStep& s) { return s.nodes_executed; })},
        {"minor_page_faults", mean_of(t, [](const XlaStep& s) { return s.minor_faults; })},
        {"mallocs_main_thread", mean_of(t, [](const XlaStep& s) { return s.mallocs_main; })},
        {"mallocs_all_threads", mean_of(t, [](const XlaStep& s) { return s.mallocs_all; })}};
    nlohmann::json rows = nlohmann::json::array();
    for (const XlaStep& s : xla_steps) {
      rows.push_back({{"ms", s.ms}, {"trace_ms", s.trace_ms}, {"compile_ms", s.compile_ms},
                      {"execute_ms", s.execute_ms}, {"transfer_ms", s.transfer_ms}, {"executions", s.executions},
                      {"compiles", s.compiles}, {"fallbacks", s.fallbacks}});
    }
    x["per_step"] = rows;
  }
  if (run_xla && run_eager) {
    out["ratio_xla_over_eager"] = out["xla"]["step_ms_median"].get<double>() /
                                  out["eager"]["step_ms_median"].get<double>();
    const Side& e = sides[0];
    const Side& x = sides[1];
    out["loss_relative_difference"] = {{"first", relative(x.losses.front(), e.losses.front())},
                                       {"last", relative(x.losses.back(), e.losses.back())}};
  }
  return out;
}

void print_table(const nlohmann::json& r) {
  const bool both = r.contains("ratio_xla_over_eager");
  std::printf("model %s (%lld parameters), batch %lld x %lld tokens, %lld steps, AdamW (%s) + clip_grad_norm_(%g)\n",
              r["model"].get<std::string>().c_str(), static_cast<long long>(r["params"].get<int64_t>()),
              static_cast<long long>(r["batch"].get<int64_t>()), static_cast<long long>(r["seq_len"].get<int64_t>()),
              static_cast<long long>(r["steps"].get<int64_t>()), r["optimizer"].get<std::string>().c_str(),
              r["clip"].get<double>());
  std::printf("cpu: %s; torch threads %d; malloc %s; load average before %s, after %s\n",
              r["cpu"].get<std::string>().c_str(), r["torch_threads"].get<int>(),
              r["malloc"].get<std::string>().c_str(), r["load_before"].get<std::string>().c_str(),
              r["load_after"].get<std::string>().c_str());
  if (r.contains("xla")) {
    std::printf("plugin: %s; XLA_FLAGS: %s\n", r["plugin"].get<std::string>().c_str(),
                r["xla_flags"].get<std::string>().c_str());
  }
  std::printf("\n| | step ms (median, steps 2..%lld) | step 0 ms | step 1 ms | loss step 0 | loss last |\n",
              static_cast<long long>(r["steps"].get<int64_t>() - 1));
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (const char* name : {"eager", "xla"}) {
    if (!r.contains(name)) continue;
    const auto& s = r[name];
    const auto& ms = s["step_ms"];
    std::printf("| %s (%s) | %.1f | %.1f | %.1f | %.6f | %.6f |\n", name, s["device"].get<std::string>().c_str(),
                s["step_ms_median"].get<double>(), ms[0].get<double>(), ms.size() > 1 ? ms[1].get<double>() : 0.0,
                s["loss"].front().get<double>(), s["loss"].back().get<double>());
  }
  if (both) {
    std::printf("\nxla / eager step time: %.2fx; loss relative difference: step 0 %.2g, last %.2g\n",
                r["ratio_xla_over_eager"].get<double>(), r["loss_relative_difference"]["first"].get<double>(),
                r["loss_relative_difference"]["last"].get<double>());
  }
  if (!r.contains("xla")) return;
  const auto& x = r["xla"];
  const auto& m = x["per_timed_step_mean"];
  std::printf("\nxla, compiles: steps 0-1: %lld (%.0f + %.0f ms); after step 1: %lld; fallback calls: %lld\n",
              static_cast<long long>(x["compiles_steps_0_1"].get<int64_t>()),
              x["compile_ms_steps_0_1"][0].get<double>(), x["compile_ms_steps_0_1"][1].get<double>(),
              static_cast<long long>(x["compiles_after_warmup"].get<int64_t>()),
              static_cast<long long>(x["fallback_calls"].get<int64_t>()));
  for (const auto& [op, n] : x["fallbacks"].items()) std::printf("  fallback %s: %lld\n", op.c_str(), static_cast<long long>(n.get<int64_t>()));
  const double step = m["step_ms"].get<double>();
  auto part = [&](const char* label, const char* key) {
    const double v = m[key].get<double>();
    std::printf("| %s | %.1f | %.0f%% |\n", label, v, step > 0 ? 100.0 * v / step : 0.0);
  };
  std::printf("\nxla step, mean of steps 2..%lld:\n\n| part | ms | share |\n| --- | --- | --- |\n",
              static_cast<long long>(r["steps"].get<int64_t>() - 1));
  part("record (lowered kernels)", "record_ms");
  part("emit (programs' text)", "emit_ms");
  part("compile cache lookup", "lookup_ms");
  part("rest (dispatch, autograd, loops)", "rest_ms");
  part("**host** (the four above)", "host_ms");
  part("compile", "compile_ms");
  part("execute", "execute_ms");
  part("transfer", "transfer_ms");
  part("step", "step_ms");
  std::printf("\nminor page faults per step (mean): %.0f\n", m["minor_page_faults"].get<double>());
  if (m["mallocs_main_thread"].get<double>() >= 0) {
    std::printf("mallocs per step (mean, bench/malloc_count.cc): %.0f on the main thread, %.0f in all threads\n",
                m["mallocs_main_thread"].get<double>(), m["mallocs_all_threads"].get<double>());
  }
  std::printf("\n| phase (median of steps 2..%lld) | eager ms | xla ms | xla execute ms (mean) |\n"
              "| --- | --- | --- | --- |\n",
              static_cast<long long>(r["steps"].get<int64_t>() - 1));
  auto eager_ms = [&](const char* key) { return r.contains("eager") ? r["eager"][key].get<double>() : 0.0; };
  std::printf("| forward, backward, clip_grad_norm_ (program 1) | %.1f | %.1f | %.1f |\n",
              eager_ms("to_clip_ms_median"), x["to_clip_ms_median"].get<double>(),
              m["first_program_execute_ms"].get<double>());
  std::printf("| AdamW, mark_step, loss read (program 2) | %.1f | %.1f | %.1f |\n",
              eager_ms("after_clip_ms_median"), x["after_clip_ms_median"].get<double>(),
              m["second_program_execute_ms"].get<double>());
  std::printf("\nper step: %.1f executions; %.0f nodes recorded, %.0f executed; host to device %.0f bytes in %.1f "
              "buffers, device to host %.0f bytes in %.1f buffers\n",
              m["executions"].get<double>(), m["nodes_recorded"].get<double>(), m["nodes_executed"].get<double>(),
              m["host_to_device_bytes"].get<double>(), m["host_to_device_count"].get<double>(),
              m["device_to_host_bytes"].get<double>(), m["device_to_host_count"].get<double>());
  std::printf("\n| step | xla ms | trace | compile | execute | transfer | executions | compiles |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  int step_index = 0;
  for (const auto& s : x["per_step"]) {
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.2f | %lld | %lld |\n", step_index++, s["ms"].get<double>(),
                s["trace_ms"].get<double>(), s["compile_ms"].get<double>(), s["execute_ms"].get<double>(),
                s["transfer_ms"].get<double>(), static_cast<long long>(s["executions"].get<int64_t>()),
                static_cast<long long>(s["compiles"].get<int64_t>()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    strata::runtime::apply_process_malloc();  // STRATA_MALLOC=mimalloc starts the bench again on mimalloc
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  BenchConfig c;
  CLI::App app{"The example GPT trained with AdamW and gradient clipping on one xla device (PJRT) beside a "
               "LibTorch eager device, from the same weights and batches; prints a table"};
  app.add_option("--model-size", c.size, "GPT preset: tiny, small, medium, large")->capture_default_str();
  app.add_option("--seq-len", c.seq_len, "Context length (block_size); 0: the preset's")->capture_default_str();
  app.add_option("--batch", c.batch, "Sequences per batch")->capture_default_str();
  app.add_option("--steps", c.steps, "Steps per side (at least 3; the median skips the first two)")
      ->capture_default_str();
  app.add_option("--pool", c.pool, "Distinct random batches, cycled")->capture_default_str();
  app.add_option("--seed", c.seed, "Seed of the data and the initial weights")->capture_default_str();
  app.add_option("--lr", c.lr, "AdamW learning rate (weight decay 0.1)")->capture_default_str();
  app.add_option("--clip", c.clip, "Maximum gradient norm (clip_grad_norm_)")->capture_default_str();
  app.add_option("--threads", c.threads, "LibTorch intra-op threads; 0: LibTorch's default")->capture_default_str();
  app.add_option("--eager-device", c.eager_device, "The eager side's device: cpu, or cuda with a CUDA LibTorch")
      ->capture_default_str();
  app.add_option("--sides", c.sides, "both, or one side alone: xla or eager (for a profiler)")
      ->check(CLI::IsMember({"both", "xla", "eager"}))
      ->capture_default_str();
  app.add_option("--optimizer", c.optimizer,
                 "AdamW's step: loop (torch::optim, ~10 ops a parameter) or fused (strata::optim: ATen's fused "
                 "kernel on the CPU, one graph node a group on xla)")
      ->check(CLI::IsMember({"loop", "fused"}))
      ->capture_default_str();
  app.add_option("--json", c.json, "Also write the result as one JSON object to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    STRATA_CHECK(c.steps >= 3 && c.batch >= 1 && c.pool >= 1 && c.threads >= 0 && c.clip > 0, ConfigError,
                 "[bench] --steps must be >= 3, --batch and --pool >= 1, --threads >= 0, --clip > 0 (got steps ",
                 c.steps, ", batch ", c.batch, ", pool ", c.pool, ", threads ", c.threads, ", clip ", c.clip, ")");
    const c10::Device eager(c.eager_device);
    STRATA_CHECK(eager.is_cpu() || (eager.is_cuda() && torch::cuda::is_available()), ConfigError,
                 "[bench] --eager-device ", c.eager_device,
                 ": use cpu, or cuda with a CUDA LibTorch on a machine with a GPU");
    const nlohmann::json result = run(c);
    print_table(result);
    if (!c.json.empty()) {
      std::ofstream file(c.json);
      file << result.dump(2) << "\n";
      STRATA_CHECK(static_cast<bool>(file), ConfigError, "[bench] cannot write --json ", c.json);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
