// The rendezvous store's server: one thread, poll() over the listening
// socket and every client, the keys in a map. It checks who joins (the job
// token, distinct ranks, one world size) and answers waits when their keys
// appear or their deadline passes. Wire format: store_protocol.h.
//
// Note [Store server]
// The thread must never end the process: everything a client sends is
// parsed under try/catch, and a client that breaks the protocol loses its
// connection, not the job. An error in the loop itself is caught too (it
// pauses briefly and goes on); std::terminate is never reached from here.
//
// Note [Strangers]
// A connection is a stranger until its hello carries the job's token, and
// anyone who reaches the port can open one. So a stranger may cost rank 0
// only a little, and only for a little while:
// - It may send one frame of at most kMaxHelloFrame bytes, and nothing past
//   it is read: a larger length is refused at its first four bytes, before
//   any body is buffered. (A length up to kMaxFrame used to be buffered from
//   anyone: a client that announced 64 MiB and sent 48 MiB held 48 MiB of
//   rank 0's memory.) c10d's TCPStore client opens with bytes that read as a
//   13 MB length, so it is refused at once and is named in the log.
// - It must say hello within the hello timeout (kDefaultHelloTimeout,
//   STRATA_STORE_HELLO_TIMEOUT_MS), counted by poll's own timeout whether
//   or not it sends anything; the deadline was once checked only when bytes
//   arrived, so a silent client stayed for ever. A strata client sends its
//   hello the moment it connects and gives up after 5 s itself (Note
//   [Handshake limit] in store.cpp): none that could succeed is cut off.
// - At most kMaxStrangers are held at once. At the limit the store accepts
//   no more until the oldest stranger has waited kStrangerGrace, and then
//   drops it to make room. Ranks that connect together are only delayed
//   (each says hello at once and stops being a stranger), while a flood of
//   silent connections cannot hold the descriptors, nor keep a rank out
//   for longer than the grace.
// Every stranger the store drops is said in rank 0's log, with its address
// and why, at most one line per kDropLogInterval: the drops in between are
// counted in the next line, so a flood of connections is no flood of lines.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "store_protocol.h"
#include "strata/core/error.h"
#include "strata/core/log.h"

namespace strata::runtime::store_protocol {
namespace {

using Clock = std::chrono::steady_clock;

// Note [Strangers]: how many may wait at once, how long the oldest waits
// before a new one may take its place, and how often drops are logged.
constexpr size_t kMaxStrangers = 64;
constexpr auto kStrangerGrace = std::chrono::seconds(1);
constexpr auto kDropLogInterval = std::chrono::seconds(10);

std::string peer_name(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return detail::cat(host, ":", port);
}

// Why a stranger's first frame length is refused (Note [Strangers]). c10d's
// TCPStore client starts with a VALIDATE query: a zero byte, then the magic
// number 0x3C85F7CE in little-endian order.
std::string refused_length(const std::string& in, uint32_t announced) {
  if (in.compare(0, 4, std::string("\x00\xce\xf7\x85", 4)) == 0) {
    return "it speaks the protocol of c10d's TCPStore (torch.distributed), not strata's; give that PyTorch job "
           "its own MASTER_PORT";
  }
  return detail::cat("its first message announced ", announced, " bytes, more than a hello's ", kMaxHelloFrame,
                     ": it is not a strata client");
}

// Says in the log which strangers were dropped and why, one line per
// kDropLogInterval at most (Note [Strangers]). Owned by the server's thread.
class DropLog {
 public:
  void dropped(const std::string& where, const std::string& peer, const std::string& why, Clock::time_point now) {
    if (open_ && now - since_ < kDropLogInterval) {
      ++held_;
      last_ = detail::cat(peer, ": ", why);
      return;
    }
    log::warning_all_ranks("[store] dropped a connection from ", peer, " to the rendezvous store at ", where, ": ",
                           why);
    open_ = true;
    since_ = now;
    held_ = 0;
  }

