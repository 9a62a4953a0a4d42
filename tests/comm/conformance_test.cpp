// The conformance suite every collectives backend runs: each operation x
// dtype x reduce op, non-contiguous inputs, the async forms and the
// variable-size object transfers, checked against values computed here in
// closed form (rank r contributes v(r, i) to element i). The local backend
// runs it in this process; Gloo and shm at world size 1 in this process and
// at 2, 3 and 4 in worker processes, and the hierarchical backend (shm
// inside hosts, Gloo between them) at 3 and 4, and at 5 with hosts whose
// ranks interleave (one launch per case: a worker runs every check and
// reports each failure).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>

#include "nccl_skip.h"
#include "strata/comm/gloo/backend.h"
#include "strata/comm/group.h"
#include "strata/comm/local.h"
#include "strata/comm/nccl/backend.h"
#include "strata/comm/shm/backend.h"
#include "strata/runtime/env.h"
#include "strata/runtime/store.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace strata::comm {
namespace {

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct};

// Values small enough that every sum, product, max and min is exact in
// bfloat16 (integers up to 256) at world size <= 4.
double v(int64_t r, int64_t i) { return static_cast<double>((r * 5 + i * 3) % 11) - 5; }  // [-5, 5]
double p(int64_t r, int64_t i) { return static_cast<double>((r + i) % 5) - 2; }            // [-2, 2]

/// The device the checks put their tensors on: the group's (CPU, or the
/// CUDA device of an NCCL group); run_conformance sets it.
c10::Device g_device(c10::kCPU);
at::TensorOptions on(at::ScalarType dt) { return at::TensorOptions(dt).device(g_device); }

/// A float64 tensor of `shape` with element i = f(r, i) (row-major).
template <class F>
at::Tensor filled(F f, int64_t r, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> data(n);
  for (int64_t i = 0; i < n; ++i) data[i] = f(r, i);
  return at::tensor(data, at::kDouble).view(shape);
}

/// The reduction of f(r, i) over ranks 0..n-1, in double, per element.
at::Tensor expected_reduce(ReduceOp op, int n, std::vector<int64_t> shape, bool integral) {
  auto f = op == ReduceOp::kProduct ? p : v;
  return filled([&](int64_t, int64_t i) {
                  double acc = f(0, i);
                  for (int r = 1; r < n; ++r) {
                    double x = f(r, i);
                    switch (op) {
                      case ReduceOp::kSum: case ReduceOp::kMean: acc += x; break;
                      case ReduceOp::kMax: acc = std::max(acc, x); break;
                      case ReduceOp::kMin: acc = std::min(acc, x); break;
                      case ReduceOp::kProduct: acc *= x; break;
                    }
                  }
                  if (op == ReduceOp::kMean) acc = integral ? std::floor(acc / n) : acc / n;
                  return acc;
                },
                0, shape);
}

/// Collects failures with enough context to act on them.
class Checker {
 public:
  explicit Checker(std::string where) : where_(std::move(where)) {}

  void expect(bool ok, const std::string& what) {
    ++checks_;
    if (!ok) failures_.push_back(where_ + ": " + what);
  }

  /// `actual` equals `expected` (float64) exactly, or within `rtol` for a mean.
  void expect_tensor(const at::Tensor& actual, const at::Tensor& expected, const std::string& what, double rtol = 0) {
    ++checks_;
    if (actual.sizes() != expected.sizes()) {
      std::ostringstream msg;
      msg << what << ": shape " << actual.sizes() << ", expected " << expected.sizes();
      failures_.push_back(where_ + ": " + msg.str());
      return;
    }
    at::Tensor a = actual.cpu().to(at::kDouble).contiguous().view(-1);
    at::Tensor e = expected.contiguous().view(-1);
    const double* pa = a.data_ptr<double>();
    const double* pe = e.data_ptr<double>();
    for (int64_t i = 0; i < a.numel(); ++i) {
      double x = pa[i], y = pe[i];
      if (std::abs(x - y) > rtol * std::abs(y)) {
        std::ostringstream msg;
        msg << what << ": element " << i << " is " << x << ", expected " << y;
        failures_.push_back(where_ + ": " + msg.str());
        return;
      }
    }
  }

