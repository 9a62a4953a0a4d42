// The lazy graph: nodes, collectives and the program of a step
// (strata/xla/lazy_graph.h); lazy_executor.cpp compiles and runs it.
#include "strata/xla/lazy_graph.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include "strata/core/error.h"
#include "lazy_graph_internal.h"

namespace strata::xla::lazy {
namespace {

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

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A parameter's identity: its kind and type (never its value).
uint64_t parameter_identity(const char* kind, const stablehlo::Type& type) {
  Attributes a;
  return a.add(std::string(kind)).add(type).hash();
}

}  // namespace

Attributes& Attributes::mix(uint64_t v) {
  h_ = splitmix(h_ ^ splitmix(v));
  return *this;
}

Attributes& Attributes::add(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return mix(bits);
}

Attributes& Attributes::add(const std::vector<int64_t>& v) {
  mix(v.size());
  for (int64_t x : v) mix(static_cast<uint64_t>(x));
  return *this;
}

Attributes& Attributes::add(const std::vector<double>& v) {
  mix(v.size());
  for (double x : v) add(x);
  return *this;
}

Attributes& Attributes::add(const std::vector<std::vector<int64_t>>& v) {
  mix(v.size());
  for (const auto& x : v) add(x);
  return *this;
}

Attributes& Attributes::add(const stablehlo::Type& t) {
  mix(static_cast<uint64_t>(t.dtype));
  return add(t.dims);
}

Attributes& Attributes::add(const std::string& s) { return add_bytes(s.data(), s.size()); }

Attributes& Attributes::add_bytes(const void* data, size_t size) {
  mix(size);
  const auto* bytes = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes + i, 8);
    mix(word);
  }
  uint64_t last = 0;
  std::memcpy(&last, bytes + i, size - i);
  return mix(last);
}

NodePtr Node::buffer(std::shared_ptr<const Buffer> buffer, stablehlo::Type type) {
  STRATA_CHECK(buffer != nullptr, ConfigError, "[xla] a graph parameter needs a device buffer, got null");
  auto node = std::make_shared<Node>(Private{});
  node->kind_ = Kind::kBuffer;
  node->identity_ = parameter_identity("buffer", type);
  node->type_ = std::move(type);
  node->op_ = "parameter";
  node->buffer_ = std::move(buffer);
  return node;
}

NodePtr Node::host_scalar(double value, ElementType dtype) {
  auto node = std::make_shared<Node>(Private{});
  node->kind_ = Kind::kHostScalar;
  node->type_ = stablehlo::Type{dtype, {}};
  node->identity_ = parameter_identity("scalar", node->type_);
  node->op_ = "scalar";
  node->scalar_ = value;
  return node;
}

std::shared_ptr<Node> Node::make(std::string op, std::vector<NodePtr> inputs, stablehlo::Type type, EmitFn emit) {
  STRATA_CHECK(emit != nullptr, ConfigError, "[xla] op '", op, "' has no emitter");
  for (size_t i = 0; i < inputs.size(); ++i) {
    STRATA_CHECK(inputs[i] != nullptr, ConfigError, "[xla] op '", op, "': input ", i, " is null");
  }
  auto node = std::make_shared<Node>(Private{});
  node->kind_ = Kind::kOp;
  node->type_ = std::move(type);
  node->op_ = std::move(op);
  node->inputs_ = std::move(inputs);
  node->emit_ = std::move(emit);
  return node;
}

NodePtr Node::op(std::string op, std::vector<NodePtr> inputs, stablehlo::Type type, EmitFn emit) {
  return make(std::move(op), std::move(inputs), std::move(type), std::move(emit));
}

NodePtr Node::keyed(std::string op, std::vector<NodePtr> inputs, stablehlo::Type type, EmitFn emit,
                    uint64_t attributes) {
  std::shared_ptr<Node> node = make(std::move(op), std::move(inputs), std::move(type), std::move(emit));
  Attributes identity;
  identity.add(node->op_).add(node->type_).add(static_cast<int64_t>(attributes));
  node->identity_ = identity.hash() == 0 ? 1 : identity.hash();
  return node;
}

