// Module and RNG state as named tensors (include/strata/checkpoint/state_dict.h);
// the optimizer's state is in optimizer_state.cpp.
//
// Loads validate everything before changing anything, so a failed load
// leaves the module exactly as it was.
#include "strata/checkpoint/state_dict.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <unordered_map>

#include "state_messages.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"

namespace strata::checkpoint {

using ::strata::detail::cat;

namespace state_messages {

// "'a', 'b', ... and K more" (the first kListedKeys names).
std::string key_list(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kListedKeys; ++i)
    out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > kListedKeys) out += cat(" and ", keys.size() - kListedKeys, " more");
  return out;
}

std::string plural(size_t n, const char* word) {
  return cat(n, " ", word, n == 1 ? "" : "s");
}

// Throws the strict-load error for `report`, when it is not ok.
void check_strict(const LoadReport& report, const std::string& source, const char* what) {
  if (report.ok()) return;
  std::string message = cat("[checkpoint] ", source, ": ", what, " do not match (strict load):");
  if (!report.missing.empty())
    message += cat(" ", plural(report.missing.size(), "missing key"), ": ", key_list(report.missing),
                   report.unexpected.empty() ? "" : ";");
  if (!report.unexpected.empty())
    message += cat(" ", plural(report.unexpected.size(), "unexpected key"), ": ",
                   key_list(report.unexpected));
  message += ". Load with strict=false to take the matching keys only";
  throw CheckpointError(message);
}

std::unordered_map<std::string, at::Tensor> index_tensors(const NamedTensors& tensors,
                                                          const std::string& source) {
  std::unordered_map<std::string, at::Tensor> index;
  for (const auto& [name, tensor] : tensors)
    STRATA_CHECK(index.emplace(name, tensor).second, CheckpointError, "[checkpoint] ", source,
                 ": key '", name, "' appears twice");
  return index;
}

}  // namespace state_messages

using namespace state_messages;

// ---- module state ---------------------------------------------------------------

NamedTensors module_state(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    out.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  return out;
}

LoadReport load_module_state(torch::nn::Module& module, const NamedTensors& tensors, bool strict,
                             const std::string& source) {
  const auto index = index_tensors(tensors, source);
  const NamedTensors targets = module_state(module);
  LoadReport report;
  std::set<std::string> expected;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (target, source)
  for (const auto& [name, target] : targets) {
    expected.insert(name);
    auto it = index.find(name);
    if (it == index.end()) {
      report.missing.push_back(name);
      continue;
    }
    const at::Tensor& value = it->second;
    STRATA_CHECK(value.defined(), CheckpointError, "[checkpoint] ", source, ": key '", name,
                 "' holds an undefined tensor");
    STRATA_CHECK(value.sizes() == target.sizes(), CheckpointError, "[checkpoint] ", source,
                 ": key '", name, "' has shape ", shape_string(value.sizes()),
                 " but the module's has shape ", shape_string(target.sizes()));
    STRATA_CHECK(value.scalar_type() == target.scalar_type(), CheckpointError, "[checkpoint] ",
                 source, ": key '", name, "' has dtype ", c10::toString(value.scalar_type()),
                 " but the module's has dtype ", c10::toString(target.scalar_type()));
    copies.emplace_back(target, value);
  }
  for (const auto& [name, tensor] : tensors)
    if (!expected.count(name)) report.unexpected.push_back(name);
  if (strict) check_strict(report, source, "the module's keys");

  torch::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(value);
  return report;
}


ParamNames param_names(const torch::nn::Module& module) {
  ParamNames names;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  return names;
}

// ---- RNG state ------------------------------------------------------------------

namespace {

// Note [Generator state]
// Every device's default generator exposes its state as a uint8 CPU
// tensor (CPU: the mt19937 state; CUDA: the Philox seed and offset) through
// at::Generator, so one pair of functions serves every device. The state
// is checked before it reaches the generator, whose own checks report
// device-specific text; a refused state leaves the generator as it was.
at::Tensor rng_state_of(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state_of(at::Generator generator, const std::string& what, const at::Tensor& state,
                      const std::string& source) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor previous = generator.get_state();
  const int64_t expected = previous.numel();
  STRATA_CHECK(state.defined() && state.scalar_type() == at::kByte && state.dim() == 1 &&
                   state.numel() == expected,
               CheckpointError, "[checkpoint] ", source, ": ", what, " RNG state must be a 1-D uint8 tensor of ",
               expected, " bytes, got ",
               state.defined() ? cat(c10::toString(state.scalar_type()), " ",
                                     shape_string(state.sizes()))
                               : std::string("an undefined tensor"));
  // The generator checks the contents (an all-zero CPU state is refused as
  // "Invalid mt19937 state"); report that as a checkpoint error.
  try {
    generator.set_state(state.cpu().contiguous());
  } catch (const c10::Error& e) {
    try {
      generator.set_state(previous);
    } catch (const c10::Error&) {
    }
    throw CheckpointError(cat("[checkpoint] ", source, ": not a valid ", what, " generator state (",
                              e.what_without_backtrace(), ")"));
  }
}

}  // namespace

at::Tensor cpu_rng_state() { return rng_state_of(at::detail::getDefaultCPUGenerator()); }

void set_cpu_rng_state(const at::Tensor& state, const std::string& source) {
  set_rng_state_of(at::detail::getDefaultCPUGenerator(), "CPU", state, source);
}

at::Tensor device_rng_state(c10::Device device) {
  if (device.is_cpu()) return cpu_rng_state();
  return rng_state_of(at::globalContext().defaultGenerator(device));
}

void set_device_rng_state(c10::Device device, const at::Tensor& state, const std::string& source) {
  if (device.is_cpu()) return set_cpu_rng_state(state, source);
  set_rng_state_of(at::globalContext().defaultGenerator(device), device.str(), state, source);
}

}  // namespace strata::checkpoint
