// The safetensors writer, dtype names and tensor specs (format:
// include/strata/checkpoint/safetensors.h; the reader is in
// safetensors_reader.cpp).
#include "strata/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_set>
#include <set>
#include <tuple>
#include <unordered_map>

#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/checksum.h"
#include "strata/checkpoint/input.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "safetensors_format.h"

namespace strata::checkpoint {

namespace safetensors_format {

void check_little_endian() {
  const uint16_t probe = 1;
  uint8_t first = 0;
  std::memcpy(&first, &probe, 1);
  STRATA_CHECK(first == 1, CheckpointError,
               "[checkpoint] safetensors I/O needs a little-endian host; this one is big-endian");
}

}  // namespace safetensors_format

using namespace safetensors_format;

namespace {

using ::strata::detail::cat;

const std::vector<std::pair<const char*, at::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<const char*, at::ScalarType>> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  return table;
}

}  // namespace

std::string dtype_name(at::ScalarType dtype) {
  for (const auto& [name, type] : dtype_table())
    if (type == dtype) return name;
  throw CheckpointError(cat("[checkpoint] dtype ", c10::toString(dtype),
                            " cannot be stored in a safetensors file; supported: F64, F32, F16, "
                            "BF16, I64, I32, I16, I8, U8, BOOL"));
}

at::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& [known, type] : dtype_table())
    if (name == known) return type;
  throw CheckpointError(cat("[checkpoint] unknown dtype '", name,
                            "'; supported: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL"));
}

