// Byte-level language-modelling data: the text of a file or of a folder of
// files, cut into fixed-length windows of (input, next-token target) pairs.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <string>
#include <vector>

#include "strata/data/dataset.h"

namespace strata::data {

/// The text `strata train` reads when no data path is given: the licence
/// texts every Debian system ships.
inline constexpr const char* kDefaultDataPath = "/usr/share/common-licenses";

/// Windows of seq_len + 1 byte tokens taken with stride seq_len:
/// window i covers tokens [i*seq_len, i*seq_len + seq_len + 1), its input
/// is the first seq_len of them and its target the last seq_len (each
/// input token's next token). Only full windows are kept, so
/// size() = (num_tokens - 1) / seq_len.
///
/// The tokens are the bytes (0..255, as int64) of `path`: a regular file,
/// or a folder whose regular files (found recursively, symbolic links to
/// files followed) are read in order of their paths and joined with one
/// '\n' between consecutive non-empty files. The result depends only on the
/// file contents, their paths and seq_len.
class TokenWindows : public Dataset {
 public:
  /// Reads all of `path` into memory (one byte per token). Throws
  /// ConfigError ("[data] ...", naming the path and the sizes) when the path
  /// does not exist, is not a file or folder, cannot be read, holds no
  /// bytes, or holds fewer than seq_len + 1 bytes; and when seq_len < 1.
  TokenWindows(const std::string& path, int64_t seq_len);

  /// Number of full windows.
  size_t size() const override;

  /// Window `index`: {input [seq_len], target [seq_len]}, both int64.
  /// Throws ConfigError when index >= size().
  Example get(size_t index) const override;

  /// Window length (tokens per input).
  int64_t seq_len() const { return seq_len_; }
  /// Total number of tokens read.
  int64_t num_tokens() const { return tokens_.numel(); }
  /// The files read, in the order they were joined.
  const std::vector<std::string>& files() const { return files_; }
  /// All tokens as a uint8 tensor [num_tokens].
  const at::Tensor& tokens() const { return tokens_; }

 private:
  std::string path_;
  int64_t seq_len_;
  std::vector<std::string> files_;
  at::Tensor tokens_;  // uint8
};

}  // namespace strata::data
