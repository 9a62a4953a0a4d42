// The machine's fp32 matmul rate, measured with LibTorch from C++: the
// denominator of the model-FLOP utilisation (MFU) in bench/run_peers.sh.
// The same measurement as bench/matmul_rate.py, which does it through the
// same libtorch_cpu from Python.
//
// Times --reps calls of at::mm_out on two n x n fp32 (--dtype bf16: bf16) matrices (after 5
// untimed ones) on --threads intra-op threads, and prints one JSON line with
// the median and best per-call rate, in GFLOP/s (2 n^3 per call). With
// --start-at EPOCH_SECONDS it waits for that wall-clock time after setting
// up, so that copies started together (one per rank) measure at the same
// time, as the ranks of a training run compute at the same time.
//
// Not a CMake target (".cc", outside bench/CMakeLists.txt's glob of *.cpp):
// bench/run_peers.sh compiles it against the LibTorch of the venv, the one
// strata links against, in about 10 s:
//   c++ -O2 -std=c++20 -I$TORCH/include bench/matmul_rate.cc -L$TORCH/lib -ltorch_cpu -lc10
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int64_t n = 1024;
  int reps = 30;
  int threads = 1;
  double start_at = 0.0;
  std::string dtype = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--n") n = std::atoll(argv[i + 1]);
    else if (flag == "--dtype") dtype = argv[i + 1];
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--start-at") start_at = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: matmul_rate [--n N] [--reps R] [--threads T] [--dtype fp32|bf16] [--start-at EPOCH_SECONDS]\n");
      return 2;
    }
  }
  if ((dtype != "fp32" && dtype != "bf16") || n < 1 || n > 8192 || reps < 1 || reps > 10000 || threads < 1) {
    std::fprintf(stderr, "matmul_rate: --dtype must be fp32 or bf16, --n 1..8192, --reps 1..10000, --threads >= 1\n");
    return 2;
  }
  const auto scalar = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  at::set_num_threads(threads);
  at::Tensor a = at::randn({n, n}).to(scalar), b = at::randn({n, n}).to(scalar), c = at::empty({n, n}, scalar);
  for (int i = 0; i < 5; ++i) at::mm_out(c, a, b);
  if (start_at > 0) {
    std::this_thread::sleep_until(std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(start_at))));
  }
  std::vector<double> secs;
  for (int i = 0; i < reps; ++i) {
    auto t = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  std::sort(secs.begin(), secs.end());
  const double flop = 2.0 * static_cast<double>(n) * n * n;
  const double median = reps % 2 ? secs[reps / 2] : 0.5 * (secs[reps / 2 - 1] + secs[reps / 2]);
  std::printf("{\"kind\": \"matmul\", \"impl\": \"libtorch (C++)\", \"dtype\": \"%s\", \"n\": %lld, \"threads\": %d, "
              "\"reps\": %d, \"gflops_median\": %.2f, \"gflops_best\": %.2f}\n",
              dtype.c_str(), static_cast<long long>(n), threads, reps, flop / median / 1e9, flop / secs.front() / 1e9);
  return 0;
}
