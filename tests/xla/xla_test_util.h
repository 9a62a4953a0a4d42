// Shared by the xla tests: where the CPU PJRT plugin and the Python with
// jax are, and running a Python script.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace strata::testing {

/// The project's Python (STRATA_PYTHON, set by the test main), or "".
inline std::string test_python() {
  const char* python = std::getenv("STRATA_PYTHON");
  return python != nullptr ? python : "";
}

/// Runs `command` through the shell and returns its standard output and
/// exit status.
inline int run_command(const std::string& command, std::string& output) {
  output.clear();
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/// The CPU PJRT plugin: STRATA_TEST_PJRT_CPU_PLUGIN, else the one the pinned
/// `lammps-jax-pjrt-cpu` wheel installs in the project's venv; "" when
/// neither exists (the tests that need it skip, saying so).
inline const std::string& cpu_plugin_path() {
  static const std::string path = [] {
    const char* env = std::getenv("STRATA_TEST_PJRT_CPU_PLUGIN");
    if (env != nullptr && *env != '\0') return std::string(env);
    const std::string python = test_python();
    if (python.empty()) return std::string();
    std::string out;
    if (run_command(python + " -c 'import lammps_jax_pjrt_cpu as p; print(p.PLUGIN_PATH)' 2>/dev/null",
                    out) != 0)
      return std::string();
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return std::filesystem::exists(out) ? out : std::string();
  }();
  return path;
}

/// Why the plugin tests skip when there is no plugin.
inline const char* kNoCpuPlugin =
    "no CPU PJRT plugin: pip install the lammps-jax-pjrt-cpu pinned in scripts/requirements.txt "
    "(scripts/install-deps.sh does), or set STRATA_TEST_PJRT_CPU_PLUGIN";

/// A file of this test source tree (tests/xla/NAME).
inline std::string xla_test_file(const std::string& name) {
  const char* source_dir = std::getenv("STRATA_SOURCE_DIR");
  return source_dir != nullptr ? std::string(source_dir) + "/tests/xla/" + name
                               : (std::filesystem::path(__FILE__).parent_path() / name).string();
}

}  // namespace strata::testing
