// TokenFile: nanoGPT's .bin files of uint16 token ids as windows, and the
// files it refuses (each error names the path and what is wrong), including
// a seeded run of hostile files.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/data/text_dataset.h"
#include "strata/data/token_file.h"
#include "support/errors.h"
#include "support/tool.h"

namespace {
namespace fs = std::filesystem;
using strata::data::TokenFile;
using strata::testing::error_message;

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata-token-file-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Writes `bytes` as they are.
  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // Writes `ids` as numpy's uint16 does: two bytes each, low byte first.
  std::string write_ids(const std::string& name, const std::vector<uint16_t>& ids) const {
    std::string bytes;
    for (uint16_t id : ids) {
      bytes.push_back(static_cast<char>(id & 0xff));
      bytes.push_back(static_cast<char>(id >> 8));
    }
    return write_bytes(name, bytes);
  }
  fs::path dir_;
};

std::vector<int64_t> values(const at::Tensor& t) { return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()}; }

TEST_F(TokenFileTest, IdsAreLittleEndianUint16CutIntoTheWindowsOfText) {
  // 0x1234 is stored as 34 12; 65535 is the largest id a file can hold.
  const std::vector<uint16_t> ids = {7, 0x1234, 65535, 0, 1, 2, 3, 4, 5, 6, 8};
  TokenFile file(write_ids("train.bin", ids), 3, 65536);
  EXPECT_EQ(file.num_tokens(), 11);
  EXPECT_EQ(file.size(), 3u);  // (11 - 1) / 3 windows, one id shared by neighbours
  const strata::data::Example first = file.get(0);
  EXPECT_EQ(values(first.input), (std::vector<int64_t>{7, 0x1234, 65535}));
  EXPECT_EQ(values(first.target), (std::vector<int64_t>{0x1234, 65535, 0}));
  const strata::data::Example last = file.get(2);
  EXPECT_EQ(values(last.input), (std::vector<int64_t>{3, 4, 5}));  // ids 6..8
  EXPECT_EQ(values(last.target), (std::vector<int64_t>{4, 5, 6}));  // the last id, 8, is in no window
  EXPECT_EQ(first.input.scalar_type(), at::kLong);
  EXPECT_EQ(values(file.ids(9, 2)), (std::vector<int64_t>{6, 8}));
  EXPECT_NE(error_message<strata::ConfigError>([&] { file.get(3); }).find("window index 3 is out of range"),
            std::string::npos);

  // A text's bytes written as ids make the windows of the text itself.
  const std::string text = "The quick brown fox jumps over the lazy dog.";
  std::vector<uint16_t> bytes(text.begin(), text.end());
  TokenFile as_ids(write_ids("text.bin", bytes), 8, 256);
  strata::data::TokenWindows as_text(write_bytes("text.txt", text), 8);
  ASSERT_EQ(as_ids.size(), as_text.size());
  for (size_t i = 0; i < as_ids.size(); ++i) {
    EXPECT_TRUE(as_ids.get(i).input.equal(as_text.get(i).input)) << i;
    EXPECT_TRUE(as_ids.get(i).target.equal(as_text.get(i).target)) << i;
  }
}

// nanoGPT's prepare.py writes train.bin with numpy; what numpy writes is
// what TokenFile reads.
TEST_F(TokenFileTest, ReadsTheFileNumpyWrites) {
  const std::string python = strata::testing::project_python();
  if (python.empty()) GTEST_SKIP() << "STRATA_PYTHON is not set (run through ctest)";
  const std::string out = path("train.bin");
  strata::testing::Outcome run = strata::testing::finish(strata::testing::start_program(
      {python, "-c",
       "import sys, numpy as np; np.array([(i * 7919) % 50257 for i in range(1000)], dtype=np.uint16).tofile(sys.argv[1])",
       out}));
  if (run.status != 0 && run.err.find("No module named 'numpy'") != std::string::npos) GTEST_SKIP() << run.err;
  ASSERT_EQ(run.status, 0) << run.err;
  TokenFile file(out, 16, 50257);
  ASSERT_EQ(file.num_tokens(), 1000);
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(file.ids(i, 1).item<int64_t>(), (i * 7919) % 50257) << i;
}

