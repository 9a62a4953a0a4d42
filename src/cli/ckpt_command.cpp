// `strata ckpt`: look into and convert checkpoints without a training job.
//   strata ckpt inspect PATH [--json]             layout, entries, every tensor
//   strata ckpt consolidate SHARDED OUT           one full state.safetensors
//   strata ckpt reshard SHARDED OUT --world-size N  shard files for N ranks
//   strata ckpt verify PATH                       every check, every checksum
//   strata ckpt export PATH OUT                   model.safetensors + config.json
//   strata ckpt export PATH OUT.ckpt --format lightning   one Lightning checkpoint file
// The work is done by strata::checkpoint (StateReader,
// consolidate_checkpoint, reshard_checkpoint), streaming one tensor at a
// time; this file parses flags, converts and verifies; inspect is in
// ckpt_inspect.cpp, export in ckpt_export.cpp.
#include "cli/commands.h"

#include <unistd.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>

#include "cli/ckpt.h"
#include "strata/checkpoint/convert.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/runtime/progress_line.h"
#include "strata/trainer/trainer_state.h"

namespace strata::cli {
namespace ckpt_cmd {

using checkpoint::StateReader;

// Note [Conversion progress]
// consolidate, reshard and export stream one tensor at a time and may take
// minutes on a large checkpoint: a progress line (tensors and bytes done of
// the total, rate, ETA; runtime::ProgressLine) is redrawn in place when
// stdout is a terminal, and otherwise printed every kProgressSeconds, none
// for a conversion quicker than that. Each file written is reported on a
// line of its own.

runtime::ProgressLine progress_line(const char* label) {
  return runtime::ProgressLine(std::cout, label, "tensors", runtime::ProgressLine::is_terminal(STDOUT_FILENO),
                               std::chrono::seconds(kProgressSeconds));
}

checkpoint::OnConvertProgress on_progress(runtime::ProgressLine& line) {
  return [&line](const checkpoint::ConvertProgress& p) {
    line.update({p.tensors_done, p.tensors_total, p.bytes_done, p.bytes_total});
  };
}

namespace {

// Prints one line per file written, above the progress line.
checkpoint::OnFileWritten progress(const std::string& out, runtime::ProgressLine& line) {
  return [out, &line](const checkpoint::WrittenFile& file) {
    line.clear();
    std::cout << "wrote " << out << "/" << file.name << " (" << file.tensors << " tensors, "
              << human_bytes(file.bytes) << ")" << std::endl;
  };
}

}  // namespace

std::string describe(const StateReader& reader) {
  return std::string(reader.sharded() ? "sharded" : reader.single_file() ? "one file" : "full") + ", world size " +
         std::to_string(reader.world_size());
}

int run_consolidate(const CkptConfig& c) {
  const StateReader source = StateReader::open(c.path);
  runtime::ProgressLine line = progress_line("consolidating");
  checkpoint::consolidate_checkpoint(source, c.out, progress(c.out, line), on_progress(line));
  line.finish();
  std::cout << "consolidated " << source.path() << " (" << describe(source) << ") into " << c.out
            << " (full)" << std::endl;
  return 0;
}

int run_reshard(const CkptConfig& c) {
  STRATA_CHECK(c.world_size >= 1, ConfigError, "[ckpt] --world-size must be at least 1, got ",
               c.world_size);
  const StateReader source = StateReader::open(c.path);
  runtime::ProgressLine line = progress_line("resharding");
  checkpoint::reshard_checkpoint(source, c.out, c.world_size, progress(c.out, line), on_progress(line));
  line.finish();
  std::cout << "resharded " << source.path() << " (" << describe(source) << ") into " << c.out
            << " (sharded, world size " << c.world_size << ")" << std::endl;
  return 0;
}

int run_verify(const CkptConfig& c) {
  const StateReader reader = StateReader::open(c.path);
  // Note [The Trainer state in inspect and verify] in ckpt_inspect.cpp.
  trainer::validate_trainer_entry(reader.entries(), reader.path());
  const size_t checked = reader.verify_checksums();
  size_t tensors = 0;
  for (const auto& file : reader.files()) tensors += file.keys().size();
  if (checked == 0 && tensors > 0) {
    std::cout << "verified " << reader.path() << " (" << describe(reader) << "): structure and metadata "
              << "checked; it has no checksums (written before strata stored them), so the tensor "
              << "data cannot be verified" << std::endl;
    return 0;
  }
  std::cout << "verified " << reader.path() << " (" << describe(reader) << "): " << reader.files().size()
            << " files, " << checked << " tensors, every checksum matches" << std::endl;
  return 0;
}

}  // namespace ckpt_cmd

namespace {

using ckpt_cmd::CkptConfig;

void add_inspect(CLI::App* ckpt, CkptConfig& c) {
  c.inspect = ckpt->add_subcommand(
      "inspect",
      "Print a summary (kind, strategy, step, epoch, world size, tensors, parameters\n"
      "and bytes by entry and top-level module), then the layout, format\n"
      "version, state entries (values such as the step printed) and every tensor:\n"
      "name, full shape, dtype, sharded or whole, bytes; then totals.\n"
      "Example: strata ckpt inspect ckpt/step-00000300 --json");
  c.inspect->add_option("path", c.path, "Checkpoint directory")->required();
  c.inspect->add_flag("--json", c.json, "Print one JSON object instead of text");
}

void add_verify(CLI::App* ckpt, CkptConfig& c) {
  c.verify = ckpt->add_subcommand(
      "verify",
      "Check a whole checkpoint: the metadata, every file and record, a Trainer\n"
      "checkpoint's state (every field's type and range), and every tensor's\n"
      "bytes against the checksum saved with it. Exit status 1 with an error\n"
      "naming the file and the tensor (or the field) when anything differs.\n"
      "Example: strata ckpt verify ckpt/step-00000300");
  c.verify->add_option("path", c.path, "Checkpoint directory")->required();
}

// consolidate and reshard: a checkpoint written for another world size.
void add_conversions(CLI::App* ckpt, CkptConfig& c) {
  c.consolidate = ckpt->add_subcommand(
      "consolidate",
      "Write SHARDED (a sharded checkpoint, any world size) as a full checkpoint at\n"
      "OUT: one state.safetensors with every tensor whole, same entries and\n"
      "strategy, loadable by every strategy. One tensor in memory at a time; OUT\n"
      "appears only when complete and must not exist (or be an empty directory).\n"
      "Example: strata ckpt consolidate ckpt/step-00000300 model-full");
  c.consolidate->add_option("sharded", c.path, "Checkpoint to read (sharded or full)")->required();
  c.consolidate->add_option("out", c.out, "New checkpoint directory to write")->required();

  c.reshard = ckpt->add_subcommand(
      "reshard",
      "Write SHARDED (sharded at any world size, or full) as a sharded checkpoint\n"
      "for N ranks at OUT: one shard-RRRRR-of-NNNNN.safetensors per rank. One\n"
      "slice in memory at a time; OUT appears only when complete and must not\n"
      "exist (or be an empty directory).\n"
      "Example: strata ckpt reshard ckpt/step-00000300 ckpt-4 --world-size 4");
  c.reshard->add_option("sharded", c.path, "Checkpoint to read (sharded or full)")->required();
  c.reshard->add_option("out", c.out, "New checkpoint directory to write")->required();
  c.reshard->add_option("--world-size", c.world_size, "Ranks to shard for (at least 1)")->required();
}

void add_export(CLI::App* ckpt, CkptConfig& c) {
  c.export_ = ckpt->add_subcommand(
      "export",
      "Write a checkpoint's model (any layout, any world size) as a plain pair that\n"
      "PyTorch and other tools read without strata: OUT/model.safetensors (every\n"
      "tensor whole, under the model's own names, a tied head under both names)\n"
      "and OUT/config.json (every GPT hyperparameter). docs/checkpoints.md shows\n"
      "how to load it into a PyTorch GPT.\n"
      "With --format lightning, OUT is one file in Lightning's checkpoint layout that\n"
      "torch.load(OUT, weights_only=True) reads and LightningModule.load_from_checkpoint\n"
      "loads: state_dict (the module's tensors), epoch, global_step, optimizer_states,\n"
      "lr_schedulers, callbacks, hyper_parameters, pytorch-lightning_version.\n"
      "Examples: strata ckpt export ckpt/step-00000300 exported\n"
      "          strata ckpt export ckpt/step-00000300 step300.ckpt --format lightning");
  c.export_->add_option("path", c.path, "Checkpoint to read")->required();
  c.export_->add_option("out", c.out,
                        "Folder to write model.safetensors and config.json into (--format lightning: the file)")
      ->required();
  c.export_->add_option("--format", c.format, "safetensors (default: a folder) or lightning (one .ckpt file)")
      ->check(CLI::IsMember({"safetensors", "lightning"}));
  c.export_->add_option("--entry", c.entry, "Module entry to export (default: 'model', or the only module)");
  c.export_->add_option("--model-size", c.model_size,
                        "GPT preset, for checkpoints saved without their model configuration");
}

}  // namespace

Command make_ckpt_command() {
  auto config = std::make_shared<CkptConfig>();
  Command command;
  command.register_fn = [config](CLI::App& app) {
    CkptConfig& c = *config;
    CLI::App* ckpt = app.add_subcommand(
        "ckpt",
        "Inspect and convert checkpoints (full or sharded) without a training job.\n"
        "Examples:\n"
        "  strata ckpt inspect ckpt/step-00000300\n"
        "  strata ckpt consolidate ckpt/step-00000300 model-full\n"
        "  strata ckpt reshard ckpt/step-00000300 ckpt-4 --world-size 4");
    ckpt->require_subcommand(1);

    add_inspect(ckpt, c);
    add_conversions(ckpt, c);
    add_verify(ckpt, c);
    add_export(ckpt, c);
    return ckpt;
  };
  command.run = [config] {
    const CkptConfig& c = *config;
    if (c.inspect->parsed()) return ckpt_cmd::run_inspect(c);
    if (c.consolidate->parsed()) return ckpt_cmd::run_consolidate(c);
    if (c.verify->parsed()) return ckpt_cmd::run_verify(c);
    if (c.export_->parsed()) return ckpt_cmd::run_export(c);
    return ckpt_cmd::run_reshard(c);
  };
  return command;
}

}  // namespace strata::cli
