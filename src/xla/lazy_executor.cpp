// lazy::Executor (strata/xla/lazy_graph.h): the compile cache, and running
// a step's program on one device or replicated over several.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include <unistd.h>

#include "strata/core/error.h"
#include "strata/xla/lazy_graph.h"
#include "lazy_graph_internal.h"

namespace strata::xla::lazy {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReasonsKept = 32;

template <class T>
void put(T value, uint8_t* out) {
  std::memcpy(out, &value, sizeof(T));
}

// Round to nearest even on the bits of a float: bfloat16 is its top half.
uint16_t to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stays a quiet NaN
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// IEEE half from a float, rounding to nearest even (subnormals included).
uint16_t to_f16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude >= 0x7F800000) return sign | (magnitude > 0x7F800000 ? 0x7E00 : 0x7C00);  // nan, inf
  if (magnitude >= 0x477FF000) return sign | 0x7C00;  // rounds past 65504: inf
  if (magnitude < 0x38800000) {                       // below 2^-14: a subnormal half (or 0)
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0f;  // x 2^24: units of the smallest half
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t rounded = magnitude + 0xFFF + ((magnitude >> 13) & 1);
  return sign | static_cast<uint16_t>((rounded - 0x38000000) >> 13);
}

// A host scalar's bytes as an element of `dtype`.
void encode_scalar(double v, ElementType dtype, uint8_t* out) {
  switch (dtype) {
    case ElementType::kPred: put<uint8_t>(v != 0.0, out); return;
    case ElementType::kS8: put(static_cast<int8_t>(v), out); return;
    case ElementType::kS16: put(static_cast<int16_t>(v), out); return;
    case ElementType::kS32: put(static_cast<int32_t>(v), out); return;
    case ElementType::kS64: put(static_cast<int64_t>(v), out); return;
    case ElementType::kU8: put(static_cast<uint8_t>(v), out); return;
    case ElementType::kU16: put(static_cast<uint16_t>(v), out); return;
    case ElementType::kU32: put(static_cast<uint32_t>(v), out); return;
    case ElementType::kU64: put(static_cast<uint64_t>(v), out); return;
    case ElementType::kF16: put(to_f16(static_cast<float>(v)), out); return;
    case ElementType::kBF16: put(to_bf16(static_cast<float>(v)), out); return;
    case ElementType::kF32: put(static_cast<float>(v), out); return;
    case ElementType::kF64: put(v, out); return;
    case ElementType::kC64:
    case ElementType::kC128: break;  // no host scalar is complex (Recorder::scalar refuses them)
  }
  throw ConfigError("[xla] a host scalar of an unknown element type");
}

// {"dtype": "f32", "dims": [4, 3]}
std::string type_json(const stablehlo::Type& t) {
  std::string out = "{\"dtype\": \"" + std::string(stablehlo_name(t.dtype)) + "\", \"dims\": [";
  for (size_t i = 0; i < t.dims.size(); ++i) out += (i ? ", " : "") + std::to_string(t.dims[i]);
  return out + "]}";
}

// Note [Dumping programs]
// With STRATA_XLA_DUMP_DIR set, each distinct program a step runs is
// written there once, before it is compiled, as HASH.mlir (the module
// text, which XLA's tools and JAX read) and HASH.json (its replicas and
// its arguments' and results' types), HASH being the FNV-1a hash of the
// text. With STRATA_XLA_DUMP_VALUES=1 as well, the program's first run
// leaves its values beside it: HASH.values/rR.inI.bin and rR.outO.bin,
// replica R's argument I and result O as raw row-major bytes (a bool one
// byte), so the run can be replayed on another XLA and compared
// (tests/xla/jax_oracle.py --replay). The arguments are read before the
// program runs, as it may consume them, and the results after. Each file
// is written under a temporary name and renamed, so a reader never sees
// half of one; the types come before the text, so a reader that finds
// HASH.mlir finds HASH.json; two processes dumping the same program write
// the same bytes.
class ProgramDump {
 public:
  /// Writes `program` unless no dump is asked for or it is there already;
  /// returns what records its values, or null.
  static std::unique_ptr<ProgramDump> begin(const Program& program, size_t replicas) {
    const char* dir = std::getenv("STRATA_XLA_DUMP_DIR");
    if (dir == nullptr || *dir == '\0') return nullptr;
    auto dump = std::unique_ptr<ProgramDump>(new ProgramDump(dir, program));
    std::error_code ec;
    if (std::filesystem::exists(dump->path(".mlir"), ec)) return nullptr;
    std::filesystem::create_directories(dump->dir_, ec);
    std::string json = "{\"module\": \"" + dump->path(".mlir").filename().string() +
                       "\", \"replicas\": " + std::to_string(replicas) + ", \"arguments\": [";
    for (size_t i = 0; i < program.parameters.size(); ++i)
      json += (i ? ", " : "") + type_json(program.parameters[i]->type());
    json += "], \"results\": [";
    for (size_t i = 0; i < program.outputs.size(); ++i) json += (i ? ", " : "") + type_json(program.outputs[i]->type());
    json += "]}\n";
    write(dump->path(".json"), json);
    write(dump->path(".mlir"), program.text);
    const char* values = std::getenv("STRATA_XLA_DUMP_VALUES");
    if (values == nullptr || std::string(values) != "1") return nullptr;
    return dump;
  }

