// Gathering a unit on the first use of its parameters (Note [Gather on
// first use]): the dispatch key that the compute tensors carry, the
// fallback behind it, and the tag that a parameter's empty storage keeps.
// Private to the strategies area.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstddef>
#include <memory>
#include <string>

namespace strata::strategies::detail {

class FSDPState;

/// Note [Gather on first use]
/// LibTorch's C++ modules have no forward hooks, and a model calls its
/// layers directly (`layers[i]->forward(x)`), so FSDP cannot rely on seeing
/// a unit's forward begin. It sees the parameters' use instead:
/// - every compute tensor (Note [FSDP parameters]) keeps its full shape at
///   all times; while its unit is not gathered its storage holds 0 bytes.
///   Shape checks (embedding's 2-D weight, conv's rank, an LSTM's flat
///   weights) pass, and no kernel ever sees a 0-element parameter;
/// - every compute tensor, and so every view of one, carries the dispatch
///   key kFirstUseKey. Its fallback looks at each tensor argument of the
///   operator (lists of tensors too); one whose storage is empty (numel > 0
///   and 0 bytes, a cheap test) names its unit through the tag kept in
///   that storage (FirstUseTag), and the unit is gathered before the
///   operator runs (FSDPState::gather_on_first_use). The operator is then
///   redispatched below the key.
/// The key is on the tensors, not in thread-local state, so it works on
/// autograd's threads too: in backward a saved view of a freed parameter
/// refills its unit the same way. Only operators that take a parameter pay
/// for the fallback (a boxed call, about a microsecond); activations carry
/// no key.
///
/// The key is DispatchKey::DeferredInit, an out-of-core functionality key
/// above autograd that LibTorch reserves for torchdistx and registers
/// nothing for; enable_first_use checks that no other fallback holds it.
/// Above autograd means the gather happens before autograd saves anything,
/// as a module forward hook would.
inline constexpr c10::DispatchKey kFirstUseKey = c10::DispatchKey::DeferredInit;

/// What the empty storage of a parameter's full value says about it.
struct FirstUseTag {
  std::weak_ptr<FSDPState> state;
  size_t param = 0;  ///< index in the state's parameters
  std::string name;  ///< the parameter's name, for errors
};

/// Registers the fallback of kFirstUseKey (once per process). Throws Error
/// when some other library registered one for that key.
void enable_first_use();

/// Makes `t` (a compute tensor) carry kFirstUseKey, so its views do too.
void intercept(at::Tensor& t);

/// A data pointer that holds no memory and keeps `tag` (for storages of
/// 0 bytes).
c10::DataPtr tagged_empty(std::shared_ptr<const FirstUseTag> tag, c10::Device device);

/// The tag kept by `storage`, or null (it holds memory, or is not FSDP's).
const FirstUseTag* tag_of(const c10::StorageImpl& storage);

/// While alive (on this thread), operators on compute tensors gather
/// nothing: FSDP's own work on them (set_data, the gathers themselves).
class NoFirstUse {
 public:
  NoFirstUse() = default;
  NoFirstUse(const NoFirstUse&) = delete;
  NoFirstUse& operator=(const NoFirstUse&) = delete;

 private:
  c10::impl::ExcludeDispatchKeyGuard guard_{kFirstUseKey};
};

}  // namespace strata::strategies::detail
