// Internal to the CPU decode-attention kernels: block layouts as per-head pointers, the per-chunk entry
// points of each ISA, and (only for the SIMD translation units) the shared SIMD kernel template.
//
// Shapes: H = n_kv_heads, D = head_dim (multiple of 32, <= 256), kBT = kKVBlockTokens = 32,
// G = n_heads / n_kv_heads (the GQA group). One "chunk" is a run of whole blocks [b0, b1) of one
// (sequence, kv head) pair, plus the fp16 tail when it is the pair's last chunk.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/decode_attention.h"

namespace fd::attn {

constexpr int kBT = kKVBlockTokens;  // tokens per KV block (kBT, not T: T is the SIMD register type in the ISA files)

// ---- Per-head views of one block (the layouts are described at the top of kv_quant.cpp) ----
struct F16Head {
  const uint16_t* k;  // [kBT][D] fp16
  const uint16_t* v;  // [kBT][D] fp16
};
inline F16Head f16_head(const void* blk, int H, int D, int h) {
  const auto* b = static_cast<const uint16_t*>(blk);
  const size_t hs = size_t(kBT) * D;
  return {b + h * hs, b + H * hs + h * hs};
}
struct I8Head {
  const int8_t* k;   // [D/4][kBT][4] codes, token-interleaved words (i8_key); x = ks[t] * code
  const int8_t* v;   // [kBT][D]
  const float* ks;   // [kBT]
  const float* vs;   // [kBT]
};
// int8 keys: word w of token t (4 bytes at (w * kBT + t) * 4) holds channels 4w..4w+3, so a vector of consecutive
// words of one w holds consecutive tokens (as the int4 keys, u4_key): a dot product makes one token per lane.
inline int i8_key(const int8_t* k, int t, int d) { return k[(size_t(d / 4) * kBT + t) * 4 + d % 4]; }
// Packs the codes c[t][d] (t < kBT, d < D; row stride cs) of one head's keys into that layout.
inline void pack_i8_keys(const int8_t* c, int cs, int D, int8_t* k) {
  for (int w = 0; w < D / 4; ++w)
    for (int t = 0; t < kBT; ++t)
      for (int b = 0; b < 4; ++b) k[(size_t(w) * kBT + t) * 4 + b] = c[size_t(t) * cs + 4 * w + b];
}
// Head-major: head h's run (the block of one head): K and V codes kBT D bytes each, then K and V scales (fp32, kBT).
inline size_t i8_head_bytes(int D) { return 2 * size_t(kBT) * D + 2 * kBT * sizeof(float); }
inline I8Head i8_head(const void* blk, int /*H*/, int D, int h) {
  const size_t hs = size_t(kBT) * D;
  const auto* b = static_cast<const int8_t*>(blk) + h * i8_head_bytes(D);
  const auto* sc = reinterpret_cast<const float*>(b + 2 * hs);
  return {b, b + hs, sc, sc + kBT};
}
struct I4Head {
  const uint8_t* k;    // [D/8][kBT][4] packed codes, token-interleaved words (u4_key; kv_quant.cpp)
  const uint8_t* v;    // [kBT/4][D/32][16][4] packed codes, quad-group words (u4_val; kv_quant.cpp)
  const uint16_t* kp;  // fp16 [2][D]: row 0 per-channel scale, row 1 per-channel min; x = s*c + z
  const uint16_t* vp;  // fp16 [D/32][2][kBT]: per 32-channel group, 32 token scales then 32 token mins
};
// int4 keys: word w of token t (4 bytes at ((w * kBT) + t) * 4) packs channels 8w..8w+7: byte b holds channel
// 8w + b in its low nibble and 8w + 4 + b in its high one. A vector of consecutive words of one w holds
// consecutive tokens, so a dot product with the query makes one token per lane (no reduction across lanes).
constexpr int kU4KeyWordBytes = 4;
inline int u4_key(const uint8_t* k, int t, int d) {
  const uint8_t b = k[(size_t(d / 8) * kBT + t) * kU4KeyWordBytes + d % 4];
  return d % 8 < 4 ? (b & 15) : (b >> 4);
}
// Packs the codes c[t][d] (t < kBT, d < D; row stride cs) of one head's keys into that layout.
inline void pack_u4_keys(const uint8_t* c, int cs, int D, uint8_t* k) {
  for (int w = 0; w < D / 8; ++w)
    for (int t = 0; t < kBT; ++t)
      for (int b = 0; b < 4; ++b) {
        const uint8_t* r = c + size_t(t) * cs + 8 * w;
        k[(size_t(w) * kBT + t) * kU4KeyWordBytes + b] = uint8_t(r[b] | (r[4 + b] << 4));
      }
}
// int4 values: word j of group g (channels 32g..32g+31) of quad q (tokens 4q..4q+3) is 4 bytes at ((q * D/32 + g)
// * 16 + j) * 4; byte r is token 4q + r's: channel 32g + j in the low nibble, 32g + 16 + j in the high one. A
// 64-byte load is a group of 4 tokens, 4 tokens' codes of a channel side by side in each lane (VPDPBUSD's operand
// for p . V as it lies) and one group's weight for all lanes.
inline int u4_val(const uint8_t* v, int t, int d, int D) {
  const uint8_t b = v[((size_t(t / 4) * (D / 32) + d / 32) * 16 + d % 16) * 4 + t % 4];
  return d % 32 < 16 ? (b & 15) : (b >> 4);
}
// Packs the codes c[t][d] (row stride cs) of one head's values into that layout.
inline void pack_u4_values(const uint8_t* c, int cs, int D, uint8_t* v) {
  for (int t = 0; t < kBT; ++t)
    for (int d = 0; d < D; d += 32)
      for (int j = 0; j < 16; ++j) {
        const uint8_t* r = c + size_t(t) * cs + d;
        v[((size_t(t / 4) * (D / 32) + d / 32) * 16 + j) * 4 + t % 4] = uint8_t(r[j] | (r[16 + j] << 4));
      }
}
// Head-major: head h's run (the block of one head): K and V codes kBT D / 2 bytes each, then K params (fp16 [2][D])
// and V params (fp16 [D/32][2][kBT]), 4 D bytes each.
inline size_t i4_head_bytes(int D) { return size_t(kBT) * D + 8 * size_t(D); }
inline I4Head i4_head(const void* blk, int /*H*/, int D, int h) {
  const size_t hs = size_t(kBT) * D / 2;
  const auto* b = static_cast<const uint8_t*>(blk) + h * i4_head_bytes(D);
  const auto* par = reinterpret_cast<const uint16_t*>(b + 2 * hs);
  return {b, b + hs, par, par + size_t(2) * D};
}

// ---- Per-ISA chunk entry points ----
struct CallCtx {
  KVDType dtype;
  int H, D, G;
  float scale;
  bool q8 = false;  // int8/int4 blocks: q . K as integer dot products on an int8-quantized query
  int prefetch = 1;  // DecodeAttentionParams::prefetch_blocks
};
struct Chunk {
  const SeqKVView* seq;
  int kv_head;
  int32_t b0, b1;  // full blocks [b0, b1)
  bool tail;       // also the fp16 tail (n_tail tokens)
  int n_heads = 1;  // kv heads kv_head .. kv_head + n_heads - 1, block by block (DecodeAttentionParams::heads_per_task)
};
// The block to prefetch while block b of the chunk is read (null: none).
inline const void* prefetch_block(const CallCtx& c, const Chunk& ch, int32_t b) {
  return c.prefetch > 0 && b + c.prefetch < ch.b1 ? ch.seq->blocks[b + c.prefetch] : nullptr;
}
// A chunk's walk: its full blocks in order, within each its heads one after the other, head(j, block, the block to
// prefetch); then, with an fp16 tail, head(j, nullptr, nullptr) for each head.
template <class F>
inline void walk_chunk(const CallCtx& c, const Chunk& ch, F&& head) {
  for (int32_t b = ch.b0; b < ch.b1; ++b) {
    const void* blk = ch.seq->blocks[b];
    const void* nxt = prefetch_block(c, ch, b);
    for (int j = 0; j < ch.n_heads; ++j) head(j, blk, nxt);
  }
  if (ch.tail && ch.seq->n_tail > 0)
    for (int j = 0; j < ch.n_heads; ++j) head(j, nullptr, nullptr);
}
// Scratch floats one thread needs (64-byte multiple): qs [G][D] (q * scale), qq [G][D] (int4: q with
// the block's per-channel key scale folded in), scores/probabilities [G][kBT], c0 [G] (int4: q . z),
// vt [D/32][2][kBT] (int4: the block's value params in fp32, 16*scale and min - 16*scale).
// red [G][kBT][16] (SIMD: per-token partial dot-product vectors before their transposed reduction),
// wv [G][D/32][kBT] (SIMD: the block's value weights p * per-token (group) scale, broadcast from memory).
// The integer-dot path (CallCtx::q8, decode_attention_qdot.h) adds, after those, kQ8Bytes bytes of int8
// query codes per head and 4 floats per head (query scale, int8 bias, int4 q . z).
// The integer p . V of the q8 path (decode_attention_qdot.h, the scalar twin's own layout is smaller) adds,
// 64-byte aligned after those, kPVFloats per head (the block's value-weight codes [8 groups][kBT] bytes and 32
// floats: weight scales [8], int4 offsets [8], the block's softmax factor, padding) and kPVShared floats (kBT
// weights, then int4 keys' per-channel scale and min in fp32, 256 each).
constexpr int kQ8Bytes = 512;
constexpr int kWCBytes = 8 * kBT;  // value-weight codes of one head: [group][token], u8 0..127
constexpr int kPVHeadFloats = 32;
constexpr int kPVFloats = kWCBytes / 4 + kPVHeadFloats;
constexpr int kPVShared = kBT + 2 * 256;
inline size_t chunk_scratch_floats(int G, int D) {
  return (size_t(G) * (2 * size_t(D) + kBT + 1 + kBT * 16 + size_t(D / 32) * kBT + kQ8Bytes / 4 + 4) +
          size_t(D / 32) * 2 * kBT + 15) / 16 * 16 + size_t(G) * kPVFloats + kPVShared + 16;
}

// The exponential of the q8 path's softmax, one definition of its arithmetic for every ISA: the SIMD
// traits' V::exp (Cephes-style, |rel err| ~ 2e-7, exactly 0 below -87) does these IEEE operations lane by
// lane, so the probabilities, and the value-weight codes made from them, are the same bits on every ISA.
inline float exp_poly(float x) {
  if (x < -87.f) return 0.f;
  x = std::max(std::min(x, 88.f), -87.f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  x = std::fma(-n, 0.693359375f, x);
  x = std::fma(-n, -2.12194440e-4f, x);
  float y = 1.9875691500e-4f;
  y = std::fma(y, x, 1.3981999507e-3f);
  y = std::fma(y, x, 8.3334519073e-3f);
  y = std::fma(y, x, 4.1665795894e-2f);
  y = std::fma(y, x, 1.6666665459e-1f);
  y = std::fma(y, x, 5.0000001201e-1f);
  y = std::fma(y, x * x, x) + 1.f;
  return std::ldexp(y, int(n));
}
// Runs one chunk for the G query heads of a kv head. q: the group's rows [G][D]. State in/out,
// initialised by the caller: m [G] (-inf), l [G] (0), acc [G][D] (0). scratch: 64-byte aligned.
using ChunkFn = void (*)(const CallCtx&, const Chunk&, const float* q, float* m, float* l, float* acc,
                         float* scratch);
void run_chunk_scalar(const CallCtx&, const Chunk&, const float*, float*, float*, float*, float*);
void run_chunk_avx2(const CallCtx&, const Chunk&, const float*, float*, float*, float*, float*);
void run_chunk_avx512(const CallCtx&, const Chunk&, const float*, float*, float*, float*, float*);
void run_chunk_avx512vnni(const CallCtx&, const Chunk&, const float*, float*, float*, float*, float*);

// The query quantization every q8 path shares (scalar code, one definition in decode_attention_scalar.cpp;
// the SIMD paths do the same element-wise IEEE operations, so their codes are identical): over the n
// values x, amax = max |x|, *sq = amax / 127, code = clamp(nearbyint(x * (127 / amax)), -127, 127) (a
// multiply: a division per element cost a quarter of an int4 block's time); all zero (and *sq = 0) when
// amax is 0. Returns the sum of the codes.
int32_t quantize_q8(const float* x, int n, int8_t* code, float* sq);

// Read-only reduction over [p, p+bytes) with the ISA's widest loads (the STREAM-like read ceiling of
// fd-attn-bench). bytes: multiple of 64. Returns a checksum so the reads cannot be optimised away.
uint64_t read_reduce_avx2(const void* p, size_t bytes);
uint64_t read_reduce_avx512(const void* p, size_t bytes);

}  // namespace fd::attn

// ---- The SIMD kernel, shared by decode_attention_avx2.cpp and decode_attention_avx512.cpp ----
// Each includes this header with FD_ATTN_SIMD_TEMPLATE defined after defining a vector-traits struct V:
//   T (vector of W floats), W, HB / HBV (query heads per register block for K / V), CG (32-channel
//   groups per V pass), zero/set1/load/store/add/sub/mul/
//   max/abs/fmadd(a,b,c)=a*b+c, hsum/hmax, hsum4/hmax4 (four vectors' sums / maxima as one __m128), reduce_rows (W rows
//   of W floats -> their W sums), exp (0 for x < -87, so -inf gives exactly 0), load_f16 (W halves), TI / load_w /
//   nib<P> / sbyte<B> / shr (4-byte words, W lanes: f = 1 + (bits P..P+3)/16 of each as a float, exact and made
//   with integer ops, so an int4 x = s*code + z = (16s)*f + (z - 16s); its signed byte B as a float; a shift right
//   by n), load_i8 (W int8), h2f (one fp16).
// Per block (32 tokens) and kv head: scores for all G heads (each K row loaded once per HB heads, i.e.
// once for the group when G <= HB), online-softmax update per head, then V accumulation (each V row
// loaded once per HB heads). Quantized data is used as is: int8 scales multiply the dot product / the
// probability; int4 key scales are folded into the query once per block (qq = qs * 16s, with f = 1 +
// code/16) plus the constant c0 = qs . (z - 16s); int4 values use weight p*16s and add
// sum_t p_t * (z - 16s)_t,g to each 32-channel group at the end.
#ifdef FD_ATTN_SIMD_TEMPLATE
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "fastdecode/core/error.h"

namespace fd::attn::simd {

// Row loaders: load(t, g, x) fills x[0..32/W) with channels [32g, 32g+32) of token t, in order;
// mult(t, g) is the factor of token t's group g (int8 values: per-token scale; int4: group scale).
// Software prefetch of a later block (CallCtx::prefetch blocks ahead): a head's K (or V) of one block is
// one short contiguous run (8 KB at d = 128 fp16) followed by a jump of H * 8 KB, too short for the hardware
// prefetchers to ramp up; while token t of this block is processed, row t of the same head in the later block
// is requested. Measured on the dev machine (Zen 5, 1 thread, fp16, B=4, ctx 2048, 32 heads): no prefetch 34 %
// of the read ceiling; into L1 (T0) 35 %; NTA 35 %; into L2 (T1) 67 %; two or four blocks ahead with T1
// the same as one. Kept: T1. On the GPU machine's Xeon at 16 threads 2-6 blocks ahead were slower than one
// (artifacts/rworker/gpu-machine-prefetch-d846a34/): the default stays 1.
inline void prefetch_row(const void* row, int bytes) {
  for (int o = 0; o < bytes; o += 64) _mm_prefetch(static_cast<const char*>(row) + o, _MM_HINT_T1);
}

template <class V, int D>
struct F16Rows {
  static constexpr bool kOffset = false;
  const uint16_t* p;  // [kBT][D]
  const uint16_t* next = nullptr;  // the same rows of the next block, or null
  void prefetch(int t) const { if (next) prefetch_row(next + size_t(t) * D, D * 2); }
  void load(int t, int g, typename V::T* x) const {
    const uint16_t* r = p + size_t(t) * D + g * 32;
    for (int i = 0; i < 32 / V::W; ++i) x[i] = V::load_f16(r + i * V::W);
  }
  float mult(int, int) const { return 1.f; }
  // Value weights of the block: fp16 uses the probabilities as they are (stride kBT per head).
  static constexpr int kWG = 0;  // weight rows per head: 0 = p itself, 1 = per token, D/32 = per group
  const float* weights(const float* p, float*, int) const { return p; }
};
template <class V, int D>
struct I8Rows {
  static constexpr bool kOffset = false;
  const int8_t* p;   // [kBT][D]
  const float* sc;   // [kBT]
  const int8_t* next = nullptr;
  void prefetch(int t) const { if (next) prefetch_row(next + size_t(t) * D, D); }
  void load(int t, int g, typename V::T* x) const {
    const int8_t* r = p + size_t(t) * D + g * 32;
    for (int i = 0; i < 32 / V::W; ++i) x[i] = V::load_i8(r + i * V::W);
  }
  float mult(int t, int) const { return sc[t]; }
  // w[h][t] = p[h][t] * scale[t] for the G heads (once per block instead of once per token and head).
  static constexpr int kWG = 1;
  const float* weights(const float* p, float* w, int G) const {
    for (int h = 0; h < G; ++h)
      for (int j = 0; j < kBT; j += V::W) V::store(w + h * kBT + j, V::mul(V::load(p + h * kBT + j), V::load(sc + j)));
    return w;
  }
};
// int4 values in quad-group words (u4_val; the keys are token-interleaved words, scores_u4k): token t's group g is
// byte t % 4 of the 16 words of (quad t / 4, group g), byte j: channel j in the low nibble, 16+j in the high. A
// word vector shifted right by 8 (t % 4) puts token t's byte at the bottom of each lane, so V::nib<0> / nib<4>
// give channels j (low) and 16 + j (high) in lane order: W=16, one load per group; W=8, two (lanes 0..7, 8..15),
// lows in x[i] and highs in x[VPG/2+i].
template <class V, int D>
struct I4Rows {
  static constexpr bool kOffset = true;
  const uint8_t* p;    // [kBT/4][D/32][16][4]
  const float* vt;     // [D/32][2][kBT] fp32 rows 16*scale and min - 16*scale (see V::nib)
  const uint8_t* next = nullptr;
  void prefetch(int t) const { if (next) prefetch_row(next + size_t(t) * D / 2, D / 2); }
  const float* mins(int g) const { return vt + (2 * g + 1) * kBT; }
  void load(int t, int g, typename V::T* x) const {
    constexpr int VPG = 32 / V::W;
    const uint8_t* r = p + (size_t(t / 4) * (D / 32) + g) * 64;
    for (int i = 0; i < VPG / 2; ++i) {
      const typename V::TI w = V::shr(V::load_w(r + i * V::W * 4), 8 * (t % 4));
      x[i] = V::template nib<0>(w);
      x[VPG / 2 + i] = V::template nib<4>(w);
    }
  }
  float mult(int t, int g) const { return vt[2 * g * kBT + t]; }
  // w[h][g][t] = p[h][t] * 16 scale[t][g].
  static constexpr int kWG = D / 32;
  const float* weights(const float* p, float* w, int G) const {
    for (int h = 0; h < G; ++h)
      for (int g = 0; g < D / 32; ++g)
        for (int j = 0; j < kBT; j += V::W)
          V::store(w + (h * (D / 32) + g) * kBT + j, V::mul(V::load(p + h * kBT + j), V::load(vt + 2 * g * kBT + j)));
    return w;
  }
};

// s[h][t] = q[h] . K[t] for t < n and HB heads (s[h][t >= n] undefined); q [HB][D], s [HB][kBT],
// r [HB][kBT][W] scratch for the per-token partial vectors.
template <class V, int D, int HB, class Rows>
inline void scores(const Rows& rows, const float* q, float* s, float* r, int n) {
  using VT = typename V::T;
  constexpr int W = V::W, VPG = 32 / W;
  for (int t = 0; t < n; ++t) {
    rows.prefetch(t);
    VT a0[HB], a1[HB];
    for (int h = 0; h < HB; ++h) a0[h] = a1[h] = V::zero();
    for (int g = 0; g < D / 32; ++g) {
      VT x[VPG];
      rows.load(t, g, x);
      for (int h = 0; h < HB; ++h)
        for (int i = 0; i < VPG; ++i) {
          const VT qv = V::load(q + h * D + g * 32 + i * W);
          if (i & 1) a1[h] = V::fmadd(qv, x[i], a1[h]);
          else a0[h] = V::fmadd(qv, x[i], a0[h]);
        }
    }
    for (int h = 0; h < HB; ++h) V::store(r + (h * kBT + t) * W, V::add(a0[h], a1[h]));
  }
  // W tokens' partial vectors at a time -> one vector of W dot products (a shuffle tree instead of a
  // horizontal sum per token: that latency chain was ~40 % of the in-cache time).
  for (int h = 0; h < HB; ++h)
    for (int j = 0; j < n; j += W) V::store(s + h * kBT + j, V::reduce_rows(r + (h * kBT + j) * W));
}

// Keys in token-interleaved 4-byte words (int4: u4_key, 8 channels a word; int8: i8_key, 4): s[h][t] = sum_d q[h][d]
// * f(code[t][d]) for the kBT tokens of a full block and HB heads, W tokens in the W lanes of a vector (no sum
// across lanes); q [HB][D], s [HB][kBT]. chan.template operator()<N>(x) gives channel N of each lane's word as
// floats (int4: 1 + code/16, V::nib; int8: the code, V::sbyte), each an FMA with the query broadcast.
template <class V, int D, int HB, int CPW, class Chan>
inline void scores_words(const uint8_t* k, const uint8_t* next, const float* q, float* s, Chan&& chan) {
  using VT = typename V::T;
  constexpr int W = V::W, NJ = kBT / W, AC = W == 16 ? 2 : 1;  // AC: accumulators per (vector, head)
  VT a[NJ][HB][AC];
  for (int j = 0; j < NJ; ++j)
    for (int h = 0; h < HB; ++h)
      for (int c = 0; c < AC; ++c) a[j][h][c] = V::zero();
  for (int w = 0; w < D / CPW; ++w) {
    const uint8_t* kw = k + size_t(w) * kBT * 4;
    if (next) prefetch_row(next + size_t(w) * kBT * 4, kBT * 4);
    for (int j = 0; j < NJ; ++j) {
      const typename V::TI x = V::load_w(kw + j * W * 4);
      [&]<int... N>(std::integer_sequence<int, N...>) {
        ([&] {
          const VT f = chan.template operator()<N>(x);
          for (int h = 0; h < HB; ++h) a[j][h][N % AC] = V::fmadd(V::set1(q[h * D + CPW * w + N]), f, a[j][h][N % AC]);
        }(), ...);
      }(std::make_integer_sequence<int, CPW>{});
    }
  }
  for (int j = 0; j < NJ; ++j)
    for (int h = 0; h < HB; ++h) V::store(s + h * kBT + j * W, AC == 2 ? V::add(a[j][h][0], a[j][h][AC - 1]) : a[j][h][0]);
}
template <class V, int D, int HB>
inline void scores_u4k(const uint8_t* k, const uint8_t* next, const float* q, float* s) {
  scores_words<V, D, HB, 8>(k, next, q, s, []<int N>(typename V::TI x) { return V::template nib<N < 4 ? 8 * N : 8 * (N - 4) + 4>(x); });
}
template <class V, int D, int HB>
inline void scores_i8k(const int8_t* k, const int8_t* next, const float* q, float* s) {
  scores_words<V, D, HB, 4>(reinterpret_cast<const uint8_t*>(k), reinterpret_cast<const uint8_t*>(next), q, s,
                            []<int N>(typename V::TI x) { return V::template sbyte<N>(x); });
}

// acc[h] += sum_t w[h][g][t] * V[t] for t < n, over the NGC 32-channel groups from g0; w: the block's
// value weights (Rows::weights: p times the token's (group's) scale, [HB][max(kWG,1)][kBT]), acc [HB][D].
// The HB * NGC * (32/W) accumulators stay in registers for the whole pass over the tokens: with
// V::cg(HB) groups per pass there are >= 8 independent FMA chains (the FMA latency, not the loads,
// bounded an earlier token-inner-per-group loop) and each V row is read in one stretch. The weights are
// broadcast from memory (an FMA operand with embedded broadcast: no scalar multiply, no shuffle per
// token and head), and the head block is the whole GQA group where registers allow, so each V row is
// loaded and converted once per group.
template <class V, int D, int HB, int NGC, class Rows>
inline void accum_pass(const Rows& rows, const float* w, float* acc, int n, int g0) {
  using VT = typename V::T;
  constexpr int W = V::W, VPG = 32 / W, NV = NGC * VPG;
  constexpr int WG = Rows::kWG > 1 ? Rows::kWG : 1, WGS = Rows::kWG > 1 ? kBT : 0;  // per-head / per-group strides
  VT a[HB][NV];
  for (int h = 0; h < HB; ++h)
    for (int i = 0; i < NV; ++i) a[h][i] = V::load(acc + h * D + g0 * 32 + i * W);
  for (int t = 0; t < n; ++t) {
    if (g0 == 0) rows.prefetch(t);
    VT x[NV];
    for (int gg = 0; gg < NGC; ++gg) rows.load(t, g0 + gg, x + gg * VPG);
    for (int h = 0; h < HB; ++h)
      for (int gg = 0; gg < NGC; ++gg) {
        const VT wv = V::set1(w[h * WG * kBT + (g0 + gg) * WGS + t]);
        for (int i = 0; i < VPG; ++i) a[h][gg * VPG + i] = V::fmadd(wv, x[gg * VPG + i], a[h][gg * VPG + i]);
      }
  }
  for (int h = 0; h < HB; ++h)
    for (int i = 0; i < NV; ++i) V::store(acc + h * D + g0 * 32 + i * W, a[h][i]);
}
template <class V, int D, int HB, class Rows>
inline void accum(const Rows& rows, const float* w, float* acc, int n) {
  constexpr int NG = D / 32, CG = V::cg(HB);
  int g0 = 0;
  for (; g0 + CG <= NG; g0 += CG) accum_pass<V, D, HB, CG>(rows, w, acc, n, g0);
  if constexpr (NG % CG != 0) accum_pass<V, D, HB, NG % CG>(rows, w, acc, n, g0);
}

// Online softmax over one block's scores s[0..n) of one head: s becomes p = exp(s - m_new);
// l = l*corr + sum p; m = m_new. Returns corr = exp(m_old - m_new) (0 for the first block).
template <class V>
inline float softmax_block(float* s, int n, float& m, float& l) {
  using VT = typename V::T;
  constexpr int W = V::W;
  for (int t = n; t < kBT; ++t) s[t] = -std::numeric_limits<float>::infinity();
  VT mx = V::load(s);
  for (int j = W; j < kBT; j += W) mx = V::max(mx, V::load(s + j));
  const float m_new = std::max(m, V::hmax(mx));
  const float corr = m == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(m - m_new);
  const VT mv = V::set1(m_new);
  VT sum = V::zero();
  for (int j = 0; j < kBT; j += W) {
    const VT e = V::exp(V::sub(V::load(s + j), mv));
    V::store(s + j, e);
    sum = V::add(sum, e);
  }
  l = l * corr + V::hsum(sum);
  m = m_new;
  return corr;
}

template <class V, int D>
struct Kernel {
  // Calls f.template operator()<HB>(h0) over the G heads in register blocks of HBM, 2, 1 heads.
  template <int HBM, class F>
  static void for_heads(int G, F&& f) {
    int h = 0;
    for (; h + HBM <= G; h += HBM) f.template operator()<HBM>(h);
    if constexpr (HBM > 2)
      for (; h + 2 <= G; h += 2) f.template operator()<2>(h);
    if constexpr (HBM > 1)
      for (; h < G; ++h) f.template operator()<1>(h);
  }

