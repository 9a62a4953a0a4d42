// The rendezvous store server's requests (store_server.h): set, get, add,
// check, wait, remove, and the hello and join that make a rendezvous
// (Note [Who may join]); a request that waits is answered when its keys
// appear or its deadline passes. Everything runs on the server's thread.
#include <algorithm>
#include <exception>

#include "store_server.h"
#include "strata/core/error.h"

namespace strata::runtime::store_protocol {

void TcpServer::refuse(Conn& c, const std::string& message, const std::string& why) {
  reply_error(c, message);
  c.why = why.empty() ? "its hello was refused: " + message : why;
}

// Handles one request; false: close the connection at once.
bool TcpServer::handle(int id, Conn& c, const std::string& payload) {
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
    case Op::kAdd:
      add(c, r);
      return true;
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

// kAdd: adds to the integer value of a key (0 when absent).
void TcpServer::add(Conn& c, Reader& r) {
  std::string key = r.str();
  int64_t delta = r.i64();
  int64_t value = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    try {
      value = std::stoll(it->second);
    } catch (const std::exception&) {
      reply_error(c, "the value of '" + key + "' is not an integer");
      return;
    }
  }
  value += delta;
  data_[key] = std::to_string(value);
  reply(c, Writer().u8(uint8_t(Reply::kInt)).i64(value));
  wake_waiters();
}

// Note [Who may join]
// A client proves it belongs to the job with the token the launcher
// handed every worker; without it, it is refused and its connection
// closed (it never sees a key). A rank may be held by one process only:
// a second process claiming it is refused, and so are ranks that
// disagree with rank 0 (the host) about the world size. Both are
// recorded, so every rank waiting at kJoin fails at once with the same
// message instead of waiting for the rendezvous timeout.
//
// Note [The next round]
// A program may set up one job after another on the same port (two
// Fabrics, one after the other, in every rank): each ends with rank 0
// closing its store (Note [Closing handshake] in store.cpp) and begins
// with rank 0 hosting a new one. A rank that finished a round first makes
// its next store while rank 0 still hosts the last one, and would join
// that one, which then waits for it to leave while it waits in there for
// rank 0: both sides until the timeout. So a hello says whether it is a
// store's first connection or a reconnection (after a lost connection),
// and a first connection from a process that held its rank here and has
// since closed every connection of it belongs to the next round: it is told to retry (kRetryNextRound), and
// the client retries as while nothing listens, until rank 0's next store
// answers.
void TcpServer::hello(Conn& c, Reader& r) {
  std::string magic = r.str();
  std::string token = r.str();
  int64_t rank = r.i64();
  int64_t world_size = r.i64();
  std::string identity = r.str();
  const bool first_connection = r.done() || r.u8() != 0;  // the port check sends no flag
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
    bool connected = false;  // a connection of this rank is still open (not a next round)
    {
      std::lock_guard<std::mutex> lock(ranks_mu_);
      connected = connected_ranks_.count(rank) > 0;
    }
    if (held != ranks_.end() && held->second == identity && first_connection && !connected) {
      reply_error(c, kRetryNextRound);  // not logged: the program's own next round, retrying
      return;
    }
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

void TcpServer::record_failure(const std::string& why) {
  if (failure_.empty()) failure_ = why;
  wake_waiters();
}

std::vector<std::string> TcpServer::missing_keys(const Waiter& w) const {
  std::vector<std::string> missing;
  for (const std::string& key : w.keys)
    if (data_.count(key) == 0) missing.push_back(key);
  return missing;
}

std::vector<std::string> TcpServer::missing_ranks() const {
  std::vector<std::string> missing;
  for (int rank = 0; rank < options_.world_size; ++rank)
    if (ranks_.count(rank) == 0) missing.push_back(std::to_string(rank));
  return missing;
}

// Answers `w` when it can; false: it still waits.
bool TcpServer::try_answer(Conn& c, const Waiter& w) {
  if (!aborted_.empty()) {  // Note [A job that failed] (store_server.cpp)
    reply_error(c, aborted_);
    return true;
  }
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

void TcpServer::wake_waiters() {
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

void TcpServer::expire(Clock::time_point now) {
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

}  // namespace strata::runtime::store_protocol
