// The lazy graph: nodes, the program of a step, and the executor with its
// compile cache (strata/xla/lazy_graph.h).
#include "strata/xla/lazy_graph.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_set>

#include <unistd.h>

#include "strata/core/error.h"

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
  }
  throw ConfigError("[xla] a host scalar of an unknown element type");
}

// The line of `text` that holds byte `at`.
std::string line_at(const std::string& text, size_t at) {
  const size_t begin = text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t start = begin == std::string::npos ? 0 : begin + 1;
  const size_t end = text.find('\n', at);
  std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
  const size_t first = line.find_first_not_of(' ');
  return first == std::string::npos ? line : line.substr(first);
}

// `text` with every span that starts with `open` and ends at the matching
// `close` replaced by `open` `close` (nesting counted on the close char's
// opener, '<' for '>').
std::string without_spans(const std::string& text, const std::string& open, char opener, char close) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, open.size(), open) == 0) {
      out += open;
      size_t j = i + open.size();
      int depth = 1;
      while (j < text.size() && depth > 0) {
        if (text[j] == opener) ++depth;
        else if (text[j] == close) --depth;
        ++j;
      }
      out += close;
      i = j;
    } else {
      out += text[i++];
    }
  }
  return out;
}

}  // namespace

NodePtr Node::buffer(std::shared_ptr<const Buffer> buffer, stablehlo::Type type) {
  STRATA_CHECK(buffer != nullptr, ConfigError, "[xla] a graph parameter needs a device buffer, got null");
  auto node = std::shared_ptr<Node>(new Node());
  node->kind_ = Kind::kBuffer;
  node->type_ = std::move(type);
  node->op_ = "parameter";
  node->buffer_ = std::move(buffer);
  return node;
}

NodePtr Node::host_scalar(double value, ElementType dtype) {
  auto node = std::shared_ptr<Node>(new Node());
  node->kind_ = Kind::kHostScalar;
  node->type_ = stablehlo::Type{dtype, {}};
  node->op_ = "scalar";
  node->scalar_ = value;
  return node;
}

NodePtr Node::op(std::string op, std::vector<NodePtr> inputs, stablehlo::Type type, EmitFn emit) {
  STRATA_CHECK(emit != nullptr, ConfigError, "[xla] op '", op, "' has no emitter");
  for (size_t i = 0; i < inputs.size(); ++i) {
    STRATA_CHECK(inputs[i] != nullptr, ConfigError, "[xla] op '", op, "': input ", i, " is null");
  }
  auto node = std::shared_ptr<Node>(new Node());
  node->kind_ = Kind::kOp;
  node->type_ = std::move(type);
  node->op_ = std::move(op);
  node->inputs_ = std::move(inputs);
  node->emit_ = std::move(emit);
  return node;
}

namespace {

// A graph in emission order: its ops after their inputs, its parameters in
// first-visit order.
struct Walk {
  std::vector<const Node*> order;
  std::vector<NodePtr> parameters;
  std::unordered_map<const Node*, size_t> argument_of;
};

// Post-order over the DAG, each node once, without recursion (a long chain
// of ops cannot overflow the stack).
Walk walk(const std::vector<NodePtr>& outputs) {
  Walk w;
  std::unordered_set<const Node*> done;
  struct Frame {
    const Node* node;
    size_t next_input;
  };
  std::vector<Frame> stack;
  std::unordered_map<const Node*, NodePtr> owner;  // keeps a pointer for each parameter
  for (const NodePtr& output : outputs) {
    if (done.count(output.get())) continue;
    owner.emplace(output.get(), output);
    stack.push_back({output.get(), 0});
    while (!stack.empty()) {
      Frame& top = stack.back();
      if (top.next_input < top.node->inputs().size()) {
        const NodePtr& input = top.node->inputs()[top.next_input++];
        if (!done.count(input.get())) {
          owner.emplace(input.get(), input);
          stack.push_back({input.get(), 0});
        }
        continue;
      }
      const Node* node = top.node;
      stack.pop_back();
      if (!done.insert(node).second) continue;
      if (node->kind() == Node::Kind::kOp) {
        w.order.push_back(node);
      } else {
        w.argument_of[node] = w.parameters.size();
        w.parameters.push_back(owner.at(node));
      }
    }
  }
  return w;
}

bool is_collective(const Node& node) {
  const std::string& op = node.op_name();
  return node.kind() == Node::Kind::kOp && (op == "all_reduce" || op == "all_gather" || op == "reduce_scatter");
}

}  // namespace

bool has_collective(const std::vector<NodePtr>& outputs) {
  const Walk w = walk(outputs);
  return std::any_of(w.order.begin(), w.order.end(), [](const Node* node) { return is_collective(*node); });
}

