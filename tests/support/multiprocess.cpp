// run_workers: starts this test binary as N workers through strata's
// launcher and collects what they printed.
#include "support/multiprocess.h"

#include <unistd.h>

#include "strata/runtime/launcher.h"

namespace strata::testing {

WorkersResult run_workers(int nproc, const std::string& name, const std::vector<std::string>& args,
                          runtime::LaunchOptions options) {
  std::vector<std::string> argv{runtime::current_command_line()[0], "--strata-worker=" + name};
  argv.insert(argv.end(), args.begin(), args.end());
  options.with_nproc_per_node(nproc);
  WorkersResult result;
  // Every line is kept for the test's assertions and echoed to stderr so a
  // failing test shows what its workers said.
  options.with_on_output([&result](int, runtime::OutputStream, const std::string& line) {
    result.output += line;
    size_t done = 0;
    while (done < line.size()) {
      ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
  });
  result.launch = runtime::launch_workers(argv, options);
  return result;
}

}  // namespace strata::testing
