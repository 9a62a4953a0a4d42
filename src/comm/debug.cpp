// The cross-rank debug checks of comm::Group (Note [Debug descriptors]).
#include "debug.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

namespace strata::comm::detail {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
  }
  return "unknown";
}

std::string dtype_name(int64_t scalar_type) {
  switch (static_cast<at::ScalarType>(scalar_type)) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kByte: return "uint8";
    default: return c10::toString(static_cast<at::ScalarType>(scalar_type));
  }
}

// Note [Debug descriptors]
// In debug mode every collective is preceded by an all-gather of a
// fixed-size int64 descriptor of the call (operation, reduce op, dtype,
// shape, call number, broadcast source, barrier name). All ranks then hold
// every rank's descriptor, compare them identically and throw the same
// CommError when they differ, instead of hanging in, or silently mixing,
// mismatched calls. The exchange itself cannot mismatch: it always has the
// same size and dtype.
Descriptor describe(OpKind op, int64_t seq, const at::Tensor* t, int64_t reduce_op, int64_t src,
                    const std::string& name) {
  Descriptor d;
  d.op = static_cast<int64_t>(op);
  d.seq = seq;
  d.reduce_op = reduce_op;
  d.src = src;
  if (t != nullptr) {
    d.dtype = static_cast<int64_t>(t->scalar_type());
    d.ndim = t->dim();
    d.numel = t->numel();
    for (int i = 0; i < std::min<int64_t>(d.ndim, kMaxDims); ++i) d.dims[i] = t->size(i);
  }
  std::memcpy(d.name, name.data(), std::min(name.size(), sizeof(d.name)));
  return d;
}

namespace {

std::string shape_string(const Descriptor& d) {
  std::string s = "[";
  for (int64_t i = 0; i < d.ndim; ++i) {
    if (i > 0) s += ", ";
    s += i < kMaxDims ? std::to_string(d.dims[i]) : std::string("...");
    if (i >= kMaxDims) break;
  }
  return s + "]";
}

std::string name_string(const Descriptor& d) {
  const char* p = reinterpret_cast<const char*>(d.name);
  return "'" + std::string(p, strnlen(p, sizeof(d.name))) + "'";
}

/// "rank 0 [4, 3], ranks 1, 2 [4, 2]": ranks grouped by the value `show`
/// gives, in order of first appearance; "" when all values are equal.
template <class Show>
std::string differences(const std::vector<Descriptor>& all, Show show) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    std::string v = show(all[r]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) groups.push_back({v, {r}});
    else it->second.push_back(r);
  }
  if (groups.size() <= 1) return "";
  std::string out;
  for (const auto& [value, ranks] : groups) {
    if (!out.empty()) out += ", ";
    out += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    out += " " + value;
  }
  return out;
}

}  // namespace

std::string compare_descriptors(const std::vector<Descriptor>& all) {
  std::vector<std::string> problems;
  auto add = [&](const char* what, const std::string& diff) {
    if (!diff.empty()) problems.push_back(std::string(what) + " differ across ranks: " + diff);
  };
  add("operations", differences(all, [](const Descriptor& d) { return std::string(op_name(OpKind(d.op))); }));
  add("call numbers", differences(all, [](const Descriptor& d) { return "#" + std::to_string(d.seq); }));
  if (!problems.empty()) return problems.front() + (problems.size() > 1 ? "; " + problems[1] : "");
  add("reduce ops", differences(all, [](const Descriptor& d) {
        return d.reduce_op < 0 ? std::string("-") : to_string(ReduceOp(d.reduce_op)); }));
  add("dtypes", differences(all, [](const Descriptor& d) { return d.dtype < 0 ? std::string("-") : dtype_name(d.dtype); }));
  add("shapes", differences(all, shape_string));
  if (problems.empty() || problems.back().rfind("shapes", 0) != 0) {
    add("element counts", differences(all, [](const Descriptor& d) { return std::to_string(d.numel); }));
  }
  add("broadcast sources", differences(all, [](const Descriptor& d) { return "src " + std::to_string(d.src); }));
  add("barrier names", differences(all, name_string));
  std::string out;
  for (const std::string& p : problems) out += (out.empty() ? "" : "; ") + p;
  return out;
}

void check_descriptors(Backend& backend, const Descriptor& mine, const std::string& label) {
  const int n = backend.size();
  at::Tensor local = at::empty({kDescriptorWords}, at::kLong);
  std::memcpy(local.data_ptr(), &mine, sizeof(Descriptor));
  at::Tensor all = at::empty({n * kDescriptorWords}, at::TensorOptions(at::kLong).device(backend.device()));
  backend.all_gather(local.to(backend.device()), all);
  if (WorkPtr work = backend.take_work()) work->wait();  // stream-ordered: the copy below waits for it
  at::Tensor host = all.cpu();
  std::vector<Descriptor> descriptors(n);
  std::memcpy(descriptors.data(), host.data_ptr(), n * sizeof(Descriptor));
  std::string problem = compare_descriptors(descriptors);
  if (!problem.empty()) throw MismatchError(strata::detail::cat("[comm] ", label, ": ", problem));
}

}  // namespace strata::comm::detail
