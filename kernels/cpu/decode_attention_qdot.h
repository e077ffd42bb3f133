// The integer-dot kernel of the CPU decode attention (CallCtx::q8): for int8 and int4 blocks, q . K as
// integer dot products of int8 key codes (int8) or unpacked 4-bit codes (int4) with an int8-quantized
// query, rescaled in fp32; softmax and p . V in fp32 exactly as the float kernel (decode_attention_impl.h,
// whose Kernel::block_scored this reuses). The fp16 tail goes through the float kernel.
//
// Included by the SIMD translation units after decode_attention_impl.h (FD_ATTN_SIMD_TEMPLATE) with an
// integer-traits struct I beside the float traits V (I::VB == 4 * V::W bytes per vector):
//   B (integer vector), VB, zero, load (VB bytes), load_part(p, n) (n < VB bytes, multiple of 16; the
//   rest zero), prep_s8 / dot_s8(acc, prep_s8(x), x, q) (acc += per-lane sums of x*q + kBias*q over 4
//   bytes, x and q signed), dot_u8(acc, x, q) (x unsigned), kBias (0, or 128 where the instruction wants
//   an unsigned operand: x + 128 is x with its sign bit flipped, and the caller subtracts 128 * sum(q)
//   once per head), unpack_u4(x, lo, hi) (the low / high nibbles of each byte), to_f32 (int32 lanes ->
//   float), amax(x, n) = max |x| (n % W == 0), quant(x, n, sq, out) (the quantize_q8 codes, n % 32 == 0).
//
// Query quantization (the same element-wise IEEE operations as quantize_q8 in decode_attention_scalar.cpp,
// so every path has the same codes): int8 keys (x = ks[t] * code): qs = q * scale is quantized once per
// chunk and head, score = (sum code_q * code_k) * (sq * ks[t]). int4 keys (x = s[d] * c + z[d], per
// channel): the key scale is folded into the query per block, qf = qs * s, quantized per block and head,
// score = (sum code_qf * c) * sqf + qs . z. Exactness: |sum| <= 255 * 127 * 256 < 2^24, so the int32
// partial sums, their conversion to float and the float reduction across lanes are all exact: the raw
// dot products equal the scalar twin's integers bit for bit; only the rescale and the softmax round.
//
// int4 codes: a 16-byte group holds channels 32g + j (low nibble of byte j) and 32g + 16 + j (high), so
// one VB-byte load unpacks to VB "low" and VB "high" bytes; the query codes are stored in that order per
// VB-byte chunk of the packed row: [chunk][low VB bytes, high VB bytes] (zero past the row's end).
#pragma once
#include <cstring>

namespace fd::attn::simd {

// s[h][t] = raw integer dot product (as float) of token t's key codes with head h's query codes, t < n,
// HB heads. k: the block's code rows ([kBT][RB] bytes, RB = D or D/2), q8: HB heads at kQ8Bytes stride.
template <class V, class I, int D, int HB, bool U4>
inline void qscores(const uint8_t* k, const uint8_t* next, const int8_t* q8, float* s, float* r, int n) {
  using B = typename I::B;
  constexpr int W = V::W, VB = I::VB, RB = U4 ? D / 2 : D, NC = (RB + VB - 1) / VB, LAST = RB - (NC - 1) * VB;
  constexpr int QC = U4 ? 2 * VB : VB;  // query bytes per chunk
  static_assert(VB == 4 * W && NC * QC <= kQ8Bytes);
  for (int t = 0; t < n; ++t) {
    if (next) prefetch_row(next + size_t(t) * RB, RB);
    B a[HB];
    for (int h = 0; h < HB; ++h) a[h] = I::zero();
    for (int c = 0; c < NC; ++c) {
      const uint8_t* p = k + size_t(t) * RB + c * VB;
      const B x = (LAST < VB && c == NC - 1) ? I::load_part(p, LAST) : I::load(p);
      if constexpr (U4) {
        B lo, hi;
        I::unpack_u4(x, lo, hi);
        for (int h = 0; h < HB; ++h) {
          a[h] = I::dot_u8(a[h], lo, I::load(q8 + h * kQ8Bytes + c * QC));
          a[h] = I::dot_u8(a[h], hi, I::load(q8 + h * kQ8Bytes + c * QC + VB));
        }
      } else {
        const B xp = I::prep_s8(x);
        for (int h = 0; h < HB; ++h) a[h] = I::dot_s8(a[h], xp, x, I::load(q8 + h * kQ8Bytes + c * QC));
      }
    }
    for (int h = 0; h < HB; ++h) V::store(r + (h * kBT + t) * W, I::to_f32(a[h]));
  }
  for (int h = 0; h < HB; ++h)
    for (int j = 0; j < n; j += W) V::store(s + h * kBT + j, V::reduce_rows(r + (h * kBT + j) * W));
}

template <class V, class I, int D>
struct QKernel {
  using K = Kernel<V, D>;
  static constexpr int VB = I::VB;

