// The `strata` command: `strata launch`, `strata train`, `strata ckpt`,
// `strata plot`.
// Each subcommand lives in its own file and registers itself here; main()
// is the only place that turns an exception into an exit code.
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/commands.h"
#include "strata/core/error.h"
#include "strata/core/interrupted.h"
#include "strata/runtime/process.h"
#include "strata/runtime/torchelastic.h"

int main(int argc, char** argv) {
  try {
    strata::runtime::apply_process_malloc();  // first: it may start the program again
  } catch (const strata::Error& e) {
    std::cerr << "strata: error: " << e.what() << "\n";
    return 1;
  }
  CLI::App app{"strata: data-parallel and fully-sharded training for LibTorch in C++"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  std::vector<strata::cli::Command> commands = strata::cli::all_commands();
  for (strata::cli::Command& command : commands) command.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (strata::cli::Command& command : commands) {
      if (command.parsed()) return command.run();
    }
  } catch (const strata::Interrupted& e) {
    // Note [Stopping on a signal]: the run saved and stopped as asked.
    std::cerr << "strata: " << e.what() << "\n";
    return e.exit_code();
  } catch (const strata::Error& e) {
    strata::runtime::record_error_file(e);  // torchrun's failure summary (Note [Workers of torchrun])
    std::cerr << "strata: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    strata::runtime::record_error_file(e);
    std::cerr << "strata: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
