// The rendezvous store: strata's own small TCP key-value store (server in
// store_server.cpp, wire format in store_protocol.h, the client's socket in
// store_connection.cpp) behind the Store interface, with errors that name
// the address, the key and what to do.
//
// Note [Why not c10d's TCPStore]
// LibTorch's c10d::TCPStore cannot check who connects (no token), reads
// lengths from the wire without a bound (a program on the port that
// answers with junk ends in std::bad_alloc) and waits without a deadline
// for a silent one. Its TCPStoreOptions can take a pre-bound socket
// (masterListenFd), so binding to one interface would be possible, but the
// rest is not. strata's store binds to the master address only, refuses a
// client without the job's token, checks ranks and world sizes at
// rendezvous, bounds every read by a deadline and every length by a limit.
#include "strata/runtime/store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "store_connection.h"
#include "store_protocol.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/core/strings.h"
#include "strata/runtime/env.h"
#include "strata/runtime/torchelastic.h"

namespace strata::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using namespace store_protocol;

// Note [Handshake limit]
// The store's own thread answers the hello within milliseconds, whatever
// rank 0's main thread is doing, so a holder of the port that stays silent
// for seconds is not strata's store, or is a rank 0 whose whole process is
// stopped (which nothing cheap tells apart from outside). Junk in answer is
// named at once; silence is named after this limit. It was 15 s, which
// left a worker started by hand waiting that long behind a program that
// held the port (rank 0 itself fails at once: it cannot bind).
constexpr auto kHandshakeLimit = std::chrono::seconds(5);
// Extra time a client gives the server to answer a wait that timed out.
constexpr auto kReplySlack = std::chrono::seconds(10);

std::string address(const std::string& host, int port) { return detail::cat(host, ":", port); }

// How long the store waits for a client's hello (Note [Strangers] in
// store_server.cpp): STRATA_STORE_HELLO_TIMEOUT_MS, else the default. Above
// the client's own kHandshakeLimit, so no client that could succeed is cut.
std::chrono::milliseconds hello_timeout_from_env() {
  const char* text = std::getenv("STRATA_STORE_HELLO_TIMEOUT_MS");
  if (text == nullptr || *text == '\0') return kDefaultHelloTimeout;
  errno = 0;
  char* end = nullptr;
  const long long ms = std::strtoll(text, &end, 10);
  constexpr long long kLo = 100, kHi = 3600 * 1000;
  STRATA_CHECK(errno == 0 && end != text && *end == '\0' && ms >= kLo && ms <= kHi, ConfigError,
               "[store] STRATA_STORE_HELLO_TIMEOUT_MS='", std::string(text, ::strnlen(text, 64)),
               "' is not a number of milliseconds between ", kLo, " and ", kHi, "; unset it to use the default (",
               kDefaultHelloTimeout.count(), ")");
  return std::chrono::milliseconds(ms);
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& key : keys) out += (out.empty() ? "'" : ", '") + key + "'";
  return out;
}

std::string identity() {
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  return detail::cat("pid ", ::getpid(), " on ", host);
}

