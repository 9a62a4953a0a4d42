// `strata launch`: placeholder until the launcher lands.
#include "cli/commands.h"

namespace strata::cli {

Command make_launch_command() {
  Command command;
  command.register_fn = [](CLI::App& app) { return app.add_subcommand("launch", "Start PROGRAM as N supervised workers"); };
  command.run = [] { return 0; };
  return command;
}

}  // namespace strata::cli
