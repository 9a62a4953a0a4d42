// A LibTorch user's data as strata's: TorchDataset adapts a `torch::data`
// dataset (their own `Dataset<Self>` of `Example<>`, MNIST, or either
// `.map()`ped with transforms such as `Normalize` and `Stack<>`) to the
// data::Dataset interface, so strata's DistributedSampler gives each rank
// its share and strata's loaders batch it: the same global batches at any
// world size, resumable, prefetched to the device.
//
//   auto train = torch::data::datasets::MNIST(root).map(torch::data::transforms::Stack<>());
//   auto loader = fabric.setup_dataloader(std::move(train), strata::data::DataOptions().with_batch_size(64));
//
// Note [Examples through a torch::data dataset]
// A torch::data loader asks its dataset for a batch of indices at once
// (get_batch), and the dataset's batch transform (Stack<>) joins them.
// strata's loaders take one example at a time and stack them (that is
// what lets the sampler's positions, not the batch size, decide which
// examples a rank reads, and a checkpoint resume at any world size). So
// TorchDataset::get(i) asks for the batch of the one index i and takes its
// only example: per-example transforms (Normalize, Lambda) and Stack<> act
// exactly as in a torch::data loader. A batch transform that mixes the
// examples of a batch (a normalisation over the batch) would see batches
// of one: write it as a step of the model instead.
#pragma once

#include <c10/util/ArrayRef.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/error.h"
#include "strata/data/dataset.h"

namespace strata::data {

namespace detail {

template <class T, class = void>
struct is_torch_dataset : std::false_type {};
template <class T>
struct is_torch_dataset<T, std::void_t<typename T::SelfType, typename T::BatchType, typename T::BatchRequestType>>
    : std::bool_constant<
          std::is_base_of_v<torch::data::datasets::BatchDataset<typename T::SelfType, typename T::BatchType,
                                                                typename T::BatchRequestType>,
                            T> &&
          std::is_same_v<typename T::BatchRequestType, c10::ArrayRef<size_t>>> {};

template <class T>
inline constexpr bool always_false = false;

using TorchExample = torch::data::Example<at::Tensor, at::Tensor>;

// The one example of a batch of one index (Note [Examples through a
// torch::data dataset]): a vector of examples, or one stacked by Stack<>.
inline Example only_example(std::vector<TorchExample> batch, size_t index) {
  STRATA_CHECK(batch.size() == 1, ConfigError, "[data] the torch::data dataset returned ", batch.size(),
               " examples for the one index ", index, "; its get_batch must return one example per index");
  return {std::move(batch.front().data), std::move(batch.front().target)};
}

inline Example only_example(TorchExample stacked, size_t index) {
  auto rows = [](const at::Tensor& t) { return t.defined() && t.dim() >= 1 ? t.size(0) : int64_t{-1}; };
  STRATA_CHECK(rows(stacked.data) == 1 && rows(stacked.target) == 1, ConfigError,
               "[data] the torch::data dataset's batch transform returned data ",
               stacked.data.defined() ? stacked.data.sizes() : at::IntArrayRef{}, " and target ",
               stacked.target.defined() ? stacked.target.sizes() : at::IntArrayRef{}, " for the one index ", index,
               "; strata batches examples itself, so a batch transform must stack them along a new dim 0 "
               "(torch::data::transforms::Stack<>) or leave them as they are");
  return {stacked.data[0], stacked.target[0]};
}

template <class Batch>
Example only_example(Batch, size_t) {
  static_assert(always_false<Batch>,
                "strata::data::TorchDataset: the dataset's batches must be torch::data::Example<> (input and target "
                "tensors) or a std::vector of them; a dataset without targets or of other types is not supported");
  return {};
}

}  // namespace detail

/// True for a `torch::data` dataset TorchDataset adapts: a sized map-style
/// dataset (a BatchDataset asked for batches by index), such as a
/// `Dataset<Self>` or a `MapDataset` made by `.map(transform)`.
template <class T>
inline constexpr bool is_torch_dataset_v = detail::is_torch_dataset<std::decay_t<T>>::value;

/// A `torch::data` dataset as a data::Dataset (Note [Examples through a
/// torch::data dataset]). Holds the dataset (moved in) and serialises its
/// get_batch calls, so a device loader's thread may read it.
template <class TorchData>
class TorchDataset : public Dataset {
  static_assert(is_torch_dataset_v<TorchData>,
                "strata::data::TorchDataset adapts a sized torch::data dataset asked for batches by index");

 public:
  /// Throws ConfigError ("[data] ...") when the dataset has no size (a
  /// stream dataset: it has no indices for a sampler to split).
  explicit TorchDataset(TorchData dataset) : dataset_(std::move(dataset)) {
    const std::optional<size_t> n = dataset_.size();
    STRATA_CHECK(n.has_value(), ConfigError,
                 "[data] the torch::data dataset has no size (a stream), so it cannot be split among ranks by "
                 "index; give it a size() or use a map-style torch::data::datasets::Dataset<Self>");
    size_ = *n;
  }

  size_t size() const override { return size_; }

  /// The example at `index`: get_batch of that one index, its only example
  /// taken out. Throws ConfigError when out of range or when the batch
  /// holds other than one example.
  Example get(size_t index) const override {
    STRATA_CHECK(index < size_, ConfigError, "[data] example index ", index,
                 " is out of range for a dataset of ", size_, " examples");
    size_t indices[1] = {index};
    std::lock_guard<std::mutex> lock(mutex_);
    return detail::only_example(dataset_.get_batch(c10::ArrayRef<size_t>(indices, 1)), index);
  }

  /// The adapted dataset.
  TorchData& torch_dataset() { return dataset_; }

 private:
  mutable TorchData dataset_;  // torch::data's get_batch is not const
  mutable std::mutex mutex_;
  size_t size_ = 0;
};

/// `dataset` (moved in) as a data::Dataset; see TorchDataset.
template <class TorchData, class = std::enable_if_t<is_torch_dataset_v<TorchData>>>
std::shared_ptr<const Dataset> from_torch(TorchData dataset) {
  return std::make_shared<TorchDataset<std::decay_t<TorchData>>>(std::move(dataset));
}

}  // namespace strata::data
