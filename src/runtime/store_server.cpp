// The rendezvous store's server: one thread, poll() over the listening
// socket and every client, the keys in a map. This file holds its
// connections: the loop, accepting, reading and writing frames, and the
// strangers. What it does with a request (who joins, the keys, the waits)
// is in store_requests.cpp; binding its port in store_listen.cpp. Wire
// format: store_protocol.h.
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
#include "store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <set>

#include "strata/core/error.h"
#include "strata/core/log.h"

namespace strata::runtime::store_protocol {
namespace {

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

}  // namespace

void DropLog::dropped(const std::string& where, const std::string& peer, const std::string& why,
                      Clock::time_point now) {
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

void DropLog::tick(const std::string& where, Clock::time_point now) {
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

// Note [A job that failed]
// The store lives in rank 0's process, whose launcher may learn before
// rank 0 does that another rank failed: the subprocess launcher's
// supervisor sees its worker exit. A rank that died before it joined the
// rendezvous never connects, so rank 0 would wait in the rendezvous (or
// for a key the dead rank was to set) until the store's timeout, 300 s by
// default. abort_hosted_stores() hands the failure to every store this
// process hosts: each answers every waiting request, and every later one,
// with the error, so rank 0 (and any rank still alive) fails at once.
namespace {
std::mutex hosted_mu;
std::set<TcpServer*>& hosted() {
  static std::set<TcpServer*> servers;
  return servers;
}
}  // namespace

TcpServer::TcpServer(const ServerOptions& options, int listen_fd, int port)
    : options_(options), listen_fd_(listen_fd), port_(port) {
  int fds[2];
  STRATA_CHECK_SYSCALL(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), CommError, "[store] cannot create a pipe");
  wake_read_ = fds[0];
  wake_write_ = fds[1];
  thread_ = std::thread([this] { loop(); });
  std::lock_guard<std::mutex> lock(hosted_mu);
  hosted().insert(this);
}

void TcpServer::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!abort_.empty()) return;
    abort_ = why;
  }
  char byte = 1;
  ssize_t ignored = ::write(wake_write_, &byte, 1);
  (void)ignored;
}

TcpServer::~TcpServer() {
  {
    std::lock_guard<std::mutex> lock(hosted_mu);
    hosted().erase(this);
  }
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

std::vector<int64_t> TcpServer::wait_for_ranks_to_leave(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(ranks_mu_);
  ranks_cv_.wait_until(lock, deadline, [this] { return connected_ranks_.empty(); });
  std::vector<int64_t> left;
  for (const auto& [rank, count] : connected_ranks_) left.push_back(rank);
  return left;
}

void TcpServer::loop() {
  while (!stop_) {
    try {
      poll_once();
    } catch (...) {  // Note [Store server]
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

void TcpServer::poll_once() {
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
  if (fds[0].revents & POLLIN) {
    char drain[64];
    while (::read(wake_read_, drain, sizeof drain) > 0) {
    }
    std::string why;
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      why = abort_;
    }
    if (aborted_.empty() && !why.empty()) {
      aborted_ = why;
      wake_waiters();
    }
  }
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

size_t TcpServer::strangers() const {
  size_t n = 0;
  for (const auto& [id, c] : conns_) n += c.hello ? 0 : 1;
  return n;
}

// The id of the stranger connected longest ago, or -1.
int TcpServer::oldest_stranger() const {
  int oldest = -1;
  for (const auto& [id, c] : conns_)
    if (!c.hello && (oldest < 0 || c.since < conns_.at(oldest).since)) oldest = id;
  return oldest;
}

void TcpServer::accept_all() {
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
void TcpServer::expire_strangers(Clock::time_point now) {
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

void TcpServer::drop(int id) {
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
bool TcpServer::receive(int id, Conn& c) {
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

bool TcpServer::flush(Conn& c) {
  while (!c.out.empty()) {
    ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) return false;
    c.out.erase(0, static_cast<size_t>(n));
  }
  return !c.close_after_write;
}

}  // namespace strata::runtime::store_protocol

namespace strata::runtime {

void abort_hosted_stores(const std::string& why) {
  std::lock_guard<std::mutex> lock(store_protocol::hosted_mu);
  for (store_protocol::TcpServer* server : store_protocol::hosted()) server->abort(why);
}

}  // namespace strata::runtime
