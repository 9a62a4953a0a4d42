// Batch, LoaderState, the Loader protocol and DataLoader.
#include "strata/data/loader.h"

#include <nlohmann/json.hpp>

#include "strata/core/error.h"

namespace strata::data {

Batch Batch::to(at::Device device, bool non_blocking) const {
  return {input.to(device, non_blocking), target.to(device, non_blocking), count, global_count};
}

void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"epoch", s.epoch}, {"position", s.position}};
}

void from_json(const nlohmann::json& j, LoaderState& s) {
  for (const char* key : {"epoch", "position"}) {
    // Parsed JSON holds non-negative numbers as unsigned, built JSON as int.
    const bool ok = j.is_object() && j.contains(key) &&
                    (j.at(key).is_number_unsigned() || (j.at(key).is_number_integer() && j.at(key).get<int64_t>() >= 0));
    STRATA_CHECK(ok, ConfigError, "[data] loader state needs a non-negative integer '", key, "', got ", j.dump());
  }
  s.epoch = j.at("epoch").get<uint64_t>();
  s.position = j.at("position").get<uint64_t>();
}

// ---- Loader -----------------------------------------------------------------

LoaderState Loader::state() const {
  throw ConfigError("[data] this loader cannot save its position (resumable() is false)");
}

void Loader::load_state(const LoaderState&) {
  throw ConfigError("[data] this loader cannot restore a position (resumable() is false)");
}

Loader::Iterator::Iterator(Loader* loader) : loader_(loader), current_(loader->next()) {}

Loader::Iterator& Loader::Iterator::operator++() {
  current_ = loader_->next();
  return *this;
}

Loader::Iterator Loader::begin() {
  reset();
  return Iterator(this);
}

// ---- DataLoader ---------------------------------------------------------------

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DistributedSampler sampler, size_t batch_size,
                       bool drop_last)
    : dataset_(std::move(dataset)), sampler_(sampler), batch_size_(batch_size), drop_last_(drop_last) {
  STRATA_CHECK(dataset_ != nullptr, ConfigError, "[data] DataLoader needs a dataset, got null");
  STRATA_CHECK(batch_size_ >= 1, ConfigError, "[data] batch_size must be >= 1, got ", batch_size_);
  STRATA_CHECK(sampler_.dataset_size() == dataset_->size(), ConfigError, "[data] the sampler was built for ",
               sampler_.dataset_size(), " examples but the dataset has ", dataset_->size());
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, size_t batch_size, bool shuffle, uint64_t seed,
                       bool drop_last)
    : DataLoader(dataset, DistributedSampler(dataset ? dataset->size() : 0, 1, 0, shuffle, seed), batch_size,
                 drop_last) {}

size_t DataLoader::size() const {
  if (sampler_.uneven()) {
    // Every rank counts the global batches (ceil(ceil(n/N)/b) = ceil(n/(N b))).
    const size_t n = sampler_.total_size(), global = batch_size_ * static_cast<size_t>(sampler_.num_replicas());
    return drop_last_ ? n / global : (n + global - 1) / global;
  }
  const size_t n = sampler_.size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

void DataLoader::reset() {
  if (!resume_pending_) position_ = 0;
  resume_pending_ = false;
  order_ = sampler_.indices();
  started_ = true;
}

std::optional<Batch> DataLoader::next() {
  if (!started_) reset();
  if (position_ >= size()) return std::nullopt;
  const size_t begin = std::min(position_ * batch_size_, order_.size());
  const size_t end = std::min(begin + batch_size_, order_.size());
  std::vector<at::Tensor> inputs, targets;
  inputs.reserve(std::max<size_t>(end - begin, 1));
  targets.reserve(std::max<size_t>(end - begin, 1));
  for (size_t i = begin; i < end; ++i) {
    Example ex = dataset_->get(order_[i]);
    inputs.push_back(std::move(ex.input));
    targets.push_back(std::move(ex.target));
  }
  Batch batch;
  if (sampler_.uneven()) {
    // Note [Unequal shares]: global batch k is positions [k B, (k+1) B) of
    // the shared order (B = batch_size x replicas); this rank holds its
    // positions r, r + N, ... in that range.
    const size_t global = batch_size_ * static_cast<size_t>(sampler_.num_replicas());
    const size_t first = position_ * global;
    const size_t in_global = std::min(global, sampler_.total_size() - std::min(first, sampler_.total_size()));
    const size_t mine = end - begin;
    if (mine * static_cast<size_t>(sampler_.num_replicas()) != in_global) {
      batch.count = static_cast<int64_t>(mine);
      batch.global_count = static_cast<int64_t>(in_global);
    }
    if (mine == 0) {
      Example filler = dataset_->get(0);  // weight 0: it only keeps the ranks in step
      inputs.push_back(std::move(filler.input));
      targets.push_back(std::move(filler.target));
    }
  }
  ++position_;
  batch.input = at::stack(inputs);
  batch.target = at::stack(targets);
  return batch;
}

void DataLoader::set_epoch(uint64_t epoch) {
  if (epoch == sampler_.epoch()) return;
  sampler_.set_epoch(epoch);
  position_ = 0;
  started_ = false;
  resume_pending_ = false;
}

LoaderState DataLoader::state() const { return {sampler_.epoch(), position_}; }

void DataLoader::load_state(const LoaderState& state) {
  STRATA_CHECK(state.position <= size(), ConfigError, "[data] cannot resume at batch ", state.position,
               " of an epoch of ", size(), " batches (was the batch size or world size changed?)");
  sampler_.set_epoch(state.epoch);
  position_ = static_cast<size_t>(state.position);
  started_ = false;
  resume_pending_ = true;
}

// ---- make_distributed_loader ------------------------------------------------------

std::shared_ptr<DataLoader> make_distributed_loader(std::shared_ptr<const Dataset> dataset,
                                                    const DataOptions& options, int world_size, int rank) {
  STRATA_CHECK(dataset != nullptr, ConfigError, "[data] make_distributed_loader got a null dataset");
  STRATA_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, ConfigError, "[data] rank ", rank,
               " is not one of the ", world_size, " ranks");
  STRATA_CHECK(options.batch_size >= 1 && options.batch_size % world_size == 0, ConfigError, "[data] batch_size ",
               options.batch_size, " must be a positive multiple of the world size (", world_size,
               "): each rank takes batch_size / world_size examples per step");
  DistributedSampler sampler(dataset->size(), world_size, rank, options.shuffle, options.seed, options.drop_last,
                             /*repeat_to_even=*/false);
  return std::make_shared<DataLoader>(std::move(dataset), sampler,
                                      static_cast<size_t>(options.batch_size / world_size), options.drop_last);
}

}  // namespace strata::data
