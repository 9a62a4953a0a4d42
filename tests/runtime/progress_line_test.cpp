// runtime::ProgressLine: the line's text, in-place redraws on a terminal,
// plain periodic lines otherwise. A fake clock decides when time passes,
// so nothing here depends on how fast the machine is.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "strata/runtime/progress_line.h"

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

class ProgressLineTest : public ::testing::Test {
 protected:
  ProgressLine::Now clock() {
    return [this] { return ProgressLine::Clock::time_point(now_); };
  }
  std::chrono::milliseconds now_{0};
  std::ostringstream out_;
};

TEST(ProgressLineText, GivesCountsBytesPercentRateAndEta) {
  const ProgressCount count{3, 10, 1024, 4096};
  EXPECT_EQ(ProgressLine::text("consolidating", "tensors", count, 2.0),
            "consolidating: 3/10 tensors, 1.0 KiB of 4.0 KiB (25%), 512 B/s, eta 0:06");
  // Before any time passed: no rate, no ETA.
  EXPECT_EQ(ProgressLine::text("exporting", "tensors", {0, 2, 0, 100}, 0.0), "exporting: 0/2 tensors, 0 B of 100 B (0%)");
  // Hours, and nothing to do.
  EXPECT_THAT(ProgressLine::text("x", "t", {1, 2, 1, 7201}, 1.0), HasSubstr("eta 2:00:00"));
  EXPECT_EQ(ProgressLine::text("x", "t", {0, 0, 0, 0}, 1.0), "x: 0/0 t, 0 B of 0 B (100%)");
}

TEST_F(ProgressLineTest, PlainOutputPrintsALineEachIntervalAndNothingForQuickWork) {
  {
    ProgressLine line(out_, "resharding", "tensors", /*terminal=*/false, 5s, clock());
    for (int i = 1; i <= 4; ++i) {
      now_ += 1s;
      line.update({uint64_t(i), 10, uint64_t(i) * 100, 1000});
    }
    EXPECT_EQ(out_.str(), "") << "under the interval: nothing yet";
    now_ += 1s;  // 5 s in
    line.update({5, 10, 500, 1000});
    EXPECT_EQ(out_.str(), "resharding: 5/10 tensors, 500 B of 1000 B (50%), 100 B/s, eta 0:05\n");
    now_ += 1s;
    line.update({6, 10, 600, 1000});
    EXPECT_EQ(out_.str().find('\r'), std::string::npos);
    now_ += 4s;  // 10 s in: the second line
    line.update({10, 10, 1000, 1000});
    line.finish();
  }
  EXPECT_EQ(out_.str(),
            "resharding: 5/10 tensors, 500 B of 1000 B (50%), 100 B/s, eta 0:05\n"
            "resharding: 10/10 tensors, 1000 B of 1000 B (100%), 100 B/s, eta 0:00\n");

  std::ostringstream quick;
  {
    ProgressLine line(quick, "exporting", "tensors", false, 5s, clock());
    line.update({1, 1, 8, 8});
    line.finish();
  }
  EXPECT_EQ(quick.str(), "");
}

TEST_F(ProgressLineTest, TerminalOutputRedrawsOneLineAndEndsIt) {
  ProgressLine line(out_, "consolidating", "tensors", /*terminal=*/true, 5s, clock());
  now_ += 50ms;
  line.update({1, 4, 10, 40});
  EXPECT_EQ(out_.str(), "") << "redraws at most every 100 ms";
  now_ += 50ms;
  line.update({2, 4, 20, 40});
  now_ += 100ms;
  line.update({3, 4, 30, 40});
  EXPECT_EQ(out_.str(),
            "\rconsolidating: 2/4 tensors, 20 B of 40 B (50%), 200 B/s, eta 0:00\033[K"
            "\rconsolidating: 3/4 tensors, 30 B of 40 B (75%), 150 B/s, eta 0:00\033[K");
  // Other output is printed on a cleared line; the next update redraws.
  line.clear();
  EXPECT_THAT(out_.str(), ::testing::EndsWith("\033[K\r\033[K"));
  line.update({4, 4, 40, 40});
  line.finish();
  EXPECT_THAT(out_.str(), ::testing::EndsWith("\rconsolidating: 4/4 tensors, 40 B of 40 B (100%), 200 B/s, eta 0:00\033[K\n"));
  line.finish();  // once
  EXPECT_EQ(out_.str().back(), '\n');
  EXPECT_EQ(out_.str().find("\n"), out_.str().size() - 1) << "one line, ended once";
}

}  // namespace
}  // namespace strata::runtime