  // Head h's int8-key query codes: qs quantized in channel order, zero-padded to whole VB chunks.
  // Returns sum(codes).
  static int32_t quant_i8(const float* qs, int8_t* q8, float* sq) {
    std::memset(q8, 0, kQ8Bytes);
    const float s = I::amax(qs, D) / 127.f;
    *sq = s;
    if (!(s > 0)) return 0;
    I::quant(qs, D, s, q8);
    int32_t sum = 0;
    for (int d = 0; d < D; ++d) sum += q8[d];
    return sum;
  }
  // Head h's int4-key query codes for one block: qf = qs * key scale, quantized, in the nibble order.
  // qf: [D] scratch. Returns sqf; *c0 = qs . z.
  static float quant_i4(const float* qs, const I4Head& hd, float* qf, int8_t* q8, float* c0) {
    auto cz = V::zero();
    for (int d = 0; d < D; d += V::W) {
      const auto qv = V::load(qs + d);
      V::store(qf + d, V::mul(qv, V::load_f16(hd.kp + d)));
      cz = V::fmadd(qv, V::load_f16(hd.kp + D + d), cz);
    }
    *c0 = V::hsum(cz);
    std::memset(q8, 0, kQ8Bytes);
    const float s = I::amax(qf, D) / 127.f;
    if (!(s > 0)) return s;
    alignas(64) int8_t nat[256];
    I::quant(qf, D, s, nat);
    for (int g = 0; g < D / 32; ++g) {  // group g sits at bytes 16g.. of the packed row
      const int c = (16 * g) / VB, j = (16 * g) % VB;
      std::memcpy(q8 + c * 2 * VB + j, nat + 32 * g, 16);           // low nibbles: channels 32g..32g+15
      std::memcpy(q8 + c * 2 * VB + VB + j, nat + 32 * g + 16, 16);  // high: 32g+16..32g+31
    }
    return s;
  }