  int checks() const { return checks_; }
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  std::string where_;
  int checks_ = 0;
  std::vector<std::string> failures_;
};

double mean_tolerance(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return 1.0 / 128;
    case at::kHalf: return 1.0 / 1024;
    case at::kFloat: return 1e-6;
    case at::kDouble: return 1e-12;
    default: return 0;
  }
}

std::string name(at::ScalarType t) { return c10::toString(t); }

void check_all_reduce(Group& g, Checker& c) {
  const int n = g.size(), r = g.rank();
  for (at::ScalarType dt : kDtypes) {
    const bool integral = at::isIntegralType(dt, false);
    for (ReduceOp op : kOps) {
      auto f = op == ReduceOp::kProduct ? p : v;
      const std::string what = "all_reduce " + to_string(op) + " " + name(dt);
      at::Tensor t = filled(f, r, {5, 3}).to(on(dt));
      g.all_reduce(t, op);
      at::Tensor want = expected_reduce(op, n, {5, 3}, integral);
      c.expect_tensor(t, want, what, op == ReduceOp::kMean ? mean_tolerance(dt) : 0);
      c.expect(t.scalar_type() == dt, what + ": dtype changed to " + name(t.scalar_type()));

      // Non-contiguous: a transposed view of a (3, 5) buffer.
      at::Tensor base = at::empty({3, 5}, on(dt));
      at::Tensor view = base.t();
      view.copy_(filled(f, r, {5, 3}));
      g.all_reduce(view, op);
      c.expect_tensor(view, want, what + " (transposed view)", op == ReduceOp::kMean ? mean_tolerance(dt) : 0);
      c.expect_tensor(base, want.t(), what + " (transposed view's storage)", op == ReduceOp::kMean ? mean_tolerance(dt) : 0);
    }
    // A 0-d tensor.
    at::Tensor scalar = at::scalar_tensor(v(r, 0), on(dt));
    g.all_reduce(scalar, ReduceOp::kSum);
    c.expect_tensor(scalar, expected_reduce(ReduceOp::kSum, n, {}, integral), "all_reduce sum 0-d " + name(dt));
  }
  // Large enough for Gloo's ring to split it into many segments.
  at::Tensor big = filled(v, r, {100003}).to(on(at::kFloat));
  g.all_reduce(big, ReduceOp::kSum);
  c.expect_tensor(big, expected_reduce(ReduceOp::kSum, n, {100003}, false), "all_reduce sum float32 x100003");
}

void check_all_gather(Group& g, Checker& c) {
  const int n = g.size(), r = g.rank();
  for (at::ScalarType dt : kDtypes) {
    at::Tensor x = filled(v, r, {2, 3}).to(on(dt));
    at::Tensor out = g.all_gather(x);
    std::vector<at::Tensor> parts;
    for (int q = 0; q < n; ++q) parts.push_back(filled(v, q, {2, 3}));
    c.expect_tensor(out, at::stack(parts), "all_gather " + name(dt));

    at::Tensor base = at::empty({3, 2}, on(dt));
    base.t().copy_(filled(v, r, {2, 3}));
    c.expect_tensor(g.all_gather(base.t()), at::stack(parts), "all_gather " + name(dt) + " (transposed view)");

    at::Tensor scalar = at::scalar_tensor(v(r, 7), on(dt));
    std::vector<double> want;
    for (int q = 0; q < n; ++q) want.push_back(v(q, 7));
    c.expect_tensor(g.all_gather(scalar), at::tensor(want, at::kDouble), "all_gather 0-d " + name(dt));
  }
}

