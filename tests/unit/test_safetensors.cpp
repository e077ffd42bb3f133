// safetensors reader / writer: round trips, compatibility with the standard byte layout, and one test
// per class of bad file (each must give an fd::ConfigError naming the file and, where relevant, the tensor).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "fastdecode/model/safetensors.h"

namespace {

namespace fs = std::filesystem;
using fd::DType;
using fd::SafetensorsFile;
using fd::SafetensorsWriter;
using fd::TensorInfo;
using ::testing::HasSubstr;

// Runs f, expects an fd::Error and returns its message (other exception types fail the test).
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const fd::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an fd::Error";
  return "";
}

// A bad file is bad input: fd::ConfigError (programs exit 2), not a runtime fd::Error.
template <class F>
std::string config_error_message(F&& f) {
  try {
    f();
  } catch (const fd::ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected an fd::ConfigError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an fd::ConfigError";
  return "";
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A file as the standard format lays it out: length, header, data (no padding added here).
std::string st_bytes(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class SafetensorsTmp : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "fd_safetensors_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write_file(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // Writes a file with one tensor per entry, all in one call of the writer.
  template <class T>
  std::string write_one(const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v,
                        std::map<std::string, std::string> meta = {}) {
    const std::string p = path(name);
    SafetensorsWriter w(p, {{"t", dt, shape}}, std::move(meta));
    w.write("t", v.data(), v.size() * sizeof(T));
    w.finish();
    return p;
  }
  // Expects open() to fail with a message naming the file and containing every string in `parts`.
  void expect_open_error(const std::string& p, std::initializer_list<std::string> parts) {
    const std::string msg = config_error_message([&] { SafetensorsFile::open(p); });
    EXPECT_THAT(msg, HasSubstr(p));
    for (const auto& s : parts) EXPECT_THAT(msg, HasSubstr(s));
  }
  // A one-tensor header whose entry for tensor "w" is `entry`.
  void expect_bad_entry(const std::string& entry, const std::string& data, std::initializer_list<std::string> parts) {
    static int n = 0;
    const std::string p = write_file("bad" + std::to_string(n++) + ".safetensors",
                                     st_bytes("{\"w\":" + entry + "}", data));
    std::vector<std::string> all(parts);
    all.push_back("'w'");
    const std::string msg = config_error_message([&] { SafetensorsFile::open(p); });
    EXPECT_THAT(msg, HasSubstr(p)) << "entry " << entry;
    for (const auto& s : all) EXPECT_THAT(msg, HasSubstr(s)) << "entry " << entry;
  }

  fs::path dir_;
};

using SafetensorsRoundTrip = SafetensorsTmp;
using SafetensorsWriterTest = SafetensorsTmp;
using SafetensorsCompat = SafetensorsTmp;
using SafetensorsBadFile = SafetensorsTmp;

std::vector<float> random_floats(size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST_F(SafetensorsRoundTrip, F32) {
  auto v = random_floats(24, 3.f, 1);
  v[0] = 0.f;
  v[1] = -0.f;
  v[2] = std::numeric_limits<float>::denorm_min();
  v[3] = std::numeric_limits<float>::max();
  const auto p = write_one("f32.safetensors", DType::F32, {2, 3, 4}, v);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  const auto f = SafetensorsFile::open(p);
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.get("t").dtype, DType::F32);
  EXPECT_EQ(f.get("t").numel(), 24);
  const auto back = f.read_f32("t", {2, 3, 4});
  EXPECT_EQ(std::memcmp(back.data(), v.data(), v.size() * 4), 0);
}

TEST_F(SafetensorsRoundTrip, F16AndBF16) {
  for (DType dt : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(std::string(fd::dtype_name(dt)));
    // Values exact in both half types come back exactly.
    const std::vector<float> exact = {0.f, 1.f, -2.f, 0.5f, 0.375f, -96.f, 256.f, 0x1p-14f};
    std::vector<uint16_t> bits(exact.size());
    fd::convert_from_f32(dt, exact.data(), bits.data(), exact.size());
    auto p = write_one("exact.safetensors", dt, {8}, bits);
    EXPECT_EQ(SafetensorsFile::open(p).read_f32("t", {8}), exact);

    // Random values: the stored bits are the library's rounding and read back as its exact value.
    const auto v = random_floats(64, 10.f, 2);
    std::vector<uint16_t> rounded(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      rounded[i] = dt == DType::F16 ? fd::fp32_to_fp16(v[i]) : fd::fp32_to_bf16(v[i]);
    p = write_one("random.safetensors", dt, {4, 16}, rounded);
    const auto f = SafetensorsFile::open(p);
    EXPECT_EQ(std::memcmp(f.data(f.get("t")), rounded.data(), rounded.size() * 2), 0);
    const auto back = f.read_f32("t", {4, 16});
    for (size_t i = 0; i < v.size(); ++i) {
      const float expect = dt == DType::F16 ? fd::fp16_to_fp32(rounded[i]) : fd::bf16_to_fp32(rounded[i]);
      EXPECT_EQ(back[i], expect);
      EXPECT_NEAR(back[i], v[i], std::abs(v[i]) * (dt == DType::F16 ? 0x1p-11f : 0x1p-8f) + 1e-7f);
    }
  }
}

TEST_F(SafetensorsRoundTrip, MetadataOrderAlignmentAndMove) {
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"model", "llama-7b \"quoted\" ü"}};
  std::vector<TensorInfo> infos = {{"z.weight", DType::F16, {3}},  // 6 bytes: next tensor unaligned on purpose
                                   {"a.bias", DType::F32, {2}},
                                   {"scalar", DType::BF16, {}},
                                   {"empty", DType::F32, {0, 5}},
                                   {"m.weight", DType::BF16, {2, 2}}};
  const std::string p = path("multi.safetensors");
  SafetensorsWriter w(p, infos, meta);
  EXPECT_TRUE(fs::exists(p + ".tmp"));
  EXPECT_FALSE(fs::exists(p));
  const std::vector<uint16_t> z = {fd::fp32_to_fp16(1.f), fd::fp32_to_fp16(2.f), fd::fp32_to_fp16(3.f)};
  const std::vector<float> a = {-1.5f, 2.25f};
  const uint16_t s = fd::fp32_to_bf16(7.f);
  const std::vector<uint16_t> m = {fd::fp32_to_bf16(1.f), fd::fp32_to_bf16(-1.f), fd::fp32_to_bf16(0.5f),
                                   fd::fp32_to_bf16(4.f)};
  w.write("z.weight", z.data(), 6);
  w.write("a.bias", a.data(), 8);
  w.write("scalar", &s, 2);
  w.write("empty", nullptr, 0);
  w.write("m.weight", m.data(), 8);
  w.finish();
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  auto opened = SafetensorsFile::open(p);
  const SafetensorsFile f = std::move(opened);  // move-only: the moved-to object owns the mapping
  EXPECT_EQ(f.path(), p);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.tensors().size(), infos.size());
  size_t offset = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(f.tensors()[i].name, infos[i].name);
    EXPECT_EQ(f.tensors()[i].shape, infos[i].shape);
    EXPECT_EQ(f.tensors()[i].offset, offset);  // contiguous, in the given order
    offset += f.tensors()[i].nbytes;
  }
  EXPECT_EQ(f.file_size(), fs::file_size(p));
  // Data starts on an 8-byte boundary: the header length is a multiple of 8.
  std::ifstream in(p, std::ios::binary);
  char len[8];
  in.read(len, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(len[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(8 + n + offset, f.file_size());

  EXPECT_EQ(f.read_f32("z.weight", {3}), (std::vector<float>{1.f, 2.f, 3.f}));
  EXPECT_EQ(f.read_f32("a.bias", {2}), a);
  EXPECT_EQ(f.read_f32("scalar", {}), std::vector<float>{7.f});
  EXPECT_TRUE(f.read_f32("empty", {0, 5}).empty());
  EXPECT_EQ(f.read_f32("m.weight", {2, 2}), (std::vector<float>{1.f, -1.f, 0.5f, 4.f}));
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_EQ(f.find("a.bias"), &f.get("a.bias"));
}

TEST_F(SafetensorsWriterTest, UnfinishedRemovesTmp) {
  const std::string p = path("unfinished.safetensors");
  {
    SafetensorsWriter w(p, {{"a", DType::F32, {2}}, {"b", DType::F32, {2}}});
    const float x[2] = {1, 2};
    w.write("a", x, 8);
    EXPECT_TRUE(fs::exists(p + ".tmp"));
  }
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(SafetensorsWriterTest, OutOfOrderWrongSizeAndEarlyFinishThrow) {
  const std::string p = path("order.safetensors");
  SafetensorsWriter w(p, {{"first", DType::F16, {4}}, {"second", DType::F32, {1}}});
  const uint16_t h[4] = {};
  std::string msg = error_message([&] { w.write("second", h, 4); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("second"));
  EXPECT_THAT(msg, HasSubstr("first"));
  msg = error_message([&] { w.write("first", h, 6); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("first"));
  EXPECT_THAT(msg, HasSubstr("8"));
  EXPECT_THAT(msg, HasSubstr("6"));
  w.write("first", h, 8);  // the failed calls wrote nothing
  msg = error_message([&] { w.finish(); });
  EXPECT_THAT(msg, HasSubstr("second"));
  const float x = 1.f;
  w.write("second", &x, 4);
  msg = error_message([&] { w.write("third", &x, 4); });
  EXPECT_THAT(msg, HasSubstr("third"));
  w.finish();
  EXPECT_EQ(SafetensorsFile::open(p).read_f32("second", {1}), std::vector<float>{1.f});
}

TEST_F(SafetensorsWriterTest, BadTensorListThrows) {
  const std::string p = path("list.safetensors");
  auto msg = error_message([&] { SafetensorsWriter(p, {{"a", DType::F32, {1}}, {"a", DType::F32, {1}}}); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("'a'"));
  msg = error_message([&] { SafetensorsWriter(p, {{"neg", DType::F32, {2, -1}}}); });
  EXPECT_THAT(msg, HasSubstr("neg"));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

// A file laid out byte by byte as Python's safetensors writes it: __metadata__ first, tensors in data
// order, header padded with spaces to a multiple of 8.
TEST_F(SafetensorsCompat, ReadsStandardLayout) {
  std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"h":{"dtype":"F16","shape":[1],"data_offsets":[16,18]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const unsigned char data[] = {0x80, 0x3f, 0x00, 0xc0, 0x00, 0x3f, 0x40, 0x40,  // bf16 1, -2, 0.5, 3
                                0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x80, 0xbe,  // f32 1.5, -0.25
                                0x00, 0x3c};                                     // f16 1
  const std::string p = write_file("py.safetensors", st_bytes(header, std::string(reinterpret_cast<const char*>(data), sizeof data)));
  const auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "w");
  EXPECT_EQ(f.tensors()[1].name, "b");
  EXPECT_EQ(f.tensors()[2].name, "h");
  EXPECT_EQ(f.read_f32("w", {2, 2}), (std::vector<float>{1.f, -2.f, 0.5f, 3.f}));
  EXPECT_EQ(f.read_f32("b", {2}), (std::vector<float>{1.5f, -0.25f}));
  EXPECT_EQ(f.read_f32("h", {1}), std::vector<float>{1.f});
}

// What our writer produces is byte for byte the standard layout.
TEST_F(SafetensorsCompat, WriterBytesAreStandard) {
  const std::vector<float> v = {1.f, 2.f};
  const auto p = write_one("ours.safetensors", DType::F32, {2}, v, {{"k", "v"}});
  std::ifstream in(p, std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string header = R"({"__metadata__":{"k":"v"},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(got, st_bytes(header, raw(v)));
}

// ---- bad files: each must give an fd::ConfigError naming the file (and tensor) ----

TEST_F(SafetensorsBadFile, MissingFile) { expect_open_error(path("does_not_exist.safetensors"), {"cannot open"}); }

TEST_F(SafetensorsBadFile, EmptyFile) { expect_open_error(write_file("empty.safetensors", ""), {"0 bytes"}); }

TEST_F(SafetensorsBadFile, ShorterThanLengthField) {
  expect_open_error(write_file("short.safetensors", "\x10\0\0\0\0"), {"too short"});
}

TEST_F(SafetensorsBadFile, HeaderLengthPastEndOfFile) {
  expect_open_error(write_file("hlen.safetensors", le64(100) + "{}"), {"header length 100", "only 2 bytes"});
}

TEST_F(SafetensorsBadFile, HeaderLengthAbsurd) {
  expect_open_error(write_file("huge1.safetensors", le64(200ull << 20) + "{}"), {"absurdly large"});
  expect_open_error(write_file("huge2.safetensors", le64(~0ull) + "{}"), {"absurdly large"});
}

TEST_F(SafetensorsBadFile, HeaderNotJson) {
  expect_open_error(write_file("json1.safetensors", st_bytes(R"({"w": {"dtype": "F32",)")), {"not valid JSON"});
  expect_open_error(write_file("json2.safetensors", st_bytes("\xff\xfe garbage")), {"not valid JSON"});
  expect_open_error(write_file("json3.safetensors", st_bytes(std::string("{\"a\0\":1}", 8))), {"not valid JSON"});
}

TEST_F(SafetensorsBadFile, HeaderNotObject) {
  expect_open_error(write_file("arr.safetensors", st_bytes("[1, 2, 3]")), {"JSON object", "array"});
  expect_open_error(write_file("num.safetensors", st_bytes("42")), {"JSON object"});
}

TEST_F(SafetensorsBadFile, EntryMissingFields) {
  expect_bad_entry(R"({"shape":[1],"data_offsets":[0,4]})", std::string(4, '\0'), {"missing", "dtype"});
  expect_bad_entry(R"({"dtype":"F32","data_offsets":[0,4]})", std::string(4, '\0'), {"missing", "shape"});
  expect_bad_entry(R"({"dtype":"F32","shape":[1]})", std::string(4, '\0'), {"missing", "data_offsets"});
}

TEST_F(SafetensorsBadFile, EntryWrongJsonTypes) {
  const std::string d(4, '\0');
  expect_bad_entry(R"([1,2])", d, {"expected a JSON object"});
  expect_bad_entry(R"({"dtype":7,"shape":[1],"data_offsets":[0,4]})", d, {"\"dtype\" must be a string"});
  expect_bad_entry(R"({"dtype":"F32","shape":"1","data_offsets":[0,4]})", d, {"\"shape\" must be an array"});
  expect_bad_entry(R"({"dtype":"F32","shape":[1],"data_offsets":"0,4"})", d, {"data_offsets"});
  expect_bad_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", d, {"data_offsets"});
  expect_bad_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", d, {"data_offsets"});
  expect_bad_entry(R"({"dtype":"F32","shape":[1],"data_offsets":["0","4"]})", d, {"data_offsets"});
  expect_bad_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", d, {"data_offsets"});
  expect_bad_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0.0,4.0]})", d, {"data_offsets"});
  // __metadata__ must map strings to strings.
  expect_open_error(write_file("meta1.safetensors", st_bytes(R"({"__metadata__":{"n":1}})")), {"__metadata__", "\"n\""});
  expect_open_error(write_file("meta2.safetensors", st_bytes(R"({"__metadata__":[]})")), {"__metadata__"});
}

TEST_F(SafetensorsBadFile, UnsupportedDtype) {
  expect_bad_entry(R"({"dtype":"I64","shape":[1],"data_offsets":[0,8]})", std::string(8, '\0'), {"unsupported", "I64"});
  expect_bad_entry(R"({"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]})", std::string(1, '\0'),
                   {"unsupported", "F8_E4M3"});
}

TEST_F(SafetensorsBadFile, BadShapeDims) {
  const std::string d(8, '\0');
  expect_bad_entry(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", d, {"non-negative", "-2"});
  expect_bad_entry(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})", d, {"non-negative integers", "2.5"});
  expect_bad_entry(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", d, {"non-negative integers"});
  expect_bad_entry(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})", d, {"non-negative integers"});
  expect_bad_entry(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]})", d, {"non-negative"});
}

