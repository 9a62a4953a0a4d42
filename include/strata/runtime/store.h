// The rendezvous key-value store: a TCP store hosted by global rank 0 that
// every worker connects to (strata's own small server; see store.cpp's
// Note [Why not c10d's TCPStore]). Collectives
// backends use it to exchange addresses; the launcher and strategies use
// it for small control messages.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata::runtime {

struct Environment;

/// A key-value store shared by every rank of a job. Thread-safe.
class Store {
 public:
  virtual ~Store() = default;

  /// Sets `key` to `value` (overwrites).
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// Returns the value of `key`, waiting up to the store's timeout for it
  /// to be set. Throws TimeoutError naming the key when it never is.
  virtual std::string get(const std::string& key) = 0;
  /// Atomically adds `delta` to the integer at `key` (0 if unset) and
  /// returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// True when every key in `keys` is set; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  /// Blocks until every key in `keys` is set, or throws TimeoutError after
  /// `timeout` naming the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  /// Removes `key`; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;
  /// The default timeout of get().
  virtual std::chrono::milliseconds timeout() const = 0;
};

/// Options of the TCP store.
struct TcpStoreOptions {
  std::string host = "127.0.0.1";  ///< address of the hosting rank; the server binds to it only
  int port = 0;                    ///< port; the server with 0 picks a free one
  bool is_server = false;          ///< this process hosts the store
  int world_size = 1;              ///< number of ranks in the job
  /// This process's rank, checked at the handshake (two processes cannot
  /// hold one rank; every rank must agree with the host about world_size);
  /// -1: a client that is no rank (no checks).
  int rank = -1;
  /// The job's token: the server refuses a client that does not carry the
  /// one it was given; "" on the server accepts any client.
  std::string token;
  /// After connecting, wait until all world_size ranks joined (Note
  /// [Rendezvous]); throws CommError naming a conflict, TimeoutError naming
  /// the ranks that never came.
  bool rendezvous = false;
  /// Connect timeout and default get() timeout.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
};

/// Hosts or connects to a TCP store. Throws CommError when the port is
/// already in use or the host is not an address of this machine (server),
/// when the program on the port is not a strata store or refuses this
/// client (its token, its rank), and TimeoutError when the master cannot be
/// reached, or does not answer, within the timeout (client); every message
/// names host:port. Destroying the hosting store waits, up to the timeout,
/// until every client with a rank has closed its connection (not while an
/// exception unwinds); a client whose host has exited throws CommError
/// saying so at its next request, without waiting for the timeout.
std::shared_ptr<Store> make_tcp_store(const TcpStoreOptions& options);

/// The rendezvous store for `env`: global rank 0 hosts it on
/// env.master_addr:env.master_port, the other ranks connect with
/// env.job_token, and every rank waits for all of them (Note [Rendezvous]).
/// Throws ConfigError when env.master_port is 0 on a multi-process job.
std::shared_ptr<Store> make_store(const Environment& env, std::chrono::milliseconds timeout);

/// Makes every store this process hosts answer each request that waits
/// (the rendezvous, get, wait), now and from now on, with the error `why`:
/// the job failed, and no rank should wait out the store's timeout for a
/// rank that is gone (Note [A job that failed] in store_server.cpp). The
/// subprocess launcher calls it when a worker it started fails.
void abort_hosted_stores(const std::string& why);

/// A view of `store` whose keys are prefixed with `prefix` + "/".
std::shared_ptr<Store> prefix_store(std::shared_ptr<Store> store, const std::string& prefix);

/// A collectives backend's rendezvous: sets "joined/<rank>" and waits until
/// all `size` ranks have, so that a rank that never starts is named rather
/// than surfacing as a transport's connect error. Throws TimeoutError
/// "[<who>] rendezvous timed out after T ms on rank R of N: rank(s) X never
/// joined (...)".
void join_ranks(Store& store, const std::string& who, int rank, int size, std::chrono::milliseconds timeout);

/// Returns a TCP port on `host` that was free a moment ago (bind to port 0).
int find_free_port(const std::string& host = "127.0.0.1");

}  // namespace strata::runtime
