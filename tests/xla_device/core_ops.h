// The core ATen operators (docs/xla-core-ops.txt, written by
// scripts/core_aten_ops.py) classified for the xla device against the live
// dispatcher, after strata::xla::init() registered the device's kernels:
//   lowered     a PrivateUse1 kernel of strata's, on the op itself or, for a
//               structured op whose functional and in-place forms LibTorch
//               derives from its .out form
//               (CompositeExplicitAutogradNonFunctional), on that .out form;
//   decomposed  a CompositeImplicitAutograd or CompositeExplicitAutograd
//               kernel rewrites it into other ops on any device;
//   fallback    the boxed CPU fallback runs LibTorch's CPU kernel (for a
//               structured op, through its .out form);
//   refused     neither: no CPU kernel either, so the fallback cannot run
//               it and fails naming the op.
// docs/xla.md's "Core ATen coverage" table is rendered from this
// (core_ops_test.cpp keeps it equal), and the conformance test samples
// every op classified lowered.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::testing {

/// The committed core op list, `aten::name.overload` a line.
inline std::vector<std::string> core_op_list() {
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  const std::string path = std::string(source != nullptr ? source : ".") + "/docs/xla-core-ops.txt";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path + ": run scripts/core_aten_ops.py");
  std::vector<std::string> ops;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') ops.push_back(line);
  return ops;
}

/// "aten::add.Tensor" -> {"aten::add", "Tensor"}.
inline c10::OperatorName parse_operator_name(const std::string& op) {
  const auto dot = op.find('.', op.find("::") + 2);
  if (dot == std::string::npos) return {op, ""};
  return {op.substr(0, dot), op.substr(dot + 1)};
}

/// "aten::add" + "out" -> "aten::add.out".
inline std::string to_string(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

enum class CoreOpClass { kLowered, kDecomposed, kFallback, kRefused };

inline const char* to_string(CoreOpClass c) {
  switch (c) {
    case CoreOpClass::kLowered: return "lowered";
    case CoreOpClass::kDecomposed: return "decomposed";
    case CoreOpClass::kFallback: return "CPU fallback";
    case CoreOpClass::kRefused: return "refused";
  }
  return "?";
}

struct CoreOp {
  std::string name;
  CoreOpClass kind = CoreOpClass::kFallback;
  std::string how;  ///< the kernel that decides it, for a person
};

namespace detail {

/// The out= form of a functional or in-place op: the overload of the same
/// name with out arguments whose other arguments are the op's (by name and
/// type), as torchgen pairs them.
inline std::optional<c10::OperatorHandle> out_form(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  auto inputs_of = [](const c10::FunctionSchema& s) {
    std::vector<std::string> args;
    for (const auto& a : s.arguments())
      if (!a.is_out()) args.push_back(a.name() + ":" + a.type()->str());
    return args;
  };
  const auto want = inputs_of(schema);
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name != schema.name() || name == schema.operator_name()) continue;
    auto handle = c10::Dispatcher::singleton().findOp(name);
    if (!handle) continue;
    const auto& other = handle->schema();
    const bool has_out =
        std::any_of(other.arguments().begin(), other.arguments().end(), [](const auto& a) { return a.is_out(); });
    if (has_out && inputs_of(other) == want) return handle;
  }
  return std::nullopt;
}

}  // namespace detail

/// `op` (an `aten::name.overload`) classified for the PrivateUse1 device.
/// Call after strata::xla::init().
inline CoreOp classify_core_op(const std::string& op) {
  using c10::DispatchKey;
  CoreOp out{op};
  auto handle = c10::Dispatcher::singleton().findOp(parse_operator_name(op));
  if (!handle) {
    out.kind = CoreOpClass::kRefused;
    out.how = "not in this LibTorch's dispatcher";
    return out;
  }
  if (handle->hasKernelForDispatchKey(DispatchKey::PrivateUse1)) {
    out.kind = CoreOpClass::kLowered;
    out.how = "PrivateUse1 kernel";
    return out;
  }
  if (handle->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional)) {
    // A structured op: LibTorch computes the functional and in-place forms
    // through the .out form's kernel on a device that has no kernel of its own.
    if (auto form = detail::out_form(*handle)) {
      const std::string via = to_string(form->operator_name());
      if (form->hasKernelForDispatchKey(DispatchKey::PrivateUse1)) {
        out.kind = CoreOpClass::kLowered;
        out.how = "through " + via;
        return out;
      }
      if (form->hasKernelForDispatchKey(DispatchKey::CPU)) {
        out.kind = CoreOpClass::kFallback;
        out.how = "through " + via;
        return out;
      }
      // Otherwise the .out form is the one LibTorch generates from the
      // functional kernel, which decomposes (copy, slice_scatter).
    }
    out.kind = CoreOpClass::kDecomposed;
    out.how = "CompositeExplicitAutogradNonFunctional";
    return out;
  }
  if (handle->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd)) {
    out.kind = CoreOpClass::kDecomposed;
    out.how = "CompositeExplicitAutograd";
    return out;
  }
  if (handle->hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd)) {
    out.kind = CoreOpClass::kDecomposed;
    out.how = "CompositeImplicitAutograd";
    return out;
  }
  if (handle->hasKernelForDispatchKey(DispatchKey::CPU)) {
    out.kind = CoreOpClass::kFallback;
    out.how = "CPU kernel";
    return out;
  }
  out.kind = CoreOpClass::kRefused;
  out.how = "no CPU kernel";
  return out;
}

/// Every listed core op, classified.
inline std::vector<CoreOp> classify_core_ops() {
  std::vector<CoreOp> ops;
  for (const auto& name : core_op_list()) ops.push_back(classify_core_op(name));
  return ops;
}

/// The markdown table of docs/xla.md's "Core ATen coverage": a count line,
/// then one row per op in the list's order.
inline std::string core_ops_table(const std::vector<CoreOp>& ops) {
  int counts[4] = {0, 0, 0, 0};
  for (const auto& op : ops) ++counts[static_cast<int>(op.kind)];
  std::ostringstream s;
  s << ops.size() << " core operators: " << counts[0] << " lowered, " << counts[1] << " decomposed, " << counts[2]
    << " through the CPU fallback, " << counts[3] << " refused.\n\n";
  s << "| operator | on xla | how |\n|---|---|---|\n";
  for (const auto& op : ops) s << "| `" << op.name << "` | " << to_string(op.kind) << " | " << op.how << " |\n";
  return s.str();
}

}  // namespace strata::testing
