// KV formats behind one interface: a codec says how a full block of kKVBlockTokens tokens of K and V is
// stored (quantize), which R-worker kernel reads it (kernel), and the values attention computes with
// (dequantize_f32, the reference every test and the reference engine use).
//
// Two kinds of codec share the interface:
//   * served formats (fp16, int8, int4): the R-worker's KV store and the decode-attention kernels read them;
//     kernel() is their KVDType and quantize / dequantize_f32 are kv_quantize_block / kv_dequantize_block_f32.
//   * study formats (int4-ktoken, int4-ktoken-rot, int4-rot): judged for accuracy before any kernel reads them
//     (issue 44: pick by accuracy first, then speed). kernel() is empty; the reference engine runs them
//     (`engine.kv_format`), an R-worker cannot.
// Adding a format: one file defining a KVCodec and its `make_...` function, one line in kv_codec.cpp's list,
// and its tests (tests/unit/test_kv_codec.cpp checks every listed codec's contract generically).
//
// Blocks in and out use the fp16 tail layout (decode_attention.h): K [H][32][D], then V [H][32][D].
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/decode_attention.h"

namespace fd {

class KVCodec {
 public:
  virtual ~KVCodec() = default;
  virtual std::string_view name() const = 0;
  // One line: how K and V are stored (grouping, bits, parameters), for reports and --help.
  virtual std::string_view describe() const = 0;
  // The R-worker kernel that reads this format; empty for a study format.
  virtual std::optional<KVDType> kernel() const = 0;
  // Throws fd::ConfigError when the format cannot hold this shape (e.g. a rotation needs head_dim a power of 2).
  virtual void check_shape(int n_kv_heads, int head_dim) const;
  virtual size_t block_bytes(int n_kv_heads, int head_dim) const = 0;
  // fp16 block (tail layout, 32 valid tokens) -> block_bytes bytes at `out`.
  virtual void quantize(const uint16_t* fp16_block, void* out, int n_kv_heads, int head_dim) const = 0;
  // The values attention computes with, fp32, in the tail layout and in the model's basis (a rotation the
  // format applied is undone: q . R^T (R k) = q . k, so rotating K back is the same as rotating the query).
  virtual void dequantize_f32(const void* block, float* out, int n_kv_heads, int head_dim) const = 0;
};

// The codec of that name; fd::ConfigError listing the known names otherwise.
const KVCodec& kv_codec(std::string_view name);
// Every codec's name, served formats first.
std::vector<std::string> kv_codec_names();

// One fp16-layout block through a codec: quantize, then the values it stands for (fp32, tail layout).
void kv_codec_round_trip(const KVCodec& c, const uint16_t* fp16_block, float* out, int n_kv_heads, int head_dim);

// In-place orthonormal Walsh-Hadamard transform of n floats (n a power of 2, scaled by 1/sqrt(n)): its own
// inverse. Used by the rotated formats; exposed for their tests.
void hadamard_transform(float* x, int n);

// The codecs defined in their own files (kv_codec.cpp lists them).
std::unique_ptr<KVCodec> make_served_kv_codec(KVDType dtype);       // kv_codec.cpp
std::unique_ptr<KVCodec> make_int4_study_codec(std::string_view name);  // kv_codec_int4_study.cpp

}  // namespace fd
