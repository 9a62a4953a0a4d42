// The subcommands of the `strata` tool. Each subcommand file defines one
// factory (make_launch_command, ...) that adds its options to the parser
// and returns the function that runs it; all_commands() lists them.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <vector>

namespace strata::cli {

/// One subcommand: `add` registers it on the app; `run` executes it once
/// parsed and returns the process exit code.
struct Command {
  std::function<CLI::App*(CLI::App&)> register_fn;
  std::function<int()> run;
  CLI::App* sub = nullptr;

  void add(CLI::App& app) { sub = register_fn(app); }
  bool parsed() const { return sub != nullptr && sub->parsed(); }
};

/// `strata launch`: start a program as N supervised workers.
Command make_launch_command();

/// `strata train`: train the example GPT.
Command make_train_command();

/// `strata ckpt`: inspect, consolidate and reshard checkpoints.
Command make_ckpt_command();

/// `strata plot`: draw loss and learning rate from a metrics file.
Command make_plot_command();

/// `strata xla-probe`: reach an XLA device through a PJRT plugin.
Command make_xla_probe_command();

/// Every subcommand of the tool, in help order.
std::vector<Command> all_commands();

}  // namespace strata::cli
