// The rendezvous store's wire format, shared by its server
// (store_server.cpp) and client (store.cpp). Internal to strata.
//
// Note [Store protocol]
// Every message is a frame: a 4-byte big-endian length, then that many
// bytes. A request starts with an Op byte, a reply with a Reply byte; the
// fields follow as 8-byte big-endian integers and length-prefixed strings.
// Each request gets exactly one reply, in order. The first request on a
// connection is kHello: the protocol magic, the job token, the caller's
// rank, world size and identity (host:pid). The server answers with kOk and
// the magic, or kError and why it refuses. A reader never trusts a length:
// a frame over kMaxFrame, or a field that runs past its frame, is a
// ProtocolError, so junk on the wire is an error message, never a huge
// allocation or a crash. Until its hello is accepted a client is a stranger
// and gets less: one frame of at most kMaxHelloFrame bytes, within the
// server's hello timeout (Note [Strangers] in store_server.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::runtime::store_protocol {

inline constexpr const char* kMagic = "strata-rendezvous-store/1";
/// The error a hello gets from the store of a round its process has
/// finished (Note [The next round] in store_requests.cpp).
inline constexpr const char* kRetryNextRound = "retry: this store serves a round the process has finished";
inline constexpr uint32_t kMaxFrame = 64u << 20;  // 64 MiB
inline constexpr size_t kMaxKeys = 1 << 16;
/// The longest frame a client may send before its hello is accepted: the
/// magic, a token of up to kMaxToken bytes, rank, world size and identity.
inline constexpr uint32_t kMaxHelloFrame = 4096;
/// The longest job token a client may carry (STRATA_JOB_TOKEN).
inline constexpr size_t kMaxToken = 2048;
/// How long a client may take to say hello, unless
/// STRATA_STORE_HELLO_TIMEOUT_MS says otherwise.
inline constexpr std::chrono::milliseconds kDefaultHelloTimeout{10000};

enum class Op : uint8_t { kHello = 1, kSet, kGet, kAdd, kCheck, kWait, kRemove, kJoin };
enum class Reply : uint8_t { kOk = 1, kValue, kInt, kBool, kTimeout, kError };

/// Bytes that do not follow the protocol.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Builds one frame's payload.
class Writer {
 public:
  Writer& u8(uint8_t v) {
    bytes_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& i64(int64_t v) {
    uint64_t u = static_cast<uint64_t>(v);
    for (int shift = 56; shift >= 0; shift -= 8) bytes_.push_back(static_cast<char>((u >> shift) & 0xff));
    return *this;
  }
  Writer& str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    bytes_ += s;
    return *this;
  }
  Writer& strs(const std::vector<std::string>& list) {
    i64(static_cast<int64_t>(list.size()));
    for (const std::string& s : list) str(s);
    return *this;
  }
  /// The frame: length prefix and payload.
  std::string frame() const {
    std::string out(4, '\0');
    uint32_t n = static_cast<uint32_t>(bytes_.size());
    for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((n >> (24 - 8 * i)) & 0xff);
    return out + bytes_;
  }

 private:
  std::string bytes_;
};

/// Reads fields from one frame's payload; throws ProtocolError past its end.
class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(bytes_[pos_++]);
  }
  int64_t i64() {
    need(8);
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<uint8_t>(bytes_[pos_++]);
    return static_cast<int64_t>(u);
  }
  std::string str() {
    int64_t n = i64();
    if (n < 0 || static_cast<uint64_t>(n) > bytes_.size() - pos_) throw ProtocolError("string length out of range");
    std::string s = bytes_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  /// Whether every byte was read.
  bool done() const { return pos_ == bytes_.size(); }
  std::vector<std::string> strs() {
    int64_t n = i64();
    // Every string takes at least its 8-byte length: a count the frame
    // cannot hold is junk.
    if (n < 0 || static_cast<size_t>(n) > kMaxKeys || static_cast<uint64_t>(n) * 8 > bytes_.size() - pos_)
      throw ProtocolError("list length out of range");
    std::vector<std::string> out;
    out.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out.push_back(str());
    return out;
  }

 private:
  void need(size_t n) const {
    if (bytes_.size() - pos_ < n) throw ProtocolError("message ends early");
  }
  const std::string& bytes_;
  size_t pos_ = 0;
};

/// Decodes a 4-byte frame length as it is, whatever its size.
inline uint32_t raw_frame_length(const char* p) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | static_cast<uint8_t>(p[i]);
  return n;
}

/// Decodes a 4-byte frame length; throws ProtocolError over kMaxFrame.
inline uint32_t frame_length(const char* p) {
  const uint32_t n = raw_frame_length(p);
  if (n > kMaxFrame) throw ProtocolError("frame of " + std::to_string(n) + " bytes is over the limit");
  return n;
}

/// The server side of the store: a thread that owns the listening socket
/// and the keys. Never throws from its thread (Note [Store server]).
class Server {
 public:
  virtual ~Server() = default;
  /// The port it listens on.
  virtual int port() const = 0;
  /// Waits until no rank (a client that said hello with a rank >= 0) holds
  /// a connection, or `deadline` passes (Note [Closing handshake] in
  /// store.cpp). Returns the ranks still connected: empty when all left.
  virtual std::vector<int64_t> wait_for_ranks_to_leave(std::chrono::steady_clock::time_point deadline) = 0;
  /// Answers every request that waits (the rendezvous, get, wait), now
  /// and from now on, with the error `why`: the job failed (Note [A job
  /// that failed] in store_server.cpp). Callable from any thread.
  virtual void abort(const std::string& why) = 0;
};

struct ServerOptions {
  std::string host;       ///< the address to bind (the master address)
  int port = 0;           ///< 0: a free port
  int world_size = 0;     ///< ranks expected at kJoin; 0: no rank checks
  std::string token;      ///< "" accepts any client
  /// A client that has not said hello this long after it connected is
  /// dropped (Note [Strangers] in store_server.cpp).
  std::chrono::milliseconds hello_timeout = kDefaultHelloTimeout;
};

/// Binds host:port and starts serving. Throws strata::CommError naming
/// host:port when it cannot bind (the port in use, the address not local).
std::unique_ptr<Server> start_server(const ServerOptions& options);

}  // namespace strata::runtime::store_protocol
