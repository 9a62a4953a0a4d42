// The Gloo backend: CPU collectives over TCP with the Gloo inside
// LibTorch, through c10d's ProcessGroupGloo (process_group_gloo.h).
//
// Rendezvous goes through strata's runtime::Store (one key prefix per
// group). all_reduce, all_gather, broadcast and barrier are c10d's Gloo
// collectives; reduce_scatter is strata's ring over c10d's point-to-point
// send/recv (Note [Ring reduce-scatter]), which moves (N-1)/N of the input
// where an all-reduce and a slice would move 2(N-1)/N. Every call has the
// backend's timeout; failures name the operation, this rank and the peers
// that never reached the call (Note [Finding missing peers]).
#include "strata/comm/gloo/backend.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "process_group_gloo.h"
#include "reduce.h"
#include "strata/core/error.h"
#include "strata/runtime/store.h"

namespace strata::comm::gloo {
namespace {

using std::chrono::milliseconds;

/// c10d's Store interface over strata's Store (c10d's Gloo rendezvous
/// exchanges its addresses through it).
class StoreAdapter final : public c10d::Store {
 public:
  StoreAdapter(std::shared_ptr<runtime::Store> store, milliseconds timeout)
      : c10d::Store(timeout), store_(std::move(store)) {}

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<StoreAdapter>(store_, timeout_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    store_->set(key, std::string(value.begin(), value.end()));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    store_->wait({key}, timeout_);
    const std::string value = store_->get(key);
    return std::vector<uint8_t>(value.begin(), value.end());
  }
  int64_t add(const std::string& key, int64_t value) override { return store_->add(key, value); }
  bool deleteKey(const std::string& key) override { return store_->remove(key); }
  bool check(const std::vector<std::string>& keys) override { return store_->check(keys); }
  int64_t getNumKeys() override {
    throw CommError("[gloo] the rendezvous store cannot count its keys (c10d asked for getNumKeys)");
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<runtime::Store> store_;
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

/// The local address that routes to `host` (a connected UDP socket sends
/// nothing, it only picks the route); "" when that cannot be determined.
std::string address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "";
  std::string out;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr) {
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

DeviceAddress device_address() {
  DeviceAddress address;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname) {
    address.interface = ifname;
    return address;
  }
  const char* master = std::getenv("MASTER_ADDR");
  const std::string m = master ? master : "";
  if (m.empty() || m == "localhost" || m.rfind("127.", 0) == 0 || m == "::1") {
    address.hostname = "127.0.0.1";
  } else {
    address.hostname = address_towards(m);
    STRATA_CHECK(!address.hostname.empty(), CommError, "[gloo] cannot find a network interface that reaches MASTER_ADDR=",
                 m, "; set GLOO_SOCKET_IFNAME to the interface to use");
  }
  return address;
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kProduct: return c10d::ReduceOp::PRODUCT;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case ReduceOp::kMean: break;
  }
  STRATA_ASSERT(false, "[gloo] mean must be lowered to sum by comm::Group");
}

/// `t`'s bytes as a flat uint8 tensor sharing its storage (t is contiguous).
at::Tensor bytes_of(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

/// Calls `fn` with the element type of `t`'s dtype.
template <class Fn>
void dispatch(const at::Tensor& t, const char* op, Fn&& fn) {
  switch (t.scalar_type()) {
    case at::kFloat: return fn(float{});
    case at::kDouble: return fn(double{});
    case at::kBFloat16: return fn(c10::BFloat16{});
    case at::kHalf: return fn(c10::Half{});
    case at::kInt: return fn(int32_t{});
    case at::kLong: return fn(int64_t{});
    default:
      throw ConfigError(detail::cat("[gloo] ", op, ": dtype ", t.scalar_type(), " is not supported"));
  }
}

/// Refuses the dtypes the collectives do not reduce (the ones dispatch
/// does not list).
void check_dtype(const at::Tensor& t, const char* op) {
  dispatch(t, op, [](auto) {});
}

// Note [Ring reduce-scatter]
// Rank r ends with chunk r of the reduction. Chunk c's partial sum starts
// at rank c+1 (its own input chunk, sent straight from the input) and
// travels the ring rightwards; each rank adds its input chunk and passes it
// on, and after N-1 hops it reaches rank c, which adds its own chunk into
// `output`. Each rank sends and receives N-1 chunks: (N-1)/N of the input,
// against 2(N-1)/N for an all-reduce followed by a slice. Two chunk-sized
// scratch buffers alternate so a step's receive never lands in the buffer
// still being sent. The scratch buffers are kept between calls: fresh pages
// for every call cost more than the transfer on some machines.
constexpr size_t kMaxSegments = 16;
constexpr size_t kMinSegmentBytes = 256 << 10;

class GlooBackend final : public Backend {
 public:
  GlooBackend(std::shared_ptr<runtime::Store> store, int rank, int size, milliseconds timeout,
              milliseconds connect_timeout)
      : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {
    join(connect_timeout);
    const DeviceAddress address = device_address();
    auto mesh = c10::make_intrusive<StoreAdapter>(runtime::prefix_store(store_, "mesh"), connect_timeout);
    try {
      pg_ = make_process_group_gloo(mesh, rank_, size_, address, connect_timeout);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(detail::cat("[gloo] rank ", rank_, " of ", size_, " could not connect to its peers on ",
                                  address.interface.empty() ? address.hostname : "interface " + address.interface,
                                  ": ", e.what()));
    }
    pg_->setTimeout(timeout_);
  }

  std::string name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  milliseconds timeout() const override { return timeout_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    const int64_t seq = begin("all_reduce", tensor);
    if (tensor.numel() == 0) return;
    check_dtype(tensor, "all_reduce");
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = timeout_;
    guarded("all_reduce", seq, [&] { pg_->allreduce(tensors, opts)->wait(); });
  }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    const int64_t seq = begin("all_gather", input);
    STRATA_ASSERT(output.is_contiguous() && output.nbytes() == input.nbytes() * size_);
    if (input.numel() == 0) return;
    at::Tensor in = bytes_of(input);
    at::Tensor out = bytes_of(output);
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    guarded("all_gather", seq, [&] { pg_->_allgather_base(out, in, opts)->wait(); });
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    const int64_t seq = begin("reduce_scatter", input);
    STRATA_ASSERT(output.is_contiguous() && input.nbytes() == output.nbytes() * size_);
    if (output.numel() == 0) return;
    if (size_ == 1) {
      output.copy_(input.view_as(output));
      return;
    }
    dispatch(input, "reduce_scatter", [&](auto type) {
      using T = decltype(type);
      guarded("reduce_scatter", seq, [&] { ring_reduce_scatter(input, output, kernels::reduce_function<T>(op), seq); });
    });
  }

  void broadcast(at::Tensor& tensor, int src) override {
    const int64_t seq = begin("broadcast", tensor);
    STRATA_CHECK(src >= 0 && src < size_, ConfigError, "[gloo] broadcast from rank ", src, " in a group of ", size_);
    if (tensor.numel() == 0) return;
    std::vector<at::Tensor> tensors{bytes_of(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    opts.timeout = timeout_;
    guarded("broadcast", seq, [&] { pg_->broadcast(tensors, opts)->wait(); });
  }

  void barrier() override {
    const int64_t seq = ++seq_;
    c10d::BarrierOptions opts;
    opts.timeout = timeout_;
    guarded("barrier", seq, [&] { pg_->barrier(opts)->wait(); });
  }

 private:
  /// Every rank announces itself, then waits for the others, so a rank that
  /// never starts is named instead of surfacing as a Gloo connect error.
  void join(milliseconds timeout) { runtime::join_ranks(*store_, "gloo", rank_, size_, timeout); }

  int64_t begin(const char* op, const at::Tensor& t) {
    STRATA_CHECK(t.device().is_cpu(), ConfigError, "[gloo] ", op, ": tensor is on ", t.device(),
                 "; the gloo backend takes CPU tensors (use nccl for CUDA)");
    STRATA_ASSERT(t.is_contiguous(), "[gloo] ", op, " needs a contiguous tensor");
    return ++seq_;
  }

  // Note [Finding missing peers]
  // When a call fails, this rank records "stuck in <op> #seq" in the store
  // and gives the others a short grace period to do the same: peers that
  // reached the same call fail too (everyone waits on everyone in these
  // algorithms), so the ranks that never record it are the ones missing.
  // Only the failure path pays for this.
  template <class Fn>
  void guarded(const char* op, int64_t seq, Fn&& fn) {
    try {
      fn();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool timed_out = what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos;
      std::string message = detail::cat("[gloo] ", op, " #", seq, timed_out ? " timed out after " : " failed",
                                        timed_out ? std::to_string(timeout_.count()) + " ms" : std::string(),
                                        " on rank ", rank_, " of ", size_, "; ", missing_peers(op, seq),
                                        " (gloo: ", what, ")");
      if (timed_out) throw TimeoutError(message);
      throw CommError(message);
    }
  }

  std::string missing_peers(const char* op, int64_t seq) {
    try {
      const std::string prefix = "stuck/" + std::to_string(seq) + "/";
      store_->set(prefix + std::to_string(rank_), op);
      std::vector<std::string> keys;
      for (int r = 0; r < size_; ++r) keys.push_back(prefix + std::to_string(r));
      const milliseconds grace = std::clamp(timeout_ / 4, milliseconds(500), milliseconds(10000));
      try {
        store_->wait(keys, grace);
      } catch (const TimeoutError&) {
      }
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (!store_->check({keys[r]})) missing.push_back(r);
      }
      if (missing.empty()) return "every peer reached this call, so a connection between them failed";
      return detail::cat("peer", missing.size() == 1 ? " " : "s ", rank_list(missing),
                         missing.size() == 1 ? " is" : " are", " missing (never reached this call)");
    } catch (const std::exception& e) {
      return detail::cat("could not ask the store which peers are missing: ", e.what());
    }
  }

  void ring_reduce_scatter(const at::Tensor& input, at::Tensor& output, const kernels::ReduceFn& fn, int64_t seq) {
    const size_t es = output.element_size();
    const size_t chunk = output.nbytes();
    // Note [Ring reduce-scatter]: segments let the reduction of one piece
    // overlap the arrival of the next.
    const size_t seg = std::max(es, (std::max(chunk / kMaxSegments, kMinSegmentBytes) / es) * es);
    const size_t nseg = (chunk + seg - 1) / seg;
    const int left = (rank_ - 1 + size_) % size_;
    const int right = (rank_ + 1) % size_;
    at::Tensor in_bytes = bytes_of(input);
    auto* in = static_cast<char*>(in_bytes.data_ptr());
    auto* out = static_cast<char*>(output.data_ptr());
    if (scratch_.numel() < static_cast<int64_t>(2 * chunk)) scratch_ = at::empty({static_cast<int64_t>(2 * chunk)}, at::kByte);
    at::Tensor halves[2] = {scratch_.narrow(0, 0, chunk), scratch_.narrow(0, chunk, chunk)};
    auto length = [&](size_t j) { return std::min(seg, chunk - j * seg); };
    auto mod = [&](int x) { return ((x % size_) + size_) % size_; };
    auto piece = [&](const at::Tensor& bytes, size_t offset, size_t n) {
      return bytes.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(n));
    };
    // Tags tell the messages of one call apart; calls run in the same order
    // on every rank, and a call's messages all arrive before the next starts.
    const int64_t tags_per_call = static_cast<int64_t>(size_ - 1) * static_cast<int64_t>(nseg);
    auto tag = [&](int s, size_t j) {
      return static_cast<int>((seq * tags_per_call + s * static_cast<int64_t>(nseg) + static_cast<int64_t>(j)) %
                              (int64_t{1} << 30));
    };
    for (int s = 0; s < size_ - 1; ++s) {
      // Send what the previous step reduced (step 0: this rank's own chunk).
      const at::Tensor& sending = s == 0 ? in_bytes : halves[(s - 1) % 2];
      const size_t base = s == 0 ? mod(rank_ - 1) * chunk : 0;
      std::vector<c10::intrusive_ptr<c10d::Work>> sends;
      sends.reserve(nseg);
      for (size_t j = 0; j < nseg; ++j) {
        std::vector<at::Tensor> t{piece(sending, base + j * seg, length(j))};
        sends.push_back(pg_->send(t, right, tag(s, j)));
      }
      const at::Tensor& receiving = halves[s % 2];
      char* recv_ptr = static_cast<char*>(receiving.data_ptr());
      std::vector<c10::intrusive_ptr<c10d::Work>> recvs;
      recvs.reserve(nseg);
      for (size_t j = 0; j < nseg; ++j) {
        std::vector<at::Tensor> t{piece(receiving, j * seg, length(j))};
        recvs.push_back(pg_->recv(t, left, tag(s, j)));
      }
      const int c = mod(rank_ - s - 2);
      char* dst = s == size_ - 2 ? out : recv_ptr;
      for (size_t j = 0; j < nseg; ++j) {
        recvs[j]->wait(timeout_);
        fn(dst + j * seg, recv_ptr + j * seg, in + c * chunk + j * seg, length(j) / es);
      }
      for (auto& w : sends) w->wait(timeout_);
    }
  }

  std::shared_ptr<runtime::Store> store_;
  int rank_, size_;
  milliseconds timeout_;
  int64_t seq_ = 0;
  c10::intrusive_ptr<c10d::Backend> pg_;
  at::Tensor scratch_;  // reduce_scatter's two chunk buffers, kept between calls
};

std::atomic<int> group_counter{0};

}  // namespace

bool is_available() { return true; }

std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store> store, int rank, int size, milliseconds timeout) {
  return create(std::move(store), rank, size, timeout, timeout);
}

