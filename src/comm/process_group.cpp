// Entry points of the collectives layer: reduce-op names, and
// init_process_group, which turns a runtime::Environment into a Group
// (local for one process; otherwise a rendezvous store and Gloo or NCCL).
#include <algorithm>
#include <cctype>

#include "strata/comm/gloo/backend.h"
#include "strata/comm/group.h"
#include "strata/comm/local.h"
#include "strata/comm/nccl/backend.h"
#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/store.h"

namespace strata::comm {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

ReduceOp parse_reduce_op(const std::string& name) {
  const std::string n = lower(name);
  if (n == "sum") return ReduceOp::kSum;
  if (n == "mean" || n == "avg") return ReduceOp::kMean;
  if (n == "max") return ReduceOp::kMax;
  if (n == "min") return ReduceOp::kMin;
  if (n == "product" || n == "prod") return ReduceOp::kProduct;
  throw ConfigError("[comm] unknown reduce op '" + name +
                    "'; use one of: sum, mean (or avg), max, min, product (or prod)");
}

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMean: return "mean";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProduct: return "product";
  }
  return "unknown";
}

Group init_process_group(const runtime::Environment& env, const ProcessGroupOptions& options) {
  std::string backend = lower(options.backend);
  const std::string device = lower(options.device_type);
  if (backend == "auto") {
    STRATA_CHECK(device == "cpu" || device == "cuda", ConfigError, "[comm] unknown device type '",
                 options.device_type, "'; use cpu or cuda");
    backend = env.world_size == 1 ? "local" : (device == "cuda" ? "nccl" : "gloo");
  }
  STRATA_CHECK(backend == "gloo" || backend == "nccl" || backend == "local", ConfigError,
               "[comm] unknown backend '", options.backend, "'; use one of: auto, gloo, nccl, local");
  STRATA_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, ConfigError,
               "[comm] invalid environment: ", env.describe());

  if (backend == "local") {
    STRATA_CHECK(env.world_size == 1, ConfigError, "[comm] backend 'local' runs one process, but the world size is ",
                 env.world_size, "; use gloo (CPU) or nccl (CUDA)");
    return Group(local::create(), options.group);
  }
  if (backend == "nccl" && !nccl::is_available()) {
    nccl::create(nullptr, env.rank, env.world_size, options.group.timeout);  // throws, saying how to build it
  }

  std::chrono::milliseconds rendezvous = options.rendezvous_timeout;
  if (rendezvous.count() <= 0) {
    rendezvous = std::chrono::seconds(env.timeout_s > 0 ? env.timeout_s : 300);
  }
  std::shared_ptr<runtime::Store> store;
  if (env.world_size == 1 && env.master_port == 0) {
    // One process asked for a real backend (tests, benchmarks): a private store.
    runtime::TcpStoreOptions o;
    o.is_server = true;
    o.timeout = rendezvous;
    store = runtime::make_tcp_store(o);
  } else {
    store = runtime::make_store(env, rendezvous);
  }
  std::shared_ptr<Backend> b =
      backend == "gloo" ? gloo::create(store, env.rank, env.world_size, options.group.timeout, rendezvous)
                        : nccl::create(store, env.rank, env.world_size, options.group.timeout);
  return Group(std::move(b), options.group);
}

}  // namespace strata::comm
