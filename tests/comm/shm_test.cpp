// The shared-memory backend beyond the conformance suite: its results bit
// for bit (against Gloo at 2 ranks, against a rank-order fold computed here
// at 3), what survivors see when a peer is killed with SIGKILL or never
// arrives, that no segment is left in /dev/shm, and the errors for hostile
// settings.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <dirent.h>
#include <signal.h>

#include <cctype>
#include <cstdlib>
#include <iostream>

#include "strata/comm/gloo/backend.h"
#include "strata/comm/group.h"
#include "strata/comm/shm/backend.h"
#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/store.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace strata::comm {
namespace {

using std::chrono::milliseconds;

/// Entries of /dev/shm whose name starts with this job's segment prefix.
int segments_of_job(const std::string& token) {
  std::string clean;
  for (char c : token) {
    if (std::isalnum(static_cast<unsigned char>(c)) && clean.size() < 24) clean += c;
  }
  const std::string prefix = "strata-" + (clean.empty() ? std::string("job") : clean) + "-";
  int n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) ++n;
    }
    ::closedir(d);
  }
  return n;
}

/// Rank r's data: values whose sums round (not exactly representable), so
/// the reduction order shows in the last bits.
at::Tensor data_of(int r, int64_t n, at::ScalarType dtype) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + r);
  return at::randn({n}, gen, at::kFloat).mul_(1000).to(dtype);
}

/// The sum over ranks 0..size-1 folded in rank order, accumulated in
/// float32 for 16-bit types and rounded once (kernels.h's contract).
at::Tensor rank_order_sum(int size, int64_t n, at::ScalarType dtype) {
  const bool half = dtype == at::kBFloat16 || dtype == at::kHalf;
  at::Tensor acc = data_of(0, n, dtype).to(half ? at::kFloat : dtype);
  for (int r = 1; r < size; ++r) acc.add_(data_of(r, n, dtype).to(half ? at::kFloat : dtype));
  return acc.to(dtype);
}

// Sizes: a small call (one wait), a large one cut into several rounds of
// a 64 KiB slot with a remainder, both for all_reduce and reduce_scatter;
// all_reduce also with every round reduced whole on every rank.
STRATA_WORKER(shm_bits) {
  runtime::Environment env = runtime::Environment::from_env();
  auto store = runtime::make_store(env, std::chrono::seconds(60));
  shm::ShmOptions options;
  options.slot_bytes = 64 << 10;
  Group shm(shm::create(store, env.rank, env.world_size, std::chrono::seconds(60), std::chrono::seconds(60),
                        env.job_token, options));
  // Every all_reduce round reduced whole on every rank (one wait per round).
  options.whole_reduce_bytes = 256 << 20;
  Group whole(shm::create(store, env.rank, env.world_size, std::chrono::seconds(60), std::chrono::seconds(60),
                          env.job_token, options));
  Group gloo(gloo::create(store, env.rank, env.world_size, std::chrono::seconds(60)));
  const int n = env.world_size, r = env.rank;
  int failures = 0;
  for (at::ScalarType dt : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    for (int64_t len : {int64_t{301}, int64_t{3 * 100003}}) {
      const std::string what = std::string(c10::toString(dt)) + " x" + std::to_string(len);
      at::Tensor a = data_of(r, len, dt);
      shm.all_reduce(a, ReduceOp::kSum);
      if (!at::equal(a, rank_order_sum(n, len, dt))) ++failures, std::cerr << "FAILED all_reduce rank order " << what << "\n";
      at::Tensor w = data_of(r, len, dt);
      whole.all_reduce(w, ReduceOp::kSum);
      if (!at::equal(w, a)) ++failures, std::cerr << "FAILED whole-buffer all_reduce " << what << "\n";
      at::Tensor rs = shm.reduce_scatter(data_of(r, len * n, dt), ReduceOp::kSum);
      if (!at::equal(rs, rank_order_sum(n, len * n, dt).narrow(0, r * len, len))) {
        ++failures, std::cerr << "FAILED reduce_scatter rank order " << what << "\n";
      }
      if (n == 2) {  // Gloo adds the same two numbers: the same bits
        at::Tensor b = data_of(r, len, dt);
        gloo.all_reduce(b, ReduceOp::kSum);
        if (!at::equal(a, b)) ++failures, std::cerr << "FAILED all_reduce equals gloo " << what << "\n";
        at::Tensor rg = gloo.reduce_scatter(data_of(r, len * n, dt), ReduceOp::kSum);
        if (!at::equal(rs, rg)) ++failures, std::cerr << "FAILED reduce_scatter equals gloo " << what << "\n";
      }
    }
  }
  if (failures == 0) std::cout << "bits match" << std::endl;
  return failures == 0 ? 0 : 1;
}

void expect_bits_match(int n) {
  testing::WorkersResult result = testing::run_workers(n, "shm_bits");
  EXPECT_TRUE(result.ok()) << result.launch.summary << "\n" << result.output;
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(result.output.find("[rank " + std::to_string(r) + "] bits match"), std::string::npos) << result.output;
  }
}

