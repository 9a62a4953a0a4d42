// The rendezvous store client's connection (store.cpp): one TCP
// connection to the store's server whose every step (connect, send, read)
// is bounded by a deadline and ends in a ConnectionError that says how it
// failed, so the store can word its message. Internal to strata.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace strata::runtime::store_protocol {

// How a connection failed, so the caller can word the message.
enum class Failure { kRefused, kTimedOut, kClosed, kJunk, kOther };

struct ConnectionError {
  Failure kind;
  std::string detail;
};

// One blocking-with-deadline TCP connection to the server.
class Connection {
 public:
  using Clock = std::chrono::steady_clock;

  Connection() = default;
  ~Connection() { close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool open() const { return fd_ >= 0; }
  void close();

  // One connect attempt; throws ConnectionError.
  void connect(const std::string& host, int port, Clock::time_point deadline);
  // Sends a whole frame before `deadline`; throws ConnectionError.
  void send(const std::string& frame, Clock::time_point deadline);
  // Reads one frame's payload before `deadline`; throws ConnectionError.
  std::string receive(Clock::time_point deadline);

 private:
  [[noreturn]] void fail(Failure kind, const std::string& why);
  std::string read_exact(size_t n, Clock::time_point deadline);

  int fd_ = -1;
};

}  // namespace strata::runtime::store_protocol
