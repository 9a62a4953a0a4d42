// The hierarchical backend: shared memory inside a host, Gloo between the
// hosts' first ranks (their "leaders").
//
// Note [Hierarchical collectives]
// all_reduce: reduce inside each host (shm), all-reduce across the leaders
// (Gloo), broadcast inside each host from its leader (shm). Only one rank
// per host touches the network, with the host's already-reduced data, so
// the network carries 1/L of what a flat Gloo all-reduce over every rank
// would (L ranks per host). broadcast: to the source host's leader, across
// the leaders, then inside the other hosts. barrier: inside, across,
// inside. all_gather: gather inside the host, exchange the hosts' blocks
// across the leaders, broadcast the whole result inside each host.
// reduce_scatter: all-reduce inside the host, reduce-scatter across the
// leaders so that each leader gets its own ranks' pieces, broadcast those
// inside the host, each rank keeping its own. Hosts may hold different
// numbers of ranks, in any order of global ranks: the leaders' blocks are
// padded to the largest host, and pieces are placed by global rank. The
// reduction order differs from a flat group's, so sums may differ from the
// flat Gloo result in the last bits; every rank still gets the same bits.
#include "hierarchical.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "strata/core/error.h"

namespace strata::comm::detail {

Topology Topology::from_identities(const std::vector<std::string>& identities, int rank) {
  Topology t;
  std::map<std::string, int> index;
  for (int r = 0; r < static_cast<int>(identities.size()); ++r) {
    auto [it, inserted] = index.emplace(identities[r], static_cast<int>(t.hosts.size()));
    if (inserted) t.hosts.emplace_back();
    if (r == rank) {
      t.host = it->second;
      t.local_rank = static_cast<int>(t.hosts[it->second].size());
    }
    t.hosts[it->second].push_back(r);
  }
  return t;
}

namespace {

class HierarchicalBackend final : public Backend {
 public:
  HierarchicalBackend(Topology topology, int rank, int size, std::shared_ptr<Backend> local,
                      std::shared_ptr<Backend> leaders, std::chrono::milliseconds timeout)
      : topo_(std::move(topology)), rank_(rank), size_(size), local_(std::move(local)),
        leaders_(std::move(leaders)), timeout_(timeout) {}

  std::string name() const override { return "shm+gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    if (local_) local_->all_reduce(tensor, op);
    if (leaders_) leaders_->all_reduce(tensor, op);
    if (local_) local_->broadcast(tensor, 0);
  }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    const int64_t n = input.numel();
    const std::vector<int>& mine = topo_.hosts[topo_.host];
    at::Tensor host_block = input.reshape({1, n});
    if (local_) {
      host_block = at::empty({static_cast<int64_t>(mine.size()), n}, input.options());
      local_->all_gather(input, host_block);
    }
    at::Tensor rows = output.view({size_, n});
    if (leaders_) {
      const int64_t widest = widest_host();
      at::Tensor padded = at::zeros({widest, n}, input.options());
      padded.narrow(0, 0, host_block.size(0)).copy_(host_block);
      at::Tensor all = at::empty({static_cast<int64_t>(topo_.hosts.size()) * widest, n}, input.options());
      leaders_->all_gather(padded, all);
      for (size_t h = 0; h < topo_.hosts.size(); ++h) {
        for (size_t i = 0; i < topo_.hosts[h].size(); ++i) {
          rows[topo_.hosts[h][i]].copy_(all[static_cast<int64_t>(h) * widest + static_cast<int64_t>(i)]);
        }
      }
    }
    if (local_) local_->broadcast(output, 0);  // the leader's result, on every rank of the host
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    const int64_t n = output.numel();
    at::Tensor host_sum = input;
    if (local_) {
      host_sum = input.clone();
      local_->all_reduce(host_sum, op);
    }
    at::Tensor rows = host_sum.view({size_, n});
    const int64_t widest = widest_host();
    at::Tensor pieces = at::empty({widest, n}, output.options());  // this host's ranks' pieces, in local order
    if (leaders_) {
      // Block h holds the pieces of host h's ranks, so the leaders'
      // reduce-scatter leaves each leader its own host's pieces.
      at::Tensor by_host = at::zeros({static_cast<int64_t>(topo_.hosts.size()) * widest, n}, output.options());
      for (size_t h = 0; h < topo_.hosts.size(); ++h) {
        for (size_t i = 0; i < topo_.hosts[h].size(); ++i) {
          by_host[static_cast<int64_t>(h) * widest + static_cast<int64_t>(i)].copy_(rows[topo_.hosts[h][i]]);
        }
      }
      leaders_->reduce_scatter(by_host, pieces, op);
    }
    if (local_) local_->broadcast(pieces, 0);
    output.view({n}).copy_(pieces[topo_.local_rank]);
  }

  void broadcast(at::Tensor& tensor, int src) override {
    STRATA_CHECK(src >= 0 && src < size_, ConfigError, "[comm] broadcast from rank ", src, " in a group of ", size_);
    int src_host = 0, src_local = 0;
    for (int h = 0; h < static_cast<int>(topo_.hosts.size()); ++h) {
      for (int i = 0; i < static_cast<int>(topo_.hosts[h].size()); ++i) {
        if (topo_.hosts[h][i] == src) src_host = h, src_local = i;
      }
    }
    if (topo_.host == src_host && local_) local_->broadcast(tensor, src_local);
    if (leaders_) leaders_->broadcast(tensor, src_host);
    if (topo_.host != src_host && local_) local_->broadcast(tensor, 0);
  }

  void barrier() override {
    if (local_) local_->barrier();
    if (leaders_) leaders_->barrier();
    if (local_) local_->barrier();
  }

 private:
  int64_t widest_host() const {
    size_t widest = 0;
    for (const std::vector<int>& h : topo_.hosts) widest = std::max(widest, h.size());
    return static_cast<int64_t>(widest);
  }

  Topology topo_;
  int rank_, size_;
  std::shared_ptr<Backend> local_, leaders_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::shared_ptr<Backend> make_hierarchical(Topology topology, int rank, int size, std::shared_ptr<Backend> local,
                                           std::shared_ptr<Backend> leaders, std::chrono::milliseconds timeout) {
  STRATA_ASSERT(local != nullptr || leaders != nullptr, "[comm] a rank of the hierarchical backend needs its host's "
                "group or the leaders' group");
  return std::make_shared<HierarchicalBackend>(std::move(topology), rank, size, std::move(local), std::move(leaders),
                                               timeout);
}

}  // namespace strata::comm::detail