  static void run(const CallCtx& c, const Chunk& ch, const float* q, float* m, float* l, float* acc, float* scratch) {
    const int G = c.G, H = c.H, kvh = ch.kv_head;
    float* qs = scratch;      // [G][D]
    float* qq = qs + G * D;   // [G][D] int4: the folded query qf
    float* sc = qq + G * D;   // [G][kBT]
    float* c0 = sc + G * kBT;  // [G]
    float* vt = c0 + G;       // [D/32][2][kBT]
    float* red = vt + (D / 32) * 2 * kBT;  // [G][kBT][W]
    float* wv = red + G * kBT * V::W;      // [G][D/32][kBT]
    auto* q8 = reinterpret_cast<int8_t*>(wv + G * (D / 32) * kBT);  // [G][kQ8Bytes]
    float* qsc = reinterpret_cast<float*>(q8 + size_t(G) * kQ8Bytes);  // [G] query scale
    float* qbias = qsc + G;                                             // [G] kBias * sum(codes)
    for (int i = 0; i < G * D; ++i) qs[i] = q[i] * c.scale;
    if (c.dtype == KVDType::I8)
      for (int h = 0; h < G; ++h) qbias[h] = float(I::kBias * quant_i8(qs + h * D, q8 + h * kQ8Bytes, &qsc[h]));
    for (int32_t b = ch.b0; b < ch.b1; ++b) {
      const void* blk = ch.seq->blocks[b];
      const void* nxt = b + kPrefetchBlocks < ch.b1 ? ch.seq->blocks[b + kPrefetchBlocks] : nullptr;
      if (c.dtype == KVDType::I8) {
        const I8Head hd = i8_head(blk, H, D, kvh);
        const I8Head nh = nxt ? i8_head(nxt, H, D, kvh) : I8Head{nullptr, nullptr, nullptr, nullptr};
        if (nxt) prefetch_row(nh.ks, kBT * 4), prefetch_row(nh.vs, kBT * 4);
        const auto* kc = reinterpret_cast<const uint8_t*>(hd.k);
        const auto* kn = reinterpret_cast<const uint8_t*>(nh.k);
        K::block_scored(
            [&] {
              K::template for_heads<V::HB>(G, [&]<int HB>(int h0) {
                qscores<V, I, D, HB, false>(kc, kn, q8 + h0 * kQ8Bytes, sc + h0 * kBT, red + h0 * kBT * V::W, kBT);
              });
            },
            I8Rows<V, D>{hd.v, hd.vs, nh.v}, kBT, G, m, l, acc, sc, wv, [&](int h, float* s, int n) {
              for (int t = 0; t < n; ++t) s[t] = (s[t] - qbias[h]) * (qsc[h] * hd.ks[t]);
            });
      } else if (c.dtype == KVDType::I4) {
        const I4Head hd = i4_head(blk, H, D, kvh);
        const I4Head nh = nxt ? i4_head(nxt, H, D, kvh) : I4Head{nullptr, nullptr, nullptr, nullptr};
        if (nxt) prefetch_row(nh.kp, 4 * D), prefetch_row(nh.vp, 4 * D);
        K::i4_value_params(hd, vt);
        for (int h = 0; h < G; ++h) qsc[h] = quant_i4(qs + h * D, hd, qq + h * D, q8 + h * kQ8Bytes, &c0[h]);
        K::block_scored(
            [&] {
              K::template for_heads<V::HB>(G, [&]<int HB>(int h0) {
                qscores<V, I, D, HB, true>(hd.k, nh.k, q8 + h0 * kQ8Bytes, sc + h0 * kBT, red + h0 * kBT * V::W, kBT);
              });
            },
            I4Rows<V, D>{hd.v, vt, nh.v}, kBT, G, m, l, acc, sc, wv, [&](int h, float* s, int n) {
              for (int t = 0; t < n; ++t) s[t] = s[t] * qsc[h] + c0[h];
            });
      } else {
        FD_THROW("decode_attention: the integer-dot path takes int8 or int4 blocks, not dtype " << int(c.dtype));
      }
    }
    if (ch.tail && ch.seq->n_tail > 0) {
      const F16Head hd = f16_head(ch.seq->tail, H, D, kvh);
      K::block(F16Rows<V, D>{hd.k}, F16Rows<V, D>{hd.v}, ch.seq->n_tail, G, qs, m, l, acc, sc, red, wv,
               [](int, float*, int) {});
    }
  }
};

template <class V, class I>
void run_qchunk(const CallCtx& c, const Chunk& ch, const float* q, float* m, float* l, float* acc, float* scratch) {
  switch (c.D) {
    case 32: return QKernel<V, I, 32>::run(c, ch, q, m, l, acc, scratch);
    case 64: return QKernel<V, I, 64>::run(c, ch, q, m, l, acc, scratch);
    case 96: return QKernel<V, I, 96>::run(c, ch, q, m, l, acc, scratch);
    case 128: return QKernel<V, I, 128>::run(c, ch, q, m, l, acc, scratch);
    case 160: return QKernel<V, I, 160>::run(c, ch, q, m, l, acc, scratch);
    case 192: return QKernel<V, I, 192>::run(c, ch, q, m, l, acc, scratch);
    case 224: return QKernel<V, I, 224>::run(c, ch, q, m, l, acc, scratch);
    case 256: return QKernel<V, I, 256>::run(c, ch, q, m, l, acc, scratch);
    default: FD_THROW("decode_attention: head_dim " << c.D << " is not a multiple of 32 in [32, 256]");
  }
}

}  // namespace fd::attn::simd
