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
// inside. all_gather and reduce_scatter run on a flat Gloo group over every
// rank for now (their hierarchical forms need the hosts' ranks to be
// contiguous and equal in number, which the launcher gives but nothing
// checks yet). The reduction order differs from a flat group's, so sums
// may differ from the flat Gloo result in the last bits; every rank still
// gets the same bits.
#include "hierarchical.h"

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
                      std::shared_ptr<Backend> leaders, std::shared_ptr<Backend> world)
      : topo_(std::move(topology)), rank_(rank), size_(size), local_(std::move(local)),
        leaders_(std::move(leaders)), world_(std::move(world)) {}

  std::string name() const override { return "shm+gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return world_->timeout(); }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    if (local_) local_->all_reduce(tensor, op);
    if (leaders_) leaders_->all_reduce(tensor, op);
    if (local_) local_->broadcast(tensor, 0);
  }

  void all_gather(const at::Tensor& input, at::Tensor& output) override { world_->all_gather(input, output); }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    world_->reduce_scatter(input, output, op);
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
  Topology topo_;
  int rank_, size_;
  std::shared_ptr<Backend> local_, leaders_, world_;
};

}  // namespace

std::shared_ptr<Backend> make_hierarchical(Topology topology, int rank, int size, std::shared_ptr<Backend> local,
                                           std::shared_ptr<Backend> leaders, std::shared_ptr<Backend> world) {
  STRATA_ASSERT(world != nullptr, "[comm] the hierarchical backend needs a world group");
  return std::make_shared<HierarchicalBackend>(std::move(topology), rank, size, std::move(local), std::move(leaders),
                                               std::move(world));
}

}  // namespace strata::comm::detail
