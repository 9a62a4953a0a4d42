// Entry points of the collectives layer: reduce-op names, and
// init_process_group, which turns a runtime::Environment into a Group
// (local for one process; otherwise a rendezvous store and shared memory,
// Gloo, both, or NCCL: Note [Choosing the CPU backend]).
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <iostream>

#include "strata/comm/gloo/backend.h"
#include "strata/comm/group.h"
#include "strata/comm/local.h"
#include "strata/comm/nccl/backend.h"
#include "strata/comm/shm/backend.h"
#include "hierarchical.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/runtime/env.h"
#include "strata/runtime/store.h"

namespace strata::comm {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

void Backend::all_gather_segmented(const at::Tensor&, at::Tensor&, const std::vector<int64_t>&) {
  throw ConfigError("[comm] the " + name() + " backend has no segmented all_gather (supports_segmented() is false)");
}

void Backend::reduce_scatter_segmented(const at::Tensor&, at::Tensor&, const std::vector<int64_t>&, ReduceOp) {
  throw ConfigError("[comm] the " + name() + " backend has no segmented reduce_scatter (supports_segmented() is false)");
}

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

namespace {

std::atomic<int> pg_counter{0};

/// Every rank's host identity (Note [Host identity] in shm/host.cpp),
/// indexed by rank, through the store.
std::vector<std::string> exchange_identities(runtime::Store& store, const runtime::Environment& env,
                                             std::chrono::milliseconds timeout) {
  store.set("host/" + std::to_string(env.rank), shm::host_identity());
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back("host/" + std::to_string(r));
  store.wait(keys, timeout);
  std::vector<std::string> out;
  for (const std::string& k : keys) out.push_back(store.get(k));
  store.set("read/" + std::to_string(env.rank), "1");
  return out;
}

/// Rank 0 hosts the store: before it throws, it lets every rank finish
/// reading the identities, so they all report the same error instead of
/// "the store closed the connection".
void let_everyone_read(runtime::Store& store, const runtime::Environment& env, std::chrono::milliseconds timeout) {
  if (env.rank != 0) return;
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back("read/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
  }
}

// Note [Choosing the CPU backend]
// "auto" on CPU exchanges the ranks' host identities through the store:
// all on one host -> shm; one rank per host -> gloo; otherwise the
// hierarchical backend (shm inside hosts, gloo between them). A failure to
// set up shared memory on one host (every rank sees the same verdict,
// shm::create's Note [Segment lifetime]) falls back to gloo with a warning.
// STRATA_COMM_BACKEND=gloo|shm|auto overrides "auto" (gloo: to compare).
std::shared_ptr<Backend> make_cpu_backend(const std::string& backend, const runtime::Environment& env,
                                          const std::shared_ptr<runtime::Store>& store, const GroupOptions& group,
                                          std::chrono::milliseconds rendezvous) {
  auto pg = runtime::prefix_store(store, "strata/pg/" + std::to_string(pg_counter++));
  detail::Topology topo = detail::Topology::from_identities(exchange_identities(*pg, env, rendezvous), env.rank);
  const int hosts = static_cast<int>(topo.hosts.size());
  if (backend == "shm" && hosts > 1) let_everyone_read(*pg, env, rendezvous);
  STRATA_CHECK(backend != "shm" || hosts == 1, ConfigError, "[comm] backend 'shm' needs every rank on one host, but the ",
               env.world_size, " ranks are on ", hosts, " hosts; use auto (shared memory inside each host, gloo "
               "between hosts) or gloo");
  if (hosts == env.world_size && env.world_size > 1) {
    return gloo::create(store, env.rank, env.world_size, group.timeout, rendezvous);
  }
  if (hosts == 1) {
    try {
      return shm::create(runtime::prefix_store(pg, "shm"), env.rank, env.world_size, group.timeout, rendezvous,
                         env.job_token);
    } catch (const TimeoutError&) {
      throw;
    } catch (const CommError& e) {
      if (backend == "shm") throw;
      if (env.rank == 0) log::warning("[comm] ", e.what(), "; using gloo instead");
      return gloo::create(store, env.rank, env.world_size, group.timeout, rendezvous);
    }
  }
  // Note [Hierarchical collectives] (hierarchical.cpp). Creation order is the
  // same on every rank: its host's shm group, then the leaders' Gloo group
  // (host leaders only).
  const std::vector<int>& mine = topo.hosts[topo.host];
  std::shared_ptr<Backend> local;
  if (mine.size() > 1) {
    local = shm::create(runtime::prefix_store(pg, "shm/" + std::to_string(topo.host)), topo.local_rank,
                        static_cast<int>(mine.size()), group.timeout, rendezvous, env.job_token);
  }
  std::shared_ptr<Backend> leaders;
  if (topo.local_rank == 0) leaders = gloo::create_named(pg, "leaders", topo.host, hosts, group.timeout, rendezvous);
  return detail::make_hierarchical(std::move(topo), env.rank, env.world_size, std::move(local), std::move(leaders),
                                   group.timeout);
}

}  // namespace

Group init_process_group(const runtime::Environment& env, const ProcessGroupOptions& options) {
  std::string backend = lower(options.backend);
  const std::string device = lower(options.device_type);
  if (backend == "auto") {
    if (const char* forced = std::getenv("STRATA_COMM_BACKEND"); forced != nullptr && *forced != '\0') {
      backend = lower(forced);
      STRATA_CHECK(backend == "auto" || backend == "gloo" || backend == "shm", ConfigError,
                   "[comm] STRATA_COMM_BACKEND='", forced, "' is not a CPU backend; use auto, gloo or shm, or unset it");
    }
  }
  if (backend == "auto") {
    // xla: one process for now (its collectives go into the compiled step,
    // which is not built yet); a one-rank group has nothing to move.
    STRATA_CHECK(device == "cpu" || device == "cuda" || (device == "xla" && env.world_size == 1), ConfigError,
                 "[comm] ", device == "xla" ? "no collectives for device type 'xla' yet (a one-process job only)"
                                            : "unknown device type '" + options.device_type + "'; use cpu or cuda");
    backend = env.world_size == 1 ? "local" : (device == "cuda" ? "nccl" : "auto-cpu");
  }
  STRATA_CHECK(backend == "gloo" || backend == "shm" || backend == "nccl" || backend == "local" || backend == "auto-cpu",
               ConfigError, "[comm] unknown backend '", options.backend,
               "'; use one of: auto, gloo, shm, nccl, local");
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
  std::shared_ptr<Backend> b;
  if (backend == "gloo") b = gloo::create(store, env.rank, env.world_size, options.group.timeout, rendezvous);
  else if (backend == "nccl") b = nccl::create(store, env.rank, env.world_size, options.group.timeout);
  else b = make_cpu_backend(backend, env, store, options.group, rendezvous);
  return Group(std::move(b), options.group);
}

}  // namespace strata::comm
