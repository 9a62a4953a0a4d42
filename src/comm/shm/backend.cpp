// The shared-memory backend (include/strata/comm/shm/backend.h).
//
// Every rank owns two staging slots in the group's segment (buffers 0 and
// 1, used alternately: Note [Double buffering]). A collective is cut into
// rounds of at most one slot; each round copies in, waits for the peers'
// phase counters (segment.h, Note [Phases]) and copies or reduces out.
//
// Note [Reduce in parallel]
// A large all_reduce round gives every rank 1/N of the elements to reduce
// (reduce-scatter), then every rank copies the other N-1 reduced pieces
// (all-gather): three phases, and each rank reads and reduces only its
// share. A small one (at most whole_reduce_bytes, 64 KiB by default) lets
// every rank reduce the whole buffer itself: more arithmetic, but one wait
// instead of two, which is what decides latency. Both fold in rank order (kernels.h), so
// the result does not depend on the size.
//
// Note [Double buffering]
// A rank may write its slot in buffer b only when every peer has finished
// reading buffer b's previous round. Alternating two buffers makes that
// wait (for the phase recorded in free_[b]) almost always already met: a
// round's copy-in overlaps the slowest peer's copy-out of the round before.
#include "strata/comm/shm/backend.h"

#include <ATen/ATen.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "../reduce_kernels.h"
#include "segment.h"
#include "strata/core/error.h"
#include "strata/runtime/store.h"

namespace strata::comm::shm {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using detail::Segment;
using detail::Sync;
using detail::WaitFailure;

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

kernels::ReduceFn reduce_fn(at::ScalarType t, ReduceOp op, const char* name) {
  switch (t) {
    case at::kFloat: return kernels::reduce_function<float>(op);
    case at::kDouble: return kernels::reduce_function<double>(op);
    case at::kBFloat16: return kernels::reduce_function<c10::BFloat16>(op);
    case at::kHalf: return kernels::reduce_function<c10::Half>(op);
    case at::kInt: return kernels::reduce_function<int32_t>(op);
    case at::kLong: return kernels::reduce_function<int64_t>(op);
    default:
      throw ConfigError(strata::detail::cat("[shm] ", name, ": dtype ", t, " is not supported"));
  }
}

/// The segmented layout of a full buffer (Note [Segmented layouts] in
/// backend.h), in bytes: where each part of a rank's shard lies in it.
class Layout {
 public:
  Layout(const std::vector<int64_t>& segments, int64_t element_size, int world) : world_(world) {
    int64_t at = 0;
    for (int64_t n : segments) {
      if (n > 0) {
        begin_.push_back(at);
        length_.push_back(n * element_size);
      }
      at += n * element_size;
    }
  }

  /// Calls f(shard_offset, bytes, full_offset) for the parts of bytes
  /// [lo, lo + count) of rank q's shard, in order.
  template <class F>
  void for_each_part(int q, int64_t lo, int64_t count, F&& f) const {
    const int64_t hi = lo + count;
    size_t i = static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), lo) - begin_.begin());
    i = i == 0 ? 0 : i - 1;
    for (; i < begin_.size() && begin_[i] < hi; ++i) {
      const int64_t a = std::max(lo, begin_[i]);
      const int64_t e = std::min(hi, begin_[i] + length_[i]);
      if (a < e) f(a, e - a, world_ * begin_[i] + q * length_[i] + (a - begin_[i]));
    }
  }

  /// Copies bytes [lo, lo + count) of rank q's shard from `src` to their
  /// places in the full buffer `full`.
  void place(char* full, int q, int64_t lo, int64_t count, const char* src) const {
    for_each_part(q, lo, count, [&](int64_t a, int64_t n, int64_t at) { std::memcpy(full + at, src + (a - lo), n); });
  }

  /// Copies bytes [lo, lo + count) of rank q's shard from their places in
  /// the full buffer `full` to `dst`.
  void take(char* dst, int q, int64_t lo, int64_t count, const char* full) const {
    for_each_part(q, lo, count, [&](int64_t a, int64_t n, int64_t at) { std::memcpy(dst + (a - lo), full + at, n); });
  }

 private:
  int world_;
  std::vector<int64_t> begin_, length_;  // the non-empty segments' places in a shard
};