void check_reduce_scatter(Group& g, Checker& c) {
  const int n = g.size(), r = g.rank();
  for (at::ScalarType dt : kDtypes) {
    const bool integral = at::isIntegralType(dt, false);
    for (ReduceOp op : kOps) {
      auto f = op == ReduceOp::kProduct ? p : v;
      const std::string what = "reduce_scatter " + to_string(op) + " " + name(dt);
      const double tol = op == ReduceOp::kMean ? mean_tolerance(dt) : 0;
      at::Tensor want = expected_reduce(op, n, {2 * n, 3}, integral).narrow(0, 2 * r, 2);
      c.expect_tensor(g.reduce_scatter(filled(f, r, {2 * n, 3}).to(on(dt)), op), want, what, tol);

      at::Tensor base = at::empty({3, 2 * n}, on(dt));
      base.t().copy_(filled(f, r, {2 * n, 3}));
      c.expect_tensor(g.reduce_scatter(base.t(), op), want, what + " (transposed view)", tol);
    }
  }
  // Large, with a chunk size that is not a multiple of anything convenient.
  const int64_t rows = 30011;
  at::Tensor want = expected_reduce(ReduceOp::kSum, n, {n * rows}, false).narrow(0, r * rows, rows);
  c.expect_tensor(g.reduce_scatter(filled(v, r, {n * rows}).to(on(at::kBFloat16)), ReduceOp::kSum), want,
                  "reduce_scatter sum bfloat16 x" + std::to_string(n * rows));
}

// Note [Segmented layouts] in backend.h: a zero-length segment, odd
// lengths, one segment, and (float32) more than one shared-memory slot.
void check_segmented(Group& g, Checker& c) {
  const int n = g.size(), r = g.rank();
  const std::vector<std::vector<int64_t>> layouts = {{3, 0, 5, 1}, {7}, {300001, 2, 700000}};
  for (at::ScalarType dt : kDtypes) {
    const bool integral = at::isIntegralType(dt, false);
    for (const std::vector<int64_t>& segments : layouts) {
      const bool big = segments.size() == 3;
      if (big && dt != at::kFloat) continue;
      int64_t len = 0;
      for (int64_t s : segments) len += s;
      const std::string what = " " + name(dt) + " x" + std::to_string(segments.size()) + " segments of " +
                               std::to_string(len);
      // all_gather: segment i holds every rank's piece i in rank order.
      at::Tensor full = at::empty({n * len}, on(dt));
      g.all_gather_segmented_async(filled(v, r, {len}).to(on(dt)), full, segments)->wait();
      std::vector<at::Tensor> parts;
      int64_t begin = 0;
      for (int64_t s : segments) {
        for (int q = 0; q < n; ++q) parts.push_back(filled(v, q, {len}).narrow(0, begin, s));
        begin += s;
      }
      c.expect_tensor(full, at::cat(parts), "all_gather_segmented" + what);
      // reduce_scatter: this rank gets its pieces of the reduced full buffer.
      for (ReduceOp op : big ? std::vector<ReduceOp>{ReduceOp::kSum} : kOps) {
        auto f = op == ReduceOp::kProduct ? p : v;
        at::Tensor reduced = expected_reduce(op, n, {n * len}, integral);
        std::vector<at::Tensor> mine;
        begin = 0;
        for (int64_t s : segments) {
          mine.push_back(reduced.narrow(0, n * begin + r * s, s));
          begin += s;
        }
        at::Tensor out = at::empty({len}, on(dt));
        g.reduce_scatter_segmented_async(filled(f, r, {n * len}).to(on(dt)), out, segments, op)->wait();
        c.expect_tensor(out, at::cat(mine), "reduce_scatter_segmented " + to_string(op) + what,
                        op == ReduceOp::kMean ? mean_tolerance(dt) : 0);
      }
    }
  }
}

void check_broadcast(Group& g, Checker& c) {
  const int n = g.size(), r = g.rank();
  for (at::ScalarType dt : kDtypes) {
    for (int src = 0; src < n; ++src) {
      at::Tensor t = filled(v, r, {4, 2}).to(on(dt));
      g.broadcast(t, src);
      c.expect_tensor(t, filled(v, src, {4, 2}), "broadcast " + name(dt) + " from " + std::to_string(src));
    }
    at::Tensor base = at::empty({2, 4}, on(dt));
    base.t().copy_(filled(v, r, {4, 2}));
    at::Tensor view = base.t();
    g.broadcast(view, n - 1);
    c.expect_tensor(base, filled(v, n - 1, {4, 2}).t(), "broadcast " + name(dt) + " (transposed view)");
  }
}

