#include "cli/commands.h"

namespace strata::cli {

std::vector<Command> all_commands() {
  std::vector<Command> commands;
  commands.push_back(make_launch_command());
  commands.push_back(make_train_command());
  commands.push_back(make_ckpt_command());
  commands.push_back(make_plot_command());
  commands.push_back(make_xla_probe_command());
  return commands;
}

}  // namespace strata::cli
