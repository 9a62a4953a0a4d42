// Language-modelling data already tokenized: a file of token ids in
// nanoGPT's format (train.bin: uint16, little-endian, one id after
// another, as `np.array(ids, dtype=np.uint16).tofile(path)` writes it),
// memory-mapped and cut into the same windows as TokenWindows.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/data/dataset.h"

namespace strata::data {

/// The file name ending that marks a token file (nanoGPT's train.bin).
inline constexpr const char* kTokenFileSuffix = ".bin";

/// True when `path` ends in kTokenFileSuffix: read it with TokenFile, not
/// as text.
bool is_token_file(const std::string& path);

/// Windows of seq_len + 1 token ids from a token file, taken with stride
/// seq_len exactly as TokenWindows takes them from text: window i covers
/// ids [i*seq_len, i*seq_len + seq_len + 1), its input the first seq_len,
/// its target the last seq_len; size() = (num_tokens - 1) / seq_len.
///
/// The file is mapped read-only, not read into memory: a corpus larger
/// than the host's memory trains, each window's ids decoded (little-endian
/// uint16 to int64) when it is fetched. Every id is checked against the
/// vocabulary once, when the file is opened, so a bad id fails before
/// training, not at the batch that holds it. The file must not change
/// while the dataset lives.
class TokenFile : public Dataset {
 public:
  /// Maps `path` and checks it. Throws ConfigError ("[data] ...", naming
  /// the path and the sizes) when seq_len < 1 or vocab_size < 1; when the
  /// path does not exist, is not a regular file or cannot be mapped; when
  /// the file is empty, holds an odd number of bytes (not uint16 ids), or
  /// fewer than seq_len + 1 ids; and when an id is >= vocab_size, naming
  /// the first such id's index and byte offset.
  TokenFile(const std::string& path, int64_t seq_len, int64_t vocab_size);
  ~TokenFile() override;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  /// Number of full windows.
  size_t size() const override;
  /// Window `index`: {input [seq_len], target [seq_len]}, both int64.
  /// Throws ConfigError when index >= size().
  Example get(size_t index) const override;

  int64_t seq_len() const { return seq_len_; }
  int64_t vocab_size() const { return vocab_size_; }
  /// Ids in the file (its bytes / 2).
  int64_t num_tokens() const { return num_tokens_; }
  /// Ids [begin, begin + count) as an int64 tensor; ConfigError when out
  /// of range.
  at::Tensor ids(int64_t begin, int64_t count) const;

 private:
  std::string path_;
  int64_t seq_len_;
  int64_t vocab_size_;
  int64_t num_tokens_ = 0;
  const uint8_t* bytes_ = nullptr;  // the mapping: num_tokens_ * 2 bytes
  size_t mapped_ = 0;
};

}  // namespace strata::data