void check_async(Group& g, Checker& c) {
  const int n = g.size(), r = g.rank();
  std::vector<at::Tensor> tensors;
  std::vector<WorkPtr> works;
  for (at::ScalarType dt : kDtypes) {
    tensors.push_back(filled(v, r, {6}).to(on(dt)));
    works.push_back(g.all_reduce_async(tensors.back(), ReduceOp::kSum));
  }
  at::Tensor base = at::empty({3, 4}, on(at::kFloat));
  base.t().copy_(filled(v, r, {4, 3}));
  works.push_back(g.all_reduce_async(base.t(), ReduceOp::kMax));
  at::Tensor gathered = at::empty({n, 5}, on(at::kLong));
  works.push_back(g.all_gather_async(filled(v, r, {5}).to(on(at::kLong)), gathered));
  at::Tensor scattered = at::empty({3}, on(at::kDouble));
  works.push_back(g.reduce_scatter_async(filled(v, r, {3 * n}).to(on(at::kDouble)), scattered, ReduceOp::kMin));
  at::Tensor broadcasted = filled(v, r, {7}).to(on(at::kHalf));
  works.push_back(g.broadcast_async(broadcasted, n - 1));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();  // any order
  for (const WorkPtr& w : works) c.expect(w->is_completed(), "async work not completed after wait()");
  for (size_t k = 0; k < kDtypes.size(); ++k) {
    c.expect_tensor(tensors[k], expected_reduce(ReduceOp::kSum, n, {6}, false), "all_reduce_async sum " + name(kDtypes[k]));
  }
  c.expect_tensor(base.t(), expected_reduce(ReduceOp::kMax, n, {4, 3}, false), "all_reduce_async max (transposed view)");
  std::vector<at::Tensor> parts;
  for (int q = 0; q < n; ++q) parts.push_back(filled(v, q, {5}));
  c.expect_tensor(gathered, at::stack(parts), "all_gather_async int64");
  c.expect_tensor(scattered, expected_reduce(ReduceOp::kMin, n, {3 * n}, false).narrow(0, 3 * r, 3),
                  "reduce_scatter_async min float64");
  c.expect_tensor(broadcasted, filled(v, n - 1, {7}), "broadcast_async float16");
  g.synchronize();
}

void check_objects(Group& g, Checker& c) {
  const int n = g.size(), r = g.rank();
  const int src = n - 1;
  // Non-source ranks pass values of other sizes: only src's matters.
  std::string s = g.broadcast_object<std::string>(r == src ? "from the source" : std::string(r + 40, 'x'), src);
  c.expect(s == "from the source", "broadcast_object string: got '" + s + "'");
  std::vector<int64_t> vec(r == src ? 1000 : r, r);
  std::vector<int64_t> got = g.broadcast_object(vec, src);
  c.expect(got == std::vector<int64_t>(1000, src), "broadcast_object vector: got " + std::to_string(got.size()) + " elements");
  std::map<std::string, int> m = g.broadcast_object(std::map<std::string, int>{{"rank", r}, {"world", n}}, 0);
  c.expect(m == std::map<std::string, int>{{"rank", 0}, {"world", n}}, "broadcast_object map");
  nlohmann::json j = {{"step", 10 * r}, {"name", "r" + std::to_string(r)}, {"list", {r, 2.5, nullptr}}};
  nlohmann::json jg = g.broadcast_object(j, src);
  c.expect(jg == nlohmann::json({{"step", 10 * src}, {"name", "r" + std::to_string(src)}, {"list", {src, 2.5, nullptr}}}),
           "broadcast_object json: got " + jg.dump());
  c.expect(g.broadcast_object<std::string>(r == 0 ? "" : "ignored", 0).empty(), "broadcast_object empty string");

  std::string binary(100000, '\0');
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<char>((i * 7 + r) % 256);
  std::string received = g.broadcast_bytes(binary, src);
  std::string want(100000, '\0');
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<char>((i * 7 + src) % 256);
  c.expect(received == want, "broadcast_bytes 100000 binary bytes");

  std::vector<std::string> strings = g.all_gather_object(std::string(3 * r, static_cast<char>('a' + r)));
  c.expect(static_cast<int>(strings.size()) == n, "all_gather_object string count");
  for (int q = 0; q < n && q < static_cast<int>(strings.size()); ++q) {
    c.expect(strings[q] == std::string(3 * q, static_cast<char>('a' + q)), "all_gather_object string from rank " + std::to_string(q));
  }
  std::vector<nlohmann::json> js = g.all_gather_object(nlohmann::json{{"rank", r}, {"sq", std::vector<int>(r, r)}});
  for (int q = 0; q < n && q < static_cast<int>(js.size()); ++q) {
    c.expect(js[q] == nlohmann::json{{"rank", q}, {"sq", std::vector<int>(q, q)}}, "all_gather_object json from rank " + std::to_string(q));
  }
  std::vector<std::string> empties = g.all_gather_bytes("");
  c.expect(empties == std::vector<std::string>(n), "all_gather_bytes of empty strings");
}