Program build_program(const std::vector<NodePtr>& outputs, const std::string& name, const Donatable& donatable,
                      int64_t num_replicas) {
  STRATA_CHECK(!outputs.empty(), ConfigError, "[xla] a step program needs at least one output");
  for (size_t i = 0; i < outputs.size(); ++i) {
    STRATA_CHECK(outputs[i] != nullptr, ConfigError, "[xla] output ", i, " of the step is null");
  }
  Walk w = walk(outputs);
  std::vector<const Node*>& order = w.order;
  std::vector<NodePtr>& parameters = w.parameters;
  const std::unordered_map<const Node*, size_t>& argument_of = w.argument_of;
  std::vector<stablehlo::Type> types;
  for (const NodePtr& p : parameters) types.push_back(p->type());
  stablehlo::Function function("main", types);
  std::unordered_map<const Node*, stablehlo::Value> value_of;
  for (const auto& [node, index] : argument_of) value_of.emplace(node, function.arg(index));
  for (const Node* node : order) {
    std::vector<stablehlo::Value> in;
    in.reserve(node->inputs().size());
    for (const NodePtr& input : node->inputs()) in.push_back(value_of.at(input.get()));
    stablehlo::Value out = node->emitter()(function, in);
    STRATA_CHECK(out.type == node->type(), Error, "[xla] op '", node->op_name(), "' emitted ", out.type.text(),
                 " where its node says ", node->type().text());
    value_of.emplace(node, std::move(out));
  }
  // Note [Donating what only the step holds]
  size_t donated = 0;
  if (donatable) {
    std::unordered_set<const Node*> returned;
    for (const NodePtr& output : outputs) returned.insert(output.get());
    for (size_t i = 0; i < parameters.size(); ++i) {
      const Node& p = *parameters[i];
      if (p.kind() == Node::Kind::kBuffer && !returned.count(&p) && donatable(p)) {
        function.donate(i);
        ++donated;
      }
    }
  }
  std::vector<stablehlo::Value> results;
  for (const NodePtr& output : outputs) results.push_back(value_of.at(output.get()));
  function.returns(results);
  stablehlo::Module module(name, num_replicas);
  module.add(function);
  Program program;
  program.text = module.text();
  program.parameters = std::move(parameters);
  program.outputs = outputs;
  program.ops = order.size();
  program.donated = donated;
  program.collective = std::any_of(order.begin(), order.end(), [](const Node* node) { return is_collective(*node); });
  return program;
}

namespace {

// {"dtype": "f32", "dims": [4, 3]}
std::string type_json(const stablehlo::Type& t) {
  std::string out = "{\"dtype\": \"" + std::string(stablehlo_name(t.dtype)) + "\", \"dims\": [";
  for (size_t i = 0; i < t.dims.size(); ++i) out += (i ? ", " : "") + std::to_string(t.dims[i]);
  return out + "]}";
}

// Note [Dumping programs]
// With STRATA_XLA_DUMP_DIR set, each distinct program a step runs is
// written there once, as HASH.mlir (the module text, which XLA's tools and
// JAX read) and HASH.json (its arguments' and results' types), HASH being
// the FNV-1a hash of the text. Each file is written under a temporary name
// and renamed, so a reader never sees half of one, and two processes
// dumping the same program write the same bytes.
void dump_program(const std::filesystem::path& dir, const Program& program) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : program.text) hash = (hash ^ c) * 0x100000001b3ull;
  char name[17];
  std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(hash));
  const std::filesystem::path mlir = dir / (std::string(name) + ".mlir");
  std::error_code ec;
  if (std::filesystem::exists(mlir, ec)) return;
  std::filesystem::create_directories(dir, ec);
  std::string json = "{\"module\": \"" + mlir.filename().string() + "\", \"arguments\": [";
  for (size_t i = 0; i < program.parameters.size(); ++i)
    json += (i ? ", " : "") + type_json(program.parameters[i]->type());
  json += "], \"results\": [";
  for (size_t i = 0; i < program.outputs.size(); ++i) json += (i ? ", " : "") + type_json(program.outputs[i]->type());
  json += "]}\n";
  auto write = [&](const std::filesystem::path& path, const std::string& bytes) {
    const std::filesystem::path temporary = path.string() + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(temporary, std::ios::binary);
      out << bytes;
      STRATA_CHECK(out.good(), ConfigError, "[xla] STRATA_XLA_DUMP_DIR: cannot write ", temporary.string(),
                   "; point it at a writable folder, or unset it");
    }
    std::filesystem::rename(temporary, path, ec);
    STRATA_CHECK(!ec, ConfigError, "[xla] STRATA_XLA_DUMP_DIR: cannot rename ", temporary.string(), " to ",
                 path.string(), ": ", ec.message());
  };
  // The types first: a reader that finds HASH.mlir finds HASH.json too.
  write(dir / (std::string(name) + ".json"), json);
  write(mlir, program.text);
}

}  // namespace