  void arguments(const std::vector<std::vector<const Buffer*>>& per_replica) {
    write_values(per_replica, "in");
  }

  void results(const std::vector<std::vector<Buffer>>& per_replica) {
    std::vector<std::vector<const Buffer*>> pointers(per_replica.size());
    for (size_t r = 0; r < per_replica.size(); ++r)
      for (const Buffer& b : per_replica[r]) pointers[r].push_back(&b);
    write_values(pointers, "out");
  }

 private:
  ProgramDump(std::filesystem::path dir, const Program& program) : dir_(std::move(dir)) {
    uint64_t hash = 0xcbf29ce484222325ull;
    for (unsigned char c : program.text) hash = (hash ^ c) * 0x100000001b3ull;
    char name[17];
    std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(hash));
    name_ = name;
  }

  std::filesystem::path path(const std::string& suffix) const { return dir_ / (name_ + suffix); }

  void write_values(const std::vector<std::vector<const Buffer*>>& per_replica, const char* kind) const {
    const std::filesystem::path folder = path(".values");
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    for (size_t r = 0; r < per_replica.size(); ++r)
      for (size_t i = 0; i < per_replica[r].size(); ++i) {
        const std::vector<uint8_t> bytes = per_replica[r][i]->to_host();
        write(folder / ("r" + std::to_string(r) + "." + kind + std::to_string(i) + ".bin"),
              std::string(bytes.begin(), bytes.end()));
      }
  }

  static void write(const std::filesystem::path& path, const std::string& bytes) {
    const std::filesystem::path temporary = path.string() + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(temporary, std::ios::binary);
      out << bytes;
      STRATA_CHECK(out.good(), ConfigError, "[xla] STRATA_XLA_DUMP_DIR: cannot write ", temporary.string(),
                   "; point it at a writable folder, or unset it");
    }
    std::error_code ec;
    std::filesystem::rename(temporary, path, ec);
    STRATA_CHECK(!ec, ConfigError, "[xla] STRATA_XLA_DUMP_DIR: cannot rename ", temporary.string(), " to ",
                 path.string(), ": ", ec.message());
  }

  std::filesystem::path dir_;
  std::string name_;
};