class ShmBackend final : public Backend {
 public:
  // Note: the backend holds the store: on rank 0 it is the rendezvous
  // server, which must outlive the other ranks' setup (and the job).
  ShmBackend(std::shared_ptr<runtime::Store> store, Segment segment, int rank, int size, milliseconds timeout,
             int spin_us, int64_t whole_reduce_bytes)
      : store_(std::move(store)), seg_(std::move(segment)), sync_(&seg_, rank, size, spin_us), rank_(rank),
        size_(size), timeout_(timeout), whole_reduce_bytes_(whole_reduce_bytes) {
    sync_.watch_peers();
  }

  std::string name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  milliseconds timeout() const override { return timeout_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    begin("all_reduce", tensor);
    if (tensor.numel() == 0 || size_ == 1) return;
    kernels::ReduceFn fn = reduce_fn(tensor.scalar_type(), op, "all_reduce");
    const int64_t es = tensor.element_size();
    const int64_t total = tensor.nbytes();
    char* data = static_cast<char*>(tensor.data_ptr());
    if (total <= whole_reduce_bytes_) {
      std::vector<const void*> in(size_);
      for (int64_t off = 0; off < total; off += slot()) {
        const int64_t c = std::min(slot(), total - off);
        const int b = acquire(true);
        std::memcpy(seg_.slot(b, rank_), data + off, c);
        wait_all(publish_next());
        for (int q = 0; q < size_; ++q) in[q] = q == rank_ ? data + off : seg_.slot(b, q);
        fn(data + off, nullptr, in.data(), size_, c / es);
        release(b);
      }
      return;
    }
    // Note [Reduce in parallel]: round size a multiple of N elements' worth
    // of 64-byte lines where possible, so pieces start on cache lines.
    const int64_t unit = std::lcm<int64_t>(64, es) * size_;
    const int64_t round = std::max<int64_t>(es * size_, slot() / unit * unit);
    std::vector<const void*> in(size_);
    for (int64_t off = 0; off < total; off += round) {
      const int64_t c = std::min(round, total - off);
      const int64_t elems = c / es;
      auto piece_begin = [&](int q) { return elems * q / size_ * es; };
      const int b = acquire(true);
      char* mine = seg_.slot(b, rank_);
      const int64_t my0 = piece_begin(rank_), my1 = piece_begin(rank_ + 1);
      // Others reduce the pieces that are not this rank's; this rank reads
      // its own piece from the tensor.
      std::memcpy(mine, data + off, my0);
      std::memcpy(mine + my1, data + off + my1, c - my1);
      wait_all(publish_next());
      for (int q = 0; q < size_; ++q) in[q] = q == rank_ ? data + off + my0 : seg_.slot(b, q) + my0;
      // The reduced piece goes to the tensor and, for the peers, to this
      // rank's slot in the same pass.
      fn(data + off + my0, mine + my0, in.data(), size_, (my1 - my0) / es);
      wait_all(publish_next());
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        const int64_t q0 = piece_begin(q), q1 = piece_begin(q + 1);
        std::memcpy(data + off + q0, seg_.slot(b, q) + q0, q1 - q0);
      }
      release(b);
    }
  }

  // The rank-major layout of all_gather and reduce_scatter is the
  // segmented one with a single segment (Note [Segmented layouts]).
  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    all_gather_segmented(input, output, {input.numel()});
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    reduce_scatter_segmented(input, output, {output.numel()}, op);
  }

  bool supports_segmented() const override { return true; }

  void all_gather_segmented(const at::Tensor& input, at::Tensor& output,
                            const std::vector<int64_t>& segments) override {
    begin("all_gather", input);
    STRATA_ASSERT(output.is_contiguous() && output.nbytes() == input.nbytes() * size_);
    const int64_t total = input.nbytes();
    if (total == 0) return;
    const Layout layout(segments, input.element_size(), size_);
    const char* in = static_cast<const char*>(input.data_ptr());
    char* out = static_cast<char*>(output.data_ptr());
    for (int64_t off = 0; off < total; off += slot()) {
      const int64_t c = std::min(slot(), total - off);
      const int b = acquire(true);
      std::memcpy(seg_.slot(b, rank_), in + off, c);
      const uint32_t written = publish_next();
      layout.place(out, rank_, off, c, in + off);  // while the peers copy in
      wait_all(written);
      for (int q = 0; q < size_; ++q) {
        if (q != rank_) layout.place(out, q, off, c, seg_.slot(b, q));
      }
      release(b);
    }
  }

  void reduce_scatter_segmented(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& segments,
                                ReduceOp op) override {
    begin("reduce_scatter", input);
    STRATA_ASSERT(output.is_contiguous() && input.nbytes() == output.nbytes() * size_);
    const int64_t piece = output.nbytes();
    if (piece == 0) return;
    kernels::ReduceFn fn = reduce_fn(input.scalar_type(), op, "reduce_scatter");
    const int64_t es = output.element_size();
    const Layout layout(segments, es, size_);
    const char* in = static_cast<const char*>(input.data_ptr());
    char* out = static_cast<char*>(output.data_ptr());
    if (size_ == 1) {
      layout.take(out, 0, 0, piece, in);
      return;
    }
    // Each round stages, for every destination rank q, the same sub-range
    // of q's pieces, gathered from their segments; rank q reduces its
    // sub-range across the slots.
    const int64_t round = std::max<int64_t>(es, slot() / size_ / 64 * 64 / es * es);
    std::vector<const void*> srcs(size_);
    for (int64_t off = 0; off < piece; off += round) {
      const int64_t c = std::min(round, piece - off);
      const int b = acquire(true);
      char* mine = seg_.slot(b, rank_);
      for (int q = 0; q < size_; ++q) {
        if (q != rank_) layout.take(mine + q * round, q, off, c, in);
      }
      wait_all(publish_next());
      layout.for_each_part(rank_, off, c, [&](int64_t a, int64_t n, int64_t at) {
        for (int q = 0; q < size_; ++q) srcs[q] = q == rank_ ? in + at : seg_.slot(b, q) + rank_ * round + (a - off);
        fn(out + a, nullptr, srcs.data(), size_, n / es);
      });
      release(b);
    }
  }

  void broadcast(at::Tensor& tensor, int src) override {
    begin("broadcast", tensor);
    STRATA_CHECK(src >= 0 && src < size_, ConfigError, "[shm] broadcast from rank ", src, " in a group of ", size_);
    const int64_t total = tensor.nbytes();
    if (total == 0 || size_ == 1) return;
    char* data = static_cast<char*>(tensor.data_ptr());
    for (int64_t off = 0; off < total; off += slot()) {
      const int64_t c = std::min(slot(), total - off);
      const int b = acquire(rank_ == src);
      if (rank_ == src) std::memcpy(seg_.slot(b, src), data + off, c);
      const uint32_t written = publish_next();
      if (rank_ != src) {
        wait_all(written, src);
        std::memcpy(data + off, seg_.slot(b, src), c);
      }
      release(b);
    }
  }

  void barrier() override {
    op_ = "barrier";
    ++seq_;
    start_op();
    wait_all(publish_next());
  }

 private:
  int64_t slot() const { return seg_.slot_bytes(); }

  void begin(const char* op, const at::Tensor& t) {
    op_ = op;
    ++seq_;
    STRATA_CHECK(t.device().is_cpu(), ConfigError, "[shm] ", op, ": tensor is on ", t.device(),
                 "; the shm backend takes CPU tensors (use nccl for CUDA)");
    STRATA_ASSERT(t.is_contiguous(), "[shm] ", op, " needs a contiguous tensor");
    start_op();
  }

  void start_op() {
    STRATA_CHECK(broken_.empty(), CommError, "[shm] ", op_, " #", seq_, " not run on rank ", rank_, ": ", broken_);
    deadline_ = Clock::now() + timeout_;
  }

  uint32_t publish_next() {
    // Phase 0 means "never used" in free_, so counting skips it when it
    // wraps (every rank skips it alike).
    if (++phase_ == 0) ++phase_;
    sync_.publish(phase_);
    return phase_;
  }

  /// Note [Double buffering]: the next buffer, once every peer has read
  /// its previous round (only a rank that writes its slot must wait).
  int acquire(bool writes) {
    const int b = next_buffer_;
    next_buffer_ ^= 1;
    if (writes && free_[b] != 0) wait_all(free_[b]);
    return b;
  }

  /// This rank is done reading buffer b in this round.
  void release(int b) { free_[b] = publish_next(); }

  void wait_all(uint32_t p, int only = -1) {
    WaitFailure f = sync_.wait_all(p, deadline_, only);
    if (f.kind == WaitFailure::Kind::kNone) return;
    const std::string where = strata::detail::cat("[shm] ", op_, " #", seq_);
    const std::string me = strata::detail::cat(" on rank ", rank_, " of ", size_);
    std::string message;
    switch (f.kind) {
      case WaitFailure::Kind::kTimeout:
        message = strata::detail::cat(where, " timed out after ", timeout_.count(), " ms", me, "; peer",
                                      f.peers.size() == 1 ? " " : "s ", rank_list(f.peers),
                                      f.peers.size() == 1 ? " is" : " are", " missing (never reached this call)");
        break;
      case WaitFailure::Kind::kPeerExited:
        message = strata::detail::cat(where, " failed", me, ": peer ", rank_list(f.peers),
                                      " exited (its process is gone)");
        break;
      case WaitFailure::Kind::kAborted:
        message = strata::detail::cat(where, " failed", me, ": rank ", f.aborted_by, " gave up on this group (",
                                      f.reason, ")");
        break;
      case WaitFailure::Kind::kNone: break;
    }
    if (f.kind != WaitFailure::Kind::kAborted) sync_.abort(message);
    broken_ = "an earlier call failed (" + message + ")";
    if (f.kind == WaitFailure::Kind::kTimeout) throw TimeoutError(message);
    throw CommError(message);
  }

  std::shared_ptr<runtime::Store> store_;
  Segment seg_;
  Sync sync_;
  int rank_, size_;
  milliseconds timeout_;
  int64_t whole_reduce_bytes_;
  const char* op_ = "";
  int64_t seq_ = 0;
  uint32_t phase_ = 0;
  uint32_t free_[2] = {0, 0};
  int next_buffer_ = 0;
  Clock::time_point deadline_;
  std::string broken_;
};

