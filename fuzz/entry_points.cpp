// Checkpoint readers as fuzzing entry points (fuzz/entry_points.h).
#include "entry_points.h"

#include <stdlib.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/safetensors.h"
#include "strata/checkpoint/sharded.h"
#include "strata/core/error.h"
#include "strata/trainer/trainer_state.h"

namespace strata::fuzz {
namespace {

// Tensors larger than this are not read (the readers bound them by the
// file size already; this keeps one run fast).
constexpr uint64_t kMaxRead = 16u << 20;

// A private folder for this process's files, made once.
const std::string& scratch() {
  // Never destroyed: the atexit handler below runs after static destructors
  // of objects constructed before it was registered.
  static const std::string& dir = *new std::string([] {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/strata-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch(), ec);
    });
    return pattern;
  }());
  return dir;
}

void write_file(const std::string& path, const char* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(size));
}

void read_everything(const checkpoint::StateReader& reader) {
  for (const std::string& name : reader.tensor_names()) {
    const checkpoint::TensorSpec spec{name, reader.dtype(name), reader.shape(name)};
    if (spec.nbytes() > kMaxRead) continue;
    (void)reader.full(name);
    const int64_t numel = spec.numel();
    (void)reader.flat_slice(name, numel / 3, numel - numel / 3);
  }
  (void)reader.verify_checksums();
  (void)reader.entries().dump();
}

// A small valid state.safetensors, made once.
const std::string& valid_state_file() {
  static const std::string bytes = [] {
    const std::string path = scratch() + "/seed.safetensors";
    checkpoint::write_safetensors(path, {{"model/w", at::arange(6, at::kFloat).reshape({2, 3})},
                                         {"optimizer/w.momentum_buffer", at::ones({2, 3})},
                                         {"rng", at::arange(5, at::kByte)}});
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  return bytes;
}

template <class Fn>
void expect_only_strata_errors(Fn fn) {
  try {
    fn();
  } catch (const strata::Error&) {
    // The input was refused with a strata error: the expected outcome.
  }
}

}  // namespace

void safetensors_input(const uint8_t* data, size_t size) {
  const std::string path = scratch() + "/input.safetensors";
  write_file(path, reinterpret_cast<const char*>(data), size);
  expect_only_strata_errors([&] {
    const checkpoint::SafetensorsFile file = checkpoint::SafetensorsFile::open(path);
    for (const std::string& key : file.keys()) {
      const checkpoint::TensorInfo& info = file.info(key);
      if (info.end - info.begin > kMaxRead) continue;
      (void)file.load(key);
      const int64_t numel = info.spec.numel();
      (void)file.load_flat(key, numel / 2, numel);
      file.verify(key);
    }
  });
  // The same bytes as a one-file checkpoint (metadata in "__metadata__").
  expect_only_strata_errors([&] { read_everything(checkpoint::StateReader::open(path)); });
}

void metadata_input(const uint8_t* data, size_t size) {
  const std::string dir = scratch() + "/meta-ckpt";
  std::filesystem::create_directories(dir);
  const std::string& state = valid_state_file();
  write_file(dir + "/state.safetensors", state.data(), state.size());
  write_file(dir + "/" + checkpoint::kCompleteMarker, "x", 1);
  write_file(dir + "/" + checkpoint::kMetadataFile, reinterpret_cast<const char*>(data), size);
  expect_only_strata_errors([&] {
    const checkpoint::StateReader reader = checkpoint::StateReader::open(dir);
    read_everything(reader);
    // A Trainer checkpoint's state, as inspect and verify check it, and
    // whatever the "trainer" value is, as Trainer::restore checks it.
    trainer::validate_trainer_entry(reader.entries(), dir);
    const nlohmann::json& entries = reader.entries();
    if (auto e = entries.find("trainer"); e != entries.end() && e->is_object() && e->contains("value")) {
      trainer::validate_trainer_state((*e)["value"], dir);
    }
  });
}

void sharded_input(const uint8_t* data, size_t size) {
  const std::string dir = scratch() + "/sharded-ckpt";
  std::filesystem::create_directories(dir);
  std::string parts[3];
  size_t at = 0;
  for (int i = 0; i < 2; ++i) {
    uint32_t n = 0;
    if (size - at >= 4) {
      std::memcpy(&n, data + at, 4);
      at += 4;
    } else {
      at = size;
    }
    n = static_cast<uint32_t>(std::min<size_t>(n, size - at));
    parts[i].assign(reinterpret_cast<const char*>(data + at), n);
    at += n;
  }
  parts[2].assign(reinterpret_cast<const char*>(data + at), size - at);
  write_file(dir + "/" + checkpoint::kMetadataFile, parts[0].data(), parts[0].size());
  write_file(dir + "/" + checkpoint::shard_file_name(0, 2), parts[1].data(), parts[1].size());
  write_file(dir + "/" + checkpoint::shard_file_name(1, 2), parts[2].data(), parts[2].size());
  write_file(dir + "/" + checkpoint::kCompleteMarker, "x", 1);
  expect_only_strata_errors([&] { read_everything(checkpoint::StateReader::open(dir)); });
}

std::string pack_sharded(const std::string& metadata, const std::string& rank0,
                         const std::string& rank1) {
  std::string out;
  for (const std::string* part : {&metadata, &rank0}) {
    const uint32_t n = static_cast<uint32_t>(part->size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += *part;
  }
  return out + rank1;
}

}  // namespace strata::fuzz