std::string explain_difference(const std::string& previous, const std::string& next) {
  if (previous.empty()) return "the first program";
  if (previous == next) return "nothing (the same program)";
  const size_t n = std::min(previous.size(), next.size());
  size_t at = 0;
  while (at < n && previous[at] == next[at]) ++at;
  const std::string line = line_at(next, std::min(at, next.size() ? next.size() - 1 : 0));
  std::string what = "the ops";
  if (without_spans(previous, "tensor<", '<', '>') == without_spans(next, "tensor<", '<', '>')) {
    what = "the shapes";
  } else if (without_spans(previous, "dense<", '<', '>') == without_spans(next, "dense<", '<', '>')) {
    what = "a constant baked into the program";
  }
  return what + ", first at: " + line;
}

namespace {

// The size of every group, checked (Note [Collectives in the step]).
int64_t group_size(const char* what, const stablehlo::ReplicaGroups& groups) {
  STRATA_CHECK(!groups.empty() && !groups[0].empty(), ConfigError, "[xla] ", what, " needs at least one replica group");
  for (const auto& g : groups) {
    STRATA_CHECK(g.size() == groups[0].size(), ConfigError, "[xla] ", what, ": replica groups of ",
                 groups[0].size(), " and ", g.size(), " replicas; every group must be the same size");
  }
  return static_cast<int64_t>(groups[0].size());
}

void check_dim(const char* what, const NodePtr& x, int64_t dim) {
  STRATA_CHECK(x != nullptr, ConfigError, "[xla] ", what, " of a null node");
  STRATA_CHECK(dim >= 0 && dim < static_cast<int64_t>(x->type().dims.size()), ConfigError, "[xla] ", what,
               " along dim ", dim, " of ", x->type().text());
}

}  // namespace

NodePtr all_reduce(const NodePtr& x, stablehlo::ReduceOp op, const stablehlo::ReplicaGroups& groups) {
  STRATA_CHECK(x != nullptr, ConfigError, "[xla] all_reduce of a null node");
  group_size("all_reduce", groups);
  return Node::op("all_reduce", {x}, x->type(), [op, groups](stablehlo::Function& f, const std::vector<stablehlo::Value>& in) {
    return f.all_reduce(in[0], op, groups);
  });
}

NodePtr all_gather(const NodePtr& x, int64_t dim, const stablehlo::ReplicaGroups& groups) {
  check_dim("all_gather", x, dim);
  stablehlo::Type type = x->type();
  type.dims[static_cast<size_t>(dim)] *= group_size("all_gather", groups);
  return Node::op("all_gather", {x}, type, [dim, groups](stablehlo::Function& f, const std::vector<stablehlo::Value>& in) {
    return f.all_gather(in[0], dim, groups);
  });
}

NodePtr reduce_scatter(const NodePtr& x, int64_t dim, stablehlo::ReduceOp op, const stablehlo::ReplicaGroups& groups) {
  check_dim("reduce_scatter", x, dim);
  const int64_t n = group_size("reduce_scatter", groups);
  stablehlo::Type type = x->type();
  const int64_t size = type.dims[static_cast<size_t>(dim)];
  STRATA_CHECK(size % n == 0, ConfigError, "[xla] reduce_scatter of ", x->type().text(), " along dim ", dim,
               ": ", size, " does not split into ", n, " equal parts; pad it to a multiple of the group size");
  type.dims[static_cast<size_t>(dim)] = size / n;
  return Node::op("reduce_scatter", {x}, type,
                  [dim, op, groups](stablehlo::Function& f, const std::vector<stablehlo::Value>& in) {
                    return f.reduce_scatter(in[0], dim, op, groups);
                  });
}

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

std::shared_ptr<const LoadedExecutable> Executor::compiled(const std::string& text) {
  CompileOptions options;
  options.with_num_replicas(static_cast<int64_t>(devices_.size()));
  std::vector<std::vector<int64_t>> assignment;
  for (const Device& d : devices_) assignment.push_back({d.id});
  options.with_device_assignment(assignment);
  const std::string key = options.serialize() + '\n' + text;
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = index_.find(key);
  if (found != index_.end()) {
    lru_.splice(lru_.begin(), lru_, found->second);
    ++metrics_.cache_hits;
    return found->second->executable;
  }
  const auto start = Clock::now();
  auto executable = std::make_shared<const LoadedExecutable>(client_->compile(text, options));
  metrics_.compile_time += Clock::now() - start;
  ++metrics_.compiles;
  metrics_.compile_reasons.push_back(explain_difference(last_compiled_, text));
  if (metrics_.compile_reasons.size() > kReasonsKept) metrics_.compile_reasons.erase(metrics_.compile_reasons.begin());
  last_compiled_ = text;
  lru_.push_front({key, executable});
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return executable;
}

