// Note [Workers of torchrun]
// torchrun's agent (TorchElastic) starts the workers itself, sets the
// torchrun names (RANK, WORLD_SIZE, MASTER_ADDR, ...) that strata reads
// everywhere, and, with TORCHELASTIC_USE_AGENT_STORE=True (static
// rendezvous, and c10d rendezvous unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1),
// already serves a c10d TCPStore on MASTER_PORT, where no worker may host a
// second one. Such workers are all clients of the agent's store, as
// PyTorch's own workers are: LibTorch's c10d::TCPStore client, so the
// protocol is the one torchrun speaks. Two things strata's own store does
// are lost there and one is kept:
// - the job token: the agent's store admits any client (it is the agent's,
//   bound where torchrun binds it); strata's keys live under a prefix of
//   their own, "strata/<run id>/attempt-<restart count>", so an attempt after
//   an elastic restart starts from no keys;
// - the bounds on what the server sends: LibTorch's client trusts its
//   server, which here is torchrun's agent of the same job;
// - the rank checks are kept: each rank claims its number with an atomic
//   add (a second claim fails, naming the rank), and join_ranks names the
//   ranks that never came.
// Without the agent store (TORCHELASTIC_USE_AGENT_STORE=False), rank 0
// hosts strata's own store on MASTER_PORT, as under strata's launcher.
//
// A failing worker writes TORCHELASTIC_ERROR_FILE in the layout of
// torch.distributed.elastic's ErrorHandler, so torchrun's failure summary
// shows the rank, the error and its time instead of "error_file: <N/A>".
#include "strata/runtime/torchelastic.h"

#include <cxxabi.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <mutex>
#include <typeinfo>

#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/runtime/env.h"
#include "strata/runtime/store.h"

extern char** environ;

namespace strata::runtime {
namespace {

using Vars = std::map<std::string, std::string>;

constexpr size_t kMaxRunIdBytes = 256;
constexpr int kMaxRestarts = 1000000;

int parse_count(const Vars& vars, const char* name) {
  auto it = vars.find(name);
  if (it == vars.end()) return 0;
  const std::string& text = it->second;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  STRATA_CHECK(!text.empty() && end == text.c_str() + text.size() && errno == 0 && value >= 0 && value <= kMaxRestarts,
               ConfigError, "[torchrun] ", name, "='", text, "' is not a count from 0 to ", kMaxRestarts,
               " (torchrun sets it; unset it when not running under torchrun)");
  return static_cast<int>(value);
}

std::string bytes_to_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> string_to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// The first line of a c10d error (its message carries a C++ stack after it).
std::string first_line(const char* what) {
  std::string text(what != nullptr ? what : "");
  const size_t nl = text.find('\n');
  return nl == std::string::npos ? text : text.substr(0, nl);
}

// strata's Store over a client of the agent's c10d TCPStore.
class AgentStore final : public Store {
 public:
  AgentStore(c10::intrusive_ptr<c10d::TCPStore> store, std::string prefix, std::string where,
             std::chrono::milliseconds timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), where_(std::move(where)), timeout_(timeout) {}

  void set(const std::string& key, const std::string& value) override {
    guarded("set", key, [&] { store_->set(prefix_ + key, string_to_bytes(value)); });
  }
  std::string get(const std::string& key) override {
    wait({key}, timeout_);
    std::string out;
    guarded("get", key, [&] { out = bytes_to_string(store_->get(prefix_ + key)); });
    return out;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t out = 0;
    guarded("add", key, [&] { out = store_->add(prefix_ + key, delta); });
    return out;
  }
  bool check(const std::vector<std::string>& keys) override {
    bool out = false;
    guarded("check", keys.empty() ? "" : keys.front(), [&] { out = store_->check(prefixed(keys)); });
    return out;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      store_->wait(prefixed(keys), timeout);
    } catch (const c10::DistStoreError& e) {
      std::string missing;
      for (const std::string& k : keys) {
        if (!store_->check({prefix_ + k})) missing += (missing.empty() ? "" : ", ") + k;
      }
      throw TimeoutError(detail::cat("[torchrun] waited ", timeout.count(), " ms on torchrun's store at ", where_,
                                     " for key(s) ", missing.empty() ? "(set meanwhile)" : missing,
                                     ": ", first_line(e.what())));
    } catch (const c10::Error& e) {
      throw CommError(detail::cat("[torchrun] torchrun's store at ", where_, " failed: ", first_line(e.what())));
    }
  }
  bool remove(const std::string& key) override {
    bool out = false;
    guarded("remove", key, [&] { out = store_->deleteKey(prefix_ + key); });
    return out;
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const std::string& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  template <class F>
  void guarded(const char* op, const std::string& key, F&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      throw CommError(detail::cat("[torchrun] ", op, " '", key, "' on torchrun's store at ", where_,
                                  " failed: ", first_line(e.what()),
                                  " (the agent that hosts it may have exited)"));
    }
  }

  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::string prefix_;
  std::string where_;
  std::chrono::milliseconds timeout_;
};

std::string demangled(const char* name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string text = status == 0 && out != nullptr ? out : name;
  std::free(out);
  return text;
}

std::terminate_handler g_previous_terminate = nullptr;

[[noreturn]] void terminate_recording() {
  if (std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      record_error_file(e);
    } catch (...) {
      record_error_file("unknown exception", "a non-standard exception escaped main()");
    }
  }
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

}  // namespace

