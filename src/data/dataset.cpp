// TensorDataset: examples along dim 0 of an (inputs, targets) tensor pair.
#include "strata/data/dataset.h"

#include "strata/core/error.h"

namespace strata::data {

TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  STRATA_CHECK(inputs_.defined() && targets_.defined(), ConfigError,
               "[data] TensorDataset needs defined input and target tensors");
  STRATA_CHECK(inputs_.dim() >= 1 && targets_.dim() >= 1, ConfigError,
               "[data] TensorDataset needs tensors with a leading example dimension, got inputs ",
               inputs_.sizes(), " and targets ", targets_.sizes());
  STRATA_CHECK(inputs_.size(0) == targets_.size(0), ConfigError, "[data] TensorDataset: inputs have ",
               inputs_.size(0), " examples but targets have ", targets_.size(0));
}

size_t TensorDataset::size() const { return static_cast<size_t>(inputs_.size(0)); }

Example TensorDataset::get(size_t index) const {
  STRATA_CHECK(index < size(), ConfigError, "[data] example index ", index, " is out of range for a dataset of ",
               size(), " examples");
  const auto i = static_cast<int64_t>(index);
  return {inputs_[i], targets_[i]};
}

}  // namespace strata::data
