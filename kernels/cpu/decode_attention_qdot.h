// The integer-dot kernel of the CPU decode attention (CallCtx::q8): for int8 and int4 blocks both dot
// products run on integers. q . K: int8 key codes (int8) or unpacked 4-bit codes (int4) against an
// int8-quantized query. p . V: the value codes against the block's value weights (probability times the
// token's value scale) quantized to 7 bits. Each is rescaled in fp32; the fp16 tail goes through the float
// kernel (decode_attention_impl.h, whose Kernel::block this reuses).
//
// Included by the SIMD translation units after decode_attention_impl.h (FD_ATTN_SIMD_TEMPLATE) with an
// integer-traits struct I beside the float traits V (I::VB == 4 * V::W bytes per vector):
//   B (integer vector), VB, HBPV (heads per register block of p . V), zero, load (VB bytes),
//   load_part(p, n) (n < VB bytes, multiple of 16; the rest zero), prep_s8 / dot_s8(acc, prep_s8(x), x, q)
//   (acc += per-lane sums of x*q + kBias*q over 4 bytes, x and q signed), dot_u8(acc, x, q) (x unsigned,
//   q signed; pair sums below 2^15 so VPMADDUBSW never saturates), kBias (0, or 128 where the instruction
//   wants an unsigned operand: x + 128 is x with its sign bit flipped, and the caller subtracts 128 * sum(q)
//   once per head), lo4 / hi4 (the low / high nibbles of each byte), kHi4 / hi4x / unhi4 (the high nibbles
//   times kHi4, 1 or 16, and the division of an accumulated sum back), to_f32 (int32
//   lanes -> float), amax(x, n) = max |x| (n % W == 0), quant16(x, inv, out) (16 query codes
//   clamp(nearbyint(x * inv), -127, 127)), quant64 (64 of them), wquant32(w, inv, out) (32 weight codes clamp(nearbyint(w * inv),
//   0, 127)), wcodes4(w, inv, out) (four groups' value-weight codes nearbyint(w * inv[k]), kBT each, from
//   kBT / W float vectors a group), bcast32(p) (a 4-byte word in every lane), interleave4(x[4], y[4]) and
//   unperm(a[4], n[4]) (int8 p . V's operand and result orders, below).
//
// Query quantization (the same element-wise IEEE operations as quantize_q8 in decode_attention_scalar.cpp,
// so every path has the same codes): int8 keys (x = ks[t] * code): qs = q * scale is quantized once per
// chunk and head, score = (sum code_q * code_k) * (sq * ks[t]). int4 keys (x = s[d] * c + z[d], per
// channel): the key scale is folded into the query per block, qf = qs * s, quantized per block and head,
// score = (sum code_qf * c) * sqf + qs . z. Keys of both are token-interleaved words (one token a lane,
// qscores_i8k / qscores_u4k, the query codes in channel order broadcast 4 at a time). Exactness: |sum| <= 255 *
// 127 * 256 < 2^24, so the int32 partial sums, their conversion to float and the float sum of two partials are
// all exact: the raw dot products equal the scalar twin's integers bit for bit.
//
// p . V on integers, per block and query head: x_t = the score less the block's constant (qs . z for int4
// keys), e_t = exp(x_t - max x) with exp_poly's arithmetic (V::exp), so e_t is the same bits on every ISA
// and in the scalar twin; value weights w_t = e_t * vs_t (int8 values: the token's scale; int4: the token's
// scale of each 32-channel group), amax = max w, codes cw_t = clamp(nearbyint(w_t * (127 / amax)), 0, 127)
// (identical everywhere too), and acc += C * (amax / 127) * sum_t cw_t * code_t with C = exp(max x + c0 -
// m_new) the block's factor in the online softmax; int4 values add C * sum_t e_t * min_t per group. The
// weight rounding is the one error this adds (at most amax / 254 per token weight; docs/RWORKER.md states
// what it costs, test_decode_attention measures it); the integer sums are exact, so every ISA matches
// the twin to float rounding.
// Operand order: VPDPBUSD sums 4 adjacent bytes per 32-bit lane, so 4 tokens' codes of one channel must
// sit side by side. int4 values are stored so (quad-group words, u4_val). int8 values are rows: interleave4
// turns 4 token rows (x[r] = row 4q + r) into y[k] whose 32-bit lane i of 128-bit lane L holds channel
// 16L + 4k + i of the 4 tokens (two unpack levels), and after the block's 8 quads unperm turns the 4
// accumulators of a register chunk back into channel order (a transpose of 128-bit lanes). The weight operand
// is the 4 tokens' codes as one 32-bit word (bcast32).
//
// int4 codes: keys are token-interleaved words (u4_key, qscores_u4k: one token a lane, the query codes in
// channel order, broadcast 4 at a time); values are quad-group words (u4_val, qaccum_u4: 4 tokens of a channel
// a lane, channels 32g + j in the low nibbles and 32g + 16 + j in the high ones, one group's weights a load).
#pragma once
#include <algorithm>
#include <cstring>

