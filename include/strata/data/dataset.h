// The dataset interface the loaders read from: a fixed number of examples,
// each an (input, target) pair of tensors, fetched by index.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

namespace strata::data {

/// One training example.
struct Example {
  at::Tensor input;
  at::Tensor target;
};

/// A random-access collection of examples. get() must be safe to call from
/// a background thread (the device loader does) while no other thread
/// mutates the dataset, and must return tensors of equal shape for every
/// index (the loader stacks them).
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of examples.
  virtual size_t size() const = 0;
  /// The example at `index` (< size()); throws ConfigError when out of range.
  virtual Example get(size_t index) const = 0;
};

/// Examples taken along dim 0 of two tensors: get(i) = {inputs[i],
/// targets[i]}. The tensors are shared, not copied.
class TensorDataset : public Dataset {
 public:
  /// Throws ConfigError ("[data] ...") when the tensors are 0-d or their
  /// first dimensions differ.
  TensorDataset(at::Tensor inputs, at::Tensor targets);
  size_t size() const override;
  Example get(size_t index) const override;

 private:
  at::Tensor inputs_;
  at::Tensor targets_;
};

}  // namespace strata::data