std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store> store, int rank, int size, milliseconds timeout,
                                milliseconds connect_timeout) {
  STRATA_CHECK(store != nullptr, ConfigError, "[gloo] create needs a store, got nullptr");
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, ConfigError, "[gloo] invalid rank ", rank, " for size ", size);
  STRATA_CHECK(timeout.count() > 0, ConfigError, "[gloo] timeout must be positive, got ", timeout.count(), " ms");
  // Note: every process creates its groups in the same order, so the n-th
  // group gets the same key prefix on every rank.
  const int id = group_counter++;
  return create_named(std::move(store), "strata/gloo/" + std::to_string(id), rank, size, timeout, connect_timeout);
}

std::shared_ptr<Backend> create_named(std::shared_ptr<runtime::Store> store, const std::string& key_prefix, int rank,
                                      int size, milliseconds timeout, milliseconds connect_timeout) {
  STRATA_CHECK(store != nullptr, ConfigError, "[gloo] create needs a store, got nullptr");
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, ConfigError, "[gloo] invalid rank ", rank, " for size ", size);
  STRATA_CHECK(timeout.count() > 0, ConfigError, "[gloo] timeout must be positive, got ", timeout.count(), " ms");
  auto prefixed = runtime::prefix_store(std::move(store), key_prefix);
  return std::make_shared<GlooBackend>(std::move(prefixed), rank, size, timeout, connect_timeout);
}

}  // namespace strata::comm::gloo
