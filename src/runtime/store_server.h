// The rendezvous store's server, internal to strata: TcpServer, one
// thread that polls the listening socket and every client, and the keys
// it keeps. Its connections and strangers are in store_server.cpp (Note
// [Store server], Note [Strangers]), its requests in store_requests.cpp
// (Note [Who may join]), the binding of its port in store_listen.cpp.
// Wire format: store_protocol.h.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store_protocol.h"
#include "strata/core/error.h"

namespace strata::runtime::store_protocol {

using Clock = std::chrono::steady_clock;

// Says in the log which strangers were dropped and why, one line per
// kDropLogInterval at most (Note [Strangers]). Owned by the server's thread.
class DropLog {
 public:
  void dropped(const std::string& where, const std::string& peer, const std::string& why, Clock::time_point now);
  // Called on every turn of the loop: writes what was held back once the
  // interval is over.
  void tick(const std::string& where, Clock::time_point now);

 private:
  bool open_ = false;  // a line was written less than kDropLogInterval ago
  Clock::time_point since_;
  size_t held_ = 0;
  std::string last_;
};

struct Conn {
  int fd = -1;
  std::string peer;
  std::string in, out;
  bool hello = false;
  bool close_after_write = false;
  int rank = -1;
  std::string identity;
  Clock::time_point since = Clock::now();
  std::string why;  // why the store drops this stranger, for the log ("": it left by itself)
};

// A request that waits: get (one key), wait (keys) or join (every rank).
struct Waiter {
  int conn = 0;
  Op op = Op::kWait;
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

class TcpServer final : public Server {
 public:
  /// Serves on `listen_fd` (bound and listening, non-blocking; the server
  /// owns it) from a thread of its own.
  TcpServer(const ServerOptions& options, int listen_fd, int port);
  ~TcpServer() override;

  int port() const override { return port_; }
  std::vector<int64_t> wait_for_ranks_to_leave(Clock::time_point deadline) override;
  void abort(const std::string& why) override;

 private:
  // ---- connections (store_server.cpp) ----
  void loop();
  void poll_once();
  std::string where() const { return detail::cat(options_.host, ":", port_); }
  size_t strangers() const;
  int oldest_stranger() const;
  void accept_all();
  void expire_strangers(Clock::time_point now);
  void drop(int id);
  bool receive(int id, Conn& c);
  bool flush(Conn& c);

  // ---- requests (store_requests.cpp) ----
  static void reply(Conn& c, const Writer& w) { c.out += w.frame(); }
  static void reply_error(Conn& c, const std::string& message) {
    reply(c, Writer().u8(uint8_t(Reply::kError)).str(message));
  }
  // Answers a hello with why it is refused; the connection closes once the
  // answer is out, and the log says so (Note [Strangers]).
  static void refuse(Conn& c, const std::string& message, const std::string& why = "");
  bool handle(int id, Conn& c, const std::string& payload);
  void add(Conn& c, Reader& r);
  void hello(Conn& c, Reader& r);
  void record_failure(const std::string& why);
  std::vector<std::string> missing_keys(const Waiter& w) const;
  std::vector<std::string> missing_ranks() const;
  bool try_answer(Conn& c, const Waiter& w);
  void wake_waiters();
  void expire(Clock::time_point now);

  ServerOptions options_;
  int listen_fd_;
  int port_;
  int wake_read_ = -1, wake_write_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // Owned by the thread:
  std::map<int, Conn> conns_;
  int next_id_ = 1;
  std::list<Waiter> waiters_;
  std::map<std::string, std::string> data_;
  std::map<int64_t, std::string> ranks_;  // rank -> identity of the process that holds it
  std::string failure_;                   // the first rendezvous conflict
  DropLog drop_log_;                      // Note [Strangers]
  // Shared with wait_for_ranks_to_leave: connections per rank still open.
  std::mutex ranks_mu_;
  std::condition_variable ranks_cv_;
  std::map<int64_t, int> connected_ranks_;
  // Set by abort() from any thread; the loop answers the waiters with it.
  std::mutex abort_mu_;
  std::string abort_;
  std::string aborted_;  // owned by the thread: abort_ once taken
};

}  // namespace strata::runtime::store_protocol