  // Called on every turn of the loop: writes what was held back once the
  // interval is over.
  void tick(const std::string& where, Clock::time_point now) {
    if (!open_ || now - since_ < kDropLogInterval) return;
    if (held_ == 0) {
      open_ = false;
      return;
    }
    log::warning_all_ranks("[store] dropped ", held_, held_ == 1 ? " more connection" : " more connections",
                           " to the rendezvous store at ", where, " in the last ",
                           std::chrono::duration_cast<std::chrono::seconds>(now - since_).count(),
                           " s from clients that did not identify themselves as this job's workers; the last from ",
                           last_);
    since_ = now;
    held_ = 0;
  }

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
  TcpServer(const ServerOptions& options, int listen_fd, int port)
      : options_(options), listen_fd_(listen_fd), port_(port) {
    int fds[2];
    STRATA_CHECK_SYSCALL(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), CommError, "[store] cannot create a pipe");
    wake_read_ = fds[0];
    wake_write_ = fds[1];
    thread_ = std::thread([this] { loop(); });
  }

  ~TcpServer() override {
    stop_ = true;
    char byte = 1;
    ssize_t ignored = ::write(wake_write_, &byte, 1);
    (void)ignored;
    thread_.join();
    // The port first: a client that sees its connection close finds
    // nothing listening (Note [A store that is gone] in store.cpp).
    ::close(listen_fd_);
    for (auto& [id, c] : conns_) ::close(c.fd);
    ::close(wake_read_);
    ::close(wake_write_);
  }

  int port() const override { return port_; }

  std::vector<int64_t> wait_for_ranks_to_leave(Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(ranks_mu_);
    ranks_cv_.wait_until(lock, deadline, [this] { return connected_ranks_.empty(); });
    std::vector<int64_t> left;
    for (const auto& [rank, count] : connected_ranks_) left.push_back(rank);
    return left;
  }

 private:
  void loop() {
    while (!stop_) {
      try {
        poll_once();
      } catch (...) {  // Note [Store server]
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }

  void poll_once() {
    auto now = Clock::now();
    // Note [Strangers]: at the limit, the port waits until one may go.
    const int oldest = oldest_stranger();
    const bool full = strangers() >= kMaxStrangers;
    const bool may_accept = !full || (oldest >= 0 && now - conns_.at(oldest).since >= kStrangerGrace);
    std::vector<pollfd> fds{{wake_read_, POLLIN, 0}, {listen_fd_, static_cast<short>(may_accept ? POLLIN : 0), 0}};
    std::vector<int> ids{-1, -1};
    int timeout_ms = 1000;
    auto wake_at = [&](Clock::time_point t) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
      timeout_ms = static_cast<int>(std::max<long long>(0, std::min<long long>(timeout_ms, left)));
    };
    for (auto& [id, c] : conns_) {
      fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      ids.push_back(id);
      if (!c.hello) wake_at(c.since + options_.hello_timeout);  // a timer, whether or not it sends
    }
    for (const Waiter& w : waiters_) wake_at(w.deadline);
    if (!may_accept && oldest >= 0) wake_at(conns_.at(oldest).since + kStrangerGrace);
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) return;  // EINTR
    if (fds[1].revents & POLLIN) accept_all();
    for (size_t i = 2; i < fds.size(); ++i) {
      auto it = conns_.find(ids[i]);
      if (it == conns_.end()) continue;
      bool keep = true;
      try {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) keep = receive(ids[i], it->second);
        if (keep && (fds[i].revents & POLLOUT)) keep = flush(it->second);
      } catch (...) {  // a client that breaks the protocol loses its connection
        if (it->second.why.empty()) it->second.why = "it broke strata's protocol";
        keep = false;
      }
      if (!keep) drop(ids[i]);
    }
    now = Clock::now();
    expire(now);
    expire_strangers(now);
    drop_log_.tick(where(), now);
  }