TEST_F(SafetensorsBadFile, OffsetsEndBeforeBegin) {
  expect_bad_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})", std::string(8, '\0'), {"end 4 < begin 8"});
}

TEST_F(SafetensorsBadFile, ByteSizeMismatch) {
  expect_bad_entry(R"({"dtype":"F16","shape":[2,3],"data_offsets":[0,8]})", std::string(8, '\0'),
                   {"[2, 3]", "needs 12 bytes", "span 8"});
  // numel * 4 wraps to 0 in 64 bits: must be reported, not accepted as an empty tensor.
  expect_bad_entry(R"({"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]})", "", {"overflow"});
  expect_bad_entry(R"({"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]})", "", {"overflow"});
}

TEST_F(SafetensorsBadFile, TruncatedData) {
  expect_bad_entry(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", std::string(12, '\0'),
                   {"past the end", "12 bytes"});
  // A good file from our writer, cut short: the last tensor is named.
  const auto v = random_floats(16, 1.f, 3);
  const auto p = path("cut.safetensors");
  {
    SafetensorsWriter w(p, {{"first", DType::F32, {8}}, {"last", DType::F32, {8}}});
    w.write("first", v.data(), 32);
    w.write("last", v.data() + 8, 32);
    w.finish();
  }
  fs::resize_file(p, fs::file_size(p) - 1);
  expect_open_error(p, {"'last'", "truncated"});
}

