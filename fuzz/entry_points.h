// The checkpoint readers as fuzzing entry points. Each takes arbitrary
// bytes, lays them out where the reader expects a file, and runs the
// reader over everything it can reach. A strata::Error (the reader refusing
// the input) is the expected outcome for garbage; anything else escaping
// (another exception, a crash, a sanitizer report, a hang) is a bug.
//
// Used by the libFuzzer targets (fuzz/fuzz_*.cpp) and by the ordinary test
// suite, which replays fuzz/regressions/ through the same functions
// (tests/checkpoint/fuzz_regression_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::fuzz {

/// The bytes as one safetensors file: open, read every tensor, verify.
void safetensors_input(const uint8_t* data, size_t size);

/// The bytes as metadata.json of a complete checkpoint whose
/// state.safetensors is a small valid file: StateReader::open, then every
/// tensor and entry, then the Trainer-state validator on a "trainer" value
/// entry (trainer/trainer_state.h), as `strata ckpt verify` and
/// Trainer::restore run it.
void metadata_input(const uint8_t* data, size_t size);

/// The bytes as a world-2 sharded checkpoint, split in three files:
/// [u32 n][n bytes metadata.json][u32 m][m bytes rank 0's file][rank 1's
/// file: the rest] (u32 little-endian; short input means empty files).
void sharded_input(const uint8_t* data, size_t size);

/// Packs three files in sharded_input's layout (for seed corpora).
std::string pack_sharded(const std::string& metadata, const std::string& rank0,
                         const std::string& rank1);

}  // namespace strata::fuzz
