// The rendezvous store client's connection (store_connection.h).
#include "store_connection.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "store_protocol.h"
#include "strata/core/error.h"

namespace strata::runtime::store_protocol {
namespace {

using Clock = Connection::Clock;

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<long long>(0, std::min<long long>(left, 24LL * 3600 * 1000)));
}

}  // namespace

void Connection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Connection::connect(const std::string& host, int port, Clock::time_point deadline) {
  close();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw ConnectionError{Failure::kOther, detail::cat("cannot resolve '", host, "': ", ::gai_strerror(rc))};
  Failure kind = Failure::kRefused;
  std::string why = "connection refused";
  for (addrinfo* ai = found; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int r = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int n = ::poll(&p, 1, remaining_ms(deadline));
      int err = 0;
      socklen_t len = sizeof(err);
      if (n == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        r = 0;
      } else {
        errno = n == 0 ? ETIMEDOUT : err;
      }
    }
    if (r == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fd_ = fd;
    } else {
      if (errno == ETIMEDOUT) kind = Failure::kTimedOut;
      if (errno != ECONNREFUSED && errno != ETIMEDOUT) {
        kind = Failure::kOther;
        why = detail::errno_string(errno);
      }
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (fd_ < 0) throw ConnectionError{kind, why};
}

void Connection::send(const std::string& frame, Clock::time_point deadline) {
  size_t done = 0;
  while (done < frame.size()) {
    ssize_t n = ::send(fd_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) == 0) fail(Failure::kTimedOut, "sending timed out");
      continue;
    }
    fail(Failure::kClosed, detail::errno_string(errno));
  }
}

std::string Connection::receive(Clock::time_point deadline) {
  std::string head = read_exact(4, deadline);
  uint32_t len = 0;
  try {
    len = frame_length(head.data());
  } catch (const ProtocolError& e) {
    fail(Failure::kJunk, e.what());
  }
  return read_exact(len, deadline);
}

void Connection::fail(Failure kind, const std::string& why) {
  close();
  throw ConnectionError{kind, why};
}

std::string Connection::read_exact(size_t n, Clock::time_point deadline) {
  std::string out;
  out.reserve(std::min<size_t>(n, 1 << 20));
  char buffer[65536];
  while (out.size() < n) {
    pollfd p{fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) fail(Failure::kTimedOut, "no answer");
    ssize_t got = ::recv(fd_, buffer, std::min(sizeof(buffer), n - out.size()), 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) fail(Failure::kClosed, got == 0 ? "closed" : detail::errno_string(errno));
    out.append(buffer, static_cast<size_t>(got));
  }
  return out;
}

}  // namespace strata::runtime::store_protocol
