// The safetensors writer and reader: round trips of every dtype and shape,
// the on-disk layout, an independent Python reader, and a clear
// CheckpointError (never a crash) for every kind of damaged file.
#include "strata/checkpoint/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "checkpoint/test_util.h"
#include "strata/core/error.h"

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;
using testing::raw_safetensors;
using testing::read_bytes;
using testing::write_bytes;

class SafetensorsTest : public testing::ScratchDir {};

// One tensor of every dtype, with 0-d, empty and large-ish shapes, and
// names with dots and slashes.
NamedTensors every_dtype() {
  at::manual_seed(7);
  NamedTensors t;
  t.emplace_back("f64.matrix", at::randn({3, 4}, at::kDouble));
  t.emplace_back("f32/scalar", at::scalar_tensor(3.25, at::kFloat));
  t.emplace_back("f16", at::tensor({1.5, -0.0, 65504.0, 6.1e-5}).to(at::kHalf));
  t.emplace_back("bf16", at::randn({2, 3}).to(at::kBFloat16));
  t.emplace_back("i64", at::tensor({std::numeric_limits<int64_t>::min(), int64_t(-1), int64_t(0),
                                    std::numeric_limits<int64_t>::max()}));
  t.emplace_back("i32", at::tensor({-2147483647 - 1, 7, 2147483647}, at::kInt));
  t.emplace_back("i16", at::tensor({-32768, 12, 32767}, at::kShort));
  t.emplace_back("i8", at::tensor({-128, -1, 127}, at::kChar));
  t.emplace_back("u8", at::arange(256, at::kByte));
  t.emplace_back("bool", at::tensor({1, 0, 1, 1, 0, 0, 1}).to(at::kBool));
  t.emplace_back("empty", at::empty({0, 3}));
  t.emplace_back("blocks.0.attn/qkv.weight", at::randn({512, 1024}));
  return t;
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeAndShapeBitExactly) {
  const NamedTensors tensors = every_dtype();
  const Metadata metadata = {{"step", "3"}, {"note", "h\xC3\xA9llo"}};
  write_safetensors(path("all.safetensors"), tensors, metadata);

  SafetensorsFile file = SafetensorsFile::open(path("all.safetensors"));
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors) names.push_back(name);
  EXPECT_EQ(file.keys(), names);  // file order is write order
  EXPECT_EQ(file.metadata(), metadata);
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    const TensorInfo& info = file.info(name);
    EXPECT_EQ(info.spec.dtype, tensor.scalar_type());
    EXPECT_EQ(info.spec.shape, tensor.sizes().vec());
    at::Tensor loaded = file.load(name);
    EXPECT_EQ(loaded.scalar_type(), tensor.scalar_type());
    EXPECT_EQ(loaded.sizes(), tensor.sizes());
    EXPECT_TRUE(loaded.is_contiguous());
    if (tensor.numel() > 0)
      EXPECT_EQ(0, std::memcmp(loaded.data_ptr(), tensor.data_ptr(), tensor.nbytes()));
  }
  EXPECT_EQ(file.load_all().size(), tensors.size());
}

