// resolve_placement and launch: Note [One launch protocol]
// (strategies/placement.h).
#include "strata/strategies/placement.h"

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>
#include <fcntl.h>
#include <unistd.h>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/runtime/env.h"
#include "strata/runtime/launcher.h"
#include "strata/runtime/process.h"
#include "strata/strategies/make_strategy.h"

namespace strata::strategies {
namespace {

constexpr const char* kResultsVar = "STRATA_LAUNCH_RESULTS";
// Rank 0's results come from our own workers, through a private folder;
// still read as untrusted input: bounded, parsed without exceptions.
constexpr std::uintmax_t kMaxResultsBytes = 64u << 20;

bool relaunched() { return std::getenv(kResultsVar) != nullptr; }

// The launching process's side, for workers that go on with the program:
// their results and the next call's index.
struct Launching {
  std::mutex mutex;
  bool spawned = false;
  std::vector<nlohmann::json> results;
  size_t next = 0;
};
Launching& launching() {
  static Launching state;
  return state;
}

// A worker's side: rank 0's results so far.
std::vector<nlohmann::json>& recorded() {
  static std::vector<nlohmann::json> results;
  return results;
}

std::string errno_text() { return ::strata::detail::errno_string(errno); }

void write_new_file(const std::string& path, const std::string& text, const std::string& who) {
  // O_EXCL | O_NOFOLLOW: never write through a name someone else made.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  STRATA_CHECK(fd >= 0, LaunchError, "[", who, "] cannot create the result file ", path, ": ", errno_text());
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  STRATA_CHECK(done == text.size(), LaunchError, "[", who, "] cannot write the result to ", path);
}

// Rank 0 of the workers: the file holds every result so far, replaced
// whole (a new name, then rename) so the launcher never reads half of one.
void record_result(const nlohmann::json& result, const std::string& who) {
  std::vector<nlohmann::json>& results = recorded();
  results.push_back(result);
  const std::string path = std::getenv(kResultsVar);
  const std::string tmp = path + ".tmp-" + std::to_string(results.size());
  write_new_file(tmp, nlohmann::json(results).dump(), who);
  std::filesystem::rename(tmp, path);
}

std::vector<nlohmann::json> read_results(const std::filesystem::path& file, const std::string& who) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return {};
  const std::uintmax_t size = std::filesystem::file_size(file, ec);
  STRATA_CHECK(!ec && size <= kMaxResultsBytes, LaunchError, "[", who, "] rank 0's result file ", file.string(),
               " is ", ec ? "unreadable" : "larger than 64 MiB");
  std::ifstream in(file);
  nlohmann::json value = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  STRATA_CHECK(!value.is_discarded() && value.is_array(), LaunchError, "[", who, "] rank 0's result file ",
               file.string(), " is not a JSON list of results");
  return value.get<std::vector<nlohmann::json>>();
}

// Note [The result file]
// Rank 0 returns its results through a file in a folder made by mkdtemp
// (mode 0700, an unguessable name), never at a predictable name in the
// shared temp folder where another user could plant a symbolic link.
std::vector<nlohmann::json> spawn(const ResolvedPlacement& placement, const std::string& who) {
  STRATA_CHECK(placement.num_nodes == 1, ConfigError, "[", who, "] num_nodes=", placement.num_nodes,
               ": a multi-node job is started by a launcher on every host, e.g. `strata launch --nnodes ",
               placement.num_nodes, " --node-rank R --master-addr HOST --master-port PORT -n ",
               placement.processes_per_node, " -- PROGRAM`");
  std::string folder = (std::filesystem::temp_directory_path() / "strata-launch-XXXXXX").string();
  STRATA_CHECK(::mkdtemp(folder.data()) != nullptr, LaunchError, "[", who, "] cannot create a private temp folder ",
               folder, ": ", errno_text());
  struct RemoveFolder {
    std::string path;
    ~RemoveFolder() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_folder{folder};
  const std::filesystem::path file = std::filesystem::path(folder) / "results.json";
  runtime::LaunchOptions options;
  options.nproc_per_node = placement.processes_per_node;
  options.extra_env[kResultsVar] = file.string();
  runtime::LaunchResult result = runtime::launch_workers(runtime::current_command_line(), options);
  if (result.exit_code != 0) throw LaunchError("[" + who + "] the workers failed: " + result.summary, result);
  return read_results(file, who);
}

thread_local const detail::ThreadRank* tls_rank = nullptr;
thread_local Strategy* tls_primary = nullptr;   // the job's strategy (rank 0's)
thread_local Strategy* tls_strategy = nullptr;  // this thread's rank's

}  // namespace

// Note [Ranks as threads] (strategies/xla.h): one thread per device of
// this process, each rank with its own strategy (rank 0 the job's own, the
// others its replicas), environment and collectives.
struct ThreadRankJob::State {
  ResolvedPlacement placement;
  std::string who;
  std::vector<std::shared_ptr<Strategy>> strategies;
  std::vector<detail::ThreadRank> ranks;  // each thread's, kept between runs
  ThreadRanks threads;
  std::string failure;  // the failed run's report: the job is over
  bool torn_down = false;
};

ThreadRankJob::ThreadRankJob(const ResolvedPlacement& placement, std::string who)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.placement = placement;
  s.who = std::move(who);
  const int n = placement.devices_per_process;
  s.strategies.push_back(placement.strategy);
  for (int r = 1; r < n; ++r) {
    s.strategies.push_back(placement.strategy->replica());
    s.strategies.back()->set_collective_timeout(placement.collective_timeout);
  }
  s.threads = placement.accelerator->thread_ranks(n, placement.collective_timeout);
  s.threads.pause(true);  // until a run starts the ranks' threads
  s.ranks.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    detail::ThreadRank& rank = s.ranks[static_cast<size_t>(r)];
    rank.env.rank = rank.env.local_rank = r;
    rank.env.world_size = rank.env.local_world_size = n;
    rank.env.source = "threads";
    rank.backend = s.threads.backends[static_cast<size_t>(r)];
  }
  std::string devices;
  for (int r = 0; r < n; ++r) devices += (r ? ", " : "") + placement.accelerator->device(r).str();
  log::info("[", s.who, "] the '", placement.accelerator->name(),
            "' accelerator drives its devices from one process: ", n, " ranks as threads of this one, on ", devices);
  if (placement.seed) seed_everything(*placement.seed);
}

