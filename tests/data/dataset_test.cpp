// TokenWindows (text files as windows of byte tokens) and TensorDataset.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "strata/core/error.h"
#include "strata/data/dataset.h"
#include "strata/data/text_dataset.h"
#include "support/errors.h"

namespace {
namespace fs = std::filesystem;
using strata::data::TokenWindows;

// A fresh temporary folder, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "strata-data-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& rel, const std::string& content) const {
    fs::path p = fs::path(path_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string as_text(const at::Tensor& t) {
  std::string s;
  for (int64_t i = 0; i < t.numel(); ++i) s.push_back(static_cast<char>(t[i].item<int64_t>()));
  return s;
}

TEST(TokenWindowsTest, WindowsOfAFileOverlapByOneTokenAndTargetsAreShiftedInputs) {
  TempDir dir;
  auto file = dir.write("t.txt", "abcdefghij");  // 10 tokens
  TokenWindows ds(file, 3);
  // Windows of 4 tokens at stride 3: abcd, defg, ghij -> (10 - 1) / 3 = 3.
  ASSERT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds.num_tokens(), 10);
  const char* inputs[] = {"abc", "def", "ghi"};
  const char* targets[] = {"bcd", "efg", "hij"};
  for (size_t i = 0; i < 3; ++i) {
    auto ex = ds.get(i);
    EXPECT_EQ(ex.input.scalar_type(), at::kLong);
    EXPECT_EQ(ex.input.sizes(), (std::vector<int64_t>{3}));
    EXPECT_EQ(as_text(ex.input), inputs[i]);
    EXPECT_EQ(as_text(ex.target), targets[i]);
  }
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { ds.get(3); }),
            "[data] window index 3 is out of range for " + file + " (3 windows of 3 tokens)");
  // One token short of a fourth window.
  EXPECT_EQ(TokenWindows(dir.write("u.txt", "abcdefghijk"), 3).size(), 3u);
  EXPECT_EQ(TokenWindows(dir.write("v.txt", "abcdefghijklm"), 3).size(), 4u);
}

TEST(TokenWindowsTest, AFolderIsReadRecursivelyInPathOrderJoinedByNewlines) {
  TempDir dir;
  dir.write("b.txt", "BB");
  dir.write("a/2.txt", "A2");
  dir.write("a/1.txt", "A1");
  dir.write("a/empty.txt", "");
  dir.write("c/d/e.bin", std::string("\x00\xff", 2));
  TokenWindows ds(dir.path(), 2);
  std::string expected = std::string("A1\nA2\nBB\n") + std::string("\x00\xff", 2);
  ASSERT_EQ(ds.num_tokens(), static_cast<int64_t>(expected.size()));
  auto tokens = ds.tokens();
  EXPECT_EQ(tokens.scalar_type(), at::kByte);
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(tokens[i].item<int>(), static_cast<unsigned char>(expected[i])) << "token " << i;
  ASSERT_EQ(ds.files().size(), 4u);  // the empty file is skipped
  EXPECT_EQ(fs::path(ds.files()[0]).filename(), "1.txt");
  EXPECT_EQ(fs::path(ds.files()[3]).filename(), "e.bin");
  ASSERT_EQ(ds.size(), 5u);
  EXPECT_EQ(ds.get(4).target[1].item<int64_t>(), 255);
  // Same path and seq_len: the same windows.
  TokenWindows again(dir.path(), 2);
  for (size_t i = 0; i < ds.size(); ++i) EXPECT_TRUE(at::equal(ds.get(i).input, again.get(i).input));
}

TEST(TokenWindowsTest, BadPathsAndTooLittleDataNameThePathAndSizes) {
  TempDir dir;
  const std::string missing = dir.path() + "/nope";
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { TokenWindows(missing, 4); }),
            "[data] data path " + missing + " does not exist; pass an existing file or folder of text");
  fs::create_directories(dir.path() + "/empty");
  dir.write("empty/zero.txt", "");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { TokenWindows(dir.path() + "/empty", 4); }),
            "[data] data path " + dir.path() + "/empty holds no data (0 bytes)");
  auto short_file = dir.write("short.txt", "abcd");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { TokenWindows(short_file, 4); }),
            "[data] data path " + short_file +
                " holds 4 bytes, fewer than one window of seq_len + 1 = 5 tokens; use a smaller seq_len or more text");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { TokenWindows(short_file, 0); }), "[data] seq_len must be >= 1, got 0");
}

TEST(TokenWindowsTest, TheDefaultDataPathLoads) {
  if (!fs::exists(strata::data::kDefaultDataPath)) GTEST_SKIP() << strata::data::kDefaultDataPath << " is absent";
  TokenWindows ds(strata::data::kDefaultDataPath, 64);
  EXPECT_GT(ds.size(), 100u);
  EXPECT_EQ(static_cast<int64_t>(ds.size()), (ds.num_tokens() - 1) / 64);
  auto last = ds.get(ds.size() - 1);
  EXPECT_EQ(last.target.sizes(), (std::vector<int64_t>{64}));
}

TEST(TensorDatasetTest, ExamplesAreRowsOfBothTensors) {
  auto x = at::arange(12, at::kFloat).view({4, 3});
  auto y = at::arange(4, at::kLong);
  strata::data::TensorDataset ds(x, y);
  ASSERT_EQ(ds.size(), 4u);
  auto ex = ds.get(2);
  EXPECT_TRUE(at::equal(ex.input, x[2]));
  EXPECT_EQ(ex.target.item<int64_t>(), 2);
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { strata::data::TensorDataset(x, at::zeros({5})); }),
            "[data] TensorDataset: inputs have 4 examples but targets have 5");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { ds.get(4); }),
            "[data] example index 4 is out of range for a dataset of 4 examples");
}

}  // namespace