ElasticRun ElasticRun::from_map(const Vars& vars) {
  ElasticRun run;
  auto id = vars.find("TORCHELASTIC_RUN_ID");
  if (id == vars.end()) return run;
  STRATA_CHECK(!id->second.empty() && id->second.size() <= kMaxRunIdBytes, ConfigError,
               "[torchrun] TORCHELASTIC_RUN_ID must hold 1 to ", kMaxRunIdBytes, " bytes, got ", id->second.size(),
               "; pass a shorter --rdzv-id to torchrun");
  run.run_id = id->second;
  run.restart_count = parse_count(vars, "TORCHELASTIC_RESTART_COUNT");
  run.max_restarts = parse_count(vars, "TORCHELASTIC_MAX_RESTARTS");
  if (auto it = vars.find("TORCHELASTIC_USE_AGENT_STORE"); it != vars.end()) {
    STRATA_CHECK(it->second == "True" || it->second == "False", ConfigError,
                 "[torchrun] TORCHELASTIC_USE_AGENT_STORE='", it->second,
                 "' is neither True nor False (torchrun sets it)");
    run.agent_store = it->second == "True";
  }
  if (auto it = vars.find("TORCHELASTIC_ERROR_FILE"); it != vars.end()) run.error_file = it->second;
  return run;
}

ElasticRun ElasticRun::from_env() {
  Vars vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    if (text.rfind("TORCHELASTIC_", 0) != 0) continue;
    const size_t eq = text.find('=');
    if (eq != std::string::npos) vars.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return from_map(vars);
}

std::shared_ptr<Store> make_agent_store(const Environment& env, const ElasticRun& elastic,
                                        std::chrono::milliseconds timeout) {
  STRATA_CHECK(env.master_port > 0, ConfigError, "[torchrun] TORCHELASTIC_USE_AGENT_STORE=True but MASTER_PORT is "
               "not set; torchrun sets both (is this worker started by torchrun?)");
  const std::string where = detail::cat(env.master_addr, ":", env.master_port);
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::TCPStore> client;
  try {
    client = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const c10::Error& e) {
    throw CommError(detail::cat("[torchrun] cannot reach torchrun's store at ", where, " within ", timeout.count(),
                                " ms: ", first_line(e.what()), " (rank ", env.rank,
                                "; is the agent on MASTER_ADDR still running?)"));
  }
  const std::string prefix = detail::cat("strata/", elastic.run_id, "/attempt-", elastic.restart_count, "/");
  auto store = std::make_shared<AgentStore>(std::move(client), prefix, where, timeout);
  const int64_t claims = store->add(detail::cat("claim/", env.rank), 1);
  STRATA_CHECK(claims == 1, CommError, "[torchrun] two workers claim rank ", env.rank, " of ", env.world_size,
               " in run '", elastic.run_id, "' (attempt ", elastic.restart_count,
               "): each worker of a job needs its own RANK");
  join_ranks(*store, "torchrun", env.rank, env.world_size, timeout);
  record_uncaught_errors();
  return store;
}

void record_error_file(const std::string& type, const std::string& what) noexcept {
  try {
    const char* file = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (file == nullptr || *file == '\0') return;
    nlohmann::json data = {
        {"message",
         {{"message", type + ": " + what},
          {"extraInfo",
           {{"py_callstack", "(a C++ program: no Python stack) " + type + ": " + what},
            {"timestamp", std::to_string(static_cast<long long>(std::time(nullptr)))}}}}}};
    const std::string path(file);
    const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << data.dump();
      if (!out.good()) return;
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
  } catch (...) {
    // Nothing to do: the process is failing already.
  }
}

void record_error_file(const std::exception& error) noexcept {
  try {
    record_error_file(demangled(typeid(error).name()), error.what());
  } catch (...) {
  }
}

void record_uncaught_errors() {
  static std::once_flag once;
  const char* file = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (file == nullptr || *file == '\0') return;
  std::call_once(once, [] { g_previous_terminate = std::set_terminate(terminate_recording); });
}

}  // namespace strata::runtime
