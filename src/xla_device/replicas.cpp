// ReplicaGroup and its collectives backend (strata/xla_device/replicas.h).
//
// Note [Collectives of the replicas]
// On an xla tensor of the replica's device, a collective records a node of
// the step (lazy::all_reduce, all_gather, reduce_scatter over the one
// replica group {0..N-1}) and rebinds the tensor to it: nothing runs until
// the replicas end the step together, and XLA schedules the collective
// inside the compiled program. A broadcast is an all_gather from which
// each replica keeps the source's part, so the value arrives bit for bit;
// since the replicas pass in values made differently (the source's
// computed one, the others' fresh buffers) while their programs must be
// one text, it runs the step so far first and feeds each replica's buffer.
// The backend is stream-ordered (Note [Stream-ordered backends] in
// comm/backend.h): comm::Group calls it on the caller's thread, so a
// collective records in call order on the thread that recorded its input,
// and what follows it (a mean's division, a copy back) is recorded when its
// Work is waited for. On CPU tensors (the Group's byte transfers, debug
// descriptors) the replicas' threads meet in process: each posts its
// tensor, every one computes its result from all of them in rank order (so
// every replica gets the same bits), and a second meeting keeps each input
// alive until all have read it. A barrier is a meeting.
#include "strata/xla_device/replicas.h"

#include <functional>
#include <mutex>
#include <string>

#include "strata/core/error.h"
#include "lowering.h"
#include "meeting.h"

namespace strata::xla {
namespace detail {
namespace {

using lowering::NodePtr;
using lowering::NotLowered;
using lowering::Recorder;

class DoneWork final : public comm::Work {
 public:
  void wait() override {}
  bool is_completed() const override { return true; }
};

stablehlo::ReduceOp lowered(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::kSum: return stablehlo::ReduceOp::kSum;
    case comm::ReduceOp::kMax: return stablehlo::ReduceOp::kMax;
    case comm::ReduceOp::kMin: return stablehlo::ReduceOp::kMin;
    case comm::ReduceOp::kProduct: return stablehlo::ReduceOp::kProduct;
    case comm::ReduceOp::kMean: break;
  }
  throw ConfigError("[xla] a backend reduces with sum, max, min or product; comm::Group divides a mean");
}

void combine(at::Tensor& into, const at::Tensor& x, comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::kSum: into.add_(x); return;
    case comm::ReduceOp::kMax: into.copy_(at::maximum(into, x)); return;
    case comm::ReduceOp::kMin: into.copy_(at::minimum(into, x)); return;
    case comm::ReduceOp::kProduct: into.mul_(x); return;
    case comm::ReduceOp::kMean: break;
  }
  throw ConfigError("[xla] a backend reduces with sum, max, min or product; comm::Group divides a mean");
}

}  // namespace

struct ReplicaShared {
  std::vector<int> devices;
  std::chrono::milliseconds timeout;
  std::shared_ptr<Replication> replication;  // Note [Replicas in one process]
  Meeting meeting;  // host collectives and barriers
  std::vector<const at::Tensor*> posted;  // slot r written by replica r only, before a host collective's first meeting
  stablehlo::ReplicaGroups groups;

  ReplicaShared(std::vector<int> d, std::chrono::milliseconds t)
      : devices(std::move(d)), timeout(t), meeting(devices.size(), t, [this](int k) {
          return "replica " + std::to_string(k) + " (xla:" + std::to_string(devices[static_cast<size_t>(k)]) + ")";
        }), posted(devices.size(), nullptr) {
    std::vector<int64_t> all;
    for (size_t r = 0; r < devices.size(); ++r) all.push_back(static_cast<int64_t>(r));
    groups = {all};
    replication = start_replication(devices, timeout);
    // Note [Replicas that wait apart] (meeting.cpp): the two meetings' waits
    // on one board.
    board = std::make_shared<WaitBoard>(devices.size(), [this](int k) {
      return "replica " + std::to_string(k) + " (xla:" + std::to_string(devices[static_cast<size_t>(k)]) + ")";
    });
    Meeting* steps = &step_ends(*replication);
    const auto abort_all = [this, steps](const std::string& reason) {
      meeting.abort(reason);
      steps->abort(reason);
    };
    meeting.set_board(board, abort_all);
    steps->set_board(board, abort_all);
  }
  std::shared_ptr<WaitBoard> board;
};

