// `strata ckpt`'s parts (ckpt_command.cpp: flags, consolidate, reshard and
// verify; ckpt_inspect.cpp; ckpt_export.cpp): what was asked, as parsed,
// and what they share. Internal to the tool.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "strata/checkpoint/convert.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/runtime/progress_line.h"

namespace strata::cli::ckpt_cmd {

/// What `strata ckpt` was asked to do, as parsed.
struct CkptConfig {
  std::string path;  // inspect: the checkpoint; consolidate/reshard: the source
  std::string out;
  bool json = false;
  int world_size = 0;
  CLI::App* inspect = nullptr;
  CLI::App* consolidate = nullptr;
  CLI::App* reshard = nullptr;
  CLI::App* verify = nullptr;
  CLI::App* export_ = nullptr;
  std::string entry;       // export: the module entry ("" = "model" or the only one)
  std::string model_size;  // export: preset for checkpoints saved without model_config
  std::string format = "safetensors";  // export: safetensors (a folder) or lightning (one file)
};

/// `strata ckpt inspect` (ckpt_inspect.cpp). Returns the exit status.
int run_inspect(const CkptConfig& c);
/// `strata ckpt export` (ckpt_export.cpp). Returns the exit status.
int run_export(const CkptConfig& c);
int run_consolidate(const CkptConfig& c);
int run_reshard(const CkptConfig& c);
int run_verify(const CkptConfig& c);

/// The progress line of a conversion (Note [Conversion progress] in
/// ckpt_command.cpp), printed every kProgressSeconds off a terminal.
inline constexpr int kProgressSeconds = 5;
runtime::ProgressLine progress_line(const char* label);
/// Feeds a conversion's progress to `line`.
checkpoint::OnConvertProgress on_progress(runtime::ProgressLine& line);
/// "sharded, world size 4": the checkpoint's layout, for messages.
std::string describe(const checkpoint::StateReader& reader);

}  // namespace strata::cli::ckpt_cmd
