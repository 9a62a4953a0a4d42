// Running a shell command from a test: its exit status and its output
// (stdout and stderr together).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace strata::testing {

struct CommandResult {
  int exit_code;  ///< 128 + the signal when a signal ended it; -1 when it could not start
  std::string output;
};

inline CommandResult run_command(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string output;
  std::array<char, 4096> buffer;
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

/// The environment variable `name`, or `fallback` when it is unset or empty.
inline std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

}  // namespace strata::testing