namespace detail {

int64_t NodeSlots::at(const Node* node) const {
  const int64_t* slot = find(node);
  if (slot == nullptr) throw std::out_of_range("[xla] a node outside the walk");
  return *slot;
}

bool NodeSlots::insert(const Node* node, int64_t slot) {
  for (size_t i = home(node);; i = (i + 1) & mask()) {
    Entry& e = entries_[i];
    if (e.node == node) return false;
    if (e.node != nullptr) continue;
    e = {node, slot};
    if (++size_ * 2 > entries_.size()) grow();
    return true;
  }
}

void NodeSlots::grow() {
  std::vector<Entry> old(entries_.size() * 2);
  old.swap(entries_);
  for (const Entry& e : old) {
    if (e.node == nullptr) continue;
    size_t i = home(e.node);
    while (entries_[i].node != nullptr) i = (i + 1) & mask();
    entries_[i] = e;
  }
}

Walk walk(const std::vector<NodePtr>& outputs) {
  Walk w;
  auto& done = w.slot;
  struct Frame {
    const NodePtr* node;  // in its user's inputs, or in `outputs`: both outlive the walk
    size_t next_input;
  };
  std::vector<Frame> stack;
  for (const NodePtr& output : outputs) {
    if (done.contains(output.get())) continue;
    stack.push_back({&output, 0});
    while (!stack.empty()) {
      Frame& top = stack.back();
      const Node& at = **top.node;
      if (top.next_input < at.inputs().size()) {
        const NodePtr& input = at.inputs()[top.next_input++];
        if (!done.contains(input.get())) stack.push_back({&input, 0});
        continue;
      }
      const NodePtr& node = *top.node;
      stack.pop_back();
      const int64_t slot = node->kind() == Node::Kind::kOp ? -static_cast<int64_t>(w.order.size()) - 1
                                                           : static_cast<int64_t>(w.parameters.size());
      if (!done.insert(node.get(), slot)) continue;
      if (node->kind() == Node::Kind::kOp) {
        w.order.push_back(node.get());
      } else {
        w.parameters.push_back(node);
      }
    }
  }
  return w;
}

}  // namespace detail

namespace {

bool is_collective(const Node& node) {
  const std::string& op = node.op_name();
  return node.kind() == Node::Kind::kOp && (op == "all_reduce" || op == "all_gather" || op == "reduce_scatter");
}

}  // namespace

bool has_collective(const std::vector<NodePtr>& outputs) {
  const detail::Walk w = detail::walk(outputs);
  return std::any_of(w.order.begin(), w.order.end(), [](const Node* node) { return is_collective(*node); });
}

