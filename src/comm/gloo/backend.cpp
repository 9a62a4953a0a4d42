// The Gloo backend: CPU collectives over Gloo's TCP transport.
//
// Rendezvous goes through strata's runtime::Store (one key prefix per
// group). all_reduce, all_gather, broadcast and barrier are Gloo's
// algorithms with strata's reduce kernels (reduce.h); reduce_scatter is a
// ring over unbound buffers (Note [Ring reduce-scatter]). Every call has the
// backend's timeout; failures name the operation, this rank and the peers
// that never reached the call (Note [Finding missing peers]).
#include "strata/comm/gloo/backend.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "reduce.h"
#include "strata/core/error.h"
#include "strata/runtime/store.h"

namespace strata::comm::gloo {
namespace {

using std::chrono::milliseconds;

/// Gloo's rendezvous Store interface over strata's Store.
class StoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<runtime::Store> store, milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store_->wait({key}, timeout_);
    std::string value = store_->get(key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<runtime::Store> store_;
  milliseconds timeout_;
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

std::shared_ptr<::gloo::transport::Device> make_device() {
  ::gloo::transport::tcp::attr attr;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname) {
    attr.iface = ifname;
  } else {
    const char* master = std::getenv("MASTER_ADDR");
    std::string m = master ? master : "";
    if (m.empty() || m == "localhost" || m.rfind("127.", 0) == 0 || m == "::1") {
      attr.hostname = "127.0.0.1";
    } else {
      std::string local = address_towards(m);
      STRATA_CHECK(!local.empty(), CommError, "[gloo] cannot find a network interface that reaches MASTER_ADDR=",
                   m, "; set GLOO_SOCKET_IFNAME to the interface to use");
      attr.hostname = local;
    }
  }
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError(detail::cat("[gloo] cannot open a TCP device on ",
                                attr.iface.empty() ? attr.hostname : "interface " + attr.iface, ": ", e.what()));
  }
}

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
constexpr uint8_t kReduceScatterSlotPrefix = 0x20;
constexpr size_t kMaxSegments = 16;
constexpr size_t kMinSegmentBytes = 256 << 10;

class GlooBackend final : public Backend {
 public:
  GlooBackend(std::shared_ptr<runtime::Store> store, int rank, int size, milliseconds timeout,
              milliseconds connect_timeout)
      : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {
    join(connect_timeout);
    auto device = make_device();
    context_ = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    context_->setTimeout(connect_timeout);
    StoreAdapter adapter(runtime::prefix_store(store_, "mesh"), connect_timeout);
    try {
      context_->connectFullMesh(adapter, device);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(detail::cat("[gloo] rank ", rank_, " of ", size_, " could not connect to its peers: ", e.what()));
    }
    context_->setTimeout(timeout_);
  }

