// StableHLO text emission: gather and scatter with general dimension
// numbers, and the two common cases a training step needs, index_select /
// embedding lookup (take_rows) and its adjoint, the scatter-add of
// embedding backward (scatter_add_rows). Shapes follow the StableHLO
// spec's inference rules; include/strata/xla/stablehlo.h has the contract.
#include <string>
#include <vector>

#include "stablehlo_internal.h"
#include "strata/core/error.h"
#include "strata/xla/stablehlo.h"

namespace strata::xla::stablehlo {
namespace {

using detail::array_attr;
using detail::check_dims;
using detail::check_integer;
using detail::contains;
using detail::join;
using detail::rank;
using detail::shape_text;

// "#stablehlo.gather<offset_dims = [2], ..., index_vector_dim = 2>", empty
// lists left out, fields in the order StableHLO's own printer uses.
std::string dims_attr(const char* kind,
                      const std::vector<std::pair<const char*, const std::vector<int64_t>*>>& lists,
                      int64_t index_vector_dim) {
  std::string out = std::string("#stablehlo.") + kind + "<";
  for (const auto& [name, values] : lists)
    if (!values->empty()) out += std::string(name) + " = [" + join(*values) + "], ";
  return out + "index_vector_dim = " + std::to_string(index_vector_dim) + ">";
}

std::string bool_text(bool b) { return b ? "true" : "false"; }

// The index vectors' size, and the batch dims of `indices` (all but
// index_vector_dim), for gather and scatter alike.
int64_t index_vector_size(const char* op, const Value& indices, int64_t index_vector_dim,
                          std::vector<int64_t>& batch_sizes) {
  STRATA_CHECK(index_vector_dim >= 0 && index_vector_dim <= rank(indices), ConfigError, "[stablehlo] ", op,
               ": index_vector_dim ", index_vector_dim, " is out of range for indices ", indices.type.text());
  for (int64_t d = 0; d < rank(indices); ++d)
    if (d != index_vector_dim) batch_sizes.push_back(indices.type.dims[static_cast<size_t>(d)]);
  return index_vector_dim < rank(indices) ? indices.type.dims[static_cast<size_t>(index_vector_dim)] : 1;
}

void check_sorted(const char* op, const char* name, const std::vector<int64_t>& dims) {
  for (size_t i = 1; i < dims.size(); ++i)
    STRATA_CHECK(dims[i - 1] < dims[i], ConfigError, "[stablehlo] ", op, ": ", name, " ", shape_text(dims),
                 " must be sorted");
}

// The batching dims of operand and indices pair up with equal sizes.
void check_batching(const char* op, const Value& operand, const std::vector<int64_t>& operand_dims,
                    const Value& indices, const std::vector<int64_t>& indices_dims,
                    int64_t index_vector_dim) {
  check_dims(op, operand_dims, operand.type.dims.size());
  check_dims(op, indices_dims, indices.type.dims.size());
  STRATA_CHECK(operand_dims.size() == indices_dims.size() && !contains(indices_dims, index_vector_dim),
               ConfigError, "[stablehlo] ", op, ": the operand's batching dims ", shape_text(operand_dims),
               " do not pair with the indices' ", shape_text(indices_dims));
  for (size_t i = 0; i < operand_dims.size(); ++i)
    STRATA_CHECK(operand.type.dims[static_cast<size_t>(operand_dims[i])] ==
                     indices.type.dims[static_cast<size_t>(indices_dims[i])],
                 ConfigError, "[stablehlo] ", op, ": batching dims ", operand_dims[i], " and ",
                 indices_dims[i], " differ in size");
}

}  // namespace

Value Function::gather(const Value& operand, const Value& indices, const GatherDims& dims,
                       const std::vector<int64_t>& slice_sizes, bool indices_are_sorted) {
  const char* op = "gather";
  check_open(op);
  check_integer(op, "indices", indices);
  std::vector<int64_t> batch_sizes;
  const int64_t vector_size = index_vector_size(op, indices, dims.index_vector_dim, batch_sizes);
  STRATA_CHECK(static_cast<int64_t>(dims.start_index_map.size()) == vector_size, ConfigError,
               "[stablehlo] gather: ", "start_index_map ", shape_text(dims.start_index_map),
               " for index vectors of size ", vector_size);
  check_dims(op, dims.start_index_map, operand.type.dims.size());
  check_dims(op, dims.collapsed_slice_dims, operand.type.dims.size());
  check_batching(op, operand, dims.operand_batching_dims, indices, dims.start_indices_batching_dims,
                 dims.index_vector_dim);
  STRATA_CHECK(slice_sizes.size() == operand.type.dims.size(), ConfigError,
               "[stablehlo] gather: ", operand.type.text(), " needs ", operand.type.dims.size(),
               " slice sizes, got ", slice_sizes.size());
  std::vector<int64_t> offset_sizes;
  for (size_t d = 0; d < slice_sizes.size(); ++d) {
    STRATA_CHECK(slice_sizes[d] >= 0 && slice_sizes[d] <= operand.type.dims[d], ConfigError,
                 "[stablehlo] gather: slice size ", slice_sizes[d], " does not fit dim ", d, " of ",
                 operand.type.text());
    const bool dropped = contains(dims.collapsed_slice_dims, static_cast<int64_t>(d)) ||
                         contains(dims.operand_batching_dims, static_cast<int64_t>(d));
    STRATA_CHECK(!dropped || slice_sizes[d] <= 1, ConfigError, "[stablehlo] gather: dim ", d,
                 " is collapsed or a batching dim, so its slice size must be 1, got ", slice_sizes[d]);
    if (!dropped) offset_sizes.push_back(slice_sizes[d]);
  }
  STRATA_CHECK(dims.offset_dims.size() == offset_sizes.size(), ConfigError,
               "[stablehlo] gather: offset_dims ", shape_text(dims.offset_dims), " for ", offset_sizes.size(),
               " kept slice dims");
  const size_t result_rank = batch_sizes.size() + offset_sizes.size();
  check_dims(op, dims.offset_dims, result_rank);
  check_sorted(op, "offset_dims", dims.offset_dims);
  Type result{operand.type.dtype, {}};
  for (size_t d = 0, offset = 0, batch = 0; d < result_rank; ++d)
    result.dims.push_back(contains(dims.offset_dims, static_cast<int64_t>(d)) ? offset_sizes[offset++]
                                                                              : batch_sizes[batch++]);
  const std::string numbers = dims_attr("gather",
                                        {{"offset_dims", &dims.offset_dims},
                                         {"collapsed_slice_dims", &dims.collapsed_slice_dims},
                                         {"operand_batching_dims", &dims.operand_batching_dims},
                                         {"start_indices_batching_dims", &dims.start_indices_batching_dims},
                                         {"start_index_map", &dims.start_index_map}},
                                        dims.index_vector_dim);
  return emit(op, {operand, indices}, "",
              "dimension_numbers = " + numbers + ", indices_are_sorted = " + bool_text(indices_are_sorted) +
                  ", slice_sizes = " + array_attr(slice_sizes),
              result);
}

Value Function::take_rows(const Value& table, const Value& indices, int64_t dim) {
  check_open("take_rows");
  check_dims("take_rows", {dim}, table.type.dims.size());
  check_integer("take_rows", "indices", indices);
  // Note [Take rows]: each index is a one-entry index vector (the implicit
  // trailing dim, index_vector_dim = rank of the indices) into `dim`; the
  // slice is the whole table but one row along `dim`, which is collapsed,
  // and the indices' dims take its place in the result.
  GatherDims dims;
  dims.collapsed_slice_dims = {dim};
  dims.start_index_map = {dim};
  dims.index_vector_dim = rank(indices);
  std::vector<int64_t> sizes = table.type.dims;
  sizes[static_cast<size_t>(dim)] = 1;
  for (int64_t d = 0; d < rank(table); ++d)
    if (d != dim) dims.offset_dims.push_back(d < dim ? d : d - 1 + rank(indices));
  return gather(table, indices, dims, sizes);
}

Value Function::scatter(const Value& operand, const Value& indices, const Value& updates,
                        const ScatterDims& dims, ReduceOp op_kind, bool indices_are_sorted,
                        bool unique_indices) {
  return scatter_with_region(operand, indices, updates, dims, reduction_region(op_kind, operand.type.dtype),
                             indices_are_sorted, unique_indices);
}

Value Function::scatter_replace(const Value& operand, const Value& indices, const Value& updates,
                                const ScatterDims& dims) {
  return scatter_with_region(operand, indices, updates, dims, replace_region(operand.type.dtype), false, false);
}

Value Function::scatter_with_region(const Value& operand, const Value& indices, const Value& updates,
                                    const ScatterDims& dims, const std::string& region, bool indices_are_sorted,
                                    bool unique_indices) {
  const char* op = "scatter";
  check_open(op);
  check_integer(op, "indices", indices);
  STRATA_CHECK(updates.type.dtype == operand.type.dtype, ConfigError, "[stablehlo] scatter: updates ",
               updates.type.text(), " and operand ", operand.type.text(), " differ in element type");
  std::vector<int64_t> batch_sizes;
  const int64_t vector_size = index_vector_size(op, indices, dims.index_vector_dim, batch_sizes);
  STRATA_CHECK(static_cast<int64_t>(dims.scatter_dims_to_operand_dims.size()) == vector_size, ConfigError,
               "[stablehlo] scatter: scatter_dims_to_operand_dims ",
               shape_text(dims.scatter_dims_to_operand_dims), " for index vectors of size ", vector_size);
  check_dims(op, dims.scatter_dims_to_operand_dims, operand.type.dims.size());
  check_dims(op, dims.inserted_window_dims, operand.type.dims.size());
  check_batching(op, operand, dims.input_batching_dims, indices, dims.scatter_indices_batching_dims,
                 dims.index_vector_dim);
  check_dims(op, dims.update_window_dims, updates.type.dims.size());
  check_sorted(op, "update_window_dims", dims.update_window_dims);
  std::vector<int64_t> window_operand_dims;  // the operand dim of each update window dim
  for (int64_t d = 0; d < rank(operand); ++d)
    if (!contains(dims.inserted_window_dims, d) && !contains(dims.input_batching_dims, d))
      window_operand_dims.push_back(d);
  STRATA_CHECK(dims.update_window_dims.size() == window_operand_dims.size() &&
                   updates.type.dims.size() == window_operand_dims.size() + batch_sizes.size(),
               ConfigError, "[stablehlo] scatter: updates ", updates.type.text(), " with update_window_dims ",
               shape_text(dims.update_window_dims), " do not match operand ", operand.type.text(),
               " and indices ", indices.type.text());
  for (int64_t d = 0, window = 0, batch = 0; d < rank(updates); ++d) {
    const int64_t size = updates.type.dims[static_cast<size_t>(d)];
    if (contains(dims.update_window_dims, d)) {
      const int64_t limit = operand.type.dims[static_cast<size_t>(window_operand_dims[window++])];
      STRATA_CHECK(size <= limit, ConfigError, "[stablehlo] scatter: update dim ", d, " (", size,
                   ") is larger than the operand's ", limit);
    } else {
      STRATA_CHECK(size == batch_sizes[batch], ConfigError, "[stablehlo] scatter: update dim ", d, " (", size,
                   ") differs from the indices' batch dim (", batch_sizes[batch], ")");
      ++batch;
    }
  }
  const std::string numbers =
      dims_attr("scatter",
                {{"update_window_dims", &dims.update_window_dims},
                 {"inserted_window_dims", &dims.inserted_window_dims},
                 {"input_batching_dims", &dims.input_batching_dims},
                 {"scatter_indices_batching_dims", &dims.scatter_indices_batching_dims},
                 {"scatter_dims_to_operand_dims", &dims.scatter_dims_to_operand_dims}},
                dims.index_vector_dim);
  return emit(op, {operand, indices, updates}, region,
              "indices_are_sorted = " + bool_text(indices_are_sorted) + ", scatter_dimension_numbers = " +
                  numbers + ", unique_indices = " + bool_text(unique_indices),
              operand.type);
}

Value Function::scatter_add_rows(const Value& table, const Value& indices, const Value& updates,
                                 int64_t dim) {
  check_open("scatter_add_rows");
  check_dims("scatter_add_rows", {dim}, table.type.dims.size());
  check_integer("scatter_add_rows", "indices", indices);
  // take_rows' layout (Note [Take rows]), read in reverse.
  std::vector<int64_t> expected(table.type.dims.begin(), table.type.dims.begin() + dim);
  expected.insert(expected.end(), indices.type.dims.begin(), indices.type.dims.end());
  expected.insert(expected.end(), table.type.dims.begin() + dim + 1, table.type.dims.end());
  STRATA_CHECK(updates.type.dims == expected && updates.type.dtype == table.type.dtype, ConfigError,
               "[stablehlo] scatter_add_rows: updates for ", table.type.text(), " at indices ",
               indices.type.text(), " along dim ", dim, " must be ", tensor_type(table.type.dtype, expected),
               ", got ", updates.type.text());
  ScatterDims dims;
  dims.inserted_window_dims = {dim};
  dims.scatter_dims_to_operand_dims = {dim};
  dims.index_vector_dim = rank(indices);
  for (int64_t d = 0; d < rank(table); ++d)
    if (d != dim) dims.update_window_dims.push_back(d < dim ? d : d - 1 + rank(indices));
  return scatter(table, indices, updates, dims, ReduceOp::kSum);
}

}  // namespace strata::xla::stablehlo