namespace fd::attn::simd {

// int8 keys (token-interleaved words, i8_key): s[h][t] = raw integer dot product (as float, kBias * sum(q) not yet
// taken off) of token t's codes with head h's query codes (channel order, q8 at kQ8Bytes stride), for the kBT
// tokens of a block, HB heads. One load is a word (4 channels) of VB / 4 tokens, against the query's 4 codes of
// those channels broadcast: every lane sums one token's products, no reduction across lanes. With few chains
// (one or two heads) the words' parities accumulate apart, so the VPDPBUSD latency does not bind.
template <class V, class I, int D, int HB>
inline void qscores_i8k(const uint8_t* k, const uint8_t* next, const int8_t* q8, float* s) {
  using B = typename I::B;
  constexpr int TPV = I::VB / 4, NJ = kBT / TPV, AC = HB * NJ <= 4 ? 2 : 1;
  static_assert(TPV == V::W && D <= kQ8Bytes);
  B a[NJ][HB][AC];
  for (int j = 0; j < NJ; ++j)
    for (int h = 0; h < HB; ++h)
      for (int c = 0; c < AC; ++c) a[j][h][c] = I::zero();
  for (int w = 0; w < D / 4; ++w) {
    const uint8_t* kw = k + size_t(w) * kBT * 4;
    if (next) prefetch_row(next + size_t(w) * kBT * 4, kBT * 4);
    for (int j = 0; j < NJ; ++j) {
      const B x = I::load(kw + j * I::VB);
      const B xp = I::prep_s8(x);
      for (int h = 0; h < HB; ++h) a[j][h][w % AC] = I::dot_s8(a[j][h][w % AC], xp, x, I::bcast32(q8 + h * kQ8Bytes + 4 * w));
    }
  }
  for (int j = 0; j < NJ; ++j)
    for (int h = 0; h < HB; ++h)
      V::store(s + h * kBT + j * TPV, AC == 2 ? V::add(I::to_f32(a[j][h][0]), I::to_f32(a[j][h][AC - 1])) : I::to_f32(a[j][h][0]));
}

// int4 keys (token-interleaved words, u4_key): s[h][t] = raw integer dot product (as float) of token t's codes
// with head h's query codes (channel order, q8 at kQ8Bytes stride), for the kBT tokens of a block, HB heads.
// One load is a word (8 channels) of VB / 4 tokens; its low nibbles (channels 8w..8w+3) and high nibbles
// (8w+4..8w+7) each meet the query's 4 codes of those channels broadcast, so every lane sums one token's
// products: no reduction across lanes. With VNNI the high nibbles go in place (hi4x, a separate accumulator,
// unhi4 after); the sums stay below 2^24 (|sum| <= 15 * 127 * 256), so the conversions and the add are exact.
template <class V, class I, int D, int HB>
inline void qscores_u4k(const uint8_t* k, const uint8_t* next, const int8_t* q8, float* s) {
  using B = typename I::B;
  constexpr int TPV = I::VB / kU4KeyWordBytes, NJ = kBT / TPV, AC = I::kHi4 == 1 ? 1 : 2;
  static_assert(TPV == V::W && D <= kQ8Bytes);
  B a[NJ][HB][AC];
  for (int j = 0; j < NJ; ++j)
    for (int h = 0; h < HB; ++h)
      for (int c = 0; c < AC; ++c) a[j][h][c] = I::zero();
  for (int w = 0; w < D / 8; ++w) {
    const uint8_t* kw = k + size_t(w) * kBT * kU4KeyWordBytes;
    if (next) prefetch_row(next + size_t(w) * kBT * kU4KeyWordBytes, kBT * kU4KeyWordBytes);
    for (int j = 0; j < NJ; ++j) {
      const B x = I::load(kw + j * I::VB);
      const B lo = I::lo4(x), hi = I::hi4x(x);
      for (int h = 0; h < HB; ++h) {
        a[j][h][0] = I::dot_u8(a[j][h][0], lo, I::bcast32(q8 + h * kQ8Bytes + 8 * w));
        a[j][h][AC - 1] = I::dot_u8(a[j][h][AC - 1], hi, I::bcast32(q8 + h * kQ8Bytes + 8 * w + 4));
      }
    }
  }
  for (int j = 0; j < NJ; ++j)
    for (int h = 0; h < HB; ++h) {
      const auto f = AC == 2 ? V::add(I::to_f32(a[j][h][0]), I::to_f32(I::unhi4(a[j][h][AC - 1]))) : I::to_f32(a[j][h][0]);
      V::store(s + h * kBT + j * TPV, f);
    }
}

// int8 values: acc[h][d] += ws[h] * sum_t cw[h][t] * code_t[d] over the block's kBT value rows ([kBT][D] int8
// codes), HB heads; cw: heads at kWCBytes stride (u8 0..127, group 0), pf: heads at kPVHeadFloats stride, ws
// first. The HB * 4 int32 accumulators of one register chunk stay in registers over the 8 quads of tokens; each
// quad's rows are interleaved in registers (interleave4) and the sums put back in channel order (unperm).
template <class V, class I, int D, int HB>
inline void qaccum(const uint8_t* v, const uint8_t* next, const uint8_t* cw, const float* pf, float* acc) {
  using B = typename I::B;
  constexpr int W = V::W, VB = I::VB, NC = (D + VB - 1) / VB, LAST = D - (NC - 1) * VB;
  static_assert(VB == 4 * W && kBT == 32);
  for (int c = 0; c < NC; ++c) {
    B a[HB][4];
    for (int h = 0; h < HB; ++h)
      for (int k = 0; k < 4; ++k) a[h][k] = I::zero();
    for (int q = 0; q < kBT / 4; ++q) {
      B x[4], y[4];
      for (int r = 0; r < 4; ++r) {
        const size_t row = size_t(4 * q + r) * D;
        if (next && c == 0) prefetch_row(next + row, D);
        const uint8_t* p = v + row + c * VB;
        x[r] = (LAST < VB && c == NC - 1) ? I::load_part(p, LAST) : I::load(p);
      }
      I::interleave4(x, y);
      for (int h = 0; h < HB; ++h) {
        const B w = I::bcast32(cw + h * kWCBytes + 4 * q);
        for (int k = 0; k < 4; ++k) a[h][k] = I::dot_u8(a[h][k], w, y[k]);
      }
    }
    for (int h = 0; h < HB; ++h) {
      B n[4];
      I::unperm(a[h], n);
      for (int j = 0; j < 4; ++j) {
        const int d = c * VB + j * W;
        if (d >= D) continue;  // past a partial chunk's end
        float* ap = acc + h * D + d;
        V::store(ap, V::fmadd(I::to_f32(n[j]), V::set1(pf[h * kPVHeadFloats]), V::load(ap)));
      }
    }
  }
}

// int4 values in quad-group words (u4_val): acc[h][32g + i] += ws[h][g] * sum_t cw[h][g][t] * code_t[32g + i] +
// off[h][g] over the block's 32 tokens, HB heads; cw: heads at kWCBytes stride ([D/32][kBT] u8 0..127), pf: heads
// at kPVHeadFloats stride, ws [8] then the offsets C * sum_t e_t * min_t [8]. A load of (quad, group) has 4 tokens'
// codes of a channel side by side in each 32-bit lane, channels 32g + j in the low nibbles and 32g + 16 + j in the
// high ones: VPDPBUSD's unsigned operand as it lies, against the quad's 4 weight codes of the group broadcast (its
// signed one). Where I::kHi4 is 16 the high codes are taken in place (x & 0xf0) and their sums, multiples of 16,
// shifted back (exact). One group at a time, its lanes' low and high sums in registers over the 8 quads; with one
// or two head sums per vector the quads' parities accumulate apart, so the dependency chains stay short.
template <class V, class I, int D, int HB>
inline void qaccum_u4(const uint8_t* v, const uint8_t* next, const uint8_t* cw, const float* pf, float* acc) {
  using B = typename I::B;
  using VT = typename V::T;
  constexpr int W = V::W, NG = D / 32, VPG = 64 / I::VB, PAR = HB * VPG <= 2 ? 2 : 1;
  static_assert(I::VB == 4 * W && kBT == 32 && W * VPG == 16);
  for (int g = 0; g < NG; ++g) {
    B a[HB][VPG][2][PAR];
    for (int h = 0; h < HB; ++h)
      for (int u = 0; u < VPG; ++u)
        for (int k = 0; k < 2; ++k)
          for (int e = 0; e < PAR; ++e) a[h][u][k][e] = I::zero();
    for (int q = 0; q < kBT / 4; ++q) {
      const uint8_t* p = v + (size_t(q) * NG + g) * 64;
      if (next) prefetch_row(next + (size_t(g) * (kBT / 4) + q) * 64, 64);  // one line an iteration, all 8 * NG lines
      for (int u = 0; u < VPG; ++u) {
        const B x = I::load(p + u * I::VB);
        const B lo = I::lo4(x), hi = I::hi4x(x);
        for (int h = 0; h < HB; ++h) {
          const B w = I::bcast32(cw + h * kWCBytes + g * kBT + 4 * q);
          a[h][u][0][q % PAR] = I::dot_u8(a[h][u][0][q % PAR], lo, w);
          a[h][u][1][q % PAR] = I::dot_u8(a[h][u][1][q % PAR], hi, w);
        }
      }
    }
    for (int h = 0; h < HB; ++h) {
      const VT ws = V::set1(pf[h * kPVHeadFloats + g]), off = V::set1(pf[h * kPVHeadFloats + 8 + g]);
      for (int u = 0; u < VPG; ++u)
        for (int k = 0; k < 2; ++k) {
          VT f = I::to_f32(k ? I::unhi4(a[h][u][k][0]) : a[h][u][k][0]);
          if constexpr (PAR == 2) f = V::add(f, I::to_f32(k ? I::unhi4(a[h][u][k][1]) : a[h][u][k][1]));  // exact: < 2^24
          float* ap = acc + h * D + 32 * g + 16 * k + u * W;
          V::store(ap, V::add(V::fmadd(f, ws, V::load(ap)), off));
        }
    }
  }
}

template <class V, class I, int D>
struct QKernel {
  using K = Kernel<V, D>;
  using VT = typename V::T;
  static constexpr int VB = I::VB, W = V::W, NG = D / 32;
  static constexpr int kPVC = 16;  // the block's softmax factor C in a head's kPVHeadFloats (after ws [8], offsets [8])