// Whether every program found by its structure is emitted too and checked
// against the text it was compiled from (Note [Programs known by their
// structure] in lazy_graph.h).
bool check_structures() {
  static const bool on = [] {
    const char* v = std::getenv("STRATA_XLA_CHECK_KEYS");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

}  // namespace

Executor::Executor(std::shared_ptr<const Client> client, Device device, size_t capacity)
    : Executor(std::move(client), std::vector<Device>{std::move(device)}, capacity) {}

Executor::Executor(std::shared_ptr<const Client> client, std::vector<Device> devices, size_t capacity)
    : client_(std::move(client)), devices_(std::move(devices)), capacity_(capacity) {
  STRATA_CHECK(client_ != nullptr, ConfigError, "[xla] the executor needs a client");
  STRATA_CHECK(!devices_.empty(), ConfigError, "[xla] the executor needs at least one device");
  for (size_t i = 0; i < devices_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      STRATA_CHECK(devices_[i].id != devices_[j].id, ConfigError, "[xla] device ", devices_[i].id,
                   " is given for replicas ", j, " and ", i, "; each replica needs a device of its own");
  STRATA_CHECK(capacity_ >= 1, ConfigError, "[xla] the compile cache must hold at least 1 program, got ", capacity_);
}

std::shared_ptr<const LoadedExecutable> Executor::compiled(const Program& program, const uint64_t* structure) {
  const auto looking = Clock::now();
  CompileOptions options;
  options.with_num_replicas(static_cast<int64_t>(devices_.size()));
  std::vector<std::vector<int64_t>> assignment;
  for (const Device& d : devices_) assignment.push_back({d.id});
  options.with_device_assignment(assignment);
  const std::string serialized = options.serialize();
  const std::string key = serialized + '\n' + program.text;
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = index_.find(key);
  const auto start = Clock::now();
  metrics_.lookup_time += start - looking;
  if (found != index_.end()) {
    lru_.splice(lru_.begin(), lru_, found->second);
    ++metrics_.cache_hits;
    if (structure != nullptr && by_structure_.emplace(*structure, found->second).second)
      found->second->structures.push_back(*structure);
    return found->second->executable;
  }
  auto executable = std::make_shared<const LoadedExecutable>(client_->compile(program.text, options));
  metrics_.compile_time += Clock::now() - start;
  ++metrics_.compiles;
  metrics_.compile_reasons.push_back(explain_difference(last_compiled_, program.text));
  if (metrics_.compile_reasons.size() > kReasonsKept) metrics_.compile_reasons.erase(metrics_.compile_reasons.begin());
  last_compiled_ = program.text;
  lru_.push_front({key, executable, serialized.size() + 1, {}, program.donated});
  index_[key] = lru_.begin();
  if (structure != nullptr && by_structure_.emplace(*structure, lru_.begin()).second)
    lru_.front().structures.push_back(*structure);
  evict_locked();
  return executable;
}

void Executor::evict_locked() {
  while (lru_.size() > capacity_) {
    for (uint64_t structure : lru_.back().structures) by_structure_.erase(structure);
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

std::vector<Buffer> Executor::run(const std::vector<NodePtr>& outputs, const Donatable& donatable) {
  STRATA_CHECK(devices_.size() == 1, ConfigError, "[xla] run() on an executor of ", devices_.size(),
               " devices; give each replica its outputs with run_replicated()");
  return std::move(run_replicated({outputs}, donatable)[0]);
}

std::vector<std::vector<Buffer>> Executor::run_replicated(const std::vector<std::vector<NodePtr>>& outputs,
                                                          const Donatable& donatable, bool allow_independent) {
  const size_t replicas = devices_.size();
  STRATA_CHECK(outputs.size() == replicas, ConfigError, "[xla] ", outputs.size(), " replicas' outputs for an executor of ",
               replicas, " devices");
  const auto traced = Clock::now();
  // Note [Donating on every replica]
  // Donation is part of the text, and the replicas run one text: a
  // parameter is donated only where every replica may give up its buffer
  // at that position.
  std::vector<detail::Walk> walks;
  walks.reserve(replicas);
  std::vector<bool> joint;
  for (size_t r = 0; r < replicas; ++r) {
    detail::check_outputs(outputs[r]);
    walks.push_back(detail::walk(outputs[r]));
    const std::vector<bool> mine = detail::donations(walks.back(), donatable);
    if (r == 0) joint = mine;
    for (size_t i = 0; i < joint.size(); ++i) joint[i] = joint[i] && i < mine.size() && mine[i];
  }
  // Note [Programs known by their structure]: a structure every replica
  // shares finds the program without emitting its text.
  std::optional<uint64_t> structure =
      detail::structure(walks[0], outputs[0], joint, "strata_step", static_cast<int64_t>(replicas));
  for (size_t r = 1; r < replicas && structure; ++r)
    if (detail::structure(walks[r], outputs[r], joint, "strata_step", static_cast<int64_t>(replicas)) != structure)
      structure.reset();
  std::shared_ptr<const LoadedExecutable> executable;
  size_t donated = 0;
  std::string known_text;  // the text it was compiled from, to check against
  auto emit_took = Clock::now() - traced;  // emitting the text, or hashing the structure in its place
  if (structure) {
    const auto looking = Clock::now();
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = by_structure_.find(*structure);
    metrics_.lookup_time += Clock::now() - looking;
    if (found != by_structure_.end()) {
      lru_.splice(lru_.begin(), lru_, found->second);
      executable = found->second->executable;
      donated = found->second->donated;
      ++metrics_.structure_hits;
      ++metrics_.cache_hits;
      if (check_structures()) known_text = found->second->key.substr(found->second->text_at);
    }
  }
  std::vector<std::vector<NodePtr>> parameters(replicas);
  const size_t ops = walks[0].order.size();
  std::unique_ptr<ProgramDump> dump;
  if (executable == nullptr || !known_text.empty()) {
    std::vector<Program> programs;
    programs.reserve(replicas);
    for (size_t r = 0; r < replicas; ++r)
      programs.push_back(detail::emit(std::move(walks[r]), outputs[r], joint, "strata_step", static_cast<int64_t>(replicas)));
    for (size_t r = 1; r < replicas; ++r) {
      if (programs[r].text == programs[0].text) continue;
      const std::string how = explain_difference(programs[0].text, programs[r].text);
      const bool collective = std::any_of(programs.begin(), programs.end(), [](const Program& p) { return p.collective; });
      if (allow_independent && !collective) return {};
      throw ConfigError("[xla] replica " + std::to_string(r) + " recorded another step than replica 0 (" + how +
                        "): every device must record the same ops on the same shapes where the step holds a "
                        "collective");
    }
    if (known_text.empty()) {  // a check's emission is not counted: the run needed none
      std::lock_guard<std::mutex> lock(mutex_);
      metrics_.programs_emitted += static_cast<int64_t>(replicas);
    }
    STRATA_CHECK(known_text.empty() || known_text == programs[0].text, Error,
                 "[xla] a step of the same structure as a compiled program emitted another text (",
                 explain_difference(known_text, programs[0].text),
                 "): an op's identity leaves out an attribute its emitter bakes in (Note [Programs known by "
                 "their structure])");
    emit_took = Clock::now() - traced;
    if (executable == nullptr) {
      dump = ProgramDump::begin(programs[0], replicas);
      executable = compiled(programs[0], structure ? &*structure : nullptr);
    }
    donated = programs[0].donated;
    for (size_t r = 0; r < replicas; ++r) parameters[r] = std::move(programs[r].parameters);
  } else {
    for (size_t r = 0; r < replicas; ++r) parameters[r] = std::move(walks[r].parameters);
  }
  // Host scalars are uploaded for this run, to each replica's device
  // (Note [Graph parameters]). The reserve keeps the pointers valid.
  size_t scalar_count = 0;
  for (const std::vector<NodePtr>& mine : parameters)
    for (const NodePtr& p : mine) scalar_count += p->kind() == Node::Kind::kHostScalar;
  std::vector<Buffer> uploaded;
  uploaded.reserve(scalar_count);
  std::vector<std::vector<const Buffer*>> arguments(replicas);
  for (size_t r = 0; r < replicas; ++r) {
    for (const NodePtr& p : parameters[r]) {
      if (p->kind() == Node::Kind::kBuffer) {
        arguments[r].push_back(p->device_buffer().get());
        continue;
      }
      const stablehlo::Type& t = p->type();
      std::vector<uint8_t> bytes(element_size(t.dtype));
      encode_scalar(p->scalar(), t.dtype, bytes.data());
      uploaded.push_back(client_->buffer_from_host(bytes.data(), bytes.size(), t.dtype, {}, devices_[r]));
      arguments[r].push_back(&uploaded.back());
    }
  }
  if (dump) dump->arguments(arguments);
  const auto start = Clock::now();
  std::vector<std::vector<Buffer>> results = executable->execute(arguments);
  const auto took = Clock::now() - start;
  if (dump) dump->results(results);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_.execute_time += took;
    metrics_.emit_time += emit_took;
    metrics_.buffers_donated += static_cast<int64_t>(donated * replicas);
    metrics_.ops_executed += static_cast<int64_t>(ops * replicas);
    ++metrics_.executions;
    metrics_.host_scalars_fed += static_cast<int64_t>(scalar_count);
  }
  STRATA_CHECK(results.size() == replicas, Error, "[xla] the step ran on ", results.size(), " replicas where ",
               replicas, " were asked for");
  for (size_t r = 0; r < replicas; ++r) {
    STRATA_CHECK(results[r].size() == outputs[r].size(), Error, "[xla] replica ", r, " of the step returned ",
                 results[r].size(), " outputs where ", outputs[r].size(), " were asked for");
  }
  return results;
}

GraphMetrics Executor::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return metrics_;
}

size_t Executor::cached() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.size();
}

}  // namespace strata::xla::lazy