/// Runs every check on `g`; returns the checker with the failures.
Checker run_conformance(Group& g) {
  g_device = g.device();
  Checker c(g.backend_name() + " rank " + std::to_string(g.rank()) + "/" + std::to_string(g.size()));
  g.reset_stats();
  check_all_reduce(g, c);
  check_all_gather(g, c);
  check_reduce_scatter(g, c);
  check_segmented(g, c);
  check_broadcast(g, c);
  check_async(g, c);
  check_objects(g, c);
  g.barrier("conformance");
  CommStats stats = g.stats();
  c.expect(stats.all_reduce.calls == 6 * 5 * 2 + 6 + 1 + 7, "stats: all_reduce calls " + std::to_string(stats.all_reduce.calls));
  c.expect(stats.barrier.calls == 1, "stats: barrier calls " + std::to_string(stats.barrier.calls));
  c.expect(stats.reduce_scatter.bytes > 0 && stats.total().calls > stats.all_reduce.calls, "stats: totals");
  c.expect(stats.summary().rfind("all_reduce 74x ", 0) == 0, "stats: summary '" + stats.summary() + "'");
  return c;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// args: BACKEND [debug]. BACKEND is passed to init_process_group ("gloo",
// "auto": one host, so shared memory), or "hierarchical": ranks 0..n/2-1 say
// they are on one host and the others on another (STRATA_HOST_ID), so
// "auto" builds shared memory inside each and Gloo between them;
// "hierarchical-interleaved": even ranks on one host, odd ones on another.
STRATA_WORKER(conformance) {
  runtime::Environment env = runtime::Environment::from_env();
  const std::string backend = args.at(0);
  ProcessGroupOptions options;
  const bool hierarchical = backend.rfind("hierarchical", 0) == 0;
  options.backend = hierarchical ? "auto" : backend;
  options.group.with_timeout(std::chrono::seconds(60)).with_debug(args.size() > 1 && args[1] == "debug");
  if (backend == "hierarchical") ::setenv("STRATA_HOST_ID", env.rank < env.world_size / 2 ? "a" : "b", 1);
  if (backend == "hierarchical-interleaved") ::setenv("STRATA_HOST_ID", env.rank % 2 == 0 ? "even" : "odd", 1);
  if (backend == "nccl") c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(c10::Device(c10::kCUDA, env.local_rank));
  Group g = init_process_group(env, options);
  const std::string want = backend == "auto" ? "shm" : hierarchical ? "shm+gloo" : backend;
  if (g.backend_name() != want) {
    std::cerr << "FAILED: backend " << g.backend_name() << ", expected " << want << "\n";
    return 1;
  }
  Checker c = run_conformance(g);
  for (const std::string& f : c.failures()) std::cerr << "FAILED " << f << "\n";
  if (!c.failures().empty()) return 1;
  std::cout << "conformance passed: " << c.checks() << " checks on " << g.backend_name() << "\n";
  return 0;
}

/// Expects every rank of an n-rank run to report success.
void expect_workers_pass(int n, const std::vector<std::string>& args) {
  testing::WorkersResult result = testing::run_workers(n, "conformance", args);
  EXPECT_TRUE(result.ok()) << result.launch.summary << "\n" << result.output;
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(result.output.find("[rank " + std::to_string(r) + "] conformance passed"), std::string::npos)
        << "rank " << r << " did not report success:\n" << result.output;
  }
}

TEST(LocalConformance, EveryOperationDtypeAndReduceOpMatchesClosedForm) {
  Group g;
  EXPECT_EQ(g.backend_name(), "local");
  Checker c = run_conformance(g);
  EXPECT_TRUE(c.failures().empty()) << joined(c.failures());
  EXPECT_GT(c.checks(), 250);
}