  // Head h's int8-key query codes: qs quantized in channel order, zero-padded to whole VB chunks (the
  // VNNI bias counts every byte of a chunk). Returns sum(codes).
  static int32_t quant_i8(const float* qs, int8_t* q8, float* sq) {
    std::memset(q8, 0, kQ8Bytes);
    const float amax = I::amax(qs, D);
    const float s = amax / 127.f, inv = 127.f / amax;
    *sq = s;
    if (!(s > 0) || !(inv < std::numeric_limits<float>::infinity())) {
      *sq = 0;
      return 0;
    }
    for (int d = 0; d < D; d += 16) I::quant16(qs + d, inv, q8 + d);
    int32_t sum = 0;
    for (int d = 0; d < D; ++d) sum += q8[d];
    return sum;
  }
  // The int4-key query codes of the G heads for one block: qf = qs * key scale (kps, the block's in fp32),
  // quantized in channel order; qsc[h] = its scale, c0[h] = qs . z (kpz). The horizontal sum (c0) and max (the
  // codes' scale) of four heads at a time (V::hsum4 / hmax4; unused slots are zeros). qf: [G][D] scratch.
  static void quant_i4(int G, const float* qs, const float* kps, const float* kpz, float* qf, int8_t* q8, float* qsc,
                       float* c0) {
    for (int h0 = 0; h0 < G; h0 += 4) {
      VT cz[4], am[4];
      for (int k = 0; k < 4; ++k) {
        const int h = h0 + k;
        cz[k] = am[k] = V::zero();
        if (h >= G) continue;  // an unused slot: zeros
        for (int d = 0; d < D; d += W) {
          const VT qv = V::load(qs + h * D + d), f = V::mul(qv, V::load(kps + d));
          V::store(qf + h * D + d, f);
          am[k] = V::max(am[k], V::abs(f));
          cz[k] = V::fmadd(qv, V::load(kpz + d), cz[k]);
        }
      }
      alignas(16) float zs[4], ms[4];
      if (h0 + 1 == G) {  // a last head alone (MHA): the single reductions are cheaper
        zs[0] = V::hsum(cz[0]);
        ms[0] = V::hmax(am[0]);
      } else {
        _mm_store_ps(zs, V::hsum4(cz));
        _mm_store_ps(ms, V::hmax4(am));
      }
      for (int k = 0; k < 4 && h0 + k < G; ++k) {
        const int h = h0 + k;
        c0[h] = zs[k];
        const float sq = ms[k] / 127.f, inv = 127.f / ms[k];
        if (!(sq > 0) || !(inv < std::numeric_limits<float>::infinity())) {
          std::memset(q8 + h * kQ8Bytes, 0, kQ8Bytes);
          qsc[h] = 0.f;
          continue;
        }
        qsc[h] = sq;
        int d = 0;
        for (; d + 64 <= D; d += 64) I::quant64(qf + h * D + d, inv, q8 + h * kQ8Bytes + d);
        for (; d < D; d += 16) I::quant16(qf + h * D + d, inv, q8 + h * kQ8Bytes + d);
      }
    }
  }

