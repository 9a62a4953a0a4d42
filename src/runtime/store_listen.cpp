// Binding the rendezvous store's port (start_server in store_protocol.h),
// and telling who holds it when it is busy (Note [Who holds a busy port]).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "store_server.h"
#include "strata/core/error.h"

namespace strata::runtime::store_protocol {
namespace {

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

// Why the store could not bind `where` (Note [Who holds a busy port]).
[[noreturn]] void throw_bind_error(const std::string& where, const std::string& host, int last_errno,
                                   bool held_by_strata) {
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
    throw CommError(detail::cat("[store] cannot host the rendezvous store on ", where, ": ", host,
                                " is not an address of this host; set MASTER_ADDR (--master-addr) to the "
                                "address of the host that runs rank 0"));
  }
  throw CommError(detail::cat("[store] cannot host the rendezvous store on ", where, ": ",
                              detail::errno_string(last_errno)));
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
  if (fd < 0) throw_bind_error(where, options.host, last_errno, held_by_strata);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::make_unique<TcpServer>(options, fd, port);
}

}  // namespace strata::runtime::store_protocol