  std::string where() const { return detail::cat(options_.host, ":", port_); }

  size_t strangers() const {
    size_t n = 0;
    for (const auto& [id, c] : conns_) n += c.hello ? 0 : 1;
    return n;
  }

  // The id of the stranger connected longest ago, or -1.
  int oldest_stranger() const {
    int oldest = -1;
    for (const auto& [id, c] : conns_)
      if (!c.hello && (oldest < 0 || c.since < conns_.at(oldest).since)) oldest = id;
    return oldest;
  }

  void accept_all() {
    while (true) {
      // Note [Strangers]: at the limit, a new connection takes the place of
      // the oldest stranger once that one has waited kStrangerGrace.
      int oldest_id = -1;
      if (strangers() >= kMaxStrangers) {
        oldest_id = oldest_stranger();
        if (oldest_id < 0 || Clock::now() - conns_.at(oldest_id).since < kStrangerGrace) return;
      }
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      if (oldest_id >= 0) {
        conns_.at(oldest_id).why = detail::cat(kMaxStrangers, " connections were waiting to identify themselves; "
                                               "the oldest made room for a new one");
        drop(oldest_id);
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Conn c;
      c.fd = fd;
      c.peer = peer_name(addr);
      conns_.emplace(next_id_++, std::move(c));
    }
  }

  // Drops every stranger whose hello timeout has passed (Note [Strangers]).
  void expire_strangers(Clock::time_point now) {
    std::vector<int> late;
    for (auto& [id, c] : conns_) {
      if (c.hello || now - c.since < options_.hello_timeout) continue;
      if (c.why.empty()) {
        c.why = detail::cat("it did not identify itself as one of this job's workers within ",
                            options_.hello_timeout.count(), " ms (STRATA_STORE_HELLO_TIMEOUT_MS)");
      }
      late.push_back(id);
    }
    for (int id : late) drop(id);
  }

  void drop(int id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    if (!it->second.hello && !it->second.why.empty()) {
      drop_log_.dropped(where(), it->second.peer, it->second.why, Clock::now());
    }
    if (it->second.hello && it->second.rank >= 0) {
      std::lock_guard<std::mutex> lock(ranks_mu_);
      auto held = connected_ranks_.find(it->second.rank);
      if (held != connected_ranks_.end() && --held->second == 0) connected_ranks_.erase(held);
      ranks_cv_.notify_all();
    }
    ::close(it->second.fd);
    conns_.erase(it);
    waiters_.remove_if([&](const Waiter& w) { return w.conn == id; });
  }

  // Reads what arrived and handles every complete frame; false: close.
  bool receive(int id, Conn& c) {
    char buffer[65536];
    size_t room = sizeof(buffer);
    if (!c.hello) {
      // Note [Strangers]: nothing past one hello's frame is read.
      const size_t most = 4 + static_cast<size_t>(kMaxHelloFrame);
      room = std::min(room, most - std::min(most, c.in.size()));
      if (room == 0) {
        c.why = "it sent more than a hello before its hello was answered";
        return false;
      }
    }
    ssize_t n = ::recv(c.fd, buffer, room, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) return false;
    c.in.append(buffer, static_cast<size_t>(n));
    while (c.in.size() >= 4 && !c.close_after_write) {
      const uint32_t announced = raw_frame_length(c.in.data());
      if (!c.hello && announced > kMaxHelloFrame) {
        c.why = refused_length(c.in, announced);
        return false;
      }
      uint32_t len = frame_length(c.in.data());  // throws over the limit
      if (c.in.size() < 4 + static_cast<size_t>(len)) break;
      std::string payload = c.in.substr(4, len);
      c.in.erase(0, 4 + static_cast<size_t>(len));
      if (!handle(id, c, payload)) return false;
    }
    return flush(c);
  }

  bool flush(Conn& c) {
    while (!c.out.empty()) {
      ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;
      if (n <= 0) return false;
      c.out.erase(0, static_cast<size_t>(n));
    }
    return !c.close_after_write;
  }

  static void reply(Conn& c, const Writer& w) { c.out += w.frame(); }
  static void reply_error(Conn& c, const std::string& message) { reply(c, Writer().u8(uint8_t(Reply::kError)).str(message)); }
  // Answers a hello with why it is refused; the connection closes once the
  // answer is out, and the log says so (Note [Strangers]).
  static void refuse(Conn& c, const std::string& message, const std::string& why = "") {
    reply_error(c, message);
    c.why = why.empty() ? "its hello was refused: " + message : why;
  }

  // Handles one request; false: close the connection at once.
  bool handle(int id, Conn& c, const std::string& payload) {
    Reader r(payload);
    Op op = static_cast<Op>(r.u8());
    if (!c.hello) {
      if (op != Op::kHello) {
        c.why = "its first message is not strata's hello: it is not a strata client";
        return false;
      }
      hello(c, r);
      return true;
    }
    switch (op) {
      case Op::kSet: {
        std::string key = r.str();
        data_[key] = r.str();
        reply(c, Writer().u8(uint8_t(Reply::kOk)));
        wake_waiters();
        return true;
      }
      case Op::kGet:
      case Op::kWait: {
        std::vector<std::string> keys = op == Op::kGet ? std::vector<std::string>{r.str()} : r.strs();
        int64_t timeout_ms = r.i64();
        Waiter w{id, op, std::move(keys), Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms))};
        if (!try_answer(c, w)) waiters_.push_back(std::move(w));
        return true;
      }
      case Op::kAdd: {
        std::string key = r.str();
        int64_t delta = r.i64();
        int64_t value = 0;
        auto it = data_.find(key);
        if (it != data_.end()) {
          try {
            value = std::stoll(it->second);
          } catch (const std::exception&) {
            reply_error(c, "the value of '" + key + "' is not an integer");
            return true;
          }
        }
        value += delta;
        data_[key] = std::to_string(value);
        reply(c, Writer().u8(uint8_t(Reply::kInt)).i64(value));
        wake_waiters();
        return true;
      }
      case Op::kCheck: {
        bool all = true;
        for (const std::string& key : r.strs()) all = all && data_.count(key) != 0;
        reply(c, Writer().u8(uint8_t(Reply::kBool)).u8(all ? 1 : 0));
        return true;
      }
      case Op::kRemove: {
        bool existed = data_.erase(r.str()) != 0;
        reply(c, Writer().u8(uint8_t(Reply::kBool)).u8(existed ? 1 : 0));
        return true;
      }
      case Op::kJoin: {
        int64_t timeout_ms = r.i64();
        Waiter w{id, Op::kJoin, {}, Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms))};
        if (!try_answer(c, w)) waiters_.push_back(std::move(w));
        return true;
      }
      case Op::kHello:
        break;
    }
    reply_error(c, "unknown request");
    return true;
  }

  // Note [Who may join]
  // A client proves it belongs to the job with the token the launcher
  // handed every worker; without it, it is refused and its connection
  // closed (it never sees a key). A rank may be held by one process only:
  // a second process claiming it is refused, and so are ranks that
  // disagree with rank 0 (the host) about the world size. Both are
  // recorded, so every rank waiting at kJoin fails at once with the same
  // message instead of waiting for the rendezvous timeout.
  void hello(Conn& c, Reader& r) {
    std::string magic = r.str();
    std::string token = r.str();
    int64_t rank = r.i64();
    int64_t world_size = r.i64();
    std::string identity = r.str();
    c.close_after_write = true;  // unless accepted below
    if (magic != kMagic) {
      refuse(c, "the client speaks another protocol",
             "its hello names another protocol than this store's (a strata of another version?)");
      return;
    }
    if (!options_.token.empty() && token != options_.token) {
      refuse(c, "refused: the client does not carry this job's token (STRATA_JOB_TOKEN)",
             "its hello does not carry this job's token (STRATA_JOB_TOKEN): a worker of another job, or one "
             "started by hand");
      return;
    }
    if (rank >= 0 && options_.world_size > 0) {
      if (world_size != options_.world_size) {
        std::string why = detail::cat("ranks disagree about WORLD_SIZE: rank 0 (the store's host) has WORLD_SIZE=",
                                      options_.world_size, ", rank ", rank, " (", identity, ") has WORLD_SIZE=",
                                      world_size, "; start every worker with the same WORLD_SIZE");
        record_failure(why);
        refuse(c, why);
        return;
      }
      auto held = ranks_.find(rank);
      if (held != ranks_.end() && held->second != identity) {
        std::string why = detail::cat("two processes claim rank ", rank, ": ", held->second, " joined first, ",
                                      identity, " was refused; give every worker a distinct RANK");
        record_failure(why);
        refuse(c, why);
        return;
      }
      ranks_[rank] = identity;
      wake_waiters();
    }
    c.hello = true;
    c.close_after_write = false;
    c.rank = static_cast<int>(rank);
    c.identity = identity;
    if (c.rank >= 0) {
      std::lock_guard<std::mutex> lock(ranks_mu_);
      ++connected_ranks_[c.rank];
    }
    reply(c, Writer().u8(uint8_t(Reply::kOk)).str(kMagic));
  }

  void record_failure(const std::string& why) {
    if (failure_.empty()) failure_ = why;
    wake_waiters();
  }

  std::vector<std::string> missing_keys(const Waiter& w) const {
    std::vector<std::string> missing;
    for (const std::string& key : w.keys)
      if (data_.count(key) == 0) missing.push_back(key);
    return missing;
  }

  std::vector<std::string> missing_ranks() const {
    std::vector<std::string> missing;
    for (int rank = 0; rank < options_.world_size; ++rank)
      if (ranks_.count(rank) == 0) missing.push_back(std::to_string(rank));
    return missing;
  }

  // Answers `w` when it can; false: it still waits.
  bool try_answer(Conn& c, const Waiter& w) {
    if (w.op == Op::kJoin) {
      if (!failure_.empty()) {
        reply_error(c, failure_);
        return true;
      }
      if (missing_ranks().empty()) {
        reply(c, Writer().u8(uint8_t(Reply::kOk)));
        return true;
      }
      return false;
    }
    if (!missing_keys(w).empty()) return false;
    if (w.op == Op::kGet) {
      reply(c, Writer().u8(uint8_t(Reply::kValue)).str(data_.at(w.keys.front())));
    } else {
      reply(c, Writer().u8(uint8_t(Reply::kOk)));
    }
    return true;
  }

  void wake_waiters() {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      auto conn = conns_.find(it->conn);
      if (conn == conns_.end() || try_answer(conn->second, *it)) {
        if (conn != conns_.end()) flush(conn->second);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void expire(Clock::time_point now) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      auto conn = conns_.find(it->conn);
      if (conn != conns_.end() && now < it->deadline) {
        ++it;
        continue;
      }
      if (conn != conns_.end()) {
        std::vector<std::string> missing = it->op == Op::kJoin ? missing_ranks() : missing_keys(*it);
        reply(conn->second, Writer().u8(uint8_t(Reply::kTimeout)).strs(missing));
        flush(conn->second);
      }
      it = waiters_.erase(it);
    }
  }

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
};