class TcpStore final : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& options) : options_(options) {
    // Note [Strangers] in store_server.cpp: a hello is a small frame.
    STRATA_CHECK(options.token.size() <= kMaxToken, ConfigError, "[store] the job token (STRATA_JOB_TOKEN) is ",
                 options.token.size(), " bytes long; the rendezvous store accepts at most ", kMaxToken,
                 " bytes: choose a shorter secret");
    if (options.is_server) {
      ServerOptions server;
      server.host = options.host;
      server.port = options.port;
      server.world_size = options.rank >= 0 ? options.world_size : 0;
      server.token = options.token;
      server.hello_timeout = hello_timeout_from_env();
      server_ = start_server(server);
      port_ = server_->port();
    } else {
      port_ = options.port;
    }
    connect_host_ = options.host;
    if (options.is_server && (connect_host_ == "0.0.0.0" || connect_host_ == "::")) connect_host_ = "127.0.0.1";
    connect(options.timeout);
  }

  // Note [Closing handshake]
  // The store lives in rank 0's process, and rank 0 may finish first. In a
  // Fabric run that does nothing, rank 0 returned from shm's set-up, tore
  // down and exited while rank 1 had yet to read the set-up's verdict from
  // the store; rank 1 took the lost store for a failed set-up, fell back to
  // Gloo, and its join_ranks reconnected to nothing until the rendezvous
  // timeout, which the launcher waited out. So the host
  // does not stop serving while a rank still holds a connection: a client
  // says goodbye by closing its connection (its Store is destroyed, or its
  // process exits, however it ends), and the host's destructor waits until
  // every rank has, up to the store's timeout (a rank that outlives that
  // is named in a warning, and fails at once when it next uses the store:
  // TcpStore::host_gone). The wait is skipped while an exception unwinds
  // the host: rank 0 is failing, and its peers are better told at once.
  //
  // The other design, torchrun's (the launcher's agent hosts the store,
  // which outlives its workers), was not taken: it covers only workers that
  // strata's launcher starts on one host, while workers started by hand,
  // mpirun, srun or a launcher per host still need rank 0 to host the store
  // and so the same handshake; one mechanism serves every way to start.
  ~TcpStore() override {
    if (!server_) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      connection_.close();  // this process's own goodbye
    }
    if (std::uncaught_exceptions() > 0) return;
    std::vector<std::string> left;
    for (int64_t rank : server_->wait_for_ranks_to_leave(Clock::now() + options_.timeout))
      left.push_back(std::to_string(rank));
    if (!left.empty()) {
      log::warning_all_ranks("[store] stopped hosting the rendezvous store at ", where(), " after waiting ",
                             options_.timeout.count(), " ms for ", left.size() == 1 ? "rank " : "ranks ",
                             strata::join(left), " to close ", left.size() == 1 ? "its connection" : "their connections",
                             "; ", left.size() == 1 ? "it fails" : "they fail", " if ",
                             left.size() == 1 ? "it uses" : "they use", " the store again");
    }
  }

  void set(const std::string& key, const std::string& value) override {
    request("set('" + key + "')", Writer().u8(uint8_t(Op::kSet)).str(key).str(value), options_.timeout);
  }

  std::string get(const std::string& key) override {
    Answer a = request("get('" + key + "')", Writer().u8(uint8_t(Op::kGet)).str(key).i64(options_.timeout.count()),
                       options_.timeout + kReplySlack);
    if (a.kind == Reply::kTimeout) throw key_timeout("get('" + key + "')", options_.timeout, a.list, {key});
    return a.text;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    return request("add('" + key + "')", Writer().u8(uint8_t(Op::kAdd)).str(key).i64(delta), options_.timeout).number;
  }

  bool check(const std::vector<std::string>& keys) override {
    return request("check(" + join_keys(keys) + ")", Writer().u8(uint8_t(Op::kCheck)).strs(keys), options_.timeout)
               .number != 0;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    if (keys.empty()) return;
    const std::string what = "wait(" + join_keys(keys) + ")";
    Answer a = request(what, Writer().u8(uint8_t(Op::kWait)).strs(keys).i64(timeout.count()), timeout + kReplySlack);
    if (a.kind == Reply::kTimeout) throw key_timeout(what, timeout, a.list, keys);
  }

  bool remove(const std::string& key) override {
    return request("remove('" + key + "')", Writer().u8(uint8_t(Op::kRemove)).str(key), options_.timeout).number != 0;
  }

  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  // Note [Rendezvous]
  // Every rank waits until all world_size ranks have joined the store, or
  // a conflict is found (two processes with one rank, another world size),
  // or the timeout passes; the error names the conflict or the ranks that
  // never came.
  void join(std::chrono::milliseconds timeout) {
    Answer a;
    try {
      a = request("rendezvous", Writer().u8(uint8_t(Op::kJoin)).i64(timeout.count()), timeout + kReplySlack);
    } catch (const RemoteError& e) {
      throw CommError(detail::cat("[store] rendezvous at ", where(), " failed: ", e.what()));
    }
    if (a.kind != Reply::kTimeout) return;
    std::vector<std::string> joined;
    for (int r = 0; r < options_.world_size; ++r) {
      std::string s = std::to_string(r);
      if (std::find(a.list.begin(), a.list.end(), s) == a.list.end()) joined.push_back(s);
    }
    throw TimeoutError(detail::cat("[store] rendezvous at ", where(), " timed out after ", timeout.count(), " ms: ",
                                   a.list.size() == 1 ? "rank " : "ranks ", strata::join(a.list), " of WORLD_SIZE=",
                                   options_.world_size, " never joined (joined: ",
                                   joined.empty() ? std::string("none") : strata::join(joined),
                                   "); start every worker with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, "
                                   "or look for why the missing ranks did not start"));
  }

 private:
  // The server's kError answer to a request.
  class RemoteError : public CommError {
   public:
    using CommError::CommError;
  };
  // The store's host has exited (Note [A store that is gone]).
  class HostGone : public CommError {
   public:
    using CommError::CommError;
  };

  struct Answer {
    Reply kind = Reply::kOk;
    std::string text;
    int64_t number = 0;
    std::vector<std::string> list;
  };

  std::string where() const { return address(options_.host, port_); }

  std::string foreign_program(const std::string& what) const {
    return detail::cat("[store] the program at ", where(), " ", what,
                       ": it is not strata's rendezvous store. Another program holds the port; choose another "
                       "port (MASTER_PORT or --master-port) or stop that program");
  }

  // The store refused this process's job token. With a token, the store
  // on the port belongs to another job: two jobs were given one port
  // (--master-port, MASTER_PORT), and this one must move. Without one, the
  // process was started by hand next to a launched job.
  CommError refused() const {
    if (options_.token.empty()) {
      return CommError(detail::cat("[store] the rendezvous store at ", where(), " refused this process: it carries "
                                   "no job token (STRATA_JOB_TOKEN) and the store belongs to a job whose launcher "
                                   "handed its workers one. Start every worker with strata launch, or give each "
                                   "the job's STRATA_JOB_TOKEN"));
    }
    return CommError(detail::cat("[store] the rendezvous store at ", where(), " belongs to another job (its job "
                                 "token is not this process's STRATA_JOB_TOKEN): the port is in use by another "
                                 "strata job; give this job another port (--master-port or MASTER_PORT), or leave "
                                 "both unset for a free port on one host; a job on several nodes needs the same "
                                 "STRATA_JOB_TOKEN on every node"));
  }

  // Note [A store that is gone]
  // Connection refused means nothing listens on the port. Before the first
  // connection that is a slow start (rank 0 has not bound the port yet),
  // and the client retries until the timeout. After it, the store's host
  // has exited or stopped the store (Note [Closing handshake]): no retry
  // can help, so the client fails at once, naming the address and the
  // host, instead of reconnecting until the rendezvous timeout.
  HostGone host_gone(const std::string& what) const {
    return HostGone(detail::cat("[store] ", what, " on ", where(), " failed: the store's host (rank 0) has exited: ",
                                 where(), " refuses connections since this process was connected to it; look in rank "
                                 "0's output (or the launcher's report) for why it ended"));
  }

  // Connects and says hello, retrying while nothing listens yet (but not
  // once this store had been connected: Note [A store that is gone]).
  void connect(std::chrono::milliseconds timeout, const std::string& what = "") {
    const auto deadline = Clock::now() + timeout;
    while (!try_connect(deadline, timeout, what)) {
      if (Clock::now() + std::chrono::milliseconds(100) >= deadline) {
        throw TimeoutError(detail::cat("[store] the rendezvous store at ", where(), " still served rank 0's "
                                       "previous round after ", timeout.count(), " ms: rank 0 did not host the "
                                       "next one; look in rank 0's output for where it stopped"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // One connection and hello; false when the store on the port serves a
  // round this process has finished (Note [The next round]).
  bool try_connect(Clock::time_point deadline, std::chrono::milliseconds timeout, const std::string& what) {
    while (true) {
      try {
        connection_.connect(connect_host_, port_, deadline);
        break;
      } catch (const ConnectionError& e) {
        if (e.kind == Failure::kOther) {
          throw CommError(detail::cat("[store] could not connect to the rendezvous store at ", where(), ": ", e.detail));
        }
        if (e.kind == Failure::kRefused && connected_once_) throw host_gone(what);
        if (Clock::now() + std::chrono::milliseconds(100) >= deadline) {
          throw TimeoutError(detail::cat("[store] could not reach the rendezvous store at ", where(), " within ",
                                         timeout.count(), " ms; check MASTER_ADDR and MASTER_PORT, and that rank 0 has started"));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    const auto handshake_deadline = std::min(deadline, Clock::now() + std::chrono::milliseconds(kHandshakeLimit));
    const auto handshake_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(handshake_deadline - Clock::now()).count();
    std::string payload;
    try {
      connection_.send(Writer()
                           .u8(uint8_t(Op::kHello))
                           .str(kMagic)
                           .str(options_.token)
                           .i64(options_.rank)
                           .i64(options_.world_size)
                           .str(identity())
                           .u8(connected_once_ ? 0 : 1)  // Note [The next round] (store_requests.cpp)
                           .frame(),
                       handshake_deadline);
      payload = connection_.receive(handshake_deadline);
    } catch (const ConnectionError& e) {
      connection_.close();
      if (e.kind == Failure::kTimedOut) {
        throw TimeoutError(foreign_program(
            detail::cat("accepted the connection but did not answer strata's handshake within ", handshake_ms, " ms")));
      }
      if (e.kind == Failure::kJunk) throw CommError(foreign_program("answered with bytes that are not strata's protocol"));
      throw CommError(foreign_program("closed the connection during strata's handshake"));
    }
    try {
      Reader r(payload);
      Reply kind = static_cast<Reply>(r.u8());
      if (kind == Reply::kOk && r.str() == kMagic) {
        connected_once_ = true;
        return true;
      }
      if (kind == Reply::kError) {
        std::string why = r.str();
        connection_.close();
        if (why == kRetryNextRound) return false;
        if (why.rfind("refused:", 0) == 0) throw refused();
        throw CommError(detail::cat("[store] rendezvous at ", where(), " failed: ", why));
      }
    } catch (const ProtocolError&) {
    }
    connection_.close();
    throw CommError(foreign_program("answered with bytes that are not strata's protocol"));
  }

  // Sends one request and reads its answer; kError answers throw RemoteError.
  Answer request(const std::string& what, const Writer& message, std::chrono::milliseconds limit) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!connection_.open()) reconnect(what);
    const auto deadline = Clock::now() + limit;
    std::string payload;
    try {
      connection_.send(message.frame(), deadline);
      payload = connection_.receive(deadline);
    } catch (const ConnectionError& e) {
      connection_.close();  // a late answer must not be read as the next one's
      if (e.kind == Failure::kTimedOut) {
        throw TimeoutError(detail::cat("[store] ", what, " on ", where(), ": the store did not answer within ",
                                       limit.count(), " ms (rank 0 may be stopped or overloaded)"));
      }
      if (!still_listening()) throw host_gone(what);
      throw CommError(detail::cat("[store] ", what, " on ", where(),
                                  " failed: the store closed the connection (rank 0 may have exited): ", e.detail));
    }
    Answer a;
    try {
      Reader r(payload);
      a.kind = static_cast<Reply>(r.u8());
      switch (a.kind) {
        case Reply::kOk: break;
        case Reply::kValue: a.text = r.str(); break;
        case Reply::kInt: a.number = r.i64(); break;
        case Reply::kBool: a.number = r.u8(); break;
        case Reply::kTimeout: a.list = r.strs(); break;
        case Reply::kError: throw RemoteError(r.str());
        default: throw ProtocolError("unknown reply");
      }
    } catch (const ProtocolError& e) {
      connection_.close();
      throw CommError(detail::cat("[store] ", what, " on ", where(), " failed: a malformed answer (", e.what(), ")"));
    }
    return a;
  }

  // After the store closed this connection: does anything still listen on
  // its port? One connect attempt, no hello (the server drops it).
  bool still_listening() {
    Connection probe;
    try {
      probe.connect(connect_host_, port_, Clock::now() + std::chrono::seconds(2));
      return true;
    } catch (const ConnectionError& e) {
      return e.kind != Failure::kRefused;
    }
  }

  void reconnect(const std::string& what) {
    try {
      connect(options_.timeout, what);
    } catch (const HostGone&) {
      throw;  // says it all
    } catch (const Error& e) {
      throw CommError(detail::cat("[store] lost the rendezvous store at ", where(), " and could not reconnect: ",
                                  e.what()));
    }
  }

  TimeoutError key_timeout(const std::string& what, std::chrono::milliseconds timeout,
                           std::vector<std::string> missing, const std::vector<std::string>& keys) const {
    if (missing.empty()) missing = keys;  // set just after the deadline: still report the timeout
    return TimeoutError(detail::cat("[store] ", what, " timed out after ", timeout.count(), " ms on ", where(),
                                    ": no worker set ", join_keys(missing),
                                    "; check that every rank reached the same point (a rank may have failed or "
                                    "be slower than the timeout)"));
  }

  TcpStoreOptions options_;
  int port_ = 0;
  std::string connect_host_;
  std::unique_ptr<Server> server_;  // when this process hosts the store
  Connection connection_;
  bool connected_once_ = false;  // Note [A store that is gone]
  std::mutex mutex_;
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
  auto store = std::make_shared<TcpStore>(options);
  if (options.rendezvous) store->join(options.timeout);
  return store;
}

std::shared_ptr<Store> make_store(const Environment& env, std::chrono::milliseconds timeout) {
  // Note [Workers of torchrun] (torchelastic.cpp): its agent hosts the store.
  if (const ElasticRun elastic = ElasticRun::from_env(); elastic.active() && elastic.agent_store) {
    return make_agent_store(env, elastic, timeout);
  }
  STRATA_CHECK(env.world_size == 1 || env.master_port != 0, ConfigError, "[store] ", env.describe(),
               " has no rendezvous port: MASTER_PORT is not set; set MASTER_PORT (strata launch sets it) to a port "
               "that is free on ", env.master_addr);
  TcpStoreOptions options;
  options.host = env.master_addr;
  options.port = env.master_port;
  options.is_server = env.rank == 0;
  options.world_size = env.world_size;
  options.rank = env.rank;
  options.token = env.job_token;
  options.rendezvous = true;
  options.timeout = timeout;
  return make_tcp_store(options);
}

}  // namespace strata::runtime
