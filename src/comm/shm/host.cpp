// The shm backend's options from the environment, and the host identity
// that init_process_group uses to find the ranks that can share memory.
//
// Note [Host identity]
// Two ranks can share a POSIX shared-memory segment when they run on the
// same kernel (boot id), see the same /dev/shm (IPC namespace; containers
// usually have their own) and, for the liveness checks, the same process
// ids (PID namespace). The network namespace is part of the identity too:
// processes in different network namespaces are set up as different hosts
// (tests/fabric/two_hosts_test.cpp), and they should talk as such. The
// hostname keeps the identity readable in messages. STRATA_HOST_ID
// replaces all of it, for setups that know better.
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sys/stat.h>

#include "strata/comm/shm/backend.h"
#include "strata/core/error.h"

namespace strata::comm::shm {
namespace {

/// Reads an integer variable within [lo, hi]; `fallback` when unset.
int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi, const char* what) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  STRATA_CHECK(errno == 0 && end != text && *end == '\0' && v >= lo && v <= hi, ConfigError, "[shm] ", name, "='",
               text, "' is not ", what, " between ", lo, " and ", hi, "; unset it to use the default (", fallback, ")");
  return v;
}

std::string namespace_id(const char* ns) {
  struct stat st {};
  const std::string path = std::string("/proc/self/ns/") + ns;
  if (::stat(path.c_str(), &st) != 0) return "?";
  return std::to_string(st.st_ino);
}

}  // namespace

ShmOptions ShmOptions::from_env() {
  ShmOptions o;
  o.slot_bytes = env_int("STRATA_SHM_SLOT_BYTES", o.slot_bytes, 64 << 10, 256 << 20, "a byte count");
  o.spin_us = static_cast<int>(env_int("STRATA_SHM_SPIN_US", o.spin_us, -1, 10000, "a number of microseconds"));
  o.whole_reduce_bytes = env_int("STRATA_SHM_WHOLE_REDUCE_BYTES", o.whole_reduce_bytes, 0, 256 << 20, "a byte count");
  return o;
}

std::string host_identity() {
  if (const char* id = std::getenv("STRATA_HOST_ID"); id != nullptr && *id != '\0') {
    const std::string s = id;
    bool printable = s.size() <= 200;
    for (unsigned char c : s) printable = printable && c > 32 && c < 127;
    STRATA_CHECK(printable, ConfigError, "[comm] STRATA_HOST_ID must be 1 to 200 printable characters without "
                 "spaces, got ", s.size(), " characters; unset it to let strata find the host");
    return "id:" + s;
  }
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot = "?";
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  if (in) std::getline(in, boot);
  return std::string(host) + "/" + boot + "/net:" + namespace_id("net") + "/ipc:" + namespace_id("ipc") +
         "/pid:" + namespace_id("pid");
}

}  // namespace strata::comm::shm
