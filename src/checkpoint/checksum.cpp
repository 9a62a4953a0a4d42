// XXH64 (include/strata/checkpoint/checksum.h), after the xxHash
// specification (https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md).
#include "strata/checkpoint/checksum.h"

#include <cstring>

namespace strata::checkpoint {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian loads (the safetensors code refuses big-endian hosts).
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint64_t round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = rotl(acc, 31);
  return acc * kP1;
}

inline uint64_t merge(uint64_t acc, uint64_t v) {
  acc ^= round(0, v);
  return acc * kP1 + kP4;
}

}  // namespace

Xxh64::Xxh64() : v_{kP1 + kP2, kP2, 0, 0 - kP1} {}

void Xxh64::update(const void* data, size_t size) {
  if (size == 0) return;
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buffered_ + size < 32) {
    std::memcpy(buffer_ + buffered_, p, size);
    buffered_ += size;
    return;
  }
  if (buffered_ > 0) {
    const size_t fill = 32 - buffered_;
    std::memcpy(buffer_ + buffered_, p, fill);
    for (int i = 0; i < 4; ++i) v_[i] = round(v_[i], load64(buffer_ + 8 * i));
    p += fill;
    size -= fill;
    buffered_ = 0;
  }
  uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
  while (size >= 32) {
    v0 = round(v0, load64(p));
    v1 = round(v1, load64(p + 8));
    v2 = round(v2, load64(p + 16));
    v3 = round(v3, load64(p + 24));
    p += 32;
    size -= 32;
  }
  v_[0] = v0, v_[1] = v1, v_[2] = v2, v_[3] = v3;
  std::memcpy(buffer_, p, size);
  buffered_ = size;
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge(h, v_[i]);
  } else {
    h = kP5;  // seed 0
  }
  h += total_;
  const unsigned char* p = buffer_;
  size_t left = buffered_;
  while (left >= 8) {
    h ^= round(0, load64(p));
    h = rotl(h, 27) * kP1 + kP4;
    p += 8;
    left -= 8;
  }
  if (left >= 4) {
    h ^= uint64_t(load32(p)) * kP1;
    h = rotl(h, 23) * kP2 + kP3;
    p += 4;
    left -= 4;
  }
  while (left > 0) {
    h ^= (*p) * kP5;
    h = rotl(h, 11) * kP1;
    ++p;
    --left;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t xxh64(const void* data, size_t size) {
  Xxh64 hash;
  hash.update(data, size);
  return hash.digest();
}

std::string hex64(uint64_t hash) {
  static const char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, hash >>= 4) out[i] = digits[hash & 0xf];
  return out;
}

}  // namespace strata::checkpoint
