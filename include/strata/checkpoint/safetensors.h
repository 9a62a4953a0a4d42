// Tensor files in the public safetensors format, written and read by strata
// itself (no third-party reader).
//
// Layout of a file: an 8-byte little-endian unsigned header length N, then N
// bytes of UTF-8 JSON, then the data buffer. The JSON maps each tensor name
// to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
// the start of the buffer) and may hold "__metadata__": {string: string}.
// strata pads the header with spaces so the buffer starts 8-byte aligned and
// stores tensors back to back in the order the writer was given.
//
// The writer streams: it takes the list of (name, dtype, shape) up front,
// writes the header, then one tensor at a time, so a caller never needs more
// than one tensor in memory. Files appear under their final name only when
// complete (see atomic.h). The reader validates the whole header before
// handing out anything and reads single tensors on request.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata::checkpoint {

/// Tensors with their names, in a caller-chosen order.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// The free-form string map stored under "__metadata__".
using Metadata = std::map<std::string, std::string>;

/// The safetensors name of `dtype` ("F32", "BF16", "I64", "BOOL", ...).
/// Throws CheckpointError for a dtype the format cannot hold (e.g. complex).
std::string dtype_name(at::ScalarType dtype);

/// The dtype named `name` in a safetensors header. Throws CheckpointError
/// listing the supported names when `name` is unknown.
at::ScalarType dtype_from_name(const std::string& name);

/// Name, dtype and shape of one tensor, as declared to a writer.
struct TensorSpec {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;

  /// The spec of `tensor` under `name`.
  static TensorSpec of(std::string name, const at::Tensor& tensor);
  /// Number of elements (1 for a 0-d tensor).
  int64_t numel() const;
  /// Number of bytes the tensor occupies in the file.
  uint64_t nbytes() const;
};

/// One tensor's entry in a file that was read: its spec and where its bytes
/// lie in the data buffer ([begin, end), relative to the buffer start).
struct TensorInfo {
  TensorSpec spec;
  uint64_t begin = 0;
  uint64_t end = 0;
  bool has_checksum = false;  ///< the file carries an XXH64 of its bytes
  uint64_t checksum = 0;      ///< that XXH64 (checksum.h)
};

/// How a reader treats the checksums a file carries (checksum.h).
struct ReadOptions {
  /// Compare every tensor read with its checksum; a mismatch is a
  /// CheckpointError naming the file and the tensor. The default is true
  /// unless the environment sets STRATA_CKPT_VERIFY=0.
  bool verify_checksums = default_verify_checksums();
  /// True unless the environment sets STRATA_CKPT_VERIFY=0.
  static bool default_verify_checksums();
};

/// Writes one safetensors file, one tensor at a time.
///
/// Usage:
///   SafetensorsWriter w(path, {TensorSpec::of("a", a), TensorSpec::of("b", b)});
///   w.write("a", a); w.write("b", b); w.close();
///
/// The file is written under a temporary name next to `path` and renamed to
/// `path` by close() after an fsync (atomic_file in atomic.h), so `path`
/// never holds a partial file. Destroying a writer that was not closed
/// removes the temporary file. Not thread-safe.
class SafetensorsWriter {
 public:
  /// Prepares `path` for the tensors `specs` (written in this order) and
  /// writes the header. Throws CheckpointError for duplicate or empty names,
  /// an unsupported dtype, a negative dimension, or a file-system error
  /// (with the path and errno text).
  SafetensorsWriter(std::string path, std::vector<TensorSpec> specs, Metadata metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  /// Writes the next tensor. `name` must be the next spec's name and
  /// `tensor` must have its dtype and shape (any device, any strides: it is
  /// copied to contiguous CPU memory if needed). Throws CheckpointError on a
  /// mismatch or an I/O error.
  void write(const std::string& name, const at::Tensor& tensor);

  /// Checks that every declared tensor was written, fsyncs the file and
  /// renames it to its final path. Throws CheckpointError naming the tensors
  /// not written, or on an I/O error.
  void close();

  /// The final path of the file.
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Writes `tensors` (in this order) and `metadata` to `path` in one call;
/// same guarantees and errors as SafetensorsWriter.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const Metadata& metadata = {});

/// A safetensors file opened for reading. The header is parsed and validated
/// once by open(); tensors are read one at a time with load(). Copies share
/// the open file descriptor; safe to use from several threads.
class SafetensorsFile {
 public:
  /// Opens and validates `path`: the file size against the header length,
  /// the JSON, every dtype and shape, that the byte span of each tensor is
  /// numel * itemsize, and that the tensors tile the data buffer exactly
  /// (in range, no overlap, no gap, nothing after the last). Throws
  /// CheckpointError naming the file, the key and the problem, e.g.
  /// "[checkpoint] model.safetensors: tensor 'fc.weight' needs bytes
  /// [0, 4096) of the data buffer but the file has only 1200 (truncated?)".
  /// Files written before checksums existed (no "strata.xxh64" in
  /// "__metadata__") load unverified. The path must name a regular file,
  /// not a symbolic link or a FIFO (input.h).
  static SafetensorsFile open(const std::string& path, const ReadOptions& options = {});

  /// Tensor names in file order (by data offset; tensors of 0 bytes that
  /// share an offset are in name order).
  const std::vector<std::string>& keys() const;
  /// True when the file holds a tensor named `key`.
  bool contains(const std::string& key) const;
  /// The entry of `key`; throws CheckpointError when there is none.
  const TensorInfo& info(const std::string& key) const;
  /// Reads tensor `key` into a new CPU tensor that owns its memory. Throws
  /// CheckpointError when there is no such key or the read fails (e.g. the
  /// file was truncated after open()).
  at::Tensor load(const std::string& key) const;
  /// Reads elements [begin, end) of tensor `key`, counted in row-major
  /// order over its flattened shape, into a new 1-D CPU tensor (only those
  /// bytes are read). Throws CheckpointError when there is no such key, the
  /// range is not within [0, numel], or the read fails.
  at::Tensor load_flat(const std::string& key, int64_t begin, int64_t end) const;
  /// Reads every tensor, in file order.
  NamedTensors load_all() const;
  /// True when the file carries checksums for its tensors.
  bool has_checksums() const;
  /// Reads tensor `key`'s bytes and compares them with its checksum (even
  /// when the file was opened without verification). Throws CheckpointError
  /// "[checkpoint] FILE: tensor 'KEY': checksum mismatch ..." when they
  /// differ; does nothing for a file without checksums.
  void verify(const std::string& key) const;
  /// The "__metadata__" map (empty when the file has none; the checksums
  /// are not part of it).
  const Metadata& metadata() const;
  /// The path given to open().
  const std::string& path() const;

 private:
  SafetensorsFile() = default;
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace strata::checkpoint
