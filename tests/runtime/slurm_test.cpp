// SLURM's compressed host lists (runtime/slurm.h): the forms SLURM writes,
// the bounds, the errors, the fuzz corpus; and requeueing through a stand-in
// scontrol on PATH that records what it was asked.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/runtime/slurm.h"

namespace {

namespace fs = std::filesystem;
using strata::runtime::count_nodelist;
using strata::runtime::expand_nodelist;
using strata::runtime::first_host;
using Hosts = std::vector<std::string>;

std::string error_of(const std::string& list, const std::string& variable = "SLURM_JOB_NODELIST") {
  try {
    expand_nodelist(list, variable);
  } catch (const strata::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

const std::string kExpected =
    "; expected host names and bracketed ranges such as node[01-04,07] or a1,b[2-3]";

TEST(SlurmNodelistTest, ExpandsTheFormsSlurmWrites) {
  EXPECT_EQ(expand_nodelist("node[01-04,07]"), (Hosts{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expand_nodelist("a1,b[2-3]"), (Hosts{"a1", "b2", "b3"}));
  EXPECT_EQ(expand_nodelist("gpu01"), (Hosts{"gpu01"}));
  // Padding is the lower bound's width; wider numbers keep their digits.
  EXPECT_EQ(expand_nodelist("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_nodelist("n[8-10]"), (Hosts{"n8", "n9", "n10"}));
  // Several groups (the last varies fastest) and text after a bracket.
  EXPECT_EQ(expand_nodelist("r[1-2]-g[08-09]x"), (Hosts{"r1-g08x", "r1-g09x", "r2-g08x", "r2-g09x"}));
  // The order as written, not sorted; dots and underscores in names.
  EXPECT_EQ(expand_nodelist("c[7,1-2],h_1.lan,127.0.0.[1-2]"),
            (Hosts{"c7", "c1", "c2", "h_1.lan", "127.0.0.1", "127.0.0.2"}));
}

TEST(SlurmNodelistTest, FirstHostAndCountAgreeWithTheExpansion) {
  for (const std::string list : {"node[01-04,07]", "a1,b[2-3]", "r[1-2]-g[08-09]x", "c[7,1-2],h", "x"}) {
    const Hosts hosts = expand_nodelist(list);
    EXPECT_EQ(first_host(list), hosts.front()) << list;
    EXPECT_EQ(count_nodelist(list), hosts.size()) << list;
  }
  // first_host does not expand: a list far past the expansion bound still
  // has a first host, at once.
  const std::string huge = "n[000000001-999999999]-g[1-999999999]";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(first_host(huge), "n000000001-g1");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(error_of(huge), "[slurm] SLURM_JOB_NODELIST='" + huge +
                                "' names more than 65536 hosts; strata reads host lists up to that size");
  EXPECT_EQ(count_nodelist("n[1-65536]"), 65536u);
  EXPECT_EQ(expand_nodelist("n[1-65536]").back(), "n65536");
  EXPECT_NE(error_of("n[1-65536],x").find("names more than 65536 hosts"), std::string::npos);
}

TEST(SlurmNodelistTest, MalformedListsNameTheVariableAndThePart) {
  EXPECT_EQ(error_of("node[01-04"),
            "[slurm] SLURM_JOB_NODELIST='node[01-04' is not a SLURM host list: a '[' that is not closed at '[01-04' "
            "(byte 4)" + kExpected);
  EXPECT_EQ(error_of("n[3-1]"),
            "[slurm] SLURM_JOB_NODELIST='n[3-1]' is not a SLURM host list: a range that runs backwards at '3-1' "
            "(byte 2)" + kExpected);
  EXPECT_EQ(error_of("a,,b", "SLURM_NODELIST"),
            "[slurm] SLURM_NODELIST='a,,b' is not a SLURM host list: an empty host name at ',' (byte 2)" + kExpected);
  EXPECT_EQ(error_of("a,"),
            "[slurm] SLURM_JOB_NODELIST='a,' is not a SLURM host list: a ',' with no host after it at ',' (byte 1)" +
                kExpected);
  EXPECT_EQ(error_of(""), "[slurm] SLURM_JOB_NODELIST='' is not a SLURM host list: it is empty" + kExpected);
  EXPECT_EQ(error_of("n]"),
            "[slurm] SLURM_JOB_NODELIST='n]' is not a SLURM host list: a ']' without its '[' at ']' (byte 1)" +
                kExpected);
  EXPECT_EQ(error_of("n[[1]]"),
            "[slurm] SLURM_JOB_NODELIST='n[[1]]' is not a SLURM host list: a '[' inside brackets at '[' (byte 2)" +
                kExpected);
  EXPECT_EQ(error_of("n[]"),
            "[slurm] SLURM_JOB_NODELIST='n[]' is not a SLURM host list: a missing number in brackets at ']' (byte 2)" +
                kExpected);
  EXPECT_EQ(error_of("n[1:2]"),
            "[slurm] SLURM_JOB_NODELIST='n[1:2]' is not a SLURM host list: a character other than a digit, '-', ',' "
            "or ']' in brackets at ':' (byte 3)" + kExpected);
  EXPECT_EQ(error_of("n[1234567890]"),
            "[slurm] SLURM_JOB_NODELIST='n[1234567890]' is not a SLURM host list: a number of more than 9 digits at "
            "'1234567890' (byte 2)" + kExpected);
  EXPECT_EQ(error_of(std::string("a\x01;b", 4)),
            "[slurm] SLURM_JOB_NODELIST='a\\x01;b' is not a SLURM host list: a character that no host name holds "
            "(letters, digits, '-', '.', '_') at '\\x01' (byte 1)" + kExpected);
  // Over the length bound: refused before parsing, the value cut short.
  const std::string long_list(strata::runtime::kMaxNodelistBytes + 1, 'a');
  EXPECT_EQ(error_of(long_list), "[slurm] SLURM_JOB_NODELIST='" + std::string(96, 'a') +
                                     "...' is not a SLURM host list: it is 65537 bytes long, over the 65536-byte "
                                     "limit" + kExpected);
  std::string deep;
  for (int i = 0; i < 17; ++i) deep += "a[1]";
  EXPECT_EQ(error_of(deep), "[slurm] SLURM_JOB_NODELIST='" + deep.substr(0, 96) + "' is not a SLURM host list: more "
                            "than 16 bracket groups in one host name at '[' (byte 65)" + kExpected);
  EXPECT_EQ(expand_nodelist(deep.substr(0, 64)).front(), "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1");
  EXPECT_THROW(first_host("a,,b"), strata::ConfigError);
  EXPECT_THROW(count_nodelist("a["), strata::ConfigError);
}

// The fuzz target's seed corpus and every regression it ever found: each
// is read or refused with a ConfigError, and the readers agree.
TEST(SlurmNodelistTest, FuzzCorpusAndRegressionsReplay) {
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  ASSERT_NE(source, nullptr);
  int files = 0, parsed = 0;
  for (const char* folder : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(source) / "fuzz" / folder / "nodelist";
    if (!fs::exists(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      ++files;
      try {
        const Hosts hosts = expand_nodelist(bytes);
        EXPECT_EQ(hosts.front(), first_host(bytes)) << entry.path();
        EXPECT_EQ(hosts.size(), count_nodelist(bytes)) << entry.path();
        ++parsed;
      } catch (const strata::ConfigError&) {
        EXPECT_THROW(first_host(bytes), strata::ConfigError) << entry.path();
      }
    }
  }
  EXPECT_GE(files, 5);
  EXPECT_GE(parsed, 4);
}

// A folder with a stand-in `scontrol` first on PATH, and the SLURM job
// variables, for one test; puts PATH and the variables back after.
class SlurmRequeueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata-requeue-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* name : {"PATH", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"}) {
      const char* value = std::getenv(name);
      saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
      if (std::string(name) != "PATH") ::unsetenv(name);
    }
    const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
    ::setenv("PATH", (dir_.string() + ":" + path).c_str(), 1);
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
    fs::remove_all(dir_);
  }

  // A `scontrol` that records its arguments, one a line, then runs `body`.
  void fake_scontrol(const std::string& body) {
    const fs::path script = dir_ / "scontrol";
    std::ofstream(script) << "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\" >> '" << (dir_ / "args").string()
                          << "'; done\n" << body << "\n";
    fs::permissions(script, fs::perms::owner_all);
  }
  std::string recorded() const {
    std::ifstream in(dir_ / "args");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  fs::path dir_;
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(SlurmRequeueTest, RunsScontrolRequeueWithTheJobId) {
  fake_scontrol("exit 0");
  ::setenv("SLURM_JOB_ID", "81234", 1);
  const auto result = strata::runtime::slurm_requeue();
  EXPECT_TRUE(result.ok) << result.message;
  EXPECT_EQ(result.job_id, "81234");
  EXPECT_EQ(result.message, "[slurm] requeued job 81234 (`scontrol requeue 81234`)");
  EXPECT_EQ(recorded(), "requeue\n81234\n");
}

TEST_F(SlurmRequeueTest, AnArrayTaskIsRequeuedByItsArrayId) {
  fake_scontrol("exit 0");
  ::setenv("SLURM_JOB_ID", "900", 1);
  ::setenv("SLURM_ARRAY_JOB_ID", "812", 1);
  ::setenv("SLURM_ARRAY_TASK_ID", "3", 1);
  const auto result = strata::runtime::slurm_requeue();
  EXPECT_TRUE(result.ok) << result.message;
  EXPECT_EQ(recorded(), "requeue\n812_3\n");
}

TEST_F(SlurmRequeueTest, FailuresComeBackAsMessages) {
  ::setenv("SLURM_JOB_ID", "81234", 1);
  fake_scontrol("echo 'scontrol: error: Requeue of job 81234 not allowed' >&2\nexit 1");
  auto result = strata::runtime::slurm_requeue();
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.message,
            "[slurm] job 81234 not requeued: `scontrol requeue 81234` exited with status 1: scontrol: error: "
            "Requeue of job 81234 not allowed");

  // A scontrol that hangs is killed at the deadline.
  fake_scontrol("exec sleep 60");
  const auto start = std::chrono::steady_clock::now();
  result = strata::runtime::slurm_requeue(/*timeout_s=*/1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.message, "[slurm] `scontrol requeue 81234` did not finish within 1 s and was killed");

  // No scontrol on PATH.
  ::setenv("PATH", dir_.string().c_str(), 1);
  fs::remove(dir_ / "scontrol");
  result = strata::runtime::slurm_requeue();
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.message,
            "[slurm] job 81234 not requeued: scontrol is not on PATH (it comes with the SLURM client tools); "
            "requeue it by hand with `scontrol requeue 81234`");
}

TEST_F(SlurmRequeueTest, WithoutAJobIdNothingRuns) {
  fake_scontrol("exit 0");
  auto result = strata::runtime::slurm_requeue();
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.message, "[slurm] not requeued: SLURM_JOB_ID is not set: this process is not part of a SLURM job");
  ::setenv("SLURM_JOB_ID", "12;rm -rf /", 1);
  result = strata::runtime::slurm_requeue();
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.message, "[slurm] not requeued: SLURM_JOB_ID='12;rm -rf /' is not a job number");
  ::setenv("SLURM_ARRAY_JOB_ID", "812", 1);
  result = strata::runtime::slurm_requeue();
  EXPECT_EQ(result.message,
            "[slurm] not requeued: SLURM_ARRAY_JOB_ID='812' and SLURM_ARRAY_TASK_ID='' do not name an array task "
            "(two numbers expected)");
  EXPECT_EQ(recorded(), "");
}

}  // namespace