std::vector<Buffer> Executor::run(const std::vector<NodePtr>& outputs, const Donatable& donatable) {
  STRATA_CHECK(devices_.size() == 1, ConfigError, "[xla] run() on an executor of ", devices_.size(),
               " devices; give each replica its outputs with run_replicated()");
  return std::move(run_replicated({outputs}, donatable)[0]);
}

std::vector<std::vector<Buffer>> Executor::run_replicated(const std::vector<std::vector<NodePtr>>& outputs,
                                                          const Donatable& donatable, std::string* independent) {
  const size_t replicas = devices_.size();
  STRATA_CHECK(outputs.size() == replicas, ConfigError, "[xla] ", outputs.size(), " replicas' outputs for an executor of ",
               replicas, " devices");
  const auto traced = Clock::now();
  // Note [Donating on every replica]
  // Donation is part of the text, and the replicas run one text: a
  // parameter is donated only where every replica may give up its buffer
  // at that position.
  Donatable joint_donatable;
  std::vector<std::unordered_map<const Node*, size_t>> position(replicas);
  std::vector<bool> joint;
  if (donatable) {
    for (size_t r = 0; r < replicas; ++r) {
      for (const NodePtr& output : outputs[r])
        STRATA_CHECK(output != nullptr, ConfigError, "[xla] output of replica ", r, " of the step is null");
      const std::vector<NodePtr> parameters = walk(outputs[r]).parameters;
      if (r == 0) joint.assign(parameters.size(), true);
      for (size_t i = 0; i < parameters.size(); ++i) {
        position[r].emplace(parameters[i].get(), i);
        if (i < joint.size()) joint[i] = joint[i] && parameters[i]->kind() == Node::Kind::kBuffer && donatable(*parameters[i]);
      }
    }
  }
  std::vector<Program> programs;
  programs.reserve(replicas);
  for (size_t r = 0; r < replicas; ++r) {
    if (donatable) {
      joint_donatable = [&, r](const Node& p) {
        const auto it = position[r].find(&p);
        return it != position[r].end() && it->second < joint.size() && joint[it->second];
      };
    }
    programs.push_back(build_program(outputs[r], "strata_step", joint_donatable, static_cast<int64_t>(replicas)));
  }
  for (size_t r = 1; r < replicas; ++r) {
    if (programs[r].text == programs[0].text) continue;
    const std::string how = explain_difference(programs[0].text, programs[r].text);
    const bool collective = std::any_of(programs.begin(), programs.end(), [](const Program& p) { return p.collective; });
    if (independent != nullptr && !collective) {
      *independent = "replica " + std::to_string(r) + " recorded another step than replica 0 (" + how + ")";
      return {};
    }
    throw ConfigError("[xla] replica " + std::to_string(r) + " recorded another step than replica 0 (" + how +
                      "): every device must record the same ops on the same shapes where the step holds a "
                      "collective");
  }
  const auto emit_took = Clock::now() - traced;
  if (const char* dir = std::getenv("STRATA_XLA_DUMP_DIR"); dir != nullptr && *dir != '\0') dump_program(dir, programs[0]);
  std::shared_ptr<const LoadedExecutable> executable = compiled(programs[0].text);
  // Host scalars are uploaded for this run, to each replica's device
  // (Note [Graph parameters]). The reserve keeps the pointers valid.
  size_t scalar_count = 0;
  for (const Program& program : programs)
    for (const NodePtr& p : program.parameters) scalar_count += p->kind() == Node::Kind::kHostScalar;
  std::vector<Buffer> uploaded;
  uploaded.reserve(scalar_count);
  std::vector<std::vector<const Buffer*>> arguments(replicas);
  for (size_t r = 0; r < replicas; ++r) {
    for (const NodePtr& p : programs[r].parameters) {
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
  const auto start = Clock::now();
  std::vector<std::vector<Buffer>> results = executable->execute(arguments);
  const auto took = Clock::now() - start;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_.execute_time += took;
    metrics_.emit_time += emit_took;
    for (const Program& program : programs) {
      metrics_.buffers_donated += static_cast<int64_t>(program.donated);
      metrics_.ops_executed += static_cast<int64_t>(program.ops);
    }
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
