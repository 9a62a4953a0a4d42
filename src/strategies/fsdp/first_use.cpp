// The fallback of kFirstUseKey (Note [Gather on first use]): finds the
// parameters whose storage is empty among an operator's arguments, has
// their units gathered, and runs the operator below the key.
#include "first_use.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <mutex>
#include <utility>
#include <vector>

#include "fsdp_state.h"
#include "strata/core/error.h"

namespace strata::strategies::detail {
namespace {

// Reaches a TensorImpl's dispatch key set (protected in c10).
struct KeySetAccess : c10::TensorImpl {
  static c10::DispatchKeySet& of(c10::TensorImpl& impl) { return impl.*(&KeySetAccess::key_set_); }
};

void delete_tag(void* context) { delete static_cast<std::shared_ptr<const FirstUseTag>*>(context); }

// One use of a parameter whose storage is empty.
struct Use {
  std::shared_ptr<FSDPState> state;
  size_t param;
  const c10::StorageImpl* storage;
};

void look_at(const at::Tensor& t, std::vector<Use>& uses) {
  if (!t.defined()) return;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->key_set().has(kFirstUseKey) || !impl->has_storage() || impl->numel() == 0) return;
  const c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
  if (storage->nbytes() != 0) return;  // gathered: the common case
  const FirstUseTag* tag = tag_of(*storage);
  if (tag == nullptr) return;
  std::shared_ptr<FSDPState> state = tag->state.lock();
  STRATA_CHECK(state != nullptr, ConfigError, "[fsdp] an operator used parameter '", tag->name,
               "' after its FSDP strategy was torn down: its full value was sharded and is gone. Read full values "
               "before teardown (full_parameter, summon_full_params or a full checkpoint)");
  uses.push_back({std::move(state), tag->param, storage});
}

void first_use_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  std::vector<Use> uses;
  for (const c10::IValue& arg : torch::jit::last(*stack, op.schema().arguments().size())) {
    if (arg.isTensor()) {
      look_at(arg.toTensor(), uses);
    } else if (arg.isList()) {  // Tensor[] and Tensor?[] (an LSTM's weights, index's indices)
      for (const c10::IValue& item : arg.toListRef()) {
        if (item.isTensor()) look_at(item.toTensor(), uses);
      }
    }
  }
  if (!uses.empty()) {
    NoFirstUse internal;
    // Each module set up gathers its own units (usually there is one).
    std::vector<bool> done(uses.size(), false);
    for (size_t i = 0; i < uses.size(); ++i) {
      if (done[i]) continue;
      std::vector<std::pair<size_t, const c10::StorageImpl*>> mine;
      for (size_t j = i; j < uses.size(); ++j) {
        if (uses[j].state != uses[i].state) continue;
        mine.emplace_back(uses[j].param, uses[j].storage);
        done[j] = true;
      }
      uses[i].state->gather_on_first_use(mine);
    }
  }
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kFirstUseKey), stack);
}

}  // namespace

void enable_first_use() {
  static std::once_flag once;
  std::call_once(once, [] {
    STRATA_CHECK(!c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(kFirstUseKey), Error,
                 "[fsdp] another library registered a fallback for dispatch key ", kFirstUseKey,
                 ", which FSDP needs to gather its units on first use (Note [Gather on first use]); torchdistx's "
                 "deferred_init cannot be loaded together with strata's FSDP");
    // Lives as long as the process: the fallback must outlive every model.
    static auto* library = new torch::Library(torch::Library::IMPL, "_", kFirstUseKey, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&first_use_fallback>());
  });
}

void intercept(at::Tensor& t) {
  c10::DispatchKeySet& keys = KeySetAccess::of(*t.unsafeGetTensorImpl());
  keys = keys.add(kFirstUseKey);
}

c10::DataPtr tagged_empty(std::shared_ptr<const FirstUseTag> tag, c10::Device device) {
  return c10::DataPtr(nullptr, new std::shared_ptr<const FirstUseTag>(std::move(tag)), &delete_tag, device);
}

const FirstUseTag* tag_of(const c10::StorageImpl& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get() != nullptr || data.get_deleter() != &delete_tag) return nullptr;
  return static_cast<const std::shared_ptr<const FirstUseTag>*>(data.get_context())->get();
}

}  // namespace strata::strategies::detail