TensorSpec TensorSpec::of(std::string name, const at::Tensor& tensor) {
  STRATA_CHECK(tensor.defined(), CheckpointError, "[checkpoint] tensor '", name, "' is undefined");
  return TensorSpec{std::move(name), tensor.scalar_type(), tensor.sizes().vec()};
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorSpec::nbytes() const {
  return static_cast<uint64_t>(numel()) * c10::elementSize(dtype);
}

// ---- writer -----------------------------------------------------------------

struct SafetensorsWriter::Impl {
  AtomicFile file;
  std::vector<TensorSpec> specs;
  size_t next = 0;
  // Where the placeholder of the checksums lies in the file (0: none), and
  // the checksums so far, 16 hex digits per tensor written.
  uint64_t checksum_offset = 0;
  std::string checksums;
  Impl(std::string path, std::vector<TensorSpec> s) : file(std::move(path)), specs(std::move(s)) {}
};

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorSpec> specs,
                                     Metadata metadata) {
  check_little_endian();
  // Validate everything before creating the file.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  STRATA_CHECK(!metadata.count(kChecksumKey), CheckpointError, "[checkpoint] ", path,
               ": __metadata__ key '", kChecksumKey, "' is reserved (strata writes the checksums)");
  // Note [Checksums in the header]
  // The checksums are known only once the tensors are written, but the
  // header comes first. So the header holds a placeholder of the final
  // length (16 zeros per tensor) under kChecksumKey, and close() writes
  // the hex digits over it in place.
  if (!specs.empty()) metadata[kChecksumKey] = std::string(16 * specs.size(), '0');
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& spec : specs) {
    STRATA_CHECK(!spec.name.empty(), CheckpointError, "[checkpoint] ", path,
                 ": a tensor name is empty");
    STRATA_CHECK(spec.name != kMetadataKey, CheckpointError, "[checkpoint] ", path,
                 ": '__metadata__' is reserved and cannot name a tensor");
    STRATA_CHECK(seen.insert(spec.name).second, CheckpointError, "[checkpoint] ", path,
                 ": tensor name '", spec.name, "' appears twice");
    for (int64_t d : spec.shape)
      STRATA_CHECK(d >= 0, CheckpointError, "[checkpoint] ", path, ": tensor '", spec.name,
                   "' has a negative dimension in shape ", shape_string(spec.shape));
    const uint64_t size = spec.nbytes();
    header[spec.name] = {{"dtype", dtype_name(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(cat("[checkpoint] ", path, ": a tensor name or metadata string is not "
                              "valid UTF-8 (", e.what(), ")"));
  }
  // Pad with spaces so the data buffer starts at a multiple of 8.
  text.append((8 - text.size() % 8) % 8, ' ');

  uint64_t checksum_offset = 0;
  if (!specs.empty()) {
    // The first match is the key itself: inside any JSON string a quote is
    // escaped, so the quoted pattern cannot occur there.
    const std::string pattern = cat("\"", kChecksumKey, "\":\"");
    const size_t at = text.find(pattern);
    STRATA_ASSERT(at != std::string::npos, "checksum placeholder missing from the header of ", path);
    checksum_offset = 8 + at + pattern.size();
  }
  impl_ = std::make_unique<Impl>(std::move(path), std::move(specs));
  impl_->checksum_offset = checksum_offset;
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));
  impl_->file.write(length, sizeof(length));
  impl_->file.write(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;
SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&&) noexcept = default;

const std::string& SafetensorsWriter::path() const { return impl_->file.path(); }

void SafetensorsWriter::write(const std::string& name, const at::Tensor& tensor) {
  STRATA_ASSERT(impl_ != nullptr, "write() on a moved-from SafetensorsWriter");
  const std::string& path = impl_->file.path();
  STRATA_CHECK(impl_->next < impl_->specs.size(), CheckpointError, "[checkpoint] ", path,
               ": tensor '", name, "' written but all ", impl_->specs.size(),
               " declared tensors were already written");
  const TensorSpec& spec = impl_->specs[impl_->next];
  STRATA_CHECK(name == spec.name, CheckpointError, "[checkpoint] ", path, ": tensor '", name,
               "' written out of order; the next declared tensor is '", spec.name, "'");
  STRATA_CHECK(tensor.defined(), CheckpointError, "[checkpoint] ", path, ": tensor '", name,
               "' is undefined");
  STRATA_CHECK(tensor.scalar_type() == spec.dtype && tensor.sizes().vec() == spec.shape,
               CheckpointError, "[checkpoint] ", path, ": tensor '", name, "' was declared as ",
               dtype_name(spec.dtype), " ", shape_string(spec.shape), " but is ",
               c10::toString(tensor.scalar_type()), " ", shape_string(tensor.sizes().vec()));
  at::Tensor data = tensor.detach();
  if (!data.device().is_cpu()) data = data.cpu();
  data = data.contiguous();
  if (spec.nbytes() > 0) impl_->file.write(data.data_ptr(), spec.nbytes());
  impl_->checksums += hex64(xxh64(data.data_ptr(), spec.nbytes()));
  ++impl_->next;
}

void SafetensorsWriter::close() {
  STRATA_ASSERT(impl_ != nullptr, "close() on a moved-from SafetensorsWriter");
  if (impl_->next != impl_->specs.size()) {
    std::string missing;
    for (size_t i = impl_->next; i < impl_->specs.size() && i < impl_->next + 10; ++i)
      missing += (missing.empty() ? "'" : ", '") + impl_->specs[i].name + "'";
    if (impl_->specs.size() - impl_->next > 10)
      missing += cat(" and ", impl_->specs.size() - impl_->next - 10, " more");
    throw CheckpointError(cat("[checkpoint] ", impl_->file.path(), ": closed with ",
                              impl_->specs.size() - impl_->next,
                              " declared tensors not written: ", missing));
  }
  if (impl_->checksum_offset != 0)
    impl_->file.write_at(impl_->checksums.data(), impl_->checksums.size(), impl_->checksum_offset);
  impl_->file.commit();
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const Metadata& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) specs.push_back(TensorSpec::of(name, tensor));
  SafetensorsWriter writer(path, std::move(specs), metadata);
  for (const auto& [name, tensor] : tensors) writer.write(name, tensor);
  writer.close();
}

}  // namespace strata::checkpoint