TEST_F(SafetensorsTest, WritesThePublicLayoutWithAnAlignedHeader) {
  write_safetensors(path("x.safetensors"),
                    {{"b", at::tensor({1, 2}, at::kInt)}, {"a", at::tensor({int16_t(-1)}, at::kShort)}},
                    {{"k", "v"}});
  const std::string bytes = read_bytes(path("x.safetensors"));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  // The caller's metadata, plus one XXH64 (16 hex digits) per tensor.
  EXPECT_EQ(header["__metadata__"].size(), 2u);
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  EXPECT_EQ(header["__metadata__"]["strata.xxh64"].get<std::string>().size() % 16, 0u);
  EXPECT_EQ(header["b"], nlohmann::json({{"dtype", "I32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}));
  EXPECT_EQ(header["a"], nlohmann::json({{"dtype", "I16"}, {"shape", {1}}, {"data_offsets", {8, 10}}}));
  EXPECT_EQ(bytes.size(), 8 + n + 10);
  EXPECT_EQ(bytes.substr(8 + n), std::string("\x01\0\0\0\x02\0\0\0\xff\xff", 10));
}

TEST_F(SafetensorsTest, WritesNonContiguousTensorsAsTheirValues) {
  at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  write_safetensors(path("t.safetensors"), {{"t", base.t()}, {"slice", base.select(1, 2)}});
  SafetensorsFile file = SafetensorsFile::open(path("t.safetensors"));
  EXPECT_TRUE(at::equal(file.load("t"), base.t()));
  EXPECT_TRUE(at::equal(file.load("slice"), at::tensor({2.f, 6.f, 10.f})));
}

TEST_F(SafetensorsTest, StreamingWriterShowsNothingUntilClosed) {
  SafetensorsWriter writer(path("s.safetensors"),
                           {TensorSpec{"a", at::kFloat, {2}}, TensorSpec{"b", at::kLong, {}}});
  writer.write("a", at::tensor({1.f, 2.f}));
  EXPECT_FALSE(std::filesystem::exists(path("s.safetensors")));
  writer.write("b", at::scalar_tensor(5, at::kLong));
  writer.close();
  EXPECT_EQ(listing(), std::vector<std::string>{"s.safetensors"});
  EXPECT_EQ(SafetensorsFile::open(path("s.safetensors")).load("b").item<int64_t>(), 5);
}

TEST_F(SafetensorsTest, StreamingWriterRejectsMisuseAndLeavesNoFile) {
  {
    SafetensorsWriter writer(path("w.safetensors"),
                             {TensorSpec{"a", at::kFloat, {2}}, TensorSpec{"b", at::kFloat, {3}}});
    try {
      writer.write("b", at::zeros({3}));
      FAIL() << "out-of-order write accepted";
    } catch (const CheckpointError& e) {
      EXPECT_THAT(e.what(), HasSubstr("tensor 'b' written out of order; the next declared tensor is 'a'"));
    }
    try {
      writer.write("a", at::zeros({3}));
      FAIL() << "wrong shape accepted";
    } catch (const CheckpointError& e) {
      EXPECT_THAT(e.what(), HasSubstr("tensor 'a' was declared as F32 [2] but is Float [3]"));
    }
    writer.write("a", at::zeros({2}));
    try {
      writer.close();
      FAIL() << "close with a tensor missing accepted";
    } catch (const CheckpointError& e) {
      EXPECT_THAT(e.what(), HasSubstr("closed with 1 declared tensors not written: 'b'"));
    }
  }
  EXPECT_TRUE(listing().empty());  // the temporary file is gone too

  EXPECT_THROW(SafetensorsWriter(path("d"), {TensorSpec{"a", at::kFloat, {1}},
                                              TensorSpec{"a", at::kFloat, {1}}}),
               CheckpointError);
  try {
    write_safetensors(path("c"), {{"z", at::zeros({2}, at::kComplexFloat)}});
    FAIL() << "complex dtype accepted";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("dtype ComplexFloat cannot be stored in a safetensors file"));
  }
  EXPECT_TRUE(listing().empty());
}

// ---- damaged files ------------------------------------------------------------

// Opens `file` expecting a CheckpointError whose message names the file and
// contains `problem`.
void expect_open_error(const std::string& file, const std::string& problem) {
  try {
    SafetensorsFile::open(file);
    ADD_FAILURE() << "opened " << file << " without error; expected: " << problem;
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("[checkpoint] " + file + ": "));
    EXPECT_THAT(e.what(), HasSubstr(problem));
  }
}

TEST_F(SafetensorsTest, MissingFileIsAnErrorNamingIt) {
  expect_open_error(path("nope.safetensors"), "cannot open: No such file or directory");
  expect_open_error(path("nope.safetensors"), "the file does not exist");
}

TEST_F(SafetensorsTest, TruncatedFileNamesTheTensorThatDoesNotFit) {
  write_safetensors(path("model.safetensors"),
                    {{"fc.bias", at::zeros({4})}, {"fc.weight", at::zeros({32, 32})}});
  const std::string bytes = read_bytes(path("model.safetensors"));
  const size_t data_start = bytes.size() - (16 + 4096);
  write_bytes(path("model.safetensors"), bytes.substr(0, data_start + 1200));
  expect_open_error(path("model.safetensors"),
                    "tensor 'fc.weight' needs bytes [16, 4112) of the data buffer but the file "
                    "has only 1200 (truncated?)");

  write_bytes(path("model.safetensors"), bytes.substr(0, 5));
  expect_open_error(path("model.safetensors"), "the file is 5 bytes, too short");
  write_bytes(path("model.safetensors"), bytes.substr(0, 40));
  expect_open_error(path("model.safetensors"), "is more than the 32 bytes that follow it");
}

TEST_F(SafetensorsTest, CorruptHeadersAreErrorsNamingTheProblem) {
  const std::string f = path("bad.safetensors");
  const std::string eight(8, '\0');
  struct Case {
    std::string header, buffer, problem;
  };
  const std::vector<Case> cases = {
      {"{\"a\": {\"dtype\": \"F32\"", eight, "the header is not valid JSON"},
      {"[1, 2]", "", "the header is JSON but not an object (array)"},
      {R"({"a": {"dtype": "F31", "shape": [2], "data_offsets": [0, 8]}})", eight,
       "tensor 'a': unknown dtype 'F31'; supported: F64, F32"},
      {R"({"a": {"dtype": 32, "shape": [2], "data_offsets": [0, 8]}})", eight,
       "tensor 'a' has dtype 32; expected a string"},
      {R"({"a": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})", eight,
       "tensor 'a' has a dimension -1; expected a non-negative integer"},
      {R"({"a": {"dtype": "F32", "data_offsets": [0, 8]}})", eight, "tensor 'a' has no \"shape\""},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 6]}})", eight,
       "tensor 'a' is F32 [2] (8 bytes) but its data_offsets [0, 6] span 6 bytes"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", eight,
       "data_offsets [8, 0] with begin after end"},
      {R"({"a": {"dtype": "U8", "shape": [6], "data_offsets": [0, 6]},
           "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
       eight, "tensor 'b' (bytes [4, 8)) overlaps tensor 'a' (bytes [0, 6))"},
      {R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})", eight,
       "tensor 'a' begins at byte 4 of the data buffer, leaving a gap after byte 0"},
      {R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})", eight,
       "the file has 4 bytes after the last tensor's data"},
      {R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
           "a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
       eight, "the header names 'a' twice"},
      {R"({"__metadata__": {"step": 3}})", "", "__metadata__ entry 'step' is 3; expected a string"},
      {R"({"a": {"dtype": "F64", "shape": [4611686018427387904, 4], "data_offsets": [0, 8]}})",
       eight, "too large to exist"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    write_bytes(f, raw_safetensors(c.header, c.buffer));
    expect_open_error(f, c.problem);
  }
  // A header length no file could have, and one past the end of the file.
  write_bytes(f, raw_safetensors("{}", "", uint64_t(1) << 60));
  expect_open_error(f, "header length 1152921504606846976 exceeds the 100000000-byte limit");
  write_bytes(f, raw_safetensors("{}", "", 1000));
  expect_open_error(f, "header length 1000 is more than the 2 bytes that follow it");
}

