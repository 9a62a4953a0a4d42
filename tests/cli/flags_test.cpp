// Every numeric flag of `strata train` and `strata launch` against hostile
// values: each is refused before any work starts with one line naming the
// flag, the value and the range (exit status 1), never a c10::Error frame
// dump, an "internal error" or a silent wrap-around.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/tool.h"

namespace {

using strata::testing::Outcome;

Outcome strata(const std::vector<std::string>& args) { return strata::testing::run_strata(args); }

bool decimal_integer(const std::string& v) {
  size_t i = (!v.empty() && (v[0] == '-' || v[0] == '+')) ? 1 : 0;
  if (i >= v.size()) return false;
  for (; i < v.size(); ++i)
    if (v[i] < '0' || v[i] > '9') return false;
  return true;
}

bool decimal_real(const std::string& v) {
  if (v.empty()) return false;
  for (char c : v)
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+')) return false;
  return true;
}

struct Flag {
  std::string command;  // "train" or "launch"
  std::string flag;
  bool integer;
  std::string range;                // as the message states it
  std::vector<std::string> bad;     // values outside the range
};

// Values every flag refuses, then each flag's own out-of-range values.
const std::vector<std::string> kAlwaysBad = {"", "abc", "0x10", "nan", "inf", " 5", "5 ", "1,5",
                                             "99999999999999999999", "1e300", "-1"};

const std::vector<Flag> kFlags = {
    {"train", "--devices", true, "an integer in -1..1024", {"-2", "1025"}},
    {"train", "--num-nodes", true, "an integer in 1..1024", {"0"}},
    {"train", "--seq-len", true, "an integer in 1..4096", {"0", "4097"}},
    {"train", "--max-steps", true, "an integer in 1..1000000000", {"0", "1000000001"}},
    {"train", "--batch-size", true, "an integer in 1..1048576", {"0"}},
    {"train", "--grad-accum", true, "an integer in 1..1048576", {"0"}},
    {"train", "--lr", false, "a number in (0, 10]", {"0", "10.5", "1e-400x"}},
    {"train", "--weight-decay", false, "a number in [0, 10]", {"11"}},
    {"train", "--grad-clip", false, "a number in [0, 1e+06]", {"1e7"}},
    {"train", "--seed", true, "an integer in 0..18446744073709551615", {"18446744073709551616"}},
    {"train", "--ckpt-every", true, "an integer in 0..1000000000", {}},
    {"train", "--log-every", true, "an integer in 1..1000000000", {"0"}},
    {"train", "--sample-tokens", true, "an integer in 0..4096", {"4097"}},
    {"train", "--max-epochs", true, "an integer in 0..1000000000", {"1000000001"}},
    {"train", "--val-every", true, "an integer in 0..1000000000", {"1000000001"}},
    {"train", "--val-fraction", false, "a number in (0, 0.5]", {"0", "0.6"}},
    {"train", "--val-batches", true, "an integer in 1..1000000", {"0"}},
    {"train", "--early-stopping", true, "an integer in 0..1000000", {"1000001"}},
    {"train", "--save-top-k", true, "an integer in 0..1000000", {"1000001"}},
    {"launch", "--nproc-per-node", true, "an integer in 1..1024", {"0"}},
    {"launch", "--nnodes", true, "an integer in 1..1024", {"0"}},
    {"launch", "--node-rank", true, "an integer in 0..1023", {"1024"}},
    {"launch", "--master-port", true, "an integer in 1..65535", {"0", "65536"}},
    {"launch", "--timeout", true, "an integer in 1..86400", {"0"}},
    {"launch", "--grace-period", false, "a number in [0, 3600]", {"3601"}},
    {"launch", "--max-time", false, "a number in [0, 3.1536e+07]", {"1e8"}},
    {"launch", "--hang-timeout", false, "a number in [0, 86400]", {"86401"}},
};

// Every case is a process start, so the cases are dealt out over a few
// tests (each a quarter of them) that CTest runs and times apart.
constexpr int kQuarters = 4;
class FlagsRangeTest : public ::testing::TestWithParam<int> {};

TEST_P(FlagsRangeTest, EveryNumericFlagRefusesValuesOutsideItsStatedRange) {
  struct Case {
    const Flag* flag;
    std::string value;
  };
  std::vector<Case> cases;
  size_t index = 0;
  for (const Flag& f : kFlags) {
    // Every flag reads its value with one of two parsers (an integer's, a
    // number's): the whole hostile list on the first flag of each parser
    // and command, and on every flag a value that is no number, one past
    // each end, and its own values out of range.
    const bool first_of_its_parser =
        &f == &*std::find_if(kFlags.begin(), kFlags.end(), [&](const Flag& g) {
          return g.command == f.command && g.integer == f.integer;
        });
    std::vector<std::string> values =
        first_of_its_parser ? kAlwaysBad : std::vector<std::string>{"abc", "-1", "99999999999999999999", "1e300"};
    values.insert(values.end(), f.bad.begin(), f.bad.end());
    for (const std::string& v : values) {
      if (v == "-1" && f.range.find(" -1..") != std::string::npos) continue;  // a value this flag takes
      if (index++ % kQuarters == static_cast<size_t>(GetParam())) cases.push_back({&f, v});
    }
  }
  // A few tools at a time: each case is a whole process start (LibTorch's
  // libraries load before any flag is read), and nearly all of it is waiting.
  constexpr size_t kAtOnce = 6;
  int checked = 0;
  for (size_t first = 0; first < cases.size(); first += kAtOnce) {
    std::vector<strata::testing::Child> running;
    const size_t last = std::min(cases.size(), first + kAtOnce);
    for (size_t k = first; k < last; ++k) {
      const Flag& f = *cases[k].flag;
      std::vector<std::string> args{f.command, f.flag, cases[k].value};
      if (f.command == "launch") args.insert(args.end(), {"--", "true"});
      running.push_back(strata::testing::start_strata(args));
    }
    for (size_t k = first; k < last; ++k) {
      const Flag& f = *cases[k].flag;
      const std::string& v = cases[k].value;
      Outcome o = strata::testing::finish(running[k - first]);
      const bool looks_numeric = f.integer ? decimal_integer(v) : decimal_real(v);
      const std::string why =
          looks_numeric ? "is out of range" : (f.integer ? "is not a decimal integer" : "is not a decimal number");
      const std::string area = f.command == "launch" ? "launcher" : "train";
      const std::string expected =
          "strata: error: [" + area + "] " + f.flag + " '" + v + "' " + why + ": it must be " + f.range + "\n";
      EXPECT_EQ(o.status, 1) << f.command << " " << f.flag << " '" << v << "'\n" << o.err;
      EXPECT_EQ(o.err, expected) << f.command << " " << f.flag << " '" << v << "'";
      EXPECT_EQ(o.out, "") << f.command << " " << f.flag << " '" << v << "' started work";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100 / kQuarters);
}

INSTANTIATE_TEST_SUITE_P(Quarters, FlagsRangeTest, ::testing::Range(0, kQuarters));

TEST(FlagsTest, HelpSaysWhatDevicesMinusOneDoesOnTheCpu) {
  // -1 is every visible GPU with --accelerator cuda, and one worker on the
  // CPU (as docs/cuda.md says): the help must not promise GPUs there.
  Outcome o = strata({"train", "--help"});
  EXPECT_EQ(o.status, 0);
  EXPECT_NE(o.out.find("-1: one per visible GPU with --accelerator cuda; one worker on the CPU"), std::string::npos)
      << o.out;
}

TEST(FlagsTest, HelpStatesEveryRange) {
  for (const std::string& command : {"train", "launch"}) {
    Outcome o = strata({command, "--help"});
    EXPECT_EQ(o.status, 0);
    for (const Flag& f : kFlags) {
      if (f.command != command) continue;
      std::string shown = f.range.substr(f.range.find(" in ") + 4);
      EXPECT_NE(o.out.find(shown), std::string::npos) << f.flag << ": " << shown << " not in\n" << o.out;
    }
  }
}

}  // namespace