// Note [Who holds a busy port]
// When rank 0 cannot bind the store's port, the user needs to know whether
// another strata job holds it (two jobs given one --master-port or
// MASTER_PORT) or another program. One short look tells: connect, send a
// hello without a token and rank -1 (which no store counts as a rank), and
// see whether the answer is strata's (accepted, or refused for the token).
// At most about a second; anything else, silence included, is "another
// program".
bool strata_store_answers(const addrinfo& ai) {
  int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) return false;
  timeval limit{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));  // bounds connect() too
  sockaddr_storage target{};
  std::memcpy(&target, ai.ai_addr, std::min<size_t>(ai.ai_addrlen, sizeof(target)));
  // A wildcard bind address is reached on loopback.
  if (target.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&target);
    if (in->sin_addr.s_addr == htonl(INADDR_ANY)) in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (target.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&target);
    if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr)) in6->sin6_addr = in6addr_loopback;
  }
  bool strata = false;
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&target), ai.ai_addrlen) == 0) {
    const std::string hello =
        Writer().u8(uint8_t(Op::kHello)).str(kMagic).str("").i64(-1).i64(0).str("port check").frame();
    if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size())) {
      std::string got;
      char buffer[512];
      // Enough for the answer's kind and magic; a refusal is a longer frame.
      while (got.size() < 4 + 1 + 8 + std::strlen(kMagic) && Clock::now() < deadline) {
        ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got.append(buffer, static_cast<size_t>(n));
      }
      // A refusal (kError, for the missing token) is strata's too; only its
      // kind is read, its text may not all be in.
      if (got.size() > 4) {
        try {
          frame_length(got.data());
          std::string payload = got.substr(4);
          Reader r(payload);
          Reply kind = static_cast<Reply>(r.u8());
          strata = kind == Reply::kError || (kind == Reply::kOk && r.str() == kMagic);
        } catch (const ProtocolError&) {
        }
      }
    }
  }
  ::close(fd);
  return strata;
}

}  // namespace