namespace {

class ReplicaBackend final : public comm::Backend {
 public:
  ReplicaBackend(std::shared_ptr<ReplicaShared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}

  std::string name() const override { return "xla"; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(shared_->devices.size()); }
  std::chrono::milliseconds timeout() const override { return shared_->timeout; }
  bool stream_ordered() const override { return true; }
  comm::WorkPtr take_work() override { return std::make_shared<DoneWork>(); }

  void all_reduce(at::Tensor& tensor, comm::ReduceOp op) override {
    if (!on_xla(tensor, "all_reduce")) {
      meet_with(&tensor, "a host all_reduce");
      at::Tensor result = posted(0).clone();
      for (int r = 1; r < size(); ++r) combine(result, posted(r), op);
      meet_with(nullptr, "a host all_reduce");
      tensor.copy_(result);
      return;
    }
    record("strata::all_reduce", tensor, [&](Recorder& rec) {
      return lazy::all_reduce(ordered(rec, rec.tensor(tensor)), lowered(op), shared_->groups);
    });
  }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    if (!on_xla(input, "all_gather")) {
      meet_with(&input, "a host all_gather");
      const int64_t n = input.numel();
      at::Tensor flat = output.view({-1});
      for (int r = 0; r < size(); ++r) flat.narrow(0, r * n, n).copy_(posted(r).reshape({-1}));
      meet_with(nullptr, "a host all_gather");
      return;
    }
    on_xla(output, "all_gather");
    record("strata::all_gather", output, [&](Recorder& rec) {
      NodePtr x = rec.reshape(ordered(rec, rec.tensor(input)), {input.numel()});
      return lazy::all_gather(x, 0, shared_->groups);
    });
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, comm::ReduceOp op) override {
    if (!on_xla(input, "reduce_scatter")) {
      meet_with(&input, "a host reduce_scatter");
      const int64_t n = output.numel();
      at::Tensor result = posted(0).reshape({-1}).narrow(0, rank_ * n, n).clone();
      for (int r = 1; r < size(); ++r) combine(result, posted(r).reshape({-1}).narrow(0, rank_ * n, n), op);
      meet_with(nullptr, "a host reduce_scatter");
      output.view({-1}).copy_(result);
      return;
    }
    on_xla(output, "reduce_scatter");
    record("strata::reduce_scatter", output, [&](Recorder& rec) {
      NodePtr x = rec.reshape(ordered(rec, rec.tensor(input)), {input.numel()});
      return lazy::reduce_scatter(x, 0, lowered(op), shared_->groups);
    });
  }

  void broadcast(at::Tensor& tensor, int src) override {
    if (!on_xla(tensor, "broadcast")) {
      meet_with(&tensor, "a host broadcast");
      if (rank_ != src) tensor.copy_(posted(src));
      meet_with(nullptr, "a host broadcast");
      return;
    }
    // The replicas' programs must be one text, but what each passes in
    // differs (the source's computed value, the others' fresh buffers): the
    // step so far runs first (a sync, which every replica reaches here), so
    // every replica's input is a buffer of its own, fed to the program.
    sync_pending();
    LazyBuffer& storage = lazy_buffer(tensor);
    if (!storage.on_device()) storage.assign(std::make_shared<const std::vector<uint8_t>>(storage.nbytes(), 0),
                                             lowering::element_type(tensor.scalar_type()));
    record("strata::broadcast", tensor, [&](Recorder& rec) {
      const int64_t n = tensor.numel();
      NodePtr all = lazy::all_gather(rec.reshape(ordered(rec, rec.tensor(tensor)), {1, n}), 0, shared_->groups);
      return rec.slice(all, {src, 0}, {src + 1, n});
    });
  }

  void barrier() override { shared_->meeting.meet(rank_, "a barrier"); }

  // Note [Segmented layouts] (comm/backend.h): in the step, the gathered
  // rows are cut into the segments and joined (and the reverse before a
  // reduce_scatter), so FSDP's full buffers need no pack or unpack copies.
  bool supports_segmented() const override { return true; }

