// One job per checkpoint folder: a second holder is refused with the first
// one's pid and host, and the lock is free again once its holder releases
// it, exits, or is killed with SIGKILL.
#include "strata/checkpoint/folder_lock.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "checkpoint/test_util.h"
#include "strata/core/error.h"

namespace strata::checkpoint {
namespace {

class FolderLockTest : public testing::ScratchDir {};

std::string host() {
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

std::string refusal(const std::string& label, const std::string& dir, long pid) {
  return "[checkpoint] " + label + " '" + dir + "' is in use by another job: pid " + std::to_string(pid) +
         " on host " + host() + " holds its lock (" + dir + "/.strata-lock). Two jobs saving into one " +
         "folder would mix their checkpoints; wait for that job to end or stop it, or give this job another " +
         label;
}

// The message of the CheckpointError `fn` throws, or "" when it throws none.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

// A child process that takes the lock on `dir`, reports it on a pipe and
// then waits until told to exit (a byte on a second pipe, or end of file
// there) or killed.
class Holder {
 public:
  explicit Holder(const std::string& dir) {
    int ready[2], go[2];
    if (::pipe(ready) != 0 || ::pipe(go) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      ::close(go[1]);
      char ok = 'n';
      try {
        FolderLock lock = FolderLock::acquire(dir);
        ok = 'y';
        if (::write(ready[1], &ok, 1) != 1) ::_exit(2);
        char byte;
        (void)!::read(go[0], &byte, 1);
      } catch (...) {
        (void)!::write(ready[1], &ok, 1);
        ::_exit(1);
      }
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(go[0]);
    go_ = go[1];
    char ok = 'n';
    locked_ = ::read(ready[0], &ok, 1) == 1 && ok == 'y';
    ::close(ready[0]);
  }
  ~Holder() {
    if (go_ >= 0) ::close(go_);
    if (pid_ > 0) wait();
  }
  pid_t pid() const { return pid_; }
  bool locked() const { return locked_; }
  // Lets the child release the lock and exit; returns its wait status.
  int finish() {
    const char byte = 'x';
    (void)!::write(go_, &byte, 1);
    return wait();
  }
  // SIGKILLs the child; returns its wait status.
  int kill() {
    ::kill(pid_, SIGKILL);
    return wait();
  }

 private:
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  pid_t pid_ = -1;
  int go_ = -1;
  bool locked_ = false;
};

TEST_F(FolderLockTest, SecondProcessIsRefusedWithThePidAndHostOfTheFirst) {
  const std::string dir = path("ckpt");
  Holder first(dir);
  ASSERT_TRUE(first.locked());
  EXPECT_EQ(error_of([&] { FolderLock::acquire(dir, "--ckpt-dir"); }), refusal("--ckpt-dir", dir, first.pid()));
  const FolderLockHolder recorded = read_folder_lock_holder(dir);
  EXPECT_EQ(recorded.pid, first.pid());
  EXPECT_EQ(recorded.host, host());

  const int status = first.finish();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(read_folder_lock_holder(dir).pid, 0) << "a released lock records nobody";
  FolderLock second = FolderLock::acquire(dir);
  EXPECT_TRUE(second.held());
  EXPECT_EQ(read_folder_lock_holder(dir).pid, ::getpid());
}

TEST_F(FolderLockTest, LockOfAJobKilledWithSigkillIsTakenByTheNextJob) {
  const std::string dir = path("ckpt");
  Holder killed(dir);
  ASSERT_TRUE(killed.locked());
  const pid_t gone = killed.pid();
  EXPECT_EQ(error_of([&] { FolderLock::acquire(dir); }), refusal("folder", dir, gone));
  ASSERT_TRUE(WIFSIGNALED(killed.kill()));
  EXPECT_EQ(read_folder_lock_holder(dir).pid, gone) << "the killed job's record stays behind";

  FolderLock next = FolderLock::acquire(dir);
  EXPECT_TRUE(next.held());
  EXPECT_EQ(read_folder_lock_holder(dir).pid, ::getpid());
  EXPECT_EQ(read_folder_lock_holder(dir).host, host());
}

TEST_F(FolderLockTest, SecondLockInOneProcessIsRefusedUntilTheFirstIsReleased) {
  const std::string dir = path("a/b");  // made when missing
  FolderLock first = FolderLock::acquire(dir);
  ASSERT_TRUE(first.held());
  EXPECT_EQ(first.file(), dir + "/.strata-lock");
  EXPECT_EQ(error_of([&] { FolderLock::acquire(dir); }), refusal("folder", dir, ::getpid()));

  FolderLock moved = std::move(first);
  EXPECT_FALSE(first.held());
  EXPECT_TRUE(moved.held());
  EXPECT_NE(error_of([&] { FolderLock::acquire(dir); }), "") << "the moved lock is still held";
  moved.release();
  EXPECT_FALSE(moved.held());
  EXPECT_TRUE(FolderLock::acquire(dir).held());
}

TEST_F(FolderLockTest, WorkerRunsUnderItsLaunchersLockAndTakesItWhenTheLauncherHoldsNone) {
  const std::string dir = path("ckpt");
  {
    // This process launches: a child of it (its worker) runs under its lock.
    FolderLock launcher = FolderLock::acquire(dir);
    const pid_t worker = ::fork();
    if (worker == 0) {
      try {
        ::_exit(FolderLock::acquire_in_worker(dir).held() ? 2 : 0);
      } catch (...) {
        ::_exit(1);
      }
    }
    int status = 0;
    ASSERT_EQ(::waitpid(worker, &status, 0), worker);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  {
    // Another job holds it (not this process's parent): refused.
    Holder other(dir);
    ASSERT_TRUE(other.locked());
    EXPECT_EQ(error_of([&] { FolderLock::acquire_in_worker(dir); }), refusal("folder", dir, other.pid()));
  }
  // Nobody holds it (a launcher that took none): the worker takes it.
  FolderLock worker = FolderLock::acquire_in_worker(dir);
  EXPECT_TRUE(worker.held());
  EXPECT_EQ(read_folder_lock_holder(dir).pid, ::getpid());
}

TEST_F(FolderLockTest, ProcessesStartedWithExecDoNotHoldTheLock) {
  const std::string dir = path("ckpt");
  FolderLock lock = FolderLock::acquire(dir);
  // A shell started by fork + exec (as the launcher starts workers) lists
  // its open descriptors: the lock file is not among them.
  const std::string command = "ls -l /proc/self/fd/ 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string listing;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) listing.append(buffer, n);
  ::pclose(pipe);
  EXPECT_NE(listing.find(" -> "), std::string::npos) << "no descriptors listed: " << listing;
  EXPECT_EQ(listing.find(".strata-lock"), std::string::npos) << listing;
}

}  // namespace
}  // namespace strata::checkpoint
