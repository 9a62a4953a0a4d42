// The StableHLO builder's sort: values sorted along a dim, with the values
// that travel with them (the indices of torch.sort and torch.topk).
#include <string>
#include <vector>

#include "stablehlo_internal.h"
#include "strata/core/error.h"
#include "strata/xla/stablehlo.h"

namespace strata::xla::stablehlo {

using detail::check_dims;
using detail::rank;

// Note [Sort's comparator]
// The comparator gets the two elements being compared of every operand
// (lhs0, rhs0, lhs1, rhs1, ...) and looks at the first operand's only:
// lhs before rhs when it is smaller (larger, descending), NaN counting as
// larger than any number, as torch.sort orders it (NaNs last ascending,
// first descending). The sort is stable, so equal keys keep their order
// and the indices that travel with them are torch's stable ones.
std::vector<Value> Function::sort(const std::vector<Value>& values, int64_t dim, bool descending) {
  check_open("sort");
  STRATA_CHECK(!values.empty(), ConfigError, "[stablehlo] sort: no operands");
  const Value& key = values[0];
  check_dims("sort", {dim}, key.type.dims.size());
  for (const Value& v : values)
    STRATA_CHECK(v.type.dims == key.type.dims, ConfigError, "[stablehlo] sort: operand ", v.type.text(),
                 " and the key ", key.type.text(), " differ in shape");
  const std::string k = tensor_type(key.type.dtype, {}), b = tensor_type(ElementType::kPred, {});
  std::vector<std::string> args;
  std::string params;
  for (const Value& v : values) {
    const std::string type = tensor_type(v.type.dtype, {});
    for (int side = 0; side < 2; ++side) {
      args.push_back(fresh());
      params += (params.empty() ? "" : ", ") + args.back() + ": " + type;
    }
  }
  std::string body;
  auto line = [&](const std::string& op, const std::vector<std::string>& operands, const std::string& attributes,
                  const std::string& operand_types) {
    const std::string out = fresh();
    std::string text = out + " = \"stablehlo." + op + "\"(";
    for (size_t i = 0; i < operands.size(); ++i) text += (i ? ", " : "") + operands[i];
    text += ")";
    if (!attributes.empty()) text += " {" + attributes + "}";
    body += "\n      " + text + " : (" + operand_types + ") -> " + b;
    return out;
  };
  auto cmp = [&](const std::string& l, const std::string& r, const char* dir) {
    return line("compare", {l, r}, std::string("comparison_direction = #stablehlo<comparison_direction ") + dir + ">",
                k + ", " + k);
  };
  const std::string lhs = args[0], rhs = args[1];
  std::string before = descending ? cmp(lhs, rhs, "GT") : cmp(lhs, rhs, "LT");
  if (is_floating(key.type.dtype)) {
    // descending: lhs is NaN and rhs is not; ascending: rhs is NaN and lhs is not.
    const std::string nan_first = descending ? lhs : rhs, number = descending ? rhs : lhs;
    const std::string is_nan = cmp(nan_first, nan_first, "NE"), is_number = cmp(number, number, "EQ");
    const std::string nan_wins = line("and", {is_nan, is_number}, "", b + ", " + b);
    before = line("or", {before, nan_wins}, "", b + ", " + b);
  }
  const std::string region = "{\n    ^bb0(" + params + "):" + body + "\n      \"stablehlo.return\"(" + before +
                             ") : (" + b + ") -> ()\n  }";
  std::vector<Type> types;
  for (const Value& v : values) types.push_back(v.type);
  return emit_op("stablehlo.sort", values, region, "dimension = " + std::to_string(dim) + " : i64, is_stable = true",
                 types);
}

}  // namespace strata::xla::stablehlo