namespace detail {

void check_outputs(const std::vector<NodePtr>& outputs) {
  STRATA_CHECK(!outputs.empty(), ConfigError, "[xla] a step program needs at least one output");
  for (size_t i = 0; i < outputs.size(); ++i) {
    STRATA_CHECK(outputs[i] != nullptr, ConfigError, "[xla] output ", i, " of the step is null");
  }
}

std::optional<uint64_t> structure(const Walk& w, const std::vector<NodePtr>& outputs, const std::vector<bool>& donate,
                                  const std::string& name, int64_t num_replicas) {
  Attributes h;
  h.add(name).add(num_replicas).add(static_cast<int64_t>(w.parameters.size()));
  for (size_t i = 0; i < w.parameters.size(); ++i)
    h.add(static_cast<int64_t>(w.parameters[i]->identity())).add(static_cast<int64_t>(i < donate.size() && donate[i]));
  for (const Node* node : w.order) {
    if (node->identity() == 0) return std::nullopt;
    h.add(static_cast<int64_t>(node->identity())).add(static_cast<int64_t>(node->inputs().size()));
    for (const NodePtr& input : node->inputs()) h.add(w.slot.at(input.get()));
  }
  h.add(static_cast<int64_t>(outputs.size()));
  for (const NodePtr& output : outputs) h.add(w.slot.at(output.get()));
  return h.hash();
}

std::vector<bool> donations(const Walk& w, const Donatable& donatable) {
  std::vector<bool> out(w.parameters.size(), false);
  if (!donatable) return out;
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = w.parameters[i]->kind() == Node::Kind::kBuffer && donatable(*w.parameters[i]);
  return out;
}

Program emit(Walk w, const std::vector<NodePtr>& outputs, const std::vector<bool>& donate, const std::string& name,
             int64_t num_replicas) {
  std::vector<stablehlo::Type> types;
  for (const NodePtr& p : w.parameters) types.push_back(p->type());
  stablehlo::Function function("main", types);
  std::unordered_map<const Node*, stablehlo::Value> value_of;
  for (size_t i = 0; i < w.parameters.size(); ++i) value_of.emplace(w.parameters[i].get(), function.arg(i));
  for (const Node* node : w.order) {
    std::vector<stablehlo::Value> in;
    in.reserve(node->inputs().size());
    for (const NodePtr& input : node->inputs()) in.push_back(value_of.at(input.get()));
    stablehlo::Value out = node->emitter()(function, in);
    STRATA_CHECK(out.type == node->type(), Error, "[xla] op '", node->op_name(), "' emitted ", out.type.text(),
                 " where its node says ", node->type().text());
    value_of.emplace(node, std::move(out));
  }
  // Note [Donating what only the step holds]
  std::unordered_set<const Node*> returned;
  for (const NodePtr& output : outputs) returned.insert(output.get());
  size_t donated = 0;
  for (size_t i = 0; i < w.parameters.size(); ++i) {
    if (i < donate.size() && donate[i] && !returned.count(w.parameters[i].get())) {
      function.donate(i);
      ++donated;
    }
  }
  std::vector<stablehlo::Value> results;
  for (const NodePtr& output : outputs) results.push_back(value_of.at(output.get()));
  function.returns(results);
  stablehlo::Module module(name, num_replicas);
  module.add(function);
  Program program;
  program.text = module.text();
  program.ops = w.order.size();
  program.donated = donated;
  program.collective = std::any_of(w.order.begin(), w.order.end(), [](const Node* node) { return is_collective(*node); });
  program.parameters = std::move(w.parameters);
  program.outputs = outputs;
  return program;
}

}  // namespace detail

Program build_program(const std::vector<NodePtr>& outputs, const std::string& name, const Donatable& donatable,
                      int64_t num_replicas) {
  detail::check_outputs(outputs);
  detail::Walk w = detail::walk(outputs);
  const std::vector<bool> donate = detail::donations(w, donatable);
  return detail::emit(std::move(w), outputs, donate, name, num_replicas);
}

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
  return Node::op("all_reduce", {x}, x->type(), Attributes{}.add(op).add(groups),
                  [op, groups](stablehlo::Function& f, const std::vector<stablehlo::Value>& in) {
                    return f.all_reduce(in[0], op, groups);
                  });
}

NodePtr all_gather(const NodePtr& x, int64_t dim, const stablehlo::ReplicaGroups& groups) {
  check_dim("all_gather", x, dim);
  stablehlo::Type type = x->type();
  type.dims[static_cast<size_t>(dim)] *= group_size("all_gather", groups);
  return Node::op("all_gather", {x}, type, Attributes{}.add(dim).add(groups),
                  [dim, groups](stablehlo::Function& f, const std::vector<stablehlo::Value>& in) {
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
                  Attributes{}.add(dim).add(op).add(groups),
                  [dim, op, groups](stablehlo::Function& f, const std::vector<stablehlo::Value>& in) {
                    return f.reduce_scatter(in[0], dim, op, groups);
                  });
}

}  // namespace strata::xla::lazy
