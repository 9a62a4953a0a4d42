// Replaying the xla device's programs on a second XLA: JAX's CPU backend.
// The steps run with STRATA_XLA_DUMP_DIR and STRATA_XLA_DUMP_VALUES=1
// (Note [Dumping programs] in src/xla/lazy_executor.cpp), so each distinct
// program is kept with the arguments and results of its first run; then
// tests/xla/jax_oracle.py --replay runs each on JAX with those arguments
// and compares the results. That each op computes what LibTorch computes
// is the per-op tests' work; the replay proves that the StableHLO strata
// prints means the same to another XLA, on the values the steps really
// fed it (NaN, infinities and indices included).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "support/environment.h"
#include "xla/xla_test_util.h"

namespace strata::testing {

struct JaxReplay {
  std::string skipped;  ///< why nothing ran, or empty
  std::string jax;      ///< jax's version
  /// Programs dumped that never finished a run, so have no values to replay.
  std::vector<std::string> not_run;
  struct Case {
    std::string program;  ///< the dump's HASH
    bool ok = false;
    std::string detail;  ///< what differed, or the error
  };
  std::vector<Case> cases;
};

/// Runs `steps` with their programs dumped, then replays each on JAX.
inline JaxReplay replay_on_jax(const std::string& label, const std::function<void()>& steps) {
  JaxReplay out;
  const std::string python = test_python();
  if (python.empty()) {
    out.skipped = "STRATA_PYTHON is not set: no Python to run jax with";
    return out;
  }
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("strata-xla-" + label + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    const ScopedEnv dump_dir("STRATA_XLA_DUMP_DIR", dir.string()), dump_values("STRATA_XLA_DUMP_VALUES", "1");
    steps();
  }
  const fs::path result_path = dir.string() + ".result.json";
  std::string output;
  const std::string command = python + " " + xla_test_file("jax_oracle.py") + " --replay " + dir.string() + " " +
                              result_path.string() + " 2>&1";
  const int status = run_command(command, output);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".mlir" && !fs::exists(fs::path(entry.path()).replace_extension(".values")))
      out.not_run.push_back(entry.path().stem().string());
  nlohmann::json result;
  if (status == 0) result = nlohmann::json::parse(std::ifstream(result_path), nullptr, /*allow_exceptions=*/false);
  fs::remove_all(dir);
  fs::remove(result_path);
  if (status != 0 || result.is_discarded()) {
    ADD_FAILURE() << "jax_oracle.py --replay failed (" << status << "): " << output;
    return out;
  }
  if (result.contains("skip")) {
    out.skipped = result["skip"].get<std::string>();
    return out;
  }
  out.jax = result["jax"].get<std::string>();
  for (const auto& c : result["cases"])
    out.cases.push_back({c["name"].get<std::string>(), c["ok"].get<bool>(), c["detail"].get<std::string>()});
  return out;
}

/// Each program dumped ran, and agreed on jax with the xla device's run.
inline void expect_all_agree(const JaxReplay& replay) {
  for (const auto& name : replay.not_run) ADD_FAILURE() << "program " << name << " was compiled but never ran";
  for (const auto& c : replay.cases)
    EXPECT_TRUE(c.ok) << "program " << c.program << " on jax " << replay.jax << ": " << c.detail;
}

}  // namespace strata::testing