  // One block of n tokens for G heads. q [G][D]; fix(h, s, n) adjusts raw dot products into scores.
  template <class KR, class VR, class Fix>
  static void block(const KR& kr, const VR& vr, int n, int G, const float* q, float* m, float* l, float* acc,
                    float* sc, float* red, float* wv, Fix&& fix) {
    block_scored(
        [&] {
          for_heads<V::HB>(G, [&]<int HB>(int h0) { scores<V, D, HB>(kr, q + h0 * D, sc + h0 * kBT, red + h0 * kBT * V::W, n); });
        },
        vr, n, G, m, l, acc, sc, wv, fix);
  }
  // The same with the raw dot products made by score() into sc [G][kBT] (the integer-dot path's entry).
  template <class Score, class VR, class Fix>
  static void block_scored(Score&& score, const VR& vr, int n, int G, float* m, float* l, float* acc, float* sc,
                           float* wv, Fix&& fix) {
    score();
    for (int h = 0; h < G; ++h) {
      fix(h, sc + h * kBT, n);
      const float corr = softmax_block<V>(sc + h * kBT, n, m[h], l[h]);
      if (corr != 1.f) {
        const auto cv = V::set1(corr);
        for (int d = 0; d < D; d += V::W) V::store(acc + h * D + d, V::mul(V::load(acc + h * D + d), cv));
      }
    }
    const float* w = vr.weights(sc, wv, G);
    constexpr int WS = (VR::kWG > 1 ? VR::kWG : 1) * kBT;  // weights per head
    for_heads<V::HBV>(G, [&]<int HB>(int h0) { accum<V, D, HB>(vr, w + h0 * WS, acc + h0 * D, n); });
    if constexpr (VR::kOffset) {  // int4 values: + sum_t p_t * min_t,g on each 32-channel group
      for (int h = 0; h < G; ++h)
        for (int g = 0; g < D / 32; ++g) {
          auto oa = V::zero();
          for (int j = 0; j < kBT; j += V::W) oa = V::fmadd(V::load(sc + h * kBT + j), V::load(vr.mins(g) + j), oa);
          const auto ov = V::set1(V::hsum(oa));  // p = 0 past n (exp(-inf)), so all kBT lanes may be summed
          for (int d = g * 32; d < g * 32 + 32; d += V::W) V::store(acc + h * D + d, V::add(V::load(acc + h * D + d), ov));
        }
    }
  }