  // The q8 block softmax of the G heads: s [G][kBT] holds raw scores, x_t = s_t * xs[h] (xs null: 1) the scores
  // less the block's constant c0[h] (c0 null: 0); s becomes e_t = exp(x_t - max x) (exp_poly's bits); l, m and
  // acc take the block in; C[h * cs] = the block's factor exp(max x + c0 - m_new) (so that C * e_t =
  // exp(score_t - m_new)). Four heads at a time: their horizontal max and sum at once (V::hmax4 / hsum4; unused
  // slots repeat the last head). (corr and C through one V::exp for four heads instead of std::exp measured no
  // faster on the dev Xeon, and 5 % slower for one head.)
  static void softmax_q8(int G, float* sc, const float* xs, const float* c0, float* m, float* l, float* acc, float* C,
                         int cs) {
    constexpr int NJ = kBT / W;
    for (int h0 = 0; h0 < G; h0 += 4) {
      const bool one = h0 + 1 == G;  // a last head alone (MHA): the single reductions are cheaper
      VT x[4][NJ], mx[4], sum[4];
      for (int k = 0; k < 4; ++k) {
        if (k > 0 && one) break;
        const int h = std::min(h0 + k, G - 1);
        const VT xv = V::set1(xs ? xs[h] : 1.f);
        for (int j = 0; j < NJ; ++j) {
          x[k][j] = V::mul(V::load(sc + h * kBT + j * W), xv);
          mx[k] = j ? V::max(mx[k], x[k][j]) : x[k][j];
        }
      }
      alignas(16) float xm[4], sm[4];
      if (one) xm[0] = V::hmax(mx[0]);
      else _mm_store_ps(xm, V::hmax4(mx));
      for (int k = 0; k < 4; ++k) {
        sum[k] = V::zero();
        if (h0 + k >= G) continue;
        const VT xv = V::set1(xm[k]);
        for (int j = 0; j < NJ; ++j) {
          const VT e = V::exp(V::sub(x[k][j], xv));
          V::store(sc + (h0 + k) * kBT + j * W, e);
          sum[k] = V::add(sum[k], e);
        }
      }
      if (one) sm[0] = V::hsum(sum[0]);
      else _mm_store_ps(sm, V::hsum4(sum));
      for (int k = 0; k < 4 && h0 + k < G; ++k) {
        const int h = h0 + k;
        const float mb = xm[k] + (c0 ? c0[h] : 0.f), m_new = std::max(m[h], mb);
        const float corr = m[h] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(m[h] - m_new);
        const float Cb = std::exp(mb - m_new);
        l[h] = l[h] * corr + Cb * sm[k];
        m[h] = m_new;
        C[h * cs] = Cb;
        if (corr != 1.f) {
          const VT cv = V::set1(corr);
          for (int d = 0; d < D; d += W) V::store(acc + h * D + d, V::mul(V::load(acc + h * D + d), cv));
        }
      }
    }
  }
  // One head's int4 value groups, four at a time (wcodes' operations, with the horizontal max and sum of four
  // groups at once): codes cwh [D/32][kBT], ph[g] = weight scale * C, ph[8 + g] = C * sum_t e_t * min_t,g.
  // vt: the block's value params in fp32 ([D/32][2][kBT]: scales, mins). Slots past the last group repeat it
  // (their codes land in cwh's spare rows: kWCBytes holds 8 groups).
  static void wgroups(const float* e, const float* vt, float C, uint8_t* cwh, float* ph) {
    constexpr int NJ = kBT / W;
    VT ev[NJ];
    for (int j = 0; j < NJ; ++j) ev[j] = V::load(e + j * W);
    for (int g0 = 0; g0 < NG; g0 += 4) {
      VT w[4][NJ], mx[4], oz[4];
      for (int k = 0; k < 4; ++k) {
        const int g = std::min(g0 + k, NG - 1);
        mx[k] = oz[k] = V::zero();
        for (int j = 0; j < NJ; ++j) {
          w[k][j] = V::mul(ev[j], V::load(vt + 2 * g * kBT + j * W));
          mx[k] = V::max(mx[k], w[k][j]);
          oz[k] = V::fmadd(ev[j], V::load(vt + (2 * g + 1) * kBT + j * W), oz[k]);
        }
      }
      alignas(16) float am[4], zs[4], inv[4];
      _mm_store_ps(am, V::hmax4(mx));
      _mm_store_ps(zs, V::hsum4(oz));
      for (int k = 0; k < 4; ++k) inv[k] = 127.f / am[k];
      I::wcodes4(w, inv, cwh + g0 * kBT);
      for (int k = 0; k < 4 && g0 + k < NG; ++k) {
        const float sw = am[k] / 127.f;
        const bool ok = sw > 0 && inv[k] < std::numeric_limits<float>::infinity();
        if (!ok) std::memset(cwh + (g0 + k) * kBT, 0, kBT);
        ph[g0 + k] = ok ? sw * C : 0.f;
        ph[8 + g0 + k] = C * zs[k];
      }
    }
  }
  // Value-weight codes of one head (and group): w_t = e_t * sv_t, cw = the 7-bit codes; returns amax / 127
  // (0 with all codes 0 when no weight is positive). wt: kBT floats of scratch.
  static float wcodes(const float* e, const float* sv, float* wt, uint8_t* cw) {
    VT mx = V::zero();
    for (int j = 0; j < kBT; j += W) {
      const VT w = V::mul(V::load(e + j), V::load(sv + j));
      V::store(wt + j, w);
      mx = V::max(mx, w);
    }
    const float amax = V::hmax(mx);
    const float s = amax / 127.f, inv = 127.f / amax;
    if (!(s > 0) || !(inv < std::numeric_limits<float>::infinity())) {
      std::memset(cw, 0, kBT);
      return 0.f;
    }
    I::wquant32(wt, inv, cw);
    return s;
  }

