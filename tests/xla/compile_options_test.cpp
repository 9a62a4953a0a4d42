// The CompileOptionsProto encoder, byte for byte. The expected bytes are
// written out by hand from the protobuf wire format (tag = field << 3 |
// wire type; varints little-endian base 128; int64 -1 is ten bytes), so a
// change in the encoder cannot also change the expectation. oracle_test.cpp
// additionally parses the same bytes with jaxlib's own CompileOptions.
#include <gtest/gtest.h>

#include <string>

#include "strata/xla/compile_options.h"
#include "support/errors.h"

namespace strata::xla {
namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

TEST(CompileOptionsTest, VarintsAreBase128LittleEndian) {
  std::string out;
  detail::put_varint(out, 0);
  detail::put_varint(out, 1);
  detail::put_varint(out, 127);
  detail::put_varint(out, 128);
  detail::put_varint(out, 300);
  EXPECT_EQ(hex(out),
            "00"
            "01"
            "7f"
            "8001"
            "ac02");
}

TEST(CompileOptionsTest, MinusOneIsTenBytes) {
  std::string out;
  detail::put_int64_field(out, 1, -1);
  EXPECT_EQ(hex(out),
            "08"
            "ffffffffffffffffff01");
}

TEST(CompileOptionsTest, DefaultsWriteOrdinalReplicasAndPartitions) {
  // 1a 0f: field 3 (executable_build_options), 15 bytes:
  //   08 ff..ff01  device_ordinal = -1 (11 bytes)
  //   20 01        num_replicas = 1
  //   28 01        num_partitions = 1
  EXPECT_EQ(hex(CompileOptions{}.serialize()),
            "1a0f"
            "08ffffffffffffffffff01"
            "2001"
            "2801");
}

TEST(CompileOptionsTest, TwoReplicasWithAnAssignment) {
  CompileOptions options;
  options.with_num_replicas(2).with_device_assignment({{0}, {1}});
  // executable_build_options (field 3), 0x1b = 27 bytes:
  //   08 ff..ff01            device_ordinal -1
  //   20 02                  num_replicas 2
  //   28 01                  num_partitions 1
  //   4a 0a                  device_assignment (field 9), 10 bytes:
  //     08 02                  replica_count 2
  //     10 01                  computation_count 1
  //     1a 04                  computation_devices (field 3), 4 bytes:
  //       0a 02 00 01            replica_device_ids, packed: 0, 1
  EXPECT_EQ(hex(options.serialize()),
            "1a1b"
            "08ffffffffffffffffff01"
            "2002"
            "2801"
            "4a0a"
            "0802"
            "1001"
            "1a04"
            "0a020001");
}

TEST(CompileOptionsTest, AssignmentIsStoredPerPartition) {
  CompileOptions options;
  options.with_num_replicas(2).with_num_partitions(2).with_device_assignment({{3, 1}, {2, 0}});
  options.use_spmd_partitioning = true;
  const std::string bytes = options.serialize();
  // ... 30 01 (spmd), then the assignment: partition 0 lists replicas' 3, 2;
  // partition 1 lists 1, 0.
  EXPECT_EQ(hex(bytes),
            "1a23"
            "08ffffffffffffffffff01"
            "2002"
            "2802"
            "3001"
            "4a10"
            "0802"
            "1002"
            "1a04"
            "0a020302"
            "1a04"
            "0a020100");
}

TEST(CompileOptionsTest, LargeDeviceIdsUseMultiByteVarints) {
  CompileOptions options;
  options.with_device_assignment({{300}});
  options.device_ordinal = 0;
  EXPECT_EQ(hex(options.serialize()),
            "1a12"
            "0800"
            "2001"
            "2801"
            "4a0a"
            "0801"
            "1001"
            "1a04"
            "0a02ac02");
}

TEST(CompileOptionsTest, RejectsBadCountsAndShapes) {
  using strata::testing::error_message;
  CompileOptions zero;
  zero.num_replicas = 0;
  EXPECT_EQ(error_message<ConfigError>([&] { zero.serialize(); }), "[pjrt] num_replicas must be >= 1, got 0");
  CompileOptions ragged;
  ragged.with_num_replicas(2).with_device_assignment({{0}});
  EXPECT_EQ(error_message<ConfigError>([&] { ragged.serialize(); }),
            "[pjrt] the device assignment has 1 replicas, num_replicas is 2");
  CompileOptions wide;
  wide.with_num_replicas(1).with_device_assignment({{0, 1}});
  EXPECT_EQ(error_message<ConfigError>([&] { wide.serialize(); }),
            "[pjrt] replica 0 of the device assignment has 2 partitions, num_partitions is 1");
  CompileOptions negative;
  negative.with_device_assignment({{-2}});
  EXPECT_EQ(error_message<ConfigError>([&] { negative.serialize(); }),
            "[pjrt] device id -2 (replica 0, partition 0) must be >= 0");
}

}  // namespace
}  // namespace strata::xla
