// What the safetensors writer (safetensors.cpp) and reader
// (safetensors_reader.cpp) share. Private to src/checkpoint.
#pragma once

#include <cstdint>

namespace strata::checkpoint::safetensors_format {

// The reference implementation refuses headers above 100 MB; so do we, so
// a corrupt length cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

// Note [Little-endian only]
// safetensors stores numbers little-endian and strata copies tensor bytes
// verbatim, so a big-endian host would read garbage. Refuse instead
// (CheckpointError).
void check_little_endian();

}  // namespace strata::checkpoint::safetensors_format
