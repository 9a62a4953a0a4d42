// The meetings of the replicas' threads (src/xla_device/meeting.h): no
// device is needed, the meetings are plain barriers.
#include "meeting.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

namespace strata::xla::detail {
namespace {

// Two replicas' two meetings (a step end, a host collective) on one
// board, as replicas.cpp sets them up: a wait that cannot end aborts both.
struct TwoMeetings {
  TwoMeetings() {
    board = std::make_shared<WaitBoard>(2, name);
    const auto abort_all = [this](const std::string& reason) {
      steps.abort(reason);
      host.abort(reason);
    };
    steps.set_board(board, abort_all);
    host.set_board(board, abort_all);
  }
  static std::string name(int k) { return "replica " + std::to_string(k); }
  std::shared_ptr<WaitBoard> board;
  Meeting steps{2, std::chrono::seconds(60), name};
  Meeting host{2, std::chrono::seconds(60), name};
};

// Note [Replicas that wait apart]: two replicas that pass a step end and a
// host collective in turn, again and again, with a wait hook that lets go
// of the meeting's lock (as the Trainer's does), are never reported as
// waiting apart. A mark put back after its meeting completed once did that
// within a few thousand rounds.
TEST(XlaMeetingTest, ReplicasThatMeetInTurnAreNeverReportedAsWaitingApart) {
  TwoMeetings m;
  const auto yield = [](int) { std::this_thread::yield(); };
  m.steps.set_on_wait(yield);
  m.host.set_on_wait(yield);

  constexpr int kRounds = 20000;
  std::string failures[2];
  const auto replica = [&](int rank) {
    try {
      for (int round = 0; round < kRounds; ++round) {
        m.steps.meet(rank, "the end of a step", [] {});
        m.host.meet(rank, "a host all_reduce");
      }
    } catch (const std::exception& e) {
      failures[rank] = e.what();
    }
  };
  std::thread zero(replica, 0), one(replica, 1);
  zero.join();
  one.join();
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
  EXPECT_EQ(m.steps.completed(), static_cast<uint64_t>(kRounds));
  EXPECT_EQ(m.host.completed(), static_cast<uint64_t>(kRounds));
}

// The board still reports a wait that cannot end, at once.
TEST(XlaMeetingTest, ReplicasAtDifferentMeetingsFailAtOnceNamingBoth) {
  TwoMeetings m;
  std::string failures[2];
  std::thread zero([&] {
    try {
      m.host.meet(0, "a host all_reduce");
    } catch (const std::exception& e) {
      failures[0] = e.what();
    }
  });
  std::thread one([&] {
    try {
      m.steps.meet(1, "the end of a step");
    } catch (const std::exception& e) {
      failures[1] = e.what();
    }
  });
  zero.join();
  one.join();
  for (const std::string& failure : failures) {
    EXPECT_NE(failure.find("the replicas wait at different points"), std::string::npos) << failure;
    EXPECT_NE(failure.find("replica 0 at a host all_reduce"), std::string::npos) << failure;
    EXPECT_NE(failure.find("replica 1 at the end of a step"), std::string::npos) << failure;
  }
}

}  // namespace
}  // namespace strata::xla::detail
