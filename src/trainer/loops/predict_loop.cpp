// The prediction loop (predict_loop.h).
//
// Note [Prediction order]
// predict() splits the dataset with an unshuffled distributed sampler:
// rank r takes positions r, r + N, r + 2N, ... of 0..n-1 (padded by
// repeating the start). Every rank holds the same number of rows, so one
// all_gather gives [N, m, ...]; position j*N + r is row j of rank r, so
// transposing to [m, N, ...] and flattening puts the rows in dataset order,
// and the first n of them drop the padding.
#include "predict_loop.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <optional>

#include "evaluation_loop.h"
#include "strata/core/error.h"
#include "strata/core/module_hooks.h"
#include "strata/strategies/precision.h"

namespace strata::trainer::detail {

PredictLoop::PredictLoop(Trainer& trainer) : trainer_(trainer) {}

at::Tensor PredictLoop::run(const DataSource& data) {
  Trainer& t = trainer_;
  std::shared_ptr<data::Loader> loader = t.make_loader(data, false, "predict");
  const int64_t limit = t.options_.limit_predict_batches.of(static_cast<int64_t>(loader->size()));
  EvalMode eval(*t.module_);
  torch::NoGradGuard no_grad;
  run_batches(*loader, limit);
  STRATA_CHECK(!predictions_.empty(), ConfigError, "[trainer] predict: the data yields no batch");
  at::Tensor local = at::cat(predictions_, 0).contiguous();
  predictions_.clear();
  const int64_t total = data.dataset() ? static_cast<int64_t>(data.dataset()->size()) : local.size(0);
  return gather(local, total);
}

void PredictLoop::run_batches(data::Loader& loader, int64_t limit) {
  Trainer& t = trainer_;
  TrainModule& module = *t.module_;
  predictions_.clear();
  loader.set_epoch(0);
  loader.reset();
  for (int64_t idx = 0; idx < limit; ++idx) {
    std::optional<data::Batch> batch = loader.next();
    if (!batch) break;
    t.current_batch_size_ = batch->size();
    at::Tensor out;
    strategies::Precision::ForwardContext autocast(t.strategy_->precision());
    try {
      hooked_forward(module, batch->input, [&](const at::Tensor&) {
        out = module.predict_step(*batch, idx);
        return out.defined() ? out : at::zeros({});
      });
    } catch (const NotOverridden&) {
      throw ConfigError("[trainer] predict() needs the module to override predict_step");
    }
    STRATA_CHECK(out.defined() && out.dim() >= 1 && out.size(0) == batch->size(), ConfigError,
                 "[trainer] predict_step must return one row per example (dim 0 = ", batch->size(),
                 "), got ", out.defined() ? strata::detail::cat(out.sizes()) : std::string("an undefined tensor"),
                 " at batch ", idx);
    predictions_.push_back(out.detach().cpu());
  }
}

at::Tensor PredictLoop::gather(const at::Tensor& local, int64_t total) {
  if (trainer_.world_size() == 1) return local.narrow(0, 0, std::min(total, local.size(0)));
  // Note [Prediction order].
  at::Tensor gathered = trainer_.strategy_->all_gather(local);  // [N, m, ...]
  if (!trainer_.is_global_zero()) return at::Tensor();
  at::Tensor ordered = gathered.transpose(0, 1).contiguous();
  std::vector<int64_t> shape{ordered.size(0) * ordered.size(1)};
  for (int64_t d = 2; d < ordered.dim(); ++d) shape.push_back(ordered.size(d));
  ordered = ordered.reshape(shape);
  return ordered.narrow(0, 0, std::min(total, ordered.size(0))).clone();
}

}  // namespace strata::trainer::detail
