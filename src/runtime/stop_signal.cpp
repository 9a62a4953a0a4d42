// Note [Stopping on a signal]
// A run stopped by Ctrl-C, by `kill`, by a scheduler that pre-empts it
// (SLURM's --signal=USR1@90, Kubernetes' SIGTERM before an eviction,
// torchrun's SIGTERM to its workers when the job ends) should lose nothing.
// The handler only records the signal; the Trainer reads the record after
// each optimizer step, the ranks agree (a rank that got nothing yet still
// stops with the others, since one rank alone cannot leave a collective),
// the callbacks' end-of-training hooks save the step as a periodic
// checkpoint would, the loggers close as "interrupted", and the process
// ends with 128 + the signal, the status a shell shows for it.
//
// A second SIGINT or SIGTERM ends the process at once (the default action,
// re-raised), for a user who does not want to wait for the save; but only
// when it comes a second or more after the first, because a launcher that
// forwards the terminal's Ctrl-C to workers that the terminal also reached
// delivers two within milliseconds, and both mean one request. SIGUSR1 is
// never fatal here (SLURM sends it once, ahead of its SIGTERM).
#include "strata/runtime/stop_signal.h"

#include <signal.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include "strata/core/error.h"

namespace strata::runtime {
namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGUSR1};
constexpr long long kRepeatAfterNs = 1'000'000'000;  // a second signal within this is the same request

// Written by the handler: lock-free atomics only (async-signal-safe).
std::atomic<int> g_pending{0};
std::atomic<long long> g_first_stop_ns{0};  // when the first SIGINT/SIGTERM came (CLOCK_MONOTONIC)

long long now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

extern "C" void strata_on_stop_signal(int sig) {
  const int saved = errno;
  if (sig == SIGUSR1) {
    int none = 0;
    g_pending.compare_exchange_strong(none, SIGUSR1);
    errno = saved;
    return;
  }
  const long long now = now_ns();
  long long first = 0;
  if (g_first_stop_ns.compare_exchange_strong(first, now)) {
    g_pending.store(sig);  // replaces a SIGUSR1: the exit code says what ended the run
  } else if (now - first >= kRepeatAfterNs) {
    // The second request: stop now, as the signal's default action does.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);
  }
  errno = saved;
}

std::mutex g_scope_mutex;
int g_scopes = 0;
struct sigaction g_previous[std::size(kStopSignals)] {};

}  // namespace

StopSignalScope::StopSignalScope() {
  std::lock_guard<std::mutex> lock(g_scope_mutex);
  if (g_scopes++ > 0) return;
  struct sigaction action {};
  action.sa_handler = strata_on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &action, &g_previous[i]);
}

StopSignalScope::~StopSignalScope() {
  std::lock_guard<std::mutex> lock(g_scope_mutex);
  if (--g_scopes > 0) return;
  for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

int pending_stop_signal() { return g_pending.load(); }

void clear_stop_signal() {
  g_pending.store(0);
  g_first_stop_ns.store(0);
}

int stop_exit_code(int signal) { return 128 + signal; }

std::string stop_signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return detail::cat("signal ", signal);
  }
}

}  // namespace strata::runtime
