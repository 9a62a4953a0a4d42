// Error paths of the collectives layer: bad names and unavailable backends
// (in this process), and, in one 3-rank launch, debug-mode mismatches, a
// rendezvous a rank never joins and a collective a rank never reaches. The
// workers print each error message as "<tag>: <message>"; the tests compare
// those lines exactly.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <iostream>

#include "strata/comm/gloo/backend.h"
#include "strata/comm/group.h"
#include "strata/comm/nccl/backend.h"
#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/store.h"
#include "support/multiprocess.h"
#include "support/worker.h"
#include "support/errors.h"

namespace strata::comm {
namespace {

using std::chrono::milliseconds;

runtime::Environment two_rank_env() {
  runtime::Environment env;
  env.rank = 0;
  env.world_size = 2;
  env.local_world_size = 2;
  env.master_port = 29999;  // never contacted: these calls fail before the rendezvous
  env.source = "strata";
  return env;
}

TEST(ReduceOpNames, AcceptsEveryNameInAnyCase) {
  EXPECT_EQ(parse_reduce_op("sum"), ReduceOp::kSum);
  EXPECT_EQ(parse_reduce_op("SUM"), ReduceOp::kSum);
  EXPECT_EQ(parse_reduce_op("Mean"), ReduceOp::kMean);
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::kMean);
  EXPECT_EQ(parse_reduce_op("AVG"), ReduceOp::kMean);
  EXPECT_EQ(parse_reduce_op("max"), ReduceOp::kMax);
  EXPECT_EQ(parse_reduce_op("MiN"), ReduceOp::kMin);
  EXPECT_EQ(parse_reduce_op("product"), ReduceOp::kProduct);
  EXPECT_EQ(parse_reduce_op("PROD"), ReduceOp::kProduct);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct}) {
    EXPECT_EQ(parse_reduce_op(to_string(op)), op);
  }
  EXPECT_EQ(to_string(ReduceOp::kProduct), "product");
}

TEST(ReduceOpNames, UnknownNameIsAConfigErrorListingTheAcceptedNames) {
  EXPECT_EQ(strata::testing::error_message<ConfigError>([] { parse_reduce_op("median"); }),
            "[comm] unknown reduce op 'median'; use one of: sum, mean (or avg), max, min, product (or prod)");
  EXPECT_EQ(strata::testing::error_message<ConfigError>([] { parse_reduce_op(""); }),
            "[comm] unknown reduce op ''; use one of: sum, mean (or avg), max, min, product (or prod)");
}

TEST(InitProcessGroup, UnknownBackendIsAConfigErrorListingTheNames) {
  ProcessGroupOptions o;
  o.backend = "mpi";
  EXPECT_EQ(strata::testing::error_message<ConfigError>([&] { init_process_group(two_rank_env(), o); }),
            "[comm] unknown backend 'mpi'; use one of: auto, gloo, shm, nccl, local");
}

TEST(InitProcessGroup, NcclWithoutNcclBuildSaysHowToGetIt) {
  if (nccl::is_available()) GTEST_SKIP() << "this build has NCCL";
  const std::string expected =
      "[nccl] strata was built without NCCL; rebuild against a CUDA LibTorch with NCCL "
      "(cmake -DSTRATA_WITH_NCCL=ON), or use the gloo backend for CPU tensors";
  ProcessGroupOptions o;
  o.backend = "NCCL";
  EXPECT_EQ(strata::testing::error_message<ConfigError>([&] { init_process_group(two_rank_env(), o); }), expected);
  ProcessGroupOptions cuda;
  cuda.device_type = "cuda";  // "auto" picks nccl for CUDA
  EXPECT_EQ(strata::testing::error_message<ConfigError>([&] { init_process_group(two_rank_env(), cuda); }), expected);
}

TEST(InitProcessGroup, LocalBackendRefusesSeveralProcesses) {
  ProcessGroupOptions o;
  o.backend = "local";
  EXPECT_EQ(strata::testing::error_message<ConfigError>([&] { init_process_group(two_rank_env(), o); }),
            "[comm] backend 'local' runs one process, but the world size is 2; use gloo (CPU) or nccl (CUDA)");
}

TEST(InitProcessGroup, OneProcessGetsTheLocalBackend) {
  Group g = init_process_group(runtime::Environment());
  EXPECT_EQ(g.backend_name(), "local");
  EXPECT_EQ(g.size(), 1);
  EXPECT_EQ(g.rank(), 0);
}

// ---- multi-process error paths (one launch of 3 ranks) ----------------------

/// Runs `fn`, expecting an exception of type E; prints "<tag>: <message>".
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

