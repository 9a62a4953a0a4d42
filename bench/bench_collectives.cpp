// Collectives micro-benchmark: one strata backend (--backend: auto, which
// is shm on one host, or gloo) on N local ranks (default 2), all_reduce,
// all_gather and reduce_scatter of float32 buffers from 1 KB to 64 MB, one
// thread per rank, through the synchronous calls a training loop makes.
// Started plainly it launches N copies of itself through strata's
// launcher; each size is timed over a fixed number of iterations (the same
// plan as bench/collectives_peer.py) and the slowest rank's time counts.
// Rank 0 prints CSV lines "strata-<backend>,op,bytes,seconds_per_iter" for
// bench/run_collectives.sh.
//
// Sizes follow the NCCL-tests convention: for all_reduce the buffer each
// rank holds, for all_gather the gathered output, for reduce_scatter the
// input each rank holds.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "strata/comm/group.h"
#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"

namespace {

using strata::comm::Group;
using strata::comm::ReduceOp;

constexpr int64_t kMinBytes = 1 << 10;
constexpr int64_t kMaxBytes = 64 << 20;

/// Iterations for a size: many for small buffers, at least 4 for large
/// ones (collectives_peer.py uses the same rule).
int iterations(int64_t bytes) { return static_cast<int>(std::max<int64_t>(4, std::min<int64_t>(1000, (256 << 20) / bytes))); }

double time_op(Group& g, const std::string& op, int64_t bytes) {
  const int n = g.size();
  const int64_t elems = bytes / 4;
  at::Tensor full = at::ones({elems}, at::kFloat);
  at::Tensor piece = at::ones({elems / n}, at::kFloat);
  auto run = [&] {
    if (op == "all_reduce") g.all_reduce(full, ReduceOp::kSum);
    else if (op == "all_gather") g.all_gather(piece, full);
    else g.reduce_scatter(full, piece, ReduceOp::kSum);
  };
  run();  // warm-up (connections, buffers)
  run();
  const int iters = iterations(bytes);
  g.barrier("bench");
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) run();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  at::Tensor slowest = at::full({1}, seconds, at::kDouble);
  g.all_reduce(slowest, ReduceOp::kMax);
  return slowest.item<double>();
}

/// "a,b,c" -> {"a", "b", "c"}.
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

int worker(const std::string& backend, const std::vector<std::string>& ops, const std::vector<int64_t>& sizes) {
  at::set_num_threads(1);
  strata::runtime::Environment env = strata::runtime::Environment::from_env();
  strata::comm::ProcessGroupOptions options;
  options.backend = backend;
  options.group.with_timeout(std::chrono::minutes(5));
  Group g = strata::comm::init_process_group(env, options);
  for (const std::string& op : ops) {
    for (int64_t bytes : sizes) {
      double s = time_op(g, op, bytes);
      if (g.rank() == 0) {
        std::printf("strata-%s,%s,%lld,%.9f\n", g.backend_name().c_str(), op.c_str(), static_cast<long long>(bytes), s);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    // Arguments: [-n RANKS] [--backend auto|shm|gloo] [--ops a,b] [--sizes BYTES,BYTES]
    // (default: auto, all ops, 1 KB..64 MB).
    int nproc = 2;
    std::string backend = "auto";
    std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter"};
    std::vector<int64_t> sizes;
    for (int64_t b = kMinBytes; b <= kMaxBytes; b *= 4) sizes.push_back(b);
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "-n") nproc = std::stoi(argv[i + 1]);
      else if (flag == "--backend") backend = argv[i + 1];
      else if (flag == "--ops") ops = split(argv[i + 1]);
      else if (flag == "--sizes") {
        sizes.clear();
        for (const std::string& s : split(argv[i + 1])) sizes.push_back(std::stoll(s));
      } else {
        throw strata::ConfigError("[bench] unknown argument " + flag + "; use -n, --backend, --ops, --sizes");
      }
    }
    if (std::getenv("WORLD_SIZE") != nullptr) return worker(backend, ops, sizes);
    strata::runtime::LaunchOptions options;
    options.with_nproc_per_node(nproc).with_prefix_output(false).with_timeout_s(60);
    options.extra_env["OMP_NUM_THREADS"] = "1";
    strata::runtime::LaunchResult result =
        strata::runtime::launch_workers(strata::runtime::current_command_line(), options);
    if (result.exit_code != 0) std::cerr << "bench_collectives: " << result.summary << "\n";
    return result.exit_code;
  } catch (const std::exception& e) {
    std::cerr << "bench_collectives: " << e.what() << "\n";
    return 1;
  }
}
