// Stores and ports around the TCP store: a store that prefixes every key
// (one namespace per group), the backends' rendezvous, and finding a free
// port for the rendezvous.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "strata/core/error.h"
#include "strata/runtime/store.h"

namespace strata::runtime {
namespace {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> inner, std::string prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix) + "/") {}

  void set(const std::string& key, const std::string& value) override { inner_->set(prefix_ + key, value); }
  std::string get(const std::string& key) override { return inner_->get(prefix_ + key); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(prefix_ + key, delta); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(prefixed(keys)); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->wait(prefixed(keys), timeout);
  }
  bool remove(const std::string& key) override { return inner_->remove(prefix_ + key); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const std::string& key : keys) out.push_back(prefix_ + key);
    return out;
  }

  std::shared_ptr<Store> inner_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> prefix_store(std::shared_ptr<Store> store, const std::string& prefix) {
  STRATA_CHECK(store != nullptr, ConfigError, "[store] prefix_store('", prefix, "') got no store");
  return std::make_shared<PrefixStore>(std::move(store), prefix);
}

void join_ranks(Store& store, const std::string& who, int rank, int size, std::chrono::milliseconds timeout) {
  store.set("joined/" + std::to_string(rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("joined/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::string missing;
    int count = 0;
    for (int r = 0; r < size; ++r) {
      if (store.check({keys[r]})) continue;
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      ++count;
    }
    throw TimeoutError(detail::cat("[", who, "] rendezvous timed out after ", timeout.count(), " ms on rank ", rank,
                                   " of ", size, ": rank", count == 1 ? " " : "s ", missing,
                                   " never joined (check that every worker started and reached init_process_group)"));
  }
}

int find_free_port(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), "0", &hints, &found);
  STRATA_CHECK(rc == 0, ConfigError, "[store] cannot resolve host '", host, "': ", ::gai_strerror(rc));
  int port = -1;
  int last_errno = 0;
  for (addrinfo* ai = found; ai != nullptr && port < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    } else {
      last_errno = errno;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  STRATA_CHECK(port > 0, CommError, "[store] cannot find a free port on '", host, "': ",
               detail::errno_string(last_errno));
  return port;
}

}  // namespace strata::runtime