std::atomic<int> group_counter{0};

/// "/strata-<hint>-<pid>-<random>": a name no other job or group uses.
std::string segment_name(const std::string& hint) {
  std::string clean;
  for (char c : hint) {
    if (std::isalnum(static_cast<unsigned char>(c)) && clean.size() < 24) clean += c;
  }
  std::random_device rd;
  char random[17];
  std::snprintf(random, sizeof(random), "%08x%08x", rd(), rd());
  return "/strata-" + (clean.empty() ? std::string("job") : clean) + "-" + std::to_string(::getpid()) + "-" + random;
}

/// The slot size for `size` ranks: the option, capped so the segment stays
/// under 1 GiB and under half of what /dev/shm has free (Docker gives
/// containers 64 MiB), in whole pages, at least 64 KiB.
int64_t slot_bytes_for(int size, int64_t wanted) {
  int64_t cap = (int64_t{1} << 30) / (2 * size);
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) == 0) {
    cap = std::min<int64_t>(cap, static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize) / 2 / (2 * size));
  }
  return std::max<int64_t>(64 << 10, std::min(wanted, cap) / 4096 * 4096);
}

}  // namespace

bool is_available() { return true; }

// Note [Segment lifetime]
// Rank 0 creates the segment under a fresh name and publishes the name;
// every rank maps it and reports "ok" or why not; rank 0 then removes the
// name and publishes the verdict, which every rank waits for. So create()
// returns (on any rank) only once the name is gone: from then on the
// segment lives exactly as long as some rank maps it, and no exit path,
// kill -9 included, can leave a file in /dev/shm. The verdict also makes
// a failure on one rank (a container without the segment, say) the same
// CommError on every rank, which lets init_process_group fall back to Gloo
// on all ranks together.
std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store> store, int rank, int size, milliseconds timeout,
                                milliseconds connect_timeout, const std::string& name_hint, const ShmOptions& options) {
  STRATA_CHECK(store != nullptr, ConfigError, "[shm] create needs a store, got nullptr");
  STRATA_CHECK(size >= 1 && size <= detail::kMaxRanks && rank >= 0 && rank < size, ConfigError, "[shm] invalid rank ",
               rank, " for size ", size, " (at most ", detail::kMaxRanks, " ranks share one segment)");
  STRATA_CHECK(timeout.count() > 0, ConfigError, "[shm] timeout must be positive, got ", timeout.count(), " ms");
  const int id = group_counter++;  // every process creates its groups in the same order
  auto s = runtime::prefix_store(std::move(store), "strata/shm/" + std::to_string(id));
  // Note [Waiting for peers] (segment.cpp): measured on 2 cores with 2
  // ranks, any polling made small calls slower (docs/benchmarks.md).
  const int spin_us = options.spin_us >= 0
                          ? options.spin_us
                          : (size < static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)) ? 5 : 0);
  auto wait_key = [&](const std::string& key, const std::string& what) {
    try {
      s->wait({key}, connect_timeout);
    } catch (const TimeoutError&) {
      throw TimeoutError(strata::detail::cat("[shm] setup timed out after ", connect_timeout.count(), " ms on rank ",
                                             rank, " of ", size, ": ", what));
    }
  };
  Segment segment;
  int64_t whole = options.whole_reduce_bytes;
  if (rank == 0) {
    const std::string name = segment_name(name_hint);
    const int64_t slot = slot_bytes_for(size, options.slot_bytes);
    try {
      segment = Segment::create(name, size, slot);
    } catch (const CommError& e) {
      s->set("segment", std::string("error:") + e.what());
      throw;
    }
    segment.state(0).pid.store(::getpid());
    // Rank 0's layout and algorithm choices hold for every rank.
    s->set("segment", name + "|" + std::to_string(slot) + "|" + std::to_string(whole));
    std::vector<std::string> keys;
    for (int r = 1; r < size; ++r) keys.push_back("mapped/" + std::to_string(r));
    try {
      s->wait(keys, connect_timeout);
    } catch (const TimeoutError&) {
      Segment::unlink(name);
      std::vector<int> missing;
      for (int r = 1; r < size; ++r) {
        if (!s->check({keys[r - 1]})) missing.push_back(r);
      }
      const std::string message = strata::detail::cat(
          "[shm] setup timed out after ", connect_timeout.count(), " ms on rank 0 of ", size, ": rank",
          missing.size() == 1 ? " " : "s ", rank_list(missing), " never mapped the segment");
      s->set("verdict", "error:" + message);
      throw TimeoutError(message);
    }
    Segment::unlink(name);  // Note [Segment lifetime]
    std::string verdict = "ok";
    for (int r = 1; r < size && verdict == "ok"; ++r) {
      const std::string v = s->get(keys[r - 1]);
      if (v != "ok") verdict = "error:" + v;
    }
    s->set("verdict", verdict);
    STRATA_CHECK(verdict == "ok", CommError, verdict.substr(6));
  } else {
    wait_key("segment", "rank 0 never created the segment");
    const std::string published = s->get("segment");
    STRATA_CHECK(published.rfind("error:", 0) != 0, CommError, published.substr(6));
    const size_t bar2 = published.rfind('|');
    const size_t bar = bar2 == std::string::npos || bar2 == 0 ? std::string::npos : published.rfind('|', bar2 - 1);
    STRATA_ASSERT(bar != std::string::npos, "[shm] malformed segment key '", published, "'");
    const std::string name = published.substr(0, bar);
    const int64_t slot = std::stoll(published.substr(bar + 1, bar2 - bar - 1));
    whole = std::stoll(published.substr(bar2 + 1));
    try {
      segment = Segment::open(name, size, slot);
      segment.state(rank).pid.store(::getpid());
      s->set("mapped/" + std::to_string(rank), "ok");
    } catch (const CommError& e) {
      s->set("mapped/" + std::to_string(rank), strata::detail::cat("rank ", rank, ": ", e.what()));
    }
    try {
      wait_key("verdict", "rank 0 never confirmed that every rank mapped the segment");
    } catch (...) {
      Segment::unlink(name);  // rank 0 may be gone: leave nothing behind
      throw;
    }
    const std::string verdict = s->get("verdict");
    STRATA_CHECK(verdict == "ok", CommError, verdict.substr(6));
  }
  return std::make_shared<ShmBackend>(std::move(s), std::move(segment), rank, size, timeout, spin_us, whole);
}

}  // namespace strata::comm::shm
