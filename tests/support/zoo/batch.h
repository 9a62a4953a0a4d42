// The zoo's deterministic inputs: every model's tiny batch is drawn from a
// CPU generator of its own seed, so the batch is the same in every process
// and on every run, whatever the global seed is.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>

namespace zoo {

/// A CPU generator seeded with `seed`, for one batch.
inline at::Generator batch_generator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

/// Standard normal values of `shape`, from `gen`.
inline torch::Tensor normal(at::IntArrayRef shape, at::Generator& gen) {
  return torch::randn(shape, gen, torch::kFloat);
}

/// Class indices in [0, classes) of `shape` (int64), from `gen`.
inline torch::Tensor labels(int64_t classes, at::IntArrayRef shape, at::Generator& gen) {
  return torch::randint(classes, shape, gen, torch::kLong);
}

}  // namespace zoo