  std::string name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  milliseconds timeout() const override { return timeout_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    const int64_t seq = begin("all_reduce", tensor);
    if (tensor.numel() == 0) return;
    dispatch(tensor, "all_reduce", [&](auto type) {
      using T = decltype(type);
      ::gloo::AllreduceOptions opts(context_);
      opts.setOutput<T>(tensor.data_ptr<T>(), tensor.numel());
      opts.setReduceFunction(kernels::reduce_function<T>(op));
      opts.setTimeout(timeout_);
      guarded("all_reduce", seq, [&] { ::gloo::allreduce(opts); });
    });
  }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    const int64_t seq = begin("all_gather", input);
    STRATA_ASSERT(output.is_contiguous() && output.nbytes() == input.nbytes() * size_);
    if (input.numel() == 0) return;
    ::gloo::AllgatherOptions opts(context_);
    opts.setInput<uint8_t>(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(output.data_ptr()), output.nbytes());
    opts.setTimeout(timeout_);
    guarded("all_gather", seq, [&] { ::gloo::allgather(opts); });
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
    ::gloo::BroadcastOptions opts(context_);
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(tensor.data_ptr()), tensor.nbytes());
    opts.setRoot(src);
    opts.setTimeout(timeout_);
    guarded("broadcast", seq, [&] { ::gloo::broadcast(opts); });
  }

  void barrier() override {
    const int64_t seq = ++seq_;
    ::gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    guarded("barrier", seq, [&] { ::gloo::barrier(opts); });
  }

 private:
  /// Every rank announces itself, then waits for the others, so a rank that
  /// never starts is named instead of surfacing as a Gloo connect error.
  void join(milliseconds timeout) {
    store_->set("joined/" + std::to_string(rank_), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back("joined/" + std::to_string(r));
    try {
      store_->wait(keys, timeout);
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (!store_->check({keys[r]})) missing.push_back(r);
      }
      throw TimeoutError(detail::cat(
          "[gloo] rendezvous timed out after ", timeout.count(), " ms on rank ", rank_, " of ", size_,
          ": rank", missing.size() == 1 ? " " : "s ", rank_list(missing),
          missing.size() == 1 ? " never joined" : " never joined",
          " (check that every worker started and reached init_process_group)"));
    }
  }

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
    using Buffer = std::unique_ptr<::gloo::transport::UnboundBuffer>;
    const size_t es = output.element_size();
    const size_t chunk = output.nbytes();
    // Note [Ring reduce-scatter]: segments let the reduction of one piece
    // overlap the arrival of the next.
    const size_t seg = std::max(es, (std::max(chunk / kMaxSegments, kMinSegmentBytes) / es) * es);
    const size_t nseg = (chunk + seg - 1) / seg;
    const int left = (rank_ - 1 + size_) % size_;
    const int right = (rank_ + 1) % size_;
    const uint64_t slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, static_cast<uint32_t>(seq));
    auto* in = static_cast<char*>(const_cast<void*>(input.data_ptr()));
    auto* out = static_cast<char*>(output.data_ptr());
    if (scratch_.numel() < static_cast<int64_t>(2 * chunk)) scratch_ = at::empty({static_cast<int64_t>(2 * chunk)}, at::kByte);
    char* tmp[2] = {static_cast<char*>(scratch_.data_ptr()), static_cast<char*>(scratch_.data_ptr()) + chunk};
    Buffer in_buf = context_->createUnboundBuffer(in, input.nbytes());
    Buffer half_bufs[2] = {context_->createUnboundBuffer(tmp[0], chunk), context_->createUnboundBuffer(tmp[1], chunk)};
    auto length = [&](size_t j) { return std::min(seg, chunk - j * seg); };
    auto mod = [&](int x) { return ((x % size_) + size_) % size_; };
    for (int s = 0; s < size_ - 1; ++s) {
      const uint64_t step_slot = slot + static_cast<uint64_t>(s) * nseg;
      // Send what the previous step reduced (step 0: this rank's own chunk).
      ::gloo::transport::UnboundBuffer* sending = s == 0 ? in_buf.get() : half_bufs[(s - 1) % 2].get();
      const size_t base = s == 0 ? mod(rank_ - 1) * chunk : 0;
      for (size_t j = 0; j < nseg; ++j) sending->send(right, step_slot + j, base + j * seg, length(j));
      char* recv_ptr = tmp[s % 2];
      std::vector<Buffer> receiving;
      receiving.reserve(nseg);
      for (size_t j = 0; j < nseg; ++j) {
        receiving.push_back(context_->createUnboundBuffer(recv_ptr + j * seg, length(j)));
        receiving.back()->recv(left, step_slot + j, 0, length(j));
      }
      const int c = mod(rank_ - s - 2);
      char* dst = s == size_ - 2 ? out : recv_ptr;
      for (size_t j = 0; j < nseg; ++j) {
        receiving[j]->waitRecv(timeout_);
        fn(dst + j * seg, recv_ptr + j * seg, in + c * chunk + j * seg, length(j) / es);
      }
      for (size_t j = 0; j < nseg; ++j) sending->waitSend(timeout_);
    }
  }

  std::shared_ptr<runtime::Store> store_;
  int rank_, size_;
  milliseconds timeout_;
  int64_t seq_ = 0;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
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
  auto prefixed = runtime::prefix_store(std::move(store), "strata/gloo/" + std::to_string(id));
  return std::make_shared<GlooBackend>(std::move(prefixed), rank, size, timeout, connect_timeout);
}

}  // namespace strata::comm::gloo