  void all_gather_segmented(const at::Tensor& input, at::Tensor& output,
                            const std::vector<int64_t>& segments) override {
    const int64_t n = input.numel(), w = size();
    if (!on_xla(input, "all_gather")) {
      at::Tensor rows = at::empty({w, n}, output.options());
      all_gather(input, rows);
      int64_t begin = 0;
      for (int64_t len : segments) {
        output.view({-1}).narrow(0, w * begin, w * len).view({w, len}).copy_(rows.narrow(1, begin, len));
        begin += len;
      }
      return;
    }
    on_xla(output, "all_gather");
    record("strata::all_gather", output, [&](Recorder& rec) {
      NodePtr rows = lazy::all_gather(rec.reshape(ordered(rec, rec.tensor(input)), {1, n}), 0, shared_->groups);  // [w, n]
      std::vector<NodePtr> parts;
      int64_t begin = 0;
      for (int64_t len : segments) {
        if (len > 0) parts.push_back(rec.reshape(rec.slice(rows, {0, begin}, {w, begin + len}), {w * len}));
        begin += len;
      }
      return rec.concat(parts, 0);
    });
  }

  void reduce_scatter_segmented(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& segments,
                                comm::ReduceOp op) override {
    const int64_t n = output.numel(), w = size();
    if (!on_xla(input, "reduce_scatter")) {
      at::Tensor rows = at::empty({w, n}, input.options());
      int64_t begin = 0;
      for (int64_t len : segments) {
        rows.narrow(1, begin, len).copy_(input.view({-1}).narrow(0, w * begin, w * len).view({w, len}));
        begin += len;
      }
      reduce_scatter(rows, output, op);
      return;
    }
    on_xla(output, "reduce_scatter");
    record("strata::reduce_scatter", output, [&](Recorder& rec) {
      NodePtr full = rec.reshape(ordered(rec, rec.tensor(input)), {w * n});
      std::vector<NodePtr> columns;
      int64_t begin = 0;
      for (int64_t len : segments) {
        if (len > 0) columns.push_back(rec.reshape(rec.slice(full, {w * begin}, {w * (begin + len)}), {w, len}));
        begin += len;
      }
      NodePtr rows = rec.concat(columns, 1);  // [w, n]: replica r's part in row r
      return lazy::reduce_scatter(rec.reshape(rows, {w * n}), 0, lowered(op), shared_->groups);
    });
  }

 private:
  // A host collective's meetings: the first with this replica's tensor
  // posted, which the others read until the second (mine: nullptr), so no
  // input changes or goes while a peer reads it.
  void meet_with(const at::Tensor* mine, const char* what) {
    if (mine != nullptr) shared_->posted[static_cast<size_t>(rank_)] = mine;
    shared_->meeting.meet(rank_, what);
  }
  const at::Tensor& posted(int rank) const { return *shared_->posted[static_cast<size_t>(rank)]; }

  // True for an xla tensor of this replica's device, false for a CPU one;
  // ConfigError for any other.
  bool on_xla(const at::Tensor& t, const char* op) const {
    const int device = shared_->devices[static_cast<size_t>(rank_)];
    if (t.device().is_cpu()) return false;
    STRATA_CHECK(t.device().type() == c10::DeviceType::PrivateUse1 && t.device().index() == device, ConfigError,
                 "[xla] ", op, " of replica ", rank_, " got a tensor on ", t.device().str(), "; replica ", rank_,
                 " reduces tensors of xla:", device, " (or of the CPU)");
    return true;
  }

