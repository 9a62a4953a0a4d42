// The rendezvous store: c10d's TCPStore behind strata's small Store
// interface, with errors that name the address, the key and what to do.
#include "strata/runtime/store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/exception.h>

#include "strata/core/error.h"
#include "strata/runtime/env.h"

namespace strata::runtime {
namespace {

using Clock = std::chrono::steady_clock;

std::string address(const std::string& host, int port) { return detail::cat(host, ":", port); }

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& key : keys) out += (out.empty() ? "'" : ", '") + key + "'";
  return out;
}

// True when nothing listens on `port` yet binding it fails with EADDRINUSE.
bool port_in_use(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool in_use = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return in_use;
}

// Note [Replacing the client after a timeout]
// c10d's client waits for a key by sending WAIT and reading the server's
// STOP_WAITING reply under a socket receive timeout. When the timeout fires
// the reply is still owed: if the key is set later, the server sends it and
// the next command on that socket would read it as its own answer. So after
// any timeout we stop using that connection and open a fresh client one
// (the server-side TCPStore object is kept alive for as long as this store
// lives, because it owns the listening socket and the data).
bool is_timeout(const std::exception& e) {
  return dynamic_cast<const c10d::TimeoutError*>(&e) != nullptr ||
         std::string(e.what()).find("timed out") != std::string::npos;
}

// Note [Quiet c10d]
// c10d logs every failed connect attempt at error level, each with a stack
// of frames, before strata reports the failure in one line of its own. While
// strata opens a connection, c10d's log level is raised to fatal, unless the
// user chose a level with TORCH_CPP_LOG_LEVEL.
class QuietC10d {
 public:
  QuietC10d() : previous_(FLAGS_caffe2_log_level) {
    if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = std::max(previous_, 3);
  }
  ~QuietC10d() { FLAGS_caffe2_log_level = previous_; }
  QuietC10d(const QuietC10d&) = delete;
  QuietC10d& operator=(const QuietC10d&) = delete;

 private:
  int previous_;
};

class TcpStore final : public Store {
 public:
  TcpStore(const TcpStoreOptions& options) : options_(options) {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(options.port);
    opts.isServer = options.is_server;
    opts.numWorkers = c10::nullopt;  // do not block the constructor on the others
    opts.waitWorkers = false;
    opts.timeout = options.timeout;
    auto start = Clock::now();
    try {
      QuietC10d quiet;
      server_or_client_ = c10::make_intrusive<c10d::TCPStore>(options.host, opts);
    } catch (const std::exception& e) {
      auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      if (options.is_server) {
        if (options.port != 0 && port_in_use(options.port)) {
          throw CommError(detail::cat("[store] cannot host the rendezvous store on ",
                                      address(options.host, options.port),
                                      ": the port is already in use; choose another port (MASTER_PORT or "
                                      "--master-port) or stop the process that holds it"));
        }
        throw CommError(detail::cat("[store] cannot host the rendezvous store on ",
                                    address(options.host, options.port), ": ", e.what()));
      }
      if (waited >= options.timeout || is_timeout(e)) {
        throw TimeoutError(detail::cat("[store] could not reach the rendezvous store at ",
                                       address(options.host, options.port), " within ", options.timeout.count(),
                                       " ms; check MASTER_ADDR and MASTER_PORT, and that rank 0 has started"));
      }
      throw CommError(detail::cat("[store] could not connect to the rendezvous store at ",
                                  address(options.host, options.port), ": ", e.what()));
    }
    port_ = server_or_client_->getPort();
    ops_ = server_or_client_;
  }

  void set(const std::string& key, const std::string& value) override {
    std::vector<uint8_t> bytes(value.begin(), value.end());
    run("set('" + key + "')", [&](c10d::TCPStore& s) { s.set(key, bytes); });
  }

  std::string get(const std::string& key) override {
    wait_for({key}, options_.timeout, "get('" + key + "')");
    std::vector<uint8_t> bytes;
    run("get('" + key + "')", [&](c10d::TCPStore& s) { bytes = s.get(key); });
    return std::string(bytes.begin(), bytes.end());
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result = 0;
    run("add('" + key + "')", [&](c10d::TCPStore& s) { result = s.add(key, delta); });
    return result;
  }

