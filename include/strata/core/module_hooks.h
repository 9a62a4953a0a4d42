// Forward hooks for LibTorch C++ modules.
//
// LibTorch's C++ modules have no forward hooks: forward() is an ordinary,
// non-virtual member function that callers invoke directly. A strategy that
// must act around a module's forward (FSDP gathers a unit's parameters
// before it and frees them after; activation checkpointing recomputes it
// during backward) therefore needs the module to run its forward through
// one call:
//
//   at::Tensor BlockImpl::forward(const at::Tensor& x) {
//     return strata::hooked_forward(*this, x, [&](const at::Tensor& x) {
//       auto h = x + attn->forward(ln1->forward(x));
//       return h + mlp->forward(ln2->forward(h));
//     });
//   }
//
// Any number of tensors in and out (the body returns a tensor, a
// std::tuple of tensors or a std::vector of them):
//
//   auto [y, state] = strata::hooked_forward(*this,
//       [&](const at::Tensor& x, const at::Tensor& h) { return std::make_tuple(f(x, h), g(h)); }, x, h);
//
// Without a strategy's hooks on the module, hooked_forward(m, x, body) is
// body(x). The body may run more than once (activation checkpointing runs
// it again in backward), so it must depend only on its inputs and the
// module's parameters and buffers.
//
// A module needs none of this when a container calls it: strategies route
// the calls a torch::nn::Sequential makes to its children, and the
// Sequential's own forward, through the hooks (core/container_calls.h).
// Only a direct call of a typed forward (`fc1->forward(x)`) is invisible;
// the caller opts in with one line:
//
//   auto h = strata::call(fc1, x);   // instead of fc1->forward(x)
//
// FSDP does not need either to shard a module: it gathers a unit on the
// first use of its parameters (Note [Gather on first use] in
// src/strategies/fsdp/first_use.h). A forward seen whole is its fast path
// (freed right after the forward), and activation checkpointing needs it
// to run the forward again in backward.
//
// Hooks never run twice around one forward: a module whose own forward
// calls hooked_forward may also be called through strata::call or by a
// Sequential.
//
// Note [Hooks live in the module]
// A strategy's hooks are kept by the module itself, in a child module
// without parameters or buffers (named kForwardHooksName) that
// set_forward_hooks registers and removes. They live and die with the
// module: a module freed and another one built at the same address never
// share hooks, and nothing outside the module maps addresses to hooks.
#pragma once

#include <ATen/core/Tensor.h>

#include <concepts>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace strata {

/// Tensors in or out of a forward.
using TensorList = std::vector<at::Tensor>;
/// A module's forward computation, from its input tensors to its outputs.
using ForwardFn = std::function<TensorList(const TensorList&)>;
/// The one-tensor form of a forward computation.
using ForwardBody = std::function<at::Tensor(const at::Tensor&)>;

/// What a strategy does around the forward of a module it hooked.
class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  /// Runs `body(inputs)` as `module`'s forward, with the strategy's work
  /// around it, and returns the outputs.
  virtual TensorList run(torch::nn::Module& module, const TensorList& inputs, const ForwardFn& body) = 0;
};

/// The name of the child module that holds a module's hooks.
inline constexpr const char* kForwardHooksName = "strata_forward_hooks";

/// Sets the hooks of `module` (replacing any), or removes them when
/// `hooks` is null. Strategies call this from setup_module and teardown.
void set_forward_hooks(torch::nn::Module& module, std::shared_ptr<ForwardHooks> hooks);

/// The hooks set on `module`, or null.
std::shared_ptr<ForwardHooks> forward_hooks(const torch::nn::Module& module);

/// The child that holds the hooks of `module`, not owned (expired, or
/// empty when none are set): it expires when the module is destroyed, so
/// a strategy can tell whether a module no shared_ptr owns is still there
/// without touching it (Note [Modules held by value] in
/// strategies/strategy.h).
std::weak_ptr<const torch::nn::Module> forward_hooks_holder(const torch::nn::Module& module);

/// True for the child module that holds hooks (walks over a model's
/// modules skip it).
bool is_forward_hooks_holder(const torch::nn::Module& module);

/// Runs `module`'s forward `body(inputs)` through the hooks a strategy set
/// on `module`; body(inputs) when there are none.
TensorList hooked_forward(torch::nn::Module& module, const TensorList& inputs, const ForwardFn& body);

/// The one-tensor form.
at::Tensor hooked_forward(torch::nn::Module& module, const at::Tensor& input, const ForwardBody& body);

/// True when hooked_forward(module, ...) would run hooks now: some are set
/// and module's forward is not already running inside them on this thread.
bool hooks_pending(const torch::nn::Module& module);

