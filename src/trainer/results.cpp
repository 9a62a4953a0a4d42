// Logged values and their reduction (results.h, Note [Epoch reduction]).
#include "results.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "strata/core/error.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/trainer_state.h"

namespace strata::trainer::detail {
namespace {

comm::ReduceOp parse_fx(const std::string& name, const std::string& fx) {
  if (fx == "mean" || fx == "avg") return comm::ReduceOp::kMean;
  if (fx == "sum") return comm::ReduceOp::kSum;
  if (fx == "max") return comm::ReduceOp::kMax;
  if (fx == "min") return comm::ReduceOp::kMin;
  throw ConfigError("[trainer] log('" + name + "'): reduce_fx '" + fx + "' is not one of mean, sum, max, min");
}

}  // namespace

void Results::log(strategies::Strategy& strategy, const std::string& name, const at::Tensor& value,
                  const LogOptions& options, bool in_training, int64_t batch_size, double share) {
  STRATA_CHECK(!name.empty(), ConfigError, "[trainer] log() got an empty metric name");
  STRATA_CHECK(value.defined(), ConfigError, "[trainer] log('", name, "') got an undefined tensor");
  STRATA_CHECK(value.numel() == 1, ConfigError, "[trainer] log('", name, "') needs a scalar (one element), got shape ",
               value.sizes());
  ResultEntry fresh;
  fresh.on_step = options.on_step.value_or(in_training);
  fresh.on_epoch = options.on_epoch.value_or(!in_training);
  fresh.sync_dist = options.sync_dist;
  fresh.prog_bar = options.prog_bar;
  fresh.logger = options.logger;
  fresh.op = parse_fx(name, options.reduce_fx);
  auto [it, inserted] = entries_.emplace(name, fresh);
  ResultEntry& e = it->second;
  if (!inserted) {
    STRATA_CHECK(e.on_step == fresh.on_step && e.on_epoch == fresh.on_epoch && e.sync_dist == fresh.sync_dist &&
                     e.op == fresh.op,
                 ConfigError, "[trainer] log('", name,
                 "') was called with other on_step/on_epoch/sync_dist/reduce_fx options earlier in this loop; log "
                 "one name with one set of options");
  }
  // Note [No reads inside a lazy step]: a value on a lazy device is read
  // when the collection is next read, after the step is marked.
  if (value.device().type() == c10::DeviceType::PrivateUse1) {
    deferred_.push_back({name, value.detach().reshape({}), batch_size, share});
    return;
  }
  at::Tensor v = value.detach().to(at::kDouble).reshape({});
  record(strategy, e, v, v.item<double>(), batch_size, share);
}

void Results::settle(strategies::Strategy& strategy) {
  std::vector<Deferred> due;
  due.swap(deferred_);
  for (const Deferred& d : due) {
    const double x = d.value.cpu().to(at::kDouble).item<double>();
    record(strategy, entries_.at(d.name), at::scalar_tensor(x, at::kDouble), x, d.batch_size, d.share);
  }
}

void Results::record(strategies::Strategy& strategy, ResultEntry& e, const at::Tensor& v, double x,
                     int64_t batch_size, double share) {
  const bool filler = share == 0.0;
  if (e.on_step) {
    // Note: a step value synced across ranks is one collective per log
    // call, as in Lightning; every rank logs the same names each step.
    // Note [Unequal shares]: with unequal shares the mean weights each
    // rank by its share, and a filler batch's value counts for nothing.
    if (e.sync_dist && strategy.world_size() > 1) {
      at::Tensor mine = v.to(at::kDouble);
      if (share != 1.0) {
        const double inf = std::numeric_limits<double>::infinity();
        switch (e.op) {
          case comm::ReduceOp::kMean: mine = mine * share; break;
          case comm::ReduceOp::kSum: if (filler) mine = at::zeros_like(mine); break;
          case comm::ReduceOp::kMax: if (filler) mine = at::full_like(mine, -inf); break;
          case comm::ReduceOp::kMin: if (filler) mine = at::full_like(mine, inf); break;
          default: break;
        }
      }
      e.step_value = strategy.all_reduce(mine, e.op).item<double>();
    } else {
      e.step_value = x;
    }
    e.stepped = true;
  }
  if (e.on_epoch && !filler) {
    const double w = static_cast<double>(std::max<int64_t>(batch_size, 1));
    switch (e.op) {
      case comm::ReduceOp::kMean: e.total += x * w; e.weight += w; break;
      case comm::ReduceOp::kSum: e.total += x; e.weight += 1; break;
      case comm::ReduceOp::kMax: e.total = e.weight > 0 ? std::max(e.total, x) : x; e.weight += 1; break;
      case comm::ReduceOp::kMin: e.total = e.weight > 0 ? std::min(e.total, x) : x; e.weight += 1; break;
      default: break;
    }
  }
}

void Results::take_step(strategies::Strategy& strategy, Metrics& for_logger, Metrics& for_prog_bar, Metrics& all) {
  settle(strategy);
  for (auto& [name, e] : entries_) {
    if (!e.on_step || !e.stepped) continue;
    e.stepped = false;
    const std::string key = e.on_epoch ? name + "_step" : name;
    all[key] = e.step_value;
    all[name] = e.step_value;
    if (e.logger) for_logger[key] = e.step_value;
    if (e.prog_bar) for_prog_bar[e.on_epoch ? key : name] = e.step_value;
  }
}

void Results::reduce_synced(strategies::Strategy& strategy, Entries& entries) const {
  // The synced entries go in one all-reduce per op: sums (mean's value and
  // weight, sum's value), maxima, minima, in name order on every rank.
  std::vector<std::string> synced;
  for (const auto& [name, e] : entries) {
    if (e.on_epoch && e.sync_dist) synced.push_back(name);
  }
  if (synced.empty() || strategy.world_size() == 1) return;
  // Every rank must have logged the same names, or the reductions would
  // pair different metrics: compare first (a clear error, not garbage).
  std::vector<std::vector<std::string>> lists = strategy.group().all_gather_object(synced);
  for (size_t r = 0; r < lists.size(); ++r) {
    STRATA_CHECK(lists[r] == synced, ConfigError, "[trainer] ranks logged different sync_dist metrics this epoch: rank ",
                 strategy.global_rank(), " logged ", names(), ", rank ", r, " others; log the same names on every rank");
  }
  for (comm::ReduceOp op : {comm::ReduceOp::kSum, comm::ReduceOp::kMax, comm::ReduceOp::kMin}) {
    std::vector<double> values;
    std::vector<ResultEntry*> order;
    for (const std::string& name : synced) {
      ResultEntry& e = entries.at(name);
      comm::ReduceOp group = e.op == comm::ReduceOp::kMean ? comm::ReduceOp::kSum : e.op;
      if (group != op) continue;
      order.push_back(&e);
      values.push_back(e.total);
      values.push_back(e.weight);
    }
    if (order.empty()) continue;
    at::Tensor reduced = strategy.all_reduce(at::tensor(values, at::kDouble), op);
    auto acc = reduced.accessor<double, 1>();
    for (size_t i = 0; i < order.size(); ++i) {
      order[i]->total = acc[2 * i];
      // Weights always add up (mean divides by the total examples).
      if (op == comm::ReduceOp::kSum) order[i]->weight = acc[2 * i + 1];
    }
  }
}

void Results::reduce_epoch(strategies::Strategy& strategy, Metrics& for_logger, Metrics& for_prog_bar, Metrics& all) {
  settle(strategy);
  Entries reduced = entries_;
  reduce_synced(strategy, reduced);
  for (const auto& [name, e] : reduced) {
    if (!e.on_epoch || e.weight == 0) continue;
    const double value = e.op == comm::ReduceOp::kMean ? e.total / e.weight : e.total;
    const std::string key = e.on_step ? name + "_epoch" : name;
    all[key] = value;
    all[name] = value;
    if (e.logger) for_logger[key] = value;
    if (e.prog_bar) for_prog_bar[key] = value;
  }
}

nlohmann::json Results::epoch_state(strategies::Strategy& strategy) {
  settle(strategy);
  Entries reduced = entries_;
  reduce_synced(strategy, reduced);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, e] : reduced) {
    if (!e.on_epoch) continue;
    out[name] = {{"on_step", e.on_step}, {"sync_dist", e.sync_dist}, {"prog_bar", e.prog_bar},
                 {"logger", e.logger},   {"reduce", comm::to_string(e.op)}, {"total", e.total},
                 {"weight", e.weight}};
  }
  return out;
}

void Results::load_epoch_state(const nlohmann::json& state, int rank, const std::string& where) {
  validate_epoch_results(state, where + ": the epoch's logged values");
  Entries entries;
  for (auto it = state.begin(); it != state.end(); ++it) {
    const nlohmann::json& s = it.value();
    ResultEntry e;
    e.on_epoch = true;
    e.on_step = s["on_step"].get<bool>();
    e.sync_dist = s["sync_dist"].get<bool>();
    e.prog_bar = s["prog_bar"].get<bool>();
    e.logger = s["logger"].get<bool>();
    e.op = parse_fx(it.key(), s["reduce"].get<std::string>());  // validated: one parse_fx knows
    e.total = s["total"].get<double>();
    e.weight = s["weight"].get<double>();
    const bool additive = e.op == comm::ReduceOp::kMean || e.op == comm::ReduceOp::kSum;
    if (e.sync_dist && additive && rank != 0) e.total = e.weight = 0.0;  // counted once, on rank 0
    entries.emplace(it.key(), e);
  }
  entries_ = std::move(entries);
}

std::string Results::names() const {
  std::string out;
  for (const auto& [name, e] : entries_) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "(none)" : out;
}

}  // namespace strata::trainer::detail