TEST_F(SafetensorsBadFile, OverlappingTensors) {
  const std::string p = write_file(
      "overlap.safetensors",
      st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               std::string(12, '\0')));
  expect_open_error(p, {"'b'", "overlaps", "'a'"});
  // Same range twice, listed in reverse data order.
  const std::string q = write_file(
      "overlap2.safetensors",
      st_bytes(R"({"b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
               std::string(8, '\0')));
  expect_open_error(q, {"overlaps", "'a'", "'b'"});
}

TEST_F(SafetensorsBadFile, DuplicateNames) {
  const std::string p = write_file(
      "dup.safetensors",
      st_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               std::string(8, '\0')));
  expect_open_error(p, {"'w'", "more than once"});
}

TEST_F(SafetensorsBadFile, ReadMissingTensorOrWrongShape) {
  const std::vector<float> v(6, 1.f);
  const auto p = write_one("shape.safetensors", DType::F32, {2, 3}, v);
  const auto f = SafetensorsFile::open(p);
  std::string msg = config_error_message([&] { f.read_f32("model.layers.0.missing", {2, 3}); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("model.layers.0.missing"));
  EXPECT_THAT(msg, HasSubstr("not found"));
  msg = config_error_message([&] { f.get("other"); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("other"));
  msg = config_error_message([&] { f.read_f32("t", {3, 2}); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("'t'"));
  EXPECT_THAT(msg, HasSubstr("expected shape [3, 2], found [2, 3]"));
  msg = config_error_message([&] { f.read_f32("t", {6}); });
  EXPECT_THAT(msg, HasSubstr("[6]"));
}

}  // namespace