std::unique_ptr<Server> start_server(const ServerOptions& options) {
  const std::string where = detail::cat(options.host, ":", options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(options.host.c_str(), std::to_string(options.port).c_str(), &hints, &found);
  STRATA_CHECK(rc == 0, CommError, "[store] cannot host the rendezvous store on ", where, ": cannot resolve '",
               options.host, "': ", ::gai_strerror(rc), "; set MASTER_ADDR (--master-addr) to an address of this host");
  int fd = -1;
  int last_errno = 0;
  bool held_by_strata = false;  // Note [Who holds a busy port]
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      if (last_errno != EADDRINUSE) last_errno = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      // A port in use on one of the names' addresses is the error to report,
      // not what a later address (an absent IPv6 ::1, say) said.
      const int bind_errno = errno;
      if (bind_errno == EADDRINUSE && last_errno != EADDRINUSE) held_by_strata = strata_store_answers(*ai);
      if (last_errno != EADDRINUSE) last_errno = bind_errno;
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    if (last_errno == EADDRINUSE && held_by_strata) {
      throw CommError(detail::cat("[store] cannot host the rendezvous store on ", where,
                                  ": the port is in use by another strata job (its rendezvous store answers "
                                  "there); give this job another port (--master-port or MASTER_PORT), or leave "
                                  "both unset for a free port on one host"));
    }
    if (last_errno == EADDRINUSE) {
      throw CommError(detail::cat("[store] cannot host the rendezvous store on ", where,
                                  ": the port is in use by another program; give this job another port "
                                  "(--master-port or MASTER_PORT), or leave both unset for a free port on one "
                                  "host, or stop the program that holds it"));
    }
    if (last_errno == EADDRNOTAVAIL) {
      throw CommError(detail::cat("[store] cannot host the rendezvous store on ", where, ": ", options.host,
                                  " is not an address of this host; set MASTER_ADDR (--master-addr) to the "
                                  "address of the host that runs rank 0"));
    }
    throw CommError(detail::cat("[store] cannot host the rendezvous store on ", where, ": ",
                                detail::errno_string(last_errno)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::make_unique<TcpServer>(options, fd, port);
}

}  // namespace strata::runtime::store_protocol
