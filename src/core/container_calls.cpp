// A Sequential's calls to its children, routed through forward hooks
// (core/container_calls.h).
//
// Note [Routed entries]
// A Sequential's forward calls its entries, type-erased AnyModules: an
// AnyModule forwards a vector of AnyValues to its holder, a class template
// over the module type and the forward's argument types. An AnyModule
// built from RoutedEntry (whose forward takes nothing) gets the holder
// AnyModuleHolder<RoutedEntry>, which this file specialises: it takes any
// number of values and hands them to the entry, which calls the original
// AnyModule inside the child's hooks. The holder's ptr() is the child, so
// `seq[i]` is unchanged; its type is RoutedEntry's, so LibTorch's typed
// getters (`seq->at<T>(i)`) refuse rather than cast.
//
// Note [Sequential's own forward]
// SequentialImpl::forward is a template that callers invoke directly; it
// has no hook. But it starts at entry 0 and ends at the last entry. When
// the Sequential has hooks, entry 0 runs the whole chain (each child
// through its own hooks) as the body of the Sequential's hooks, and the
// entries after it hand that result on untouched. The result is the same
// as the plain chain, and the hooks see the Sequential's forward whole,
// so it can be recomputed in backward or be FSDP's root.
#include "strata/core/container_calls.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "strata/core/error.h"
#include "strata/core/module_hooks.h"

namespace strata::detail {

class RoutedEntry;

// The routes of one Sequential: its entries, and how many of them are
// still to hand entry 0's chain on.
struct SequentialRoute {
  std::weak_ptr<torch::nn::Module> sequential;
  std::vector<std::weak_ptr<RoutedEntry>> entries;
  size_t pass_on = 0;
};

// What a routed forward returned, so that it is rebuilt as the same type.
enum class OutputKind { kTensor, kVector, kPair, kTriple };

class RoutedEntry : public torch::nn::Module {
 public:
  RoutedEntry(std::shared_ptr<SequentialRoute> route, size_t index, torch::nn::AnyModule original)
      : torch::nn::Module("strata::RoutedEntry"),
        route_(std::move(route)),
        index_(index),
        original_(std::move(original)) {}

  // Never called: AnyModule needs a forward to pick its holder, which is
  // the specialisation below.
  at::Tensor forward() { throw Error("[strata] RoutedEntry::forward is not called directly"); }

  const torch::nn::AnyModule& original() const { return original_; }

  // The entry's call from the Sequential (Note [Sequential's own forward]).
  torch::nn::AnyValue call(std::vector<torch::nn::AnyValue>&& args) {
    std::shared_ptr<SequentialRoute> route = route_.lock();
    if (route && index_ > 0 && route->pass_on > 0) {
      --route->pass_on;
      return std::move(args.at(0));
    }
    if (route && index_ == 0) {
      route->pass_on = 0;
      std::shared_ptr<torch::nn::Module> sequential = route->sequential.lock();
      if (sequential && hooks_pending(*sequential)) {
        torch::nn::AnyValue out = run_hooked(*sequential, std::move(args), [route](std::vector<torch::nn::AnyValue> a) {
          return chain(*route, std::move(a));
        });
        route->pass_on = route->entries.size() - 1;
        return out;
      }
    }
    return call_child(std::move(args));
  }

  // The child's forward, through the child's hooks.
  torch::nn::AnyValue call_child(std::vector<torch::nn::AnyValue>&& args) {
    torch::nn::AnyModule original = original_;
    return run_hooked(*original_.ptr(), std::move(args), [original](std::vector<torch::nn::AnyValue> a) mutable {
      return invoke(original, std::move(a));
    });
  }

 private:
  using Fn = std::function<torch::nn::AnyValue(std::vector<torch::nn::AnyValue>)>;

  static torch::nn::AnyValue chain(SequentialRoute& route, std::vector<torch::nn::AnyValue> args) {
    std::vector<std::shared_ptr<RoutedEntry>> entries;
    for (const auto& weak : route.entries) {
      std::shared_ptr<RoutedEntry> entry = weak.lock();
      STRATA_CHECK(entry != nullptr, Error, "[strata] a routed Sequential lost an entry while it ran");
      entries.push_back(std::move(entry));
    }
    torch::nn::AnyValue x = entries.at(0)->call_child(std::move(args));
    for (size_t i = 1; i < entries.size(); ++i) {
      std::vector<torch::nn::AnyValue> next;
      next.push_back(std::move(x));
      x = entries[i]->call_child(std::move(next));
    }
    return x;
  }

