// The compile options PJRT_Client_Compile takes: a serialized
// xla.CompileOptionsProto, written by a small hand encoder so that strata
// links no protobuf (docs/xla.md, "Compile options").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::xla {

/// What strata sets in a CompileOptionsProto's executable_build_options.
/// Validated by serialize().
struct CompileOptions {
  int64_t num_replicas = 1;
  int64_t num_partitions = 1;
  /// -1: let the runtime choose (the device assignment decides).
  int64_t device_ordinal = -1;
  bool use_spmd_partitioning = false;
  /// device_assignment[replica][partition] = global device id; empty for
  /// the plugin's default assignment.
  std::vector<std::vector<int64_t>> device_assignment;

  CompileOptions& with_num_replicas(int64_t n) {
    num_replicas = n;
    return *this;
  }
  CompileOptions& with_num_partitions(int64_t n) {
    num_partitions = n;
    return *this;
  }
  CompileOptions& with_device_assignment(std::vector<std::vector<int64_t>> a) {
    device_assignment = std::move(a);
    return *this;
  }

  /// The serialized CompileOptionsProto. Throws ConfigError for counts
  /// below 1 or an assignment whose shape is not
  /// [num_replicas][num_partitions].
  std::string serialize() const;
};

namespace detail {
/// Protobuf wire-format helpers, exposed for the byte-exact tests.
void put_varint(std::string& out, uint64_t value);
void put_tag(std::string& out, int field, int wire_type);
void put_int64_field(std::string& out, int field, int64_t value);
void put_bytes_field(std::string& out, int field, const std::string& bytes);
}  // namespace detail

}  // namespace strata::xla
