// The logger: one mutex-guarded line per message on stderr.
#include "strata/core/log.h"

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>

#include "strata/core/strings.h"

namespace strata::log {
namespace {

Level initial_level() {
  const char* value = std::getenv("STRATA_LOG_LEVEL");
  if (value == nullptr || *value == '\0') return Level::kInfo;
  try {
    return parse_level(value);
  } catch (const ConfigError&) {
    return Level::kInfo;
  }
}

std::atomic<int> current_level{static_cast<int>(initial_level())};
std::atomic<int> current_rank{-1};
std::atomic<bool> every_rank{false};
std::mutex output_mutex;

const char* level_tag(Level level) {
  switch (level) {
    case Level::kDebug: return "debug: ";
    case Level::kWarning: return "warning: ";
    case Level::kError: return "error: ";
    case Level::kInfo: break;
  }
  return "";
}

}  // namespace

void set_level(Level level) { current_level = static_cast<int>(level); }
Level level() { return static_cast<Level>(current_level.load()); }
void set_rank(int rank) { current_rank = rank; }
int rank() { return current_rank; }
void set_all_ranks(bool all) { every_rank = all; }

// A worker of strata's launcher has its every line prefixed "[rank R] " by
// the launcher's forwarder, which says so with STRATA_LAUNCHER_PREFIX=1
// (runtime/launcher.h); such a worker leaves the prefix to it, so that a
// line carries one. Under other launchers (torchrun, srun, mpirun) and
// `strata launch --no-prefix` the log writes it.
bool prefixed_by_launcher() {
  static const bool forwarded = [] {
    const char* value = std::getenv("STRATA_LAUNCHER_PREFIX");
    return value != nullptr && std::string(value) == "1";
  }();
  return forwarded;
}

void write(Level level, const std::string& message, bool any_rank) {
  if (static_cast<int>(level) < current_level.load()) return;
  const int r = current_rank.load();
  if (!any_rank && !every_rank.load() && r > 0) return;
  std::string line;
  if (r >= 0 && !prefixed_by_launcher()) line = "[rank " + std::to_string(r) + "] ";
  line += level_tag(level);
  line += message;
  line += '\n';
  std::lock_guard<std::mutex> lock(output_mutex);
  std::cerr << line << std::flush;
}

Level parse_level(const std::string& name) {
  const std::string n = lower(name);
  if (n == "debug") return Level::kDebug;
  if (n == "info") return Level::kInfo;
  if (n == "warning" || n == "warn") return Level::kWarning;
  if (n == "error") return Level::kError;
  throw ConfigError("[log] unknown log level '" + name + "'; choose one of: debug, info, warning, error");
}

}  // namespace strata::log