  // The original AnyModule's forward on a runtime list of arguments.
  static torch::nn::AnyValue invoke(torch::nn::AnyModule& m, std::vector<torch::nn::AnyValue> a) {
    switch (a.size()) {
      case 0: return m.any_forward();
      case 1: return m.any_forward(std::move(a[0]));
      case 2: return m.any_forward(std::move(a[0]), std::move(a[1]));
      case 3: return m.any_forward(std::move(a[0]), std::move(a[1]), std::move(a[2]));
      case 4: return m.any_forward(std::move(a[0]), std::move(a[1]), std::move(a[2]), std::move(a[3]));
      case 5:
        return m.any_forward(std::move(a[0]), std::move(a[1]), std::move(a[2]), std::move(a[3]), std::move(a[4]));
      case 6:
        return m.any_forward(std::move(a[0]), std::move(a[1]), std::move(a[2]), std::move(a[3]), std::move(a[4]),
                             std::move(a[5]));
      default:
        throw ConfigError("[strata] a Sequential entry (" + m.ptr()->name() + ") got " + std::to_string(a.size()) +
                          " arguments; strata routes at most 6");
    }
  }

  static std::vector<at::Tensor> to_tensors(torch::nn::AnyValue& out, OutputKind& kind, const std::string& module) {
    if (auto* t = out.try_get<at::Tensor>()) {
      kind = OutputKind::kTensor;
      return {*t};
    }
    if (auto* v = out.try_get<std::vector<at::Tensor>>()) {
      kind = OutputKind::kVector;
      return *v;
    }
    if (auto* p = out.try_get<std::tuple<at::Tensor, at::Tensor>>()) {
      kind = OutputKind::kPair;
      return {std::get<0>(*p), std::get<1>(*p)};
    }
    if (auto* p = out.try_get<std::tuple<at::Tensor, at::Tensor, at::Tensor>>()) {
      kind = OutputKind::kTriple;
      return {std::get<0>(*p), std::get<1>(*p), std::get<2>(*p)};
    }
    throw ConfigError("[strata] the forward of " + module + " returns " + c10::demangle(out.type_info().name()) +
                      "; a module that a strategy runs through its hooks (an FSDP unit, an activation-checkpointed "
                      "module) must return a tensor, a std::vector of tensors or a std::tuple of 2 or 3 tensors");
  }

  static torch::nn::AnyValue from_tensors(std::vector<at::Tensor> t, OutputKind kind) {
    switch (kind) {
      case OutputKind::kTensor: return torch::nn::AnyValue(std::move(t.at(0)));
      case OutputKind::kVector: return torch::nn::AnyValue(std::move(t));
      case OutputKind::kPair: return torch::nn::AnyValue(std::make_tuple(t.at(0), t.at(1)));
      case OutputKind::kTriple: return torch::nn::AnyValue(std::make_tuple(t.at(0), t.at(1), t.at(2)));
    }
    throw Error("[strata] unknown output kind");
  }

  // Runs fn(args) as `module`'s forward through its hooks: the tensor
  // arguments are the forward's inputs, the others are kept as they are.
  static torch::nn::AnyValue run_hooked(torch::nn::Module& module, std::vector<torch::nn::AnyValue>&& args,
                                        const Fn& fn) {
    if (!hooks_pending(module)) return fn(std::move(args));
    TensorList inputs;
    std::vector<bool> is_tensor;
    for (torch::nn::AnyValue& a : args) {
      at::Tensor* t = a.try_get<at::Tensor>();
      is_tensor.push_back(t != nullptr);
      if (t) inputs.push_back(*t);
    }
    auto kind = std::make_shared<OutputKind>(OutputKind::kTensor);
    // The body keeps copies of the other arguments: it may run again in
    // backward.
    auto kept = std::make_shared<std::vector<torch::nn::AnyValue>>(std::move(args));
    std::string name = module.name();
    ForwardFn body = [fn, kept, is_tensor, kind, name](const TensorList& in) {
      std::vector<torch::nn::AnyValue> call_args;
      size_t next = 0;
      for (size_t i = 0; i < kept->size(); ++i) {
        if (is_tensor[i]) call_args.emplace_back(in.at(next++));
        else call_args.push_back((*kept)[i]);
      }
      torch::nn::AnyValue out = fn(std::move(call_args));
      return to_tensors(out, *kind, name);
    };
    return from_tensors(hooked_forward(module, inputs, body), *kind);
  }

