// Note [Stopping on a signal]: a scope records SIGINT, SIGTERM and SIGUSR1
// instead of ending the process; a second SIGINT/SIGTERM a second or more
// later ends it as the default action does; the previous handlers return
// when the last scope ends.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "strata/runtime/stop_signal.h"

namespace {

using namespace std::chrono_literals;
using strata::runtime::clear_stop_signal;
using strata::runtime::pending_stop_signal;
using strata::runtime::StopSignalScope;

// Runs `body` in a forked child and returns its wait status.
template <class F>
int in_child(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(StopSignalTest, ASignalIsRecordedAndTheProcessGoesOn) {
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) {
    const int status = in_child([sig] {
      StopSignalScope scope;
      clear_stop_signal();
      ::raise(sig);
      ::_exit(pending_stop_signal() == sig ? 7 : 8);
    });
    ASSERT_TRUE(WIFEXITED(status)) << strata::runtime::stop_signal_name(sig);
    EXPECT_EQ(WEXITSTATUS(status), 7) << strata::runtime::stop_signal_name(sig);
  }
}

TEST(StopSignalTest, SigtermAfterSigusr1NamesTheStopAndSigusr1NeverKills) {
  const int status = in_child([] {
    StopSignalScope scope;
    clear_stop_signal();
    ::raise(SIGUSR1);
    ::raise(SIGUSR1);
    if (pending_stop_signal() != SIGUSR1) ::_exit(8);
    ::raise(SIGTERM);
    ::_exit(pending_stop_signal() == SIGTERM ? 7 : 9);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

TEST(StopSignalTest, ASecondSignalWithinASecondIsTheSameRequest) {
  // A launcher forwarding the terminal's Ctrl-C to a worker the terminal
  // also reached delivers two at once: one request.
  const int status = in_child([] {
    StopSignalScope scope;
    clear_stop_signal();
    ::raise(SIGINT);
    ::raise(SIGTERM);
    ::_exit(pending_stop_signal() == SIGINT ? 7 : 8);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

TEST(StopSignalTest, ASecondSignalLaterEndsTheProcessAtOnce) {
  const int status = in_child([] {
    StopSignalScope scope;
    clear_stop_signal();
    ::raise(SIGTERM);
    std::this_thread::sleep_for(1100ms);
    ::raise(SIGTERM);
    ::_exit(7);  // not reached: the second SIGTERM ends the process
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

TEST(StopSignalTest, ThePreviousHandlersReturnWhenTheLastScopeEnds) {
  const int status = in_child([] {
    ::signal(SIGUSR1, SIG_IGN);
    {
      StopSignalScope outer;
      {
        StopSignalScope inner;
      }
      clear_stop_signal();
      ::raise(SIGUSR1);  // still recorded: the outer scope is alive
      if (pending_stop_signal() != SIGUSR1) ::_exit(8);
    }
    struct sigaction now {};
    ::sigaction(SIGUSR1, nullptr, &now);
    ::_exit(now.sa_handler == SIG_IGN ? 7 : 9);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

TEST(StopSignalTest, ExitCodesAreTheShells) {
  EXPECT_EQ(strata::runtime::stop_exit_code(SIGINT), 130);
  EXPECT_EQ(strata::runtime::stop_exit_code(SIGTERM), 143);
  EXPECT_EQ(strata::runtime::stop_signal_name(SIGUSR1), "SIGUSR1");
}

}  // namespace
