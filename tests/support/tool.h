// Running the built `strata` binary in tests, as users run it: a child
// process (no shell) with its standard output and error on pipes.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

namespace strata::testing {

/// The tool next to the tests (STRATA_BINARY_DIR/strata).
inline std::string strata_binary() {
  const char* dir = std::getenv("STRATA_BINARY_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/strata";
}

/// A started tool: its pid and the read ends of its stdout and stderr.
struct Child {
  pid_t pid = -1;
  int out = -1;
  int err = -1;
};

/// What a finished tool said and returned.
struct Outcome {
  int status = 0;  ///< exit code, or 128+signal
  std::string out, err;
};

/// Starts the program argv[0] (a path) with arguments argv[1...], stdout
/// and stderr on pipes.
inline Child start_program(std::vector<std::string> argv) {
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  int out[2], err[2];
  EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
  EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  return {pid, out[0], err[0]};
}

/// Starts `strata ARGS...` with stdout and stderr on pipes.
inline Child start_strata(const std::vector<std::string>& args) {
  std::vector<std::string> argv{strata_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return start_program(std::move(argv));
}

/// Reads both pipes to the end and reaps the child.
inline Outcome finish(Child child) {
  Outcome o;
  pollfd fds[2] = {{child.out, POLLIN, 0}, {child.err, POLLIN, 0}};
  int open = 2;
  while (open > 0) {
    if (::poll(fds, 2, -1) < 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        (i == 0 ? o.out : o.err).append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  o.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

/// Runs `strata ARGS...` to the end.
inline Outcome run_strata(const std::vector<std::string>& args) { return finish(start_strata(args)); }

/// The project's Python (STRATA_PYTHON, set by the test main from the
/// build's configuration), or "" when there is none.
inline std::string project_python() {
  const char* python = std::getenv("STRATA_PYTHON");
  return python != nullptr ? python : "";
}

/// Runs the project's Python on `script` (relative to the source tree) with
/// `args` to the end.
inline Outcome run_python(const std::string& script, const std::vector<std::string>& args) {
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  std::vector<std::string> argv{project_python(), std::string(source != nullptr ? source : ".") + "/" + script};
  argv.insert(argv.end(), args.begin(), args.end());
  return finish(start_program(std::move(argv)));
}

}  // namespace strata::testing