namespace detail {

/// A tensor, or a std::tuple of tensors and such tuples (an LSTM returns
/// std::tuple<Tensor, std::tuple<Tensor, Tensor>>).
template <class T>
struct IsTensorTree : std::bool_constant<std::same_as<T, at::Tensor>> {};
template <class... Ts>
struct IsTensorTree<std::tuple<Ts...>> : std::bool_constant<(IsTensorTree<Ts>::value && ...)> {};

template <class T>
void append_leaves(TensorList& out, const T& value) {
  if constexpr (std::same_as<T, at::Tensor>) {
    out.push_back(value);
  } else {
    std::apply([&](const auto&... parts) { (append_leaves(out, parts), ...); }, value);
  }
}

template <class Out>
TensorList to_list(Out&& out) {
  using T = std::decay_t<Out>;
  if constexpr (std::same_as<T, TensorList>) {
    return std::forward<Out>(out);
  } else {
    TensorList list;
    append_leaves(list, out);
    return list;
  }
}

// The tree `Out` from the tensors of `list` from `next` on, in order.
template <class Out>
Out take_leaves(const TensorList& list, size_t& next) {
  if constexpr (std::same_as<Out, at::Tensor>) {
    return list.at(next++);
  } else {
    // A braced list evaluates its elements left to right.
    return [&]<size_t... I>(std::index_sequence<I...>) { return Out{take_leaves<std::tuple_element_t<I, Out>>(list, next)...}; }
    (std::make_index_sequence<std::tuple_size_v<Out>>());
  }
}

template <class Out>
Out from_list(TensorList list) {
  if constexpr (std::same_as<Out, TensorList>) {
    return list;
  } else {
    size_t next = 0;
    return take_leaves<Out>(list, next);
  }
}

}  // namespace detail

/// The variadic form: `body(inputs...)` returns a tensor, a tuple of
/// tensors (nested tuples too: an LSTM's output and state) or a vector of
/// tensors; hooked_forward returns the same type.
template <class Body, class... Inputs>
  requires(sizeof...(Inputs) > 0 && (std::same_as<std::decay_t<Inputs>, at::Tensor> && ...) &&
           std::invocable<const std::decay_t<Body>&, const Inputs&...>)
auto hooked_forward(torch::nn::Module& module, Body&& body, const Inputs&... inputs) {
  using Out = std::decay_t<std::invoke_result_t<const std::decay_t<Body>&, const Inputs&...>>;
  static_assert(std::same_as<Out, TensorList> || detail::IsTensorTree<Out>::value,
                "hooked_forward: the body must return at::Tensor, std::vector<at::Tensor> or a std::tuple of tensors "
                "(tuples of tensors may nest)");
  // A copy of the body: activation checkpointing keeps it until backward.
  ForwardFn fn = [body = std::decay_t<Body>(std::forward<Body>(body))](const TensorList& in) {
    return [&]<size_t... I>(std::index_sequence<I...>) { return detail::to_list(body(in.at(I)...)); }
    (std::index_sequence_for<Inputs...>());
  };
  return detail::from_list<Out>(hooked_forward(module, TensorList{inputs...}, fn));
}

/// Calls `module`'s typed forward through the hooks a strategy set on it:
/// `strata::call(fc1, x)` is `fc1->forward(x)` for a module that an FSDP
/// unit or activation checkpointing may wrap. `module` is a LibTorch module
/// holder (torch::nn::Linear) or a std::shared_ptr to a module; its forward
/// takes the tensors given and returns a tensor, a vector or a tuple of
/// tensors, nested tuples included (torch::nn::LSTM, GRU and
/// MultiheadAttention called with their input tensors only).
template <class Module, class... Inputs>
  requires(sizeof...(Inputs) > 0 && (std::same_as<std::decay_t<Inputs>, at::Tensor> && ...))
auto call(const Module& module, const Inputs&... inputs) {
  auto ptr = [&] {
    if constexpr (requires { module.ptr(); }) return module.ptr();
    else return module;
  }();
  return hooked_forward(
      *ptr, [ptr](const Inputs&... in) { return ptr->forward(in...); }, inputs...);
}

/// Called by a model's constructor when a submodule that may become a
/// sharded unit is complete (the example GPT: after each block), so that a
/// strategy's module_sharded_context can shard it at once and the whole
/// model never exists unsharded. Does nothing unless a handler is set.
void module_built(torch::nn::Module& module);

/// What module_built calls on this thread.
using ModuleBuiltHandler = std::function<void(torch::nn::Module&)>;
/// Sets the handler of this thread (null: none); returns the previous one.
ModuleBuiltHandler set_module_built_handler(ModuleBuiltHandler handler);
/// True when module_built would call a handler on this thread.
bool module_built_handler_active();

/// While alive (on this thread), models that honour it skip initialising
/// their parameters, which are then to be loaded (a strategy's
/// module_init_context(empty_init=true)). The example models honour it;
/// LibTorch's built-in layers initialise in their constructors regardless.
class SkipParameterInit {
 public:
  SkipParameterInit();
  ~SkipParameterInit();
  SkipParameterInit(const SkipParameterInit&) = delete;
  SkipParameterInit& operator=(const SkipParameterInit&) = delete;
  /// True inside a SkipParameterInit scope on this thread.
  static bool active();

 private:
  bool previous_;
};

}  // namespace strata