TEST_F(TokenFileTest, FilesThatAreNotTokenIdsGetErrorsNamingThePathAndSizes) {
  using strata::ConfigError;
  const std::string missing = path("missing.bin");
  EXPECT_NE(error_message<ConfigError>([&] { TokenFile(missing, 4, 256); })
                .find("[data] cannot open token file " + missing + ": No such file or directory"),
            std::string::npos);
  fs::create_directories(path("folder.bin"));
  EXPECT_NE(error_message<ConfigError>([&] { TokenFile(path("folder.bin"), 4, 256); })
                .find("is not a regular file but a folder"),
            std::string::npos);
  const std::string empty = write_bytes("empty.bin", "");
  EXPECT_EQ(error_message<ConfigError>([&] { TokenFile(empty, 4, 256); }),
            "[data] token file " + empty + " is empty (0 bytes); write the ids with np.array(ids, "
            "dtype=np.uint16).tofile(path)");
  const std::string odd = write_bytes("odd.bin", "abcde");
  EXPECT_NE(error_message<ConfigError>([&] { TokenFile(odd, 1, 256); })
                .find("[data] token file " + odd + " holds 5 bytes, an odd count: a .bin token file holds uint16 "
                      "ids, 2 bytes each"),
            std::string::npos);
  const std::string small = write_ids("small.bin", {1, 2, 3, 4});
  EXPECT_EQ(error_message<ConfigError>([&] { TokenFile(small, 4, 256); }),
            "[data] token file " + small + " holds 4 token ids, fewer than one window of seq_len + 1 = 5 ids; use a "
            "smaller seq_len or more tokens");
  const std::string big = write_ids("big.bin", {1, 2, 300, 4, 999, 6});
  EXPECT_EQ(error_message<ConfigError>([&] { TokenFile(big, 2, 256); }),
            "[data] token file " + big + ": token 2 (byte offset 4) is 300, not below the vocabulary size 256 (the "
            "largest id is 999); pass the tokenizer's vocabulary size, or check that the file holds uint16 ids");
  EXPECT_NE(error_message<ConfigError>([&] { TokenFile(small, 0, 256); }).find("seq_len must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(error_message<ConfigError>([&] { TokenFile(small, 1, 0); }).find("must be >= 1, got 0"),
            std::string::npos);
  EXPECT_TRUE(strata::data::is_token_file("data/train.bin"));
  EXPECT_FALSE(strata::data::is_token_file("data/train.txt"));
  EXPECT_FALSE(strata::data::is_token_file(".bin"));
  EXPECT_FALSE(strata::data::is_token_file("/usr/share/common-licenses"));
}

// Hostile files, seeded: any length and content, any vocabulary and window.
// Each either loads, and then every id it yields is below the vocabulary
// and the windows are the file's ids in order, or fails with a [data]
// ConfigError; nothing else (no crash, no read past the end).
TEST_F(TokenFileTest, RandomFilesLoadWithIdsBelowTheVocabularyOrFailWithADataError) {
  std::mt19937_64 rng(20240611);
  int loaded = 0, refused = 0;
  for (int round = 0; round < 400; ++round) {
    // Mostly even lengths and ids below the vocabulary (files that load),
    // else any length and any bytes.
    size_t length = rng() % 96;
    if (rng() % 4 != 0) length &= ~size_t{1};
    std::string bytes(length, '\0');
    const int64_t vocab = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t seq_len = 1 + static_cast<int64_t>(rng() % 8);
    const bool in_vocabulary = rng() % 2 == 0;
    for (size_t i = 0; i < length; ++i) {
      const uint64_t r = rng();
      bytes[i] = static_cast<char>(!in_vocabulary ? r % 256 : i % 2 == 1 ? 0 : r % std::min<int64_t>(vocab, 256));
    }
    const std::string file = write_bytes("hostile.bin", bytes);
    try {
      TokenFile data(file, seq_len, vocab);
      ++loaded;
      ASSERT_EQ(data.num_tokens(), static_cast<int64_t>(length / 2));
      ASSERT_EQ(data.size(), static_cast<size_t>((length / 2 - 1) / seq_len));
      for (size_t w = 0; w < data.size(); ++w) {
        const strata::data::Example e = data.get(w);
        for (int64_t k = 0; k < seq_len; ++k) {
          const int64_t at = static_cast<int64_t>(w) * seq_len + k;
          const int64_t id = static_cast<uint8_t>(bytes[2 * at]) | (static_cast<uint8_t>(bytes[2 * at + 1]) << 8);
          ASSERT_EQ(e.input[k].item<int64_t>(), id) << "round " << round;
          ASSERT_LT(e.target[k].item<int64_t>(), vocab) << "round " << round;
        }
      }
    } catch (const strata::ConfigError& e) {
      ++refused;
      ASSERT_EQ(std::string(e.what()).rfind("[data] token file " + file, 0), 0u) << e.what();
    }
  }
  EXPECT_GT(loaded, 100);
  EXPECT_GT(refused, 100);
}

}  // namespace
