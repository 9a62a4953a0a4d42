// Checksums of tensor bytes: XXH64 (xxHash's 64-bit hash, seed 0), written
// by strata itself. Each safetensors file strata writes carries the hash of
// every tensor's bytes in its "__metadata__" (kChecksumKey), and readers
// verify them (docs/checkpoints.md, "Checksums").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::checkpoint {

/// The "__metadata__" key holding a file's tensor checksums: one 16-digit
/// lowercase hex XXH64 per tensor, concatenated in data-offset order.
inline constexpr const char* kChecksumKey = "strata.xxh64";

/// Streaming XXH64 (seed 0): update() any number of times, then digest().
class Xxh64 {
 public:
  Xxh64();
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  uint64_t v_[4];
  uint64_t total_ = 0;
  unsigned char buffer_[32];
  size_t buffered_ = 0;
};

/// XXH64 of `size` bytes at `data`.
uint64_t xxh64(const void* data, size_t size);

/// `hash` as 16 lowercase hex digits.
std::string hex64(uint64_t hash);

}  // namespace strata::checkpoint