  std::weak_ptr<SequentialRoute> route_;
  size_t index_;
  torch::nn::AnyModule original_;
};

}  // namespace strata::detail

namespace torch::nn {

// Note [Routed entries]: the holder of an AnyModule built from a
// RoutedEntry takes any arguments and hands them to the entry.
template <>
struct AnyModuleHolder<strata::detail::RoutedEntry> : public AnyModulePlaceholder {
  explicit AnyModuleHolder(std::shared_ptr<strata::detail::RoutedEntry>&& entry)
      : AnyModulePlaceholder(typeid(strata::detail::RoutedEntry)), module(std::move(entry)) {}
  AnyModuleHolder(const AnyModuleHolder& other) : AnyModulePlaceholder(other.type_info), module(other.module) {}

  AnyValue forward(std::vector<AnyValue>&& arguments) override { return module->call(std::move(arguments)); }
  std::shared_ptr<Module> ptr() override { return module->original().ptr(); }
  std::unique_ptr<AnyModulePlaceholder> copy() const override { return std::make_unique<AnyModuleHolder>(*this); }
  // A clone is a plain copy of the child, without routes.
  std::unique_ptr<AnyModulePlaceholder> clone_module(std::optional<Device> device) const override {
    return std::make_unique<AnyModuleHolder>(
        std::make_shared<strata::detail::RoutedEntry>(nullptr, 0, module->original().clone(device)));
  }

  std::shared_ptr<strata::detail::RoutedEntry> module;
};

}  // namespace torch::nn

namespace strata {
namespace {

class SequentialRoutes : public ContainerRoutes {
 public:
  struct Routed {
    std::weak_ptr<torch::nn::SequentialImpl> sequential;
    std::shared_ptr<detail::SequentialRoute> route;
  };

  ~SequentialRoutes() override { restore(); }

  void restore() override {
    for (Routed& routed : routed_) {
      std::shared_ptr<torch::nn::SequentialImpl> sequential = routed.sequential.lock();
      if (!sequential) continue;
      for (torch::nn::AnyModule& entry : *sequential) {
        if (entry.is_empty() || entry.type_info() != typeid(detail::RoutedEntry)) continue;
        torch::nn::AnyModule original = entry.get<detail::RoutedEntry>().original();
        entry = std::move(original);
      }
    }
    routed_.clear();
  }

  size_t size() const override { return routed_.size(); }

  void route(const std::shared_ptr<torch::nn::SequentialImpl>& sequential) {
    if (sequential->is_empty()) return;
    bool hooked = forward_hooks(*sequential) != nullptr;
    for (const torch::nn::AnyModule& entry : *sequential) {
      if (entry.type_info() == typeid(detail::RoutedEntry)) return;  // routed already
      hooked = hooked || forward_hooks(*entry.ptr()) != nullptr;
    }
    if (!hooked) return;  // nothing to route: the Sequential stays untouched
    auto route = std::make_shared<detail::SequentialRoute>();
    route->sequential = sequential;
    size_t index = 0;
    for (torch::nn::AnyModule& entry : *sequential) {
      auto routed = std::make_shared<detail::RoutedEntry>(route, index++, entry);
      route->entries.push_back(routed);
      entry = torch::nn::AnyModule(std::move(routed));
    }
    routed_.push_back({sequential, std::move(route)});
  }

 private:
  std::vector<Routed> routed_;
};

}  // namespace

std::unique_ptr<ContainerRoutes> route_container_calls(torch::nn::Module& root) {
  auto routes = std::make_unique<SequentialRoutes>();
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  if (auto* self = dynamic_cast<torch::nn::SequentialImpl*>(&root)) {
    // The root is usually owned by a shared_ptr (a module holder).
    try {
      routes->route(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(self->shared_from_this()));
    } catch (const std::bad_weak_ptr&) {
      throw ConfigError("[strata] a Sequential that is not owned by a std::shared_ptr cannot be routed; build it as "
                        "torch::nn::Sequential (a module holder)");
    }
  }
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (auto sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(item.value())) routes->route(sequential);
  }
  return routes;
}

}  // namespace strata