  bool check(const std::vector<std::string>& keys) override {
    bool result = false;
    run("check(" + join_keys(keys) + ")", [&](c10d::TCPStore& s) { result = s.check(keys); });
    return result;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    wait_for(keys, timeout, "wait(" + join_keys(keys) + ")");
  }

  bool remove(const std::string& key) override {
    bool result = false;
    run("remove('" + key + "')", [&](c10d::TCPStore& s) { result = s.deleteKey(key); });
    return result;
  }

  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  int port() const { return port_; }

 private:
  // Runs one c10d call under the lock; c10d errors become CommError.
  template <class Fn>
  void run(const std::string& what, Fn&& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      fn(*ops_);
    } catch (const std::exception& e) {
      throw CommError(detail::cat("[store] ", what, " on ", address(options_.host, port_), " failed: ", e.what()));
    }
  }

  void wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout, const std::string& what) {
    if (keys.empty()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto start = Clock::now();
    try {
      ops_->wait(keys, timeout);
      return;
    } catch (const std::exception& e) {
      auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      reconnect();  // Note [Replacing the client after a timeout]
      if (waited + std::chrono::milliseconds(50) < timeout) {
        throw CommError(
            detail::cat("[store] ", what, " on ", address(options_.host, port_), " failed: ", e.what()));
      }
    }
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      try {
        if (!ops_->check({key})) missing.push_back(key);
      } catch (const std::exception&) {
        missing.push_back(key);
      }
    }
    if (missing.empty()) missing = keys;  // set just after the deadline: still report the timeout
    throw TimeoutError(detail::cat("[store] ", what, " timed out after ", timeout.count(), " ms on ",
                                   address(options_.host, port_), ": no worker set ", join_keys(missing),
                                   "; check that every rank reached the same point (a rank may have failed or "
                                   "be slower than the timeout)"));
  }

  // Opens a new client connection to the same server (caller holds mutex_).
  void reconnect() {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(port_);
    opts.isServer = false;
    opts.numWorkers = c10::nullopt;
    opts.waitWorkers = false;
    opts.timeout = options_.timeout;
    try {
      QuietC10d quiet;
      ops_ = c10::make_intrusive<c10d::TCPStore>(options_.is_server ? std::string("127.0.0.1") : options_.host, opts);
    } catch (const std::exception& e) {
      throw CommError(detail::cat("[store] lost the rendezvous store at ", address(options_.host, port_),
                                  " and could not reconnect: ", e.what()));
    }
  }

  TcpStoreOptions options_;
  int port_ = 0;
  c10::intrusive_ptr<c10d::TCPStore> server_or_client_;  // owns the server when is_server
  c10::intrusive_ptr<c10d::TCPStore> ops_;               // the connection operations use
  std::mutex mutex_;
};

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

std::shared_ptr<Store> make_tcp_store(const TcpStoreOptions& options) {
  STRATA_CHECK(options.port >= 0 && options.port <= 65535, ConfigError, "[store] port ", options.port,
               " is not a TCP port (0..65535)");
  STRATA_CHECK(options.is_server || options.port != 0, ConfigError,
               "[store] a client needs the server's port; got port 0 for ", options.host);
  STRATA_CHECK(options.timeout.count() > 0, ConfigError, "[store] timeout must be positive, got ",
               options.timeout.count(), " ms");
  STRATA_CHECK(!options.host.empty(), ConfigError, "[store] host is empty; set MASTER_ADDR");
  return std::make_shared<TcpStore>(options);
}

std::shared_ptr<Store> make_store(const Environment& env, std::chrono::milliseconds timeout) {
  STRATA_CHECK(env.world_size == 1 || env.master_port != 0, ConfigError, "[store] ", env.describe(),
               " has no rendezvous port: MASTER_PORT is not set; set MASTER_PORT (strata launch sets it) to a port "
               "that is free on ", env.master_addr);
  TcpStoreOptions options;
  options.host = env.master_addr;
  options.port = env.master_port;
  options.is_server = env.rank == 0;
  options.world_size = env.world_size;
  options.timeout = timeout;
  return make_tcp_store(options);
}

std::shared_ptr<Store> prefix_store(std::shared_ptr<Store> store, const std::string& prefix) {
  STRATA_CHECK(store != nullptr, ConfigError, "[store] prefix_store('", prefix, "') got no store");
  return std::make_shared<PrefixStore>(std::move(store), prefix);
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