  // A head's scratch from its base qs: qs, qq [G][D], sc [G][kBT], c0 [G], vt, red, wv as in Kernel, then the
  // int8 query codes [G][kQ8Bytes], their scales [G] and biases [G], then (64-byte aligned) the p . V part.
  static int8_t* q8_codes(float* qs, int G) {
    return reinterpret_cast<int8_t*>(qs + 2 * G * D + G * kBT + G + (D / 32) * 2 * kBT + G * kBT * V::W + G * (D / 32) * kBT);
  }
  // The chunk's ch.n_heads kv heads block by block, each head with its own scratch (chunk_scratch_floats(G, D)
  // floats) and state slice, as Kernel::run.
  static void run(const CallCtx& c, const Chunk& ch, const float* q, float* m0, float* l0, float* acc0,
                  float* scratch) {
    const int G = c.G, H = c.H;
    const size_t sf = chunk_scratch_floats(G, D);
    for (int j = 0; j < ch.n_heads; ++j) {
      float* qs = scratch + j * sf;
      int8_t* q8 = q8_codes(qs, G);
      float* qsc = reinterpret_cast<float*>(q8 + size_t(G) * kQ8Bytes);
      float* qbias = qsc + G;
      for (int i = 0; i < G * D; ++i) qs[i] = q[size_t(j) * G * D + i] * c.scale;
      if (c.dtype == KVDType::I8)
        for (int h = 0; h < G; ++h) qbias[h] = float(I::kBias * quant_i8(qs + h * D, q8 + h * kQ8Bytes, &qsc[h]));
    }
    auto head = [&](int j, const void* blk, const void* nxt) {
      const int kvh = ch.kv_head + j;
      float *m = m0 + j * G, *l = l0 + j * G, *acc = acc0 + size_t(j) * G * D;
      float* qs = scratch + j * sf;  // [G][D]
      float* qq = qs + G * D;   // [G][D] int4: the folded query qf
      float* sc = qq + G * D;   // [G][kBT] scores, then e
      float* c0 = sc + G * kBT;  // [G]
      float* vt = c0 + G;       // [D/32][2][kBT] int4 values: fp32 scale row, then min row
      float* red = vt + (D / 32) * 2 * kBT;  // [G][kBT][W]
      float* wv = red + G * kBT * V::W;      // [G][D/32][kBT] the fp16 tail's value weights
      int8_t* q8 = q8_codes(qs, G);  // [G][kQ8Bytes], after wv
      float* qsc = reinterpret_cast<float*>(q8 + size_t(G) * kQ8Bytes);  // [G] query scale
      float* qbias = qsc + G;                                             // [G] kBias * sum(codes)
      // p . V (64-byte aligned): codes [G][kWCBytes], per-head floats [G][kPVHeadFloats] (ws [8], int4 offsets [8],
      // the block's C), then wt [kBT], kps [256], kpz [256].
      const size_t off = size_t(qbias + G - qs);
      auto* cw = reinterpret_cast<uint8_t*>(qs + (off + 15) / 16 * 16);
      auto* pf = reinterpret_cast<float*>(cw + size_t(G) * kWCBytes);
      float* wt = pf + size_t(G) * kPVHeadFloats;
      float* kps = wt + kBT;
      float* kpz = kps + 256;
      auto accum = [&]<bool U4>(const uint8_t* v, const uint8_t* vn) {
        K::template for_heads<I::HBPV>(G, [&]<int HB>(int h0) {
          if constexpr (U4) qaccum_u4<V, I, D, HB>(v, vn, cw + h0 * kWCBytes, pf + h0 * kPVHeadFloats, acc + h0 * D);
          else qaccum<V, I, D, HB>(v, vn, cw + h0 * kWCBytes, pf + h0 * kPVHeadFloats, acc + h0 * D);
        });
      };
      if (!blk) {
        const F16Head hd = f16_head(ch.seq->tail, H, D, kvh);
        K::block(F16Rows<V, D>{hd.k}, F16Rows<V, D>{hd.v}, ch.seq->n_tail, G, qs, m, l, acc, sc, red, wv,
                 [](int, float*, int) {});
        return;
      }
      if (c.dtype == KVDType::I8) {
        const I8Head hd = i8_head(blk, H, D, kvh);
        const I8Head nh = nxt ? i8_head(nxt, H, D, kvh) : I8Head{nullptr, nullptr, nullptr, nullptr};
        if (nxt) prefetch_row(nh.ks, kBT * 4), prefetch_row(nh.vs, kBT * 4);
        const auto* kc = reinterpret_cast<const uint8_t*>(hd.k);
        const auto* kn = reinterpret_cast<const uint8_t*>(nh.k);
        K::template for_heads<V::HB>(G, [&]<int HB>(int h0) { qscores_i8k<V, I, D, HB>(kc, kn, q8 + h0 * kQ8Bytes, sc + h0 * kBT); });
        for (int h = 0; h < G; ++h) {
          float* s = sc + h * kBT;
          const VT bias = V::set1(qbias[h]), qv = V::set1(qsc[h]);
          for (int t = 0; t < kBT; t += W) V::store(s + t, V::mul(V::sub(V::load(s + t), bias), V::mul(qv, V::load(hd.ks + t))));
        }
        softmax_q8(G, sc, nullptr, nullptr, m, l, acc, pf + kPVC, kPVHeadFloats);
        for (int h = 0; h < G; ++h)
          pf[h * kPVHeadFloats] = wcodes(sc + h * kBT, hd.vs, wt, cw + h * kWCBytes) * pf[h * kPVHeadFloats + kPVC];
        accum.template operator()<false>(reinterpret_cast<const uint8_t*>(hd.v), reinterpret_cast<const uint8_t*>(nh.v));
      } else if (c.dtype == KVDType::I4) {
        const I4Head hd = i4_head(blk, H, D, kvh);
        const I4Head nh = nxt ? i4_head(nxt, H, D, kvh) : I4Head{nullptr, nullptr, nullptr, nullptr};
        for (int d = 0; d < D; d += W) {
          V::store(kps + d, V::load_f16(hd.kp + d));
          V::store(kpz + d, V::load_f16(hd.kp + D + d));
        }
        quant_i4(G, qs, kps, kpz, qq, q8, qsc, c0);
        K::template for_heads<V::HB>(G, [&]<int HB>(int h0) {
          qscores_u4k<V, I, D, HB>(hd.k, nh.k, q8 + h0 * kQ8Bytes, sc + h0 * kBT);
        });
        // The next block's params (4 D bytes each of key and value params: D / 8 lines), a line an iteration.
        for (int x = 0, i = 0; x < 2 * NG * kBT; x += W, ++i) {
          V::store(vt + x, V::load_f16(hd.vp + x));
          if (nxt && i < D / 8) _mm_prefetch(reinterpret_cast<const char*>(i < D / 16 ? nh.kp : nh.vp) + (i % (D / 16)) * 64, _MM_HINT_T1);
        }
        softmax_q8(G, sc, qsc, c0, m, l, acc, pf + kPVC, kPVHeadFloats);
        for (int h = 0; h < G; ++h) {
          float* ph = pf + h * kPVHeadFloats;
          uint8_t* cwh = cw + h * kWCBytes;
          wgroups(sc + h * kBT, vt, ph[kPVC], cwh, ph);
        }
        accum.template operator()<true>(hd.v, nh.v);
      } else {
        FD_THROW("decode_attention: the integer-dot path takes int8 or int4 blocks, not dtype " << int(c.dtype));
      }
    };
    walk_chunk(c, ch, head);
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