  // Records `collective` (a node of the whole tensor's elements) into
  // `out` as the op `name` ("strata::all_reduce"): directly when `out` is
  // contiguous (a view included: Note [Writes into a view] in lowering.h),
  // else into a new tensor copied into `out`.
  template <class Collective>
  void record(const char* name, at::Tensor& out, Collective&& collective) {
    if (out.numel() == 0) return;
    // Note [Paused replicas] (recorder.cpp).
    STRATA_CHECK(size() == 1 || !replication_paused(*shared_->replication), ConfigError, "[xla] ", name + 8,
                 " of replica ", rank_, " while the replicas are paused (between two runs of their threads, e.g. "
                 "after Trainer::fit returned): a collective of xla tensors runs only in a step of all ",
                 size(), " replicas. Call it inside a call that runs on every rank (a callback's on_fit_end, "
                 "Trainer::validate); a model sharded by xla_fsdp gathers its parameters so in every forward");
    try {
      at::Tensor target = out.is_contiguous() ? out : at::empty(out.sizes(), out.options());
      {
        Recorder rec(name);
        NodePtr value = collective(rec);
        {
          std::lock_guard<std::mutex> lock(token_mutex_);
          token_ = value;
        }
        rec.write(target, rec.reshape(value, lowering::vec(out.sizes())));
      }
      if (!target.is_same(out)) out.copy_(target);
    } catch (const NotLowered&) {
      throw ConfigError("[xla] " + std::string(name + 8) + " of replica " + std::to_string(rank_) + " cannot record a " +
                        std::string(c10::toString(out.scalar_type())) + " tensor of shape " +
                        c10::str(out.sizes()) + " into the step: its dtype or layout has no lowering");
    }
  }

  // Note [Collectives in order]
  // Each collective's input passes through an optimization_barrier with
  // the result of the replica's previous collective of the step (torch_xla
  // chains a token the same way). So XLA keeps the collectives in call
  // order, and two collectives of the same value (FSDP's gather of a unit
  // before its forward and again before its backward) stay two: the
  // backward's cannot be merged with the forward's, nor hoisted above the
  // backward's earlier collectives, which would keep the unit's full
  // parameters alive from forward to backward. The token is held weakly:
  // once a step has run, its nodes are gone and the next step starts a
  // new chain, the same on every replica.
  NodePtr ordered(Recorder& rec, const NodePtr& x) {
    NodePtr token;
    {
      std::lock_guard<std::mutex> lock(token_mutex_);
      token = token_.lock();
    }
    if (!token) return x;
    return rec.op("optimization_barrier", {x, token}, x->type(),
                  [](stablehlo::Function& f, const std::vector<stablehlo::Value>& in) {
                    return f.optimization_barrier({in[0], in[1]})[0];
                  });
  }

  std::shared_ptr<ReplicaShared> shared_;
  const int rank_;
  std::mutex token_mutex_;
  std::weak_ptr<const lazy::Node> token_;  // the last collective of the step recorded here
};

}  // namespace
}  // namespace detail

struct ReplicaGroup::State {
  std::shared_ptr<detail::ReplicaShared> shared;
};

ReplicaGroup::ReplicaGroup(std::vector<int> devices, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>()) {
  init();
  state_->shared = std::make_shared<detail::ReplicaShared>(std::move(devices), timeout);
}

int ReplicaGroup::size() const { return static_cast<int>(state_->shared->devices.size()); }

const std::vector<int>& ReplicaGroup::devices() const { return state_->shared->devices; }

void ReplicaGroup::set_on_wait(std::function<void(int)> on_wait) {
  state_->shared->meeting.set_on_wait(on_wait);
  detail::step_ends(*state_->shared->replication).set_on_wait(std::move(on_wait));
}

int64_t ReplicaGroup::steps() const {
  return static_cast<int64_t>(detail::step_ends(*state_->shared->replication).completed());
}

void ReplicaGroup::pause(bool paused) {
  if (!paused) state_->shared->board->reset();
  detail::pause_replication(*state_->shared->replication, paused);
}

void ReplicaGroup::finish(int rank) {
  STRATA_CHECK(rank >= 0 && rank < size(), ConfigError, "[xla] replica ", rank, " does not exist: the group has ",
               size());
  const std::string stuck = state_->shared->board->leave(rank);
  if (!stuck.empty()) abort(stuck);
}

void ReplicaGroup::abort(const std::string& reason) {
  state_->shared->meeting.abort(reason);
  detail::step_ends(*state_->shared->replication).abort(reason);
}

std::shared_ptr<comm::Backend> ReplicaGroup::backend(int rank) const {
  STRATA_CHECK(rank >= 0 && rank < size(), ConfigError, "[xla] replica ", rank, " does not exist: the group has ",
               size(), " replica(s)");
  return std::make_shared<detail::ReplicaBackend>(state_->shared, rank);
}

}  // namespace strata::xla