ThreadRankJob::~ThreadRankJob() {
  try {
    teardown();
  } catch (const std::exception& e) {
    log::error("[", state_->who, "] teardown failed: ", e.what());
  }
}

int ThreadRankJob::size() const { return static_cast<int>(state_->strategies.size()); }

const std::shared_ptr<Strategy>& ThreadRankJob::strategy(int rank) const {
  return state_->strategies.at(static_cast<size_t>(rank));
}

nlohmann::json ThreadRankJob::run(const std::function<nlohmann::json(int rank)>& call) {
  State& s = *state_;
  STRATA_CHECK(s.failure.empty(), Error, "[", s.who, "] the job's ranks stopped after a failure (", s.failure,
               "); start a new one");
  STRATA_CHECK(!s.torn_down, Error, "[", s.who, "] the job's ranks were torn down; start a new one");
  const int n = size();
  // Note [Ranks start one at a time]
  // The ranks share the process's CPU generator, which a launched function
  // uses first of all (seed_everything, then the model's initial weights).
  // So rank r+1 starts only once rank r waits for its peers (its first
  // collective or step end) or returns: each rank's start runs alone, as
  // in a process of its own, and every run draws the same numbers.
  std::mutex turn_mutex;
  std::condition_variable turn_cv;
  int turn = 0;  // the rank that may start
  const auto pass = [&](int r) {
    {
      std::lock_guard<std::mutex> lock(turn_mutex);
      if (turn != r) return;
      turn = r + 1;
    }
    turn_cv.notify_all();
  };
  s.threads.set_on_wait(pass);
  s.threads.pause(false);
  std::mutex mutex;
  std::exception_ptr first_failure;
  nlohmann::json result;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      tls_rank = &s.ranks[static_cast<size_t>(r)];
      tls_primary = s.placement.strategy.get();
      tls_strategy = s.strategies[static_cast<size_t>(r)].get();
      Strategy& strategy = *tls_strategy;
      {
        std::unique_lock<std::mutex> lock(turn_mutex);
        turn_cv.wait(lock, [&] { return turn >= r; });
      }
      try {
        // A thread's device is its own (the xla device's replica): set again
        // on each run's new thread.
        if (strategy.launched()) set_current_device(s.placement.accelerator->device(r));
        else strategy.setup_environment();
        nlohmann::json out = call(r);
        pass(r);
        strategy.mark_step();  // the last step's collectives run with their peers
        s.threads.finish(r);   // a rank that still waits for this one fails at once
        if (r == 0) result = std::move(out);
      } catch (const std::exception& e) {
        bool first = false;
        {
          std::lock_guard<std::mutex> lock(mutex);
          first = !first_failure;
          if (first) first_failure = std::current_exception();
        }
        const std::string report = "[" + s.who + "] rank " + std::to_string(r) + " of " + std::to_string(n) +
                                   " failed in step " + std::to_string(s.threads.steps()) + " (counting from 0): " +
                                   e.what();
        // The first failure is the job's; the others are ranks it stopped.
        if (first) {
          log::error(report);
          std::lock_guard<std::mutex> lock(mutex);
          s.failure = report;
        }
        s.threads.abort(report);
        pass(r);
        try {
          strategy.teardown();
        } catch (const std::exception&) {
          // the rank's own error is the one reported
        }
      }
      tls_rank = nullptr;
      tls_primary = tls_strategy = nullptr;
    });
  }
  for (std::thread& t : threads) t.join();
  s.threads.set_on_wait(nullptr);  // `pass` ends with this call
  s.threads.pause(true);           // the caller may use rank 0's device until the next run
  if (first_failure) std::rethrow_exception(first_failure);
  return result;
}