TEST(ShmBits, TwoRanksEqualGlooBitForBitInEveryFloatType) { expect_bits_match(2); }
TEST(ShmBits, ThreeRanksFoldInRankOrder) { expect_bits_match(3); }

/// Runs `fn`, expecting E; prints "<tag>: <message>".
template <class E, class Fn>
bool print_error(const std::string& tag, Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    std::cout << tag << ": " << e.what() << std::endl;
    return true;
  } catch (const std::exception& e) {
    std::cerr << tag << ": wrong exception type: " << e.what() << std::endl;
    return false;
  }
  std::cerr << tag << ": no exception" << std::endl;
  return false;
}

// args[0] = "kill": the last rank kills itself with SIGKILL before the
// second all_reduce; "late": rank 1 reaches it only after rank 0 timed out.
// Survivors ignore the launcher's SIGTERM (it stops the job when a rank
// dies) long enough to report what they saw.
STRATA_WORKER(shm_failures) {
  ::signal(SIGTERM, SIG_IGN);
  runtime::Environment env = runtime::Environment::from_env();
  const int r = env.rank, n = env.world_size;
  auto store = runtime::make_store(env, std::chrono::seconds(60));
  const bool kill = args.at(0) == "kill";
  const milliseconds timeout = kill ? milliseconds(120000) : milliseconds(1000);
  Group g(shm::create(store, r, n, timeout, std::chrono::seconds(60), env.job_token));
  std::cout << "segments after setup: " << segments_of_job(env.job_token) << std::endl;
  at::Tensor t = at::ones({1000});
  g.all_reduce(t, ReduceOp::kSum);
  std::cout << "first: " << t[0].item<float>() << std::endl;
  bool ok = true;
  if (kill) {
    if (r == n - 1) ::raise(SIGKILL);
    ok &= print_error<CommError>("after kill", [&] { g.all_reduce(t, ReduceOp::kSum); });
    std::cout << "segments after kill: " << segments_of_job(env.job_token) << std::endl;
    return ok ? 0 : 1;
  }
  if (r == 0) {
    ok &= print_error<TimeoutError>("timeout", [&] { g.all_reduce(t, ReduceOp::kSum); });
    ok &= print_error<CommError>("after timeout", [&] { g.barrier("next"); });
    store->set("shm_failures/timed_out", "1");
  } else {
    store->wait({"shm_failures/timed_out"}, std::chrono::seconds(60));
    ok &= print_error<CommError>("late", [&] { g.all_reduce(t, ReduceOp::kSum); });
  }
  return ok ? 0 : 1;
}

std::string line_of(const std::string& output, int rank, const std::string& tag) {
  const std::string key = "[rank " + std::to_string(rank) + "] " + tag + ": ";
  size_t at = output.find(key);
  if (at == std::string::npos) return "(missing)";
  at += key.size();
  return output.substr(at, output.find('\n', at) - at);
}

TEST(ShmFailures, SurvivorsOfAKilledRankGetACommErrorNamingItAndNoSegmentRemains) {
  testing::WorkersResult result = testing::run_workers(
      2, "shm_failures", {"kill"}, runtime::LaunchOptions().with_timeout_s(60).with_grace_period(std::chrono::seconds(60)));
  EXPECT_EQ(result.launch.failed_rank, 1) << result.launch.summary << "\n" << result.output;
  EXPECT_EQ(result.launch.failed_signal, SIGKILL) << result.launch.summary;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(line_of(result.output, r, "segments after setup"), "0") << result.output;
    EXPECT_EQ(line_of(result.output, r, "first"), "2") << result.output;
  }
  // Detected through the peer's process, well before the 120 s timeout
  // (a timeout would say "timed out").
  EXPECT_EQ(line_of(result.output, 0, "after kill"),
            "[comm] all_reduce #2: [shm] all_reduce #2 failed on rank 0 of 2: peer 1 exited (its process is gone)")
      << result.output;
  EXPECT_EQ(line_of(result.output, 0, "segments after kill"), "0") << result.output;
}

TEST(ShmFailures, EverySurvivorOfAKilledRankGetsACommError) {
  testing::WorkersResult result = testing::run_workers(
      3, "shm_failures", {"kill"}, runtime::LaunchOptions().with_timeout_s(60).with_grace_period(std::chrono::seconds(60)));
  EXPECT_EQ(result.launch.failed_rank, 2) << result.launch.summary << "\n" << result.output;
  for (int r = 0; r < 2; ++r) {
    // Each survivor either sees rank 2 gone itself or learns it from the
    // other survivor, who gave up first.
    const std::string line = line_of(result.output, r, "after kill");
    const std::string prefix = "[comm] all_reduce #2: [shm] all_reduce #2 failed on rank " + std::to_string(r) + " of 3: ";
    EXPECT_EQ(line.rfind(prefix, 0), 0u) << line;
    EXPECT_NE(line.find("peer 2 exited (its process is gone)"), std::string::npos) << line;
    EXPECT_EQ(line_of(result.output, r, "segments after kill"), "0") << result.output;
  }
}