  // The block's int4 value params in fp32, per 32-channel group: 16 * scale [kBT], then min - 16 * scale [kBT].
  static void i4_value_params(const I4Head& hd, float* vt) {
    for (int g = 0; g < D / 32; ++g)
      for (int j = 0; j < kBT; j += V::W) {
        const auto s16 = V::mul(V::load_f16(hd.vp + 2 * g * kBT + j), V::set1(16.f));
        V::store(vt + 2 * g * kBT + j, s16);
        V::store(vt + (2 * g + 1) * kBT + j, V::sub(V::load_f16(hd.vp + (2 * g + 1) * kBT + j), s16));
      }
  }

  // The chunk's ch.n_heads kv heads block by block (each block: head after head), every head with its own
  // scratch (chunk_scratch_floats(G, D) floats each) and its slice of the state (m, l [G], acc [G][D]).
  static void run(const CallCtx& c, const Chunk& ch, const float* q, float* m0, float* l0, float* acc0,
                  float* scratch) {
    const int G = c.G, H = c.H;
    const size_t sf = chunk_scratch_floats(G, D);
    for (int j = 0; j < ch.n_heads; ++j)
      for (int i = 0; i < G * D; ++i) scratch[j * sf + i] = q[size_t(j) * G * D + i] * c.scale;
    auto raw = [](int, float*, int) {};
    // One head's part of one block (blk) or of the tail (blk null).
    auto head = [&](int j, const void* blk, const void* nxt) {
      const int kvh = ch.kv_head + j;
      float *m = m0 + j * G, *l = l0 + j * G, *acc = acc0 + size_t(j) * G * D;
      float* qs = scratch + j * sf;  // [G][D]
      float* qq = qs + G * D;   // [G][D]
      float* sc = qq + G * D;   // [G][kBT]
      float* c0 = sc + G * kBT;   // [G]
      float* vt = c0 + G;       // [D/32][2][kBT] int4 value params in fp32
      float* red = vt + (D / 32) * 2 * kBT;  // [G][kBT][W] per-token partial dot products
      float* wv = red + G * kBT * V::W;      // [G][D/32][kBT] value weights
      if (!blk) {
        const F16Head hd = f16_head(ch.seq->tail, H, D, kvh);
        block(F16Rows<V, D>{hd.k}, F16Rows<V, D>{hd.v}, ch.seq->n_tail, G, qs, m, l, acc, sc, red, wv, raw);
        return;
      }
      switch (c.dtype) {
        case KVDType::F16: {
          const F16Head hd = f16_head(blk, H, D, kvh);
          const F16Head nh = nxt ? f16_head(nxt, H, D, kvh) : F16Head{nullptr, nullptr};
          block(F16Rows<V, D>{hd.k, nh.k}, F16Rows<V, D>{hd.v, nh.v}, kBT, G, qs, m, l, acc, sc, red, wv, raw);
          break;
        }
        case KVDType::I8: {
          const I8Head hd = i8_head(blk, H, D, kvh);
          const I8Head nh = nxt ? i8_head(nxt, H, D, kvh) : I8Head{nullptr, nullptr, nullptr, nullptr};
          if (nxt) prefetch_row(nh.ks, kBT * 4), prefetch_row(nh.vs, kBT * 4);
          block_scored(
              [&] {
                for_heads<V::HB>(G, [&]<int HB>(int h0) { scores_i8k<V, D, HB>(hd.k, nh.k, qs + h0 * D, sc + h0 * kBT); });
              },
              I8Rows<V, D>{hd.v, hd.vs, nh.v}, kBT, G, m, l, acc, sc, wv,
              [&](int, float* s, int n) { for (int t = 0; t < n; ++t) s[t] *= hd.ks[t]; });
          break;
        }
        case KVDType::I4: {
          const I4Head hd = i4_head(blk, H, D, kvh);
          const I4Head nh = nxt ? i4_head(nxt, H, D, kvh) : I4Head{nullptr, nullptr, nullptr, nullptr};
          if (nxt) prefetch_row(nh.kp, 4 * D), prefetch_row(nh.vp, 4 * D);
          i4_value_params(hd, vt);
          // Fold the per-channel key scale into the query: qq = qs*16s, c0 = qs.(z-16s) (once per block).
          for (int h = 0; h < G; ++h) {
            auto cz = V::zero();
            for (int d = 0; d < D; d += V::W) {
              const auto qv = V::load(qs + h * D + d), s16 = V::mul(V::load_f16(hd.kp + d), V::set1(16.f));
              V::store(qq + h * D + d, V::mul(qv, s16));
              cz = V::fmadd(qv, V::sub(V::load_f16(hd.kp + D + d), s16), cz);
            }
            c0[h] = V::hsum(cz);
          }
          block_scored(
              [&] {
                for_heads<V::HB>(G, [&]<int HB>(int h0) { scores_u4k<V, D, HB>(hd.k, nh.k, qq + h0 * D, sc + h0 * kBT); });
              },
              I4Rows<V, D>{hd.v, vt, nh.v}, kBT, G, m, l, acc, sc, wv,
              [&](int h, float* s, int n) { for (int t = 0; t < n; ++t) s[t] += c0[h]; });
          break;
        }
        default: FD_THROW("decode_attention: unknown KV dtype " << int(c.dtype));
      }
    };
    walk_chunk(c, ch, head);
  }
};

template <class V>
void run_chunk(const CallCtx& c, const Chunk& ch, const float* q, float* m, float* l, float* acc, float* scratch) {
  switch (c.D) {
    case 32: return Kernel<V, 32>::run(c, ch, q, m, l, acc, scratch);
    case 64: return Kernel<V, 64>::run(c, ch, q, m, l, acc, scratch);
    case 96: return Kernel<V, 96>::run(c, ch, q, m, l, acc, scratch);
    case 128: return Kernel<V, 128>::run(c, ch, q, m, l, acc, scratch);
    case 160: return Kernel<V, 160>::run(c, ch, q, m, l, acc, scratch);
    case 192: return Kernel<V, 192>::run(c, ch, q, m, l, acc, scratch);
    case 224: return Kernel<V, 224>::run(c, ch, q, m, l, acc, scratch);
    case 256: return Kernel<V, 256>::run(c, ch, q, m, l, acc, scratch);
    default: FD_THROW("decode_attention: head_dim " << c.D << " is not a multiple of 32 in [32, 256]");
  }
}

}  // namespace fd::attn::simd
#endif  // FD_ATTN_SIMD_TEMPLATE