void ThreadRankJob::teardown() {
  State& s = *state_;
  if (s.torn_down) return;
  s.torn_down = true;
  if (!s.failure.empty()) return;  // a failed run tore its ranks down
  std::exception_ptr failure;
  std::mutex mutex;
  std::vector<std::thread> threads;
  s.threads.pause(false);
  for (int r = 0; r < size(); ++r) {
    threads.emplace_back([&, r] {
      tls_rank = &s.ranks[static_cast<size_t>(r)];
      tls_primary = s.placement.strategy.get();
      tls_strategy = s.strategies[static_cast<size_t>(r)].get();
      try {
        set_current_device(s.placement.accelerator->device(r));
        if (tls_strategy->launched()) tls_strategy->teardown();
      } catch (const std::exception&) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
        s.threads.abort("a rank's teardown failed");
      }
      tls_rank = nullptr;
      tls_primary = tls_strategy = nullptr;
    });
  }
  for (std::thread& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

namespace {

nlohmann::json launch_thread_ranks(const ResolvedPlacement& placement, const std::string& who, WorkerExit exit,
                                   const std::function<nlohmann::json()>& call) {
  STRATA_CHECK(exit == WorkerExit::kAfterCall, ConfigError, "[", who, "] accelerator '",
               placement.accelerator->name(), "' runs its ", placement.devices_per_process,
               " ranks as threads of one process: keep the ranks between calls in a ThreadRankJob");
  // Every rank ends its last step and tears its strategy down, so the next
  // launch starts afresh as a worker process's would.
  ThreadRankJob job(placement, who);
  nlohmann::json result = job.run([&](int) { return call(); });
  job.teardown();
  return result;
}

}  // namespace

Strategy& strategy_of_thread(Strategy& primary) {
  return tls_primary == &primary && tls_strategy != nullptr ? *tls_strategy : primary;
}

const detail::ThreadRank* detail::current_thread_rank() { return tls_rank; }

ResolvedPlacement resolve_placement(const Placement& placement, const std::string& who) {
  STRATA_CHECK(placement.devices == -1 || placement.devices >= 1, ConfigError, "[", who,
               "] devices must be >= 1 (or -1: every visible device, one worker on the CPU), got ",
               placement.devices);
  STRATA_CHECK(placement.num_nodes >= 1, ConfigError, "[", who, "] num_nodes must be >= 1, got ",
               placement.num_nodes);
  STRATA_CHECK(placement.collective_timeout.count() > 0, ConfigError, "[", who,
               "] collective_timeout must be positive, got ", placement.collective_timeout.count(), " ms");
  ResolvedPlacement out;
  out.accelerator = make_accelerator(placement.accelerator);
  out.devices = resolve_devices(*out.accelerator, placement.devices);
  out.num_nodes = placement.num_nodes;
  out.devices_per_process = out.accelerator->devices_per_process(out.devices);
  STRATA_CHECK(out.devices_per_process >= 1 && out.devices % out.devices_per_process == 0, Error, "[", who,
               "] the '", out.accelerator->name(), "' accelerator drives ", out.devices_per_process,
               " devices per process, which does not divide devices=", out.devices);
  out.processes_per_node = out.devices / out.devices_per_process;
  const runtime::Environment env = runtime::Environment::from_env();
  out.launched = env.launched();
  if (out.launched) {
    STRATA_CHECK(env.local_world_size == out.processes_per_node || out.devices == 1, ConfigError, "[", who,
                 "] this worker was started as one of ", env.local_world_size, " per host, but devices=",
                 out.devices, "; start as many workers as devices (or leave devices at 1 when a launcher decides)");
  }
  // The one place a job's size is worked out: the launcher's word when one
  // started this process, else the workers launch() will start.
  out.world_size = out.launched ? env.world_size : out.processes_per_node * out.num_nodes;
  if (out.thread_ranks()) {
    // Note [Ranks as threads] (strategies/xla.h)
    STRATA_CHECK(out.num_nodes == 1, ConfigError, "[", who, "] accelerator '", out.accelerator->name(),
                 "' runs the ranks of a host as threads of one process, on one host for now; got num_nodes=",
                 out.num_nodes);
    STRATA_CHECK(!out.launched || env.world_size == 1, ConfigError, "[", who, "] accelerator '",
                 out.accelerator->name(), "' drives every device from one process, but a launcher started ",
                 env.world_size, " workers; start one process (devices=N runs N ranks as its threads)");
    out.world_size = out.devices;
  }
  STRATA_CHECK(out.accelerator->name() != "xla" || out.world_size == 1 || out.thread_ranks(), ConfigError, "[",
               who, "] accelerator 'xla' runs one process per host, with its devices as ranks; got a job of ",
               out.world_size, " worker processes");
  // The precision, when given, is a strategy object's too (Lightning's rule).
  out.strategy = resolve_strategy(placement.strategy, out.accelerator, placement.precision, out.world_size, who);
  if (!out.strategy->launched()) out.strategy->set_collective_timeout(placement.collective_timeout);
  out.seed = placement.seed;
  out.collective_timeout = placement.collective_timeout;
  return out;
}

nlohmann::json launch(const ResolvedPlacement& placement, const std::string& who, WorkerExit exit,
                      const std::function<nlohmann::json()>& call) {
  if (placement.thread_ranks() && tls_rank == nullptr) return launch_thread_ranks(placement, who, exit, call);
  if (placement.needs_spawn() && exit == WorkerExit::kAfterCall) {
    // Workers that end after their call: each launch starts them afresh.
    std::vector<nlohmann::json> results = spawn(placement, who);
    return results.empty() ? nlohmann::json() : results.front();
  }
  if (placement.needs_spawn()) {
    Launching& state = launching();
    std::lock_guard<std::mutex> lock(state.mutex);
    if (!state.spawned) {
      state.spawned = true;  // also when they fail: the job ran, and ended
      state.results = spawn(placement, who);
    }
    const size_t index = state.next++;
    return index < state.results.size() ? state.results[index] : nlohmann::json();
  }
  Strategy& strategy = *placement.strategy;
  if (!strategy.launched()) {
    strategy.setup_environment();
    if (placement.seed) seed_everything(*placement.seed);
  }
  const bool ends_worker = exit == WorkerExit::kAfterCall && relaunched();
  nlohmann::json result;
  try {
    result = call();
  } catch (const std::exception& e) {
    if (!ends_worker) throw;
    // The launcher reports a worker's last "error: " line as its reason.
    log::error(e.what());
    runtime::end_relaunched_worker(1, /*graceful=*/false);
  }
  if (relaunched() && strategy.is_global_zero()) record_result(result, who);
  if (ends_worker) {
    strategy.teardown();
    // Code after Fabric::launch runs in the launching process only.
    runtime::end_relaunched_worker(0, /*graceful=*/true);
  }
  return result;
}

void seed_everything(uint64_t seed) {
  at::manual_seed(seed);
  std::srand(static_cast<unsigned>(seed));
}

}  // namespace strata::strategies