TEST(ShmFailures, TimeoutNamesTheMissingPeerAndTheLatePeerLearnsWhy) {
  testing::WorkersResult result = testing::run_workers(2, "shm_failures", {"late"});
  EXPECT_TRUE(result.ok()) << result.launch.summary << "\n" << result.output;
  const std::string timeout =
      "[shm] all_reduce #2 timed out after 1000 ms on rank 0 of 2; peer 1 is missing (never reached this call)";
  EXPECT_EQ(line_of(result.output, 0, "timeout"), "[comm] all_reduce #2: " + timeout);
  EXPECT_EQ(line_of(result.output, 0, "after timeout"),
            "[comm] barrier 'next' #3 not run: an earlier collective of this group failed (all_reduce #2: " + timeout +
                "); create a new group after a communication failure");
  EXPECT_EQ(line_of(result.output, 1, "late"),
            "[comm] all_reduce #2: [shm] all_reduce #2 failed on rank 1 of 2: rank 0 gave up on this group (" +
                timeout + ")");
}

// ---- hostile settings ---------------------------------------------------------

/// Sets an environment variable for the scope's lifetime.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  const char* name_;
};

TEST(ShmSettings, MalformedSlotBytesIsAConfigErrorNamingTheVariable) {
  ScopedEnv e("STRATA_SHM_SLOT_BYTES", "4MB");
  EXPECT_EQ(strata::testing::error_message<ConfigError>([] { shm::ShmOptions::from_env(); }),
            "[shm] STRATA_SHM_SLOT_BYTES='4MB' is not a byte count between 65536 and 268435456; unset it to use the "
            "default (4194304)");
}

TEST(ShmSettings, OutOfRangeSpinIsAConfigError) {
  ScopedEnv e("STRATA_SHM_SPIN_US", "99999999");
  EXPECT_EQ(strata::testing::error_message<ConfigError>([] { shm::ShmOptions::from_env(); }),
            "[shm] STRATA_SHM_SPIN_US='99999999' is not a number of microseconds between -1 and 10000; unset it to "
            "use the default (-1)");
}

TEST(ShmSettings, HostIdWithSpacesIsAConfigError) {
  ScopedEnv e("STRATA_HOST_ID", "my host");
  EXPECT_EQ(strata::testing::error_message<ConfigError>([] { shm::host_identity(); }),
            "[comm] STRATA_HOST_ID must be 1 to 200 printable characters without spaces, got 7 characters; unset it "
            "to let strata find the host");
}

TEST(ShmSettings, HostIdentityIsStableAndOverridable) {
  EXPECT_EQ(shm::host_identity(), shm::host_identity());
  ScopedEnv e("STRATA_HOST_ID", "rack1-node7");
  EXPECT_EQ(shm::host_identity(), "id:rack1-node7");
}

TEST(ShmSettings, UnknownForcedBackendIsAConfigError) {
  ScopedEnv e("STRATA_COMM_BACKEND", "mpi");
  runtime::Environment env;
  env.world_size = 2;
  env.master_port = 29999;  // never contacted: the check comes first
  EXPECT_EQ(strata::testing::error_message<ConfigError>([&] { init_process_group(env); }),
            "[comm] STRATA_COMM_BACKEND='mpi' is not a CPU backend; use auto, gloo or shm, or unset it");
}

TEST(ShmSettings, NonPositiveTimeoutIsAConfigError) {
  runtime::TcpStoreOptions o;
  o.is_server = true;
  EXPECT_EQ(strata::testing::error_message<ConfigError>(
                [&] { shm::create(runtime::make_tcp_store(o), 0, 1, milliseconds(0), milliseconds(1000)); }),
            "[shm] timeout must be positive, got 0 ms");
}

// Two ranks that say they are on different hosts cannot use backend "shm".
STRATA_WORKER(shm_across_hosts) {
  runtime::Environment env = runtime::Environment::from_env();
  ::setenv("STRATA_HOST_ID", env.rank == 0 ? "a" : "b", 1);
  ProcessGroupOptions o;
  o.backend = "shm";
  return print_error<ConfigError>("across hosts", [&] { init_process_group(env, o); }) ? 0 : 1;
}

TEST(ShmSettings, BackendShmAcrossHostsSaysWhatToUseInstead) {
  testing::WorkersResult result = testing::run_workers(2, "shm_across_hosts");
  EXPECT_TRUE(result.ok()) << result.launch.summary << "\n" << result.output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(line_of(result.output, r, "across hosts"),
              "[comm] backend 'shm' needs every rank on one host, but the 2 ranks are on 2 hosts; use auto (shared "
              "memory inside each host, gloo between hosts) or gloo");
  }
}

}  // namespace
}  // namespace strata::comm