TEST(LocalConformance, PassesWithDebugChecksOn) {
  Group g(local::create(), GroupOptions().with_debug(true));
  Checker c = run_conformance(g);
  EXPECT_TRUE(c.failures().empty()) << joined(c.failures());
}

TEST(GlooConformance, OneRankInProcessMatchesClosedForm) {
  runtime::TcpStoreOptions o;
  o.is_server = true;
  o.timeout = std::chrono::seconds(30);
  Group g(gloo::create(runtime::make_tcp_store(o), 0, 1, std::chrono::seconds(30)));
  EXPECT_EQ(g.backend_name(), "gloo");
  Checker c = run_conformance(g);
  EXPECT_TRUE(c.failures().empty()) << joined(c.failures());
}

TEST(GlooConformance, TwoRanksMatchClosedForm) { expect_workers_pass(2, {"gloo"}); }
TEST(GlooConformance, ThreeRanksWithDebugChecksMatchClosedForm) { expect_workers_pass(3, {"gloo", "debug"}); }
TEST(GlooConformance, FourRanksMatchClosedForm) { expect_workers_pass(4, {"gloo"}); }

TEST(ShmConformance, OneRankInProcessMatchesClosedForm) {
  runtime::TcpStoreOptions o;
  o.is_server = true;
  o.timeout = std::chrono::seconds(30);
  Group g(shm::create(runtime::make_tcp_store(o), 0, 1, std::chrono::seconds(30), std::chrono::seconds(30)));
  EXPECT_EQ(g.backend_name(), "shm");
  Checker c = run_conformance(g);
  EXPECT_TRUE(c.failures().empty()) << joined(c.failures());
}

// "auto" on one host: these runs check that init_process_group picks shm.
TEST(ShmConformance, TwoRanksOnOneHostPickShmAndMatchClosedForm) { expect_workers_pass(2, {"auto"}); }
TEST(ShmConformance, ThreeRanksWithDebugChecksMatchClosedForm) { expect_workers_pass(3, {"auto", "debug"}); }
TEST(ShmConformance, FourRanksMatchClosedForm) { expect_workers_pass(4, {"shm"}); }

TEST(HierarchicalConformance, TwoHostsOfTwoRanksMatchClosedForm) { expect_workers_pass(4, {"hierarchical"}); }
TEST(HierarchicalConformance, HostsOfOneAndTwoRanksMatchClosedForm) { expect_workers_pass(3, {"hierarchical"}); }
// Hosts whose ranks are not contiguous: {0, 2, 4} and {1, 3}.
TEST(HierarchicalConformance, InterleavedHostsOfThreeAndTwoRanksMatchClosedForm) {
  expect_workers_pass(5, {"hierarchical-interleaved"});
}

using strata::testing::nccl_unavailable;

void expect_nccl_one_rank_passes(GroupOptions options) {
  runtime::TcpStoreOptions o;
  o.is_server = true;
  o.timeout = std::chrono::seconds(30);
  Group g(nccl::create(runtime::make_tcp_store(o), 0, 1, std::chrono::seconds(30)), options);
  EXPECT_EQ(g.backend_name(), "nccl");
  Checker c = run_conformance(g);
  EXPECT_TRUE(c.failures().empty()) << joined(c.failures());
  EXPECT_GT(c.checks(), 250);
}

TEST(NcclConformance, OneRankInProcessMatchesClosedForm) {
  if (std::string why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  expect_nccl_one_rank_passes(GroupOptions());
}
TEST(NcclConformance, OneRankWithDebugChecksMatchesClosedForm) {
  if (std::string why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  expect_nccl_one_rank_passes(GroupOptions().with_debug(true));
}
TEST(NcclConformance, TwoRanksOnTwoGpusMatchClosedForm) {
  if (std::string why = nccl_unavailable(2); !why.empty()) GTEST_SKIP() << why;
  expect_workers_pass(2, {"nccl"});
}
TEST(NcclConformance, TwoRanksWithDebugChecksMatchClosedForm) {
  if (std::string why = nccl_unavailable(2); !why.empty()) GTEST_SKIP() << why;
  expect_workers_pass(2, {"nccl", "debug"});
}

}  // namespace
}  // namespace strata::comm
