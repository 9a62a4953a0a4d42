// A hand encoder for the few fields of xla.CompileOptionsProto strata sets.
//
// Field numbers (xla/pjrt/proto/compile_options.proto, xla/xla_data.proto):
//   CompileOptionsProto        3: executable_build_options (message)
//   ExecutableBuildOptionsProto 1: device_ordinal (int64), 4: num_replicas,
//                              5: num_partitions, 6: use_spmd_partitioning
//                              (bool), 9: device_assignment (message)
//   DeviceAssignmentProto      1: replica_count (int32), 2: computation_count
//                              (int32), 3: computation_devices (repeated)
//   ComputationDevice          1: replica_device_ids (repeated int64, packed)
//
// Note [Explicit counts]: XLA copies num_replicas from the proto verbatim,
// so an absent field means 0 replicas, not 1; and it sets the device
// ordinal unless it is -1. So all three are always written, even where a
// proto3 writer would skip a default.
#include "strata/xla/compile_options.h"

#include "strata/core/error.h"

namespace strata::xla {
namespace detail {

constexpr int kVarint = 0;
constexpr int kLengthDelimited = 2;

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void put_int64_field(std::string& out, int field, int64_t value) {
  put_tag(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(value));  // negative: ten bytes, as protobuf does
}

void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

}  // namespace detail

std::string CompileOptions::serialize() const {
  STRATA_CHECK(num_replicas >= 1, ConfigError, "[pjrt] num_replicas must be >= 1, got ", num_replicas);
  STRATA_CHECK(num_partitions >= 1, ConfigError, "[pjrt] num_partitions must be >= 1, got ", num_partitions);
  STRATA_CHECK(device_ordinal >= -1, ConfigError, "[pjrt] device_ordinal must be -1 (any) or >= 0, got ",
               device_ordinal);

  std::string build;
  detail::put_int64_field(build, 1, device_ordinal);
  detail::put_int64_field(build, 4, num_replicas);
  detail::put_int64_field(build, 5, num_partitions);
  if (use_spmd_partitioning) detail::put_int64_field(build, 6, 1);

  if (!device_assignment.empty()) {
    STRATA_CHECK(static_cast<int64_t>(device_assignment.size()) == num_replicas, ConfigError,
                 "[pjrt] the device assignment has ", device_assignment.size(), " replicas, num_replicas is ",
                 num_replicas);
    for (size_t r = 0; r < device_assignment.size(); ++r)
      STRATA_CHECK(static_cast<int64_t>(device_assignment[r].size()) == num_partitions, ConfigError,
                   "[pjrt] replica ", r, " of the device assignment has ", device_assignment[r].size(),
                   " partitions, num_partitions is ", num_partitions);
    // The proto is stored by computation (partition), each listing the
    // device of every replica.
    std::string assignment;
    detail::put_int64_field(assignment, 1, num_replicas);
    detail::put_int64_field(assignment, 2, num_partitions);
    for (int64_t p = 0; p < num_partitions; ++p) {
      std::string ids;
      for (int64_t r = 0; r < num_replicas; ++r) {
        const int64_t id = device_assignment[static_cast<size_t>(r)][static_cast<size_t>(p)];
        STRATA_CHECK(id >= 0, ConfigError, "[pjrt] device id ", id, " (replica ", r, ", partition ", p,
                     ") must be >= 0");
        detail::put_varint(ids, static_cast<uint64_t>(id));
      }
      std::string computation;
      detail::put_bytes_field(computation, 1, ids);  // packed repeated int64
      detail::put_bytes_field(assignment, 3, computation);
    }
    detail::put_bytes_field(build, 9, assignment);
  }

  std::string out;
  detail::put_bytes_field(out, 3, build);
  return out;
}

}  // namespace strata::xla