TEST_F(SafetensorsTest, AcceptsAnEmptyFileAndNullMetadata) {
  write_bytes(path("e.safetensors"), raw_safetensors(R"({"__metadata__": null})", ""));
  SafetensorsFile file = SafetensorsFile::open(path("e.safetensors"));
  EXPECT_TRUE(file.keys().empty());
  EXPECT_TRUE(file.metadata().empty());
  write_safetensors(path("none.safetensors"), {});
  EXPECT_TRUE(SafetensorsFile::open(path("none.safetensors")).keys().empty());
}

TEST_F(SafetensorsTest, UnknownKeyAndFileTruncatedAfterOpenAreErrors) {
  write_safetensors(path("m.safetensors"), {{"w", at::ones({256})}});
  SafetensorsFile file = SafetensorsFile::open(path("m.safetensors"));
  try {
    file.load("v");
    FAIL() << "unknown key loaded";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path("m.safetensors") + ": no tensor named 'v'"));
  }
  ASSERT_EQ(::truncate(path("m.safetensors").c_str(), 100), 0);
  try {
    file.load("w");
    FAIL() << "read past the end of a truncated file";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'w' needs 1024 bytes but the file ended after"));
  }
}

TEST_F(SafetensorsTest, ZeroElementTensorsRoundTripAnywhereInTheFile) {
  // Shards of small tensors are often empty: they share an offset with
  // their neighbour and must keep their names, dtypes and shapes.
  const NamedTensors tensors = {{"first", at::empty({0}, at::kFloat)},
                                {"a", at::tensor({1.f, 2.f, 3.f})},
                                {"empty.bf16", at::empty({0}, at::kBFloat16)},
                                {"empty.i64", at::empty({0, 5}, at::kLong)},
                                {"b", at::tensor({int64_t(7)})},
                                {"last", at::empty({0}, at::kFloat)}};
  write_safetensors(path("z.safetensors"), tensors);
  SafetensorsFile file = SafetensorsFile::open(path("z.safetensors"));
  // 0-byte tensors at one offset are listed in name order.
  EXPECT_EQ(file.keys(), (std::vector<std::string>{"first", "a", "empty.bf16", "empty.i64", "b",
                                                   "last"}));
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    at::Tensor loaded = file.load(name);
    EXPECT_EQ(loaded.scalar_type(), tensor.scalar_type());
    EXPECT_EQ(loaded.sizes(), tensor.sizes());
    EXPECT_TRUE(at::equal(loaded, tensor));
    EXPECT_EQ(file.load_flat(name, 0, 0).numel(), 0);
  }

  write_safetensors(path("only.safetensors"), {{"x", at::empty({0})}, {"y", at::empty({3, 0})}});
  SafetensorsFile only = SafetensorsFile::open(path("only.safetensors"));
  EXPECT_EQ(only.keys(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(only.load("y").sizes(), (std::vector<int64_t>{3, 0}));
}

TEST_F(SafetensorsTest, LoadFlatReadsAnyRangeOfTheFlattenedTensor) {
  const at::Tensor m = at::arange(12, at::kDouble).reshape({3, 4});
  write_safetensors(path("f.safetensors"), {{"pad", at::ones({3}, at::kByte)}, {"m", m}});
  SafetensorsFile file = SafetensorsFile::open(path("f.safetensors"));
  for (int64_t begin = 0; begin <= 12; ++begin)
    for (int64_t end = begin; end <= 12; ++end)
      EXPECT_TRUE(at::equal(file.load_flat("m", begin, end), m.reshape({-1}).slice(0, begin, end)))
          << begin << ".." << end;
  try {
    file.load_flat("m", 4, 13);
    FAIL() << "range past the end accepted";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'm' has 12 elements; elements [4, 13) are out of range"));
  }
  EXPECT_THROW(file.load_flat("m", 5, 4), CheckpointError);
}

// ---- an independent reader ----------------------------------------------------

TEST_F(SafetensorsTest, PythonStandardLibraryReaderSeesTheSameValues) {
  const char* python = std::getenv("STRATA_PYTHON");
  ASSERT_TRUE(python != nullptr && *python) << "STRATA_PYTHON is not set: run the suite through scripts/test.sh";
  const char* source_dir = std::getenv("STRATA_SOURCE_DIR");
  const std::string script =
      source_dir ? std::string(source_dir) + "/tests/checkpoint/read_safetensors.py"
                 : (std::filesystem::path(__FILE__).parent_path() / "read_safetensors.py").string();
  ASSERT_TRUE(std::filesystem::exists(script)) << script;

  NamedTensors tensors = every_dtype();
  tensors.pop_back();  // the large one: keep the JSON small
  const float inf = std::numeric_limits<float>::infinity();
  tensors.emplace_back("special", at::tensor({std::nanf(""), inf, -inf, 1e-45f, -0.f}));
  write_safetensors(path("py.safetensors"), tensors, {{"epoch", "2"}});

  const std::string command = std::string(python) + " " + script + " " + path("py.safetensors");
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  ASSERT_EQ(::pclose(pipe), 0) << output;
  const auto result = nlohmann::json::parse(output);

  nlohmann::json metadata = result["metadata"];
  EXPECT_TRUE(metadata.contains("strata.xxh64"));  // the checksums, a string like any other
  metadata.erase("strata.xxh64");
  EXPECT_EQ(metadata, nlohmann::json({{"epoch", "2"}}));
  ASSERT_EQ(result["tensors"].size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    const auto& entry = result["tensors"][name];
    EXPECT_EQ(entry["dtype"], dtype_name(tensor.scalar_type()));
    EXPECT_EQ(entry["shape"].get<std::vector<int64_t>>(), tensor.sizes().vec());
    const at::Tensor flat = tensor.reshape({-1});
    ASSERT_EQ(entry["values"].size(), size_t(flat.numel()));
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const auto& value = entry["values"][i];
      if (tensor.is_floating_point()) {
        const double expected = flat[i].item<double>();
        if (std::isnan(expected)) {
          EXPECT_EQ(value, "nan");
        } else if (std::isinf(expected)) {
          EXPECT_EQ(value, expected > 0 ? "inf" : "-inf");
        } else {
          EXPECT_EQ(value.get<double>(), expected) << "element " << i;  // exact
          EXPECT_EQ(std::signbit(value.get<double>()), std::signbit(expected)) << "element " << i;
        }
      } else if (tensor.scalar_type() == at::kBool) {
        EXPECT_EQ(value.get<bool>(), flat[i].item<bool>()) << "element " << i;
      } else {
        EXPECT_EQ(value.get<int64_t>(), flat[i].item<int64_t>()) << "element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace strata::checkpoint