STRATA_WORKER(comm_errors) {
  runtime::Environment env = runtime::Environment::from_env();
  const int r = env.rank;
  auto store = runtime::make_store(env, std::chrono::seconds(60));
  bool ok = true;

  // 1. Debug mode, all three ranks (group 0).
  {
    Group g(gloo::create(store, r, 3, std::chrono::seconds(30)), GroupOptions().with_debug(true));
    at::Tensor t = at::ones(r == 1 ? std::vector<int64_t>{4, 2} : std::vector<int64_t>{4, 3});
    ok &= print_error<CommError>("shapes", [&] { g.all_reduce(t, ReduceOp::kSum); });
    at::Tensor ones = at::ones({2});
    g.all_reduce(ones, ReduceOp::kSum);
    std::cout << "recovered: " << ones[0].item<float>() << "," << ones[1].item<float>() << std::endl;
    at::Tensor d = at::ones({3}, r == 2 ? at::kDouble : at::kFloat);
    ok &= print_error<CommError>("dtypes", [&] { g.all_reduce(d, ReduceOp::kSum); });
    at::Tensor b = at::ones({3});
    ok &= print_error<CommError>("ops", [&] {
      if (r == 0) g.broadcast(b, 0);
      else g.all_reduce(b, ReduceOp::kSum);
    });
    ok &= print_error<CommError>("reduce_ops", [&] { g.all_reduce(b, r == 1 ? ReduceOp::kMax : ReduceOp::kSum); });
    ok &= print_error<CommError>("barrier_names", [&] { g.barrier(r == 2 ? "b" : "a"); });
    ok &= print_error<CommError>("sources", [&] { g.broadcast(b, r == 0 ? 0 : 1); });
    g.set_debug(false);
    g.barrier("end of debug checks");
  }

  // 2. Rank 2 never joins group 1.
  if (r == 2) {
    store->wait({"errors/done"}, std::chrono::seconds(60));
    return ok ? 0 : 1;
  }
  ok &= print_error<TimeoutError>("rendezvous", [&] {
    gloo::create(store, r, 3, std::chrono::seconds(30), milliseconds(1500));
  });

  // 3. Ranks 0 and 1 (group 2); rank 1 never reaches rank 0's second call.
  Group g(gloo::create(store, r, 2, milliseconds(1000), std::chrono::seconds(30)));
  at::Tensor t = at::ones({4});
  g.all_reduce(t, ReduceOp::kSum);
  std::cout << "before timeout: " << t.sum().item<float>() << std::endl;
  if (r == 0) {
    ok &= print_error<TimeoutError>("timeout", [&] { g.all_reduce(t, ReduceOp::kSum); });
    ok &= print_error<CommError>("after timeout", [&] { g.barrier("next"); });
    store->set("errors/done", "1");
  } else {
    store->wait({"errors/done"}, std::chrono::seconds(60));
  }
  return ok ? 0 : 1;
}

/// What rank `rank` printed after "<tag>: " (one line), or "(missing)".
std::string line_of(const std::string& output, int rank, const std::string& tag) {
  const std::string key = "[rank " + std::to_string(rank) + "] " + tag + ": ";
  size_t at = output.find(key);
  if (at == std::string::npos) return "(missing)";
  at += key.size();
  return output.substr(at, output.find('\n', at) - at);
}

class GlooErrors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    result_ = new testing::WorkersResult(testing::run_workers(3, "comm_errors"));
  }
  static void TearDownTestSuite() {
    delete result_;
    result_ = nullptr;
  }
  static std::string line(int rank, const std::string& tag) { return line_of(result_->output, rank, tag); }
  static testing::WorkersResult* result_;
};
testing::WorkersResult* GlooErrors::result_ = nullptr;

TEST_F(GlooErrors, WorkersSucceed) { EXPECT_TRUE(result_->ok()) << result_->launch.summary << "\n" << result_->output; }

TEST_F(GlooErrors, DebugModeNamesRanksAndShapesThatDiffer) {
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(line(r, "shapes"), "[comm] all_reduce #1: shapes differ across ranks: ranks 0, 2 [4, 3], rank 1 [4, 2]");
    EXPECT_EQ(line(r, "recovered"), "3,3") << "the group stays usable after a mismatch";
    EXPECT_EQ(line(r, "dtypes"), "[comm] all_reduce #3: dtypes differ across ranks: ranks 0, 1 float32, rank 2 float64");
    EXPECT_EQ(line(r, "reduce_ops"), "[comm] all_reduce #5: reduce ops differ across ranks: ranks 0, 2 sum, rank 1 max");
    EXPECT_EQ(line(r, "sources"), "[comm] broadcast #7: broadcast sources differ across ranks: rank 0 src 0, ranks 1, 2 src 1");
  }
  const std::string ops = "operations differ across ranks: rank 0 broadcast, ranks 1, 2 all_reduce";
  EXPECT_EQ(line(0, "ops"), "[comm] broadcast #4: " + ops);
  EXPECT_EQ(line(1, "ops"), "[comm] all_reduce #4: " + ops);
  EXPECT_EQ(line(2, "ops"), "[comm] all_reduce #4: " + ops);
  const std::string names = "barrier names differ across ranks: ranks 0, 1 'a', rank 2 'b'";
  EXPECT_EQ(line(0, "barrier_names"), "[comm] barrier 'a' #6: " + names);
  EXPECT_EQ(line(2, "barrier_names"), "[comm] barrier 'b' #6: " + names);
}

TEST_F(GlooErrors, RendezvousTimeoutNamesTheRankThatNeverJoined) {
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(line(r, "rendezvous"),
              "[gloo] rendezvous timed out after 1500 ms on rank " + std::to_string(r) +
                  " of 3: rank 2 never joined (check that every worker started and reached init_process_group)");
  }
}

TEST_F(GlooErrors, CollectiveTimeoutNamesOperationRankAndMissingPeer) {
  EXPECT_EQ(line(0, "before timeout"), "8");
  EXPECT_EQ(line(1, "before timeout"), "8");
  const std::string timeout = line(0, "timeout");
  const std::string expected =
      "[comm] all_reduce #2: [gloo] all_reduce #2 timed out after 1000 ms on rank 0 of 2; "
      "peer 1 is missing (never reached this call) (gloo: ";
  EXPECT_EQ(timeout.substr(0, expected.size()), expected) << timeout;
  const std::string after = line(0, "after timeout");
  EXPECT_EQ(after.rfind("[comm] barrier 'next' #3 not run: an earlier collective of this group failed (all_reduce #2: "
                        "[gloo] all_reduce #2 timed out",
                        0),
            0u)
      << after;
}

}  // namespace
}  // namespace strata::comm
