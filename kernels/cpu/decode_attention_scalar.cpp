// Scalar reference of the CPU decode attention: plain loops, the same arithmetic as the SIMD paths
// (online softmax per 32-token block, fp32 accumulation, quantized data used directly), so it is the
// readable golden twin they are compared with. Shapes: see decode_attention_impl.h.
#include <algorithm>
#include <cmath>
#include <limits>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "kernels/cpu/decode_attention_impl.h"

namespace fd::attn {
namespace {

// Dequantizers for one element of token t, channel d of one head's K or V in one block. Each block
// also gives the per-query-head score correction (int8: per-token key scale; int4: q . z).
struct Ctx {
  int G, D;
  float* m;    // [G]
  float* l;    // [G]
  float* acc;  // [G][D]
  float* s;    // [G][kBT] scores, then probabilities
};

// Online-softmax update of head h after its scores s[0..n) are final; returns corr and turns s into p.
void softmax_update(Ctx& c, int h, int n) {
  float* s = c.s + h * kBT;
  float mb = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < n; ++t) mb = std::max(mb, s[t]);
  const float m_new = std::max(c.m[h], mb);
  const float corr = c.m[h] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(c.m[h] - m_new);
  float sum = 0;
  for (int t = 0; t < n; ++t) {
    s[t] = std::exp(s[t] - m_new);
    sum += s[t];
  }
  c.l[h] = c.l[h] * corr + sum;
  c.m[h] = m_new;
  if (corr != 1.f)
    for (int d = 0; d < c.D; ++d) c.acc[h * c.D + d] *= corr;
}

void block_f16(Ctx& c, const F16Head& hd, int n, const float* qs) {
  const int D = c.D;
  for (int t = 0; t < n; ++t) {  // each K row is read once for all G heads
    const uint16_t* k = hd.k + size_t(t) * D;
    for (int h = 0; h < c.G; ++h) {
      float dot = 0;
      for (int d = 0; d < D; ++d) dot += qs[h * D + d] * fp16_to_fp32(k[d]);
      c.s[h * kBT + t] = dot;
    }
  }
  for (int h = 0; h < c.G; ++h) softmax_update(c, h, n);
  for (int t = 0; t < n; ++t) {
    const uint16_t* v = hd.v + size_t(t) * D;
    for (int h = 0; h < c.G; ++h)
      for (int d = 0; d < D; ++d) c.acc[h * D + d] += c.s[h * kBT + t] * fp16_to_fp32(v[d]);
  }
}

// The block's scores c.s are in: softmax them, then acc += (p * vs[t]) * code over the int8 values.
void softmax_and_i8_values(Ctx& c, const I8Head& hd) {
  const int D = c.D;
  for (int h = 0; h < c.G; ++h) softmax_update(c, h, kBT);
  for (int t = 0; t < kBT; ++t) {
    const int8_t* v = hd.v + size_t(t) * D;
    for (int h = 0; h < c.G; ++h) {
      const float w = c.s[h * kBT + t] * hd.vs[t];
      for (int d = 0; d < D; ++d) c.acc[h * D + d] += w * float(v[d]);
    }
  }
}

// int8: x = scale[t] * code. score = ks[t] * (qs . code); acc += (p * vs[t]) * code.
void block_i8(Ctx& c, const I8Head& hd, const float* qs) {
  const int D = c.D;
  for (int t = 0; t < kBT; ++t) {
    for (int h = 0; h < c.G; ++h) {
      float dot = 0;
      for (int d = 0; d < D; ++d) dot += qs[h * D + d] * float(i8_key(hd.k, t, d));
      c.s[h * kBT + t] = dot * hd.ks[t];
    }
  }
  softmax_and_i8_values(c, hd);
}

// The block's scores c.s are in: softmax them, then the int4 values x = s[t,g]*c + z[t,g] (per token and
// 32-channel group): acc += p*s*c, plus sum_t p*z.
void softmax_and_i4_values(Ctx& c, const I4Head& hd) {
  const int D = c.D, NG = D / 32;
  for (int h = 0; h < c.G; ++h) softmax_update(c, h, kBT);
  for (int h = 0; h < c.G; ++h)
    for (int g = 0; g < NG; ++g) {
      float off = 0;
      for (int t = 0; t < kBT; ++t) {
        const float p = c.s[h * kBT + t];
        const float w = p * fp16_to_fp32(hd.vp[(2 * g) * kBT + t]);
        off += p * fp16_to_fp32(hd.vp[(2 * g + 1) * kBT + t]);
        for (int d = g * 32; d < g * 32 + 32; ++d) c.acc[h * D + d] += w * float(u4_val(hd.v, t, d, D));
      }
      for (int d = g * 32; d < g * 32 + 32; ++d) c.acc[h * D + d] += off;
    }
}

// int4 keys x = s[d]*c + z[d] (per channel): score = (qs*s) . c + qs . z.
void block_i4(Ctx& c, const I4Head& hd, const float* qs, float* qq) {
  const int D = c.D;
  for (int h = 0; h < c.G; ++h) {
    float c0 = 0;
    for (int d = 0; d < D; ++d) {
      qq[h * D + d] = qs[h * D + d] * fp16_to_fp32(hd.kp[d]);
      c0 += qs[h * D + d] * fp16_to_fp32(hd.kp[D + d]);
    }
    for (int t = 0; t < kBT; ++t) {
      float dot = 0;
      for (int d = 0; d < D; ++d) dot += qq[h * D + d] * float(u4_key(hd.k, t, d));
      c.s[h * kBT + t] = dot + c0;
    }
  }
  softmax_and_i4_values(c, hd);
}

// The integer-dot twins (CallCtx::q8; the SIMD kernel is decode_attention_qdot.h): the same codes and
// the same integer sums, here in int32, then the same fp32 rescale. Both dot products are on integers:
// q . K on the int8 query codes, p . V on the value-weight codes (7 bits, per block and head, and per
// 32-channel group for int4 values), made from e_t = exp_poly(x_t - max x) so that they are the same bits
// as the SIMD paths' (decode_attention_qdot.h says why and what it costs).

// Block softmax of head h: s holds x_t (the scores less the block's constant c0), becomes e_t; returns the
// block's factor C = exp(max x + c0 - m_new).
float softmax_q8(Ctx& c, int h, float c0) {
  float* s = c.s + h * kBT;
  float xmax = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < kBT; ++t) xmax = std::max(xmax, s[t]);
  float sum = 0;
  for (int t = 0; t < kBT; ++t) {
    s[t] = exp_poly(s[t] - xmax);
    sum += s[t];
  }
  const float mb = xmax + c0, m_new = std::max(c.m[h], mb);
  const float corr = c.m[h] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(c.m[h] - m_new);
  const float C = std::exp(mb - m_new);
  c.l[h] = c.l[h] * corr + C * sum;
  c.m[h] = m_new;
  if (corr != 1.f)
    for (int d = 0; d < c.D; ++d) c.acc[h * c.D + d] *= corr;
  return C;
}

// Value-weight codes of w_t = e_t * sv_t: clamp(nearbyint(w * (127 / amax)), 0, 127); returns amax / 127
// (0, and all codes 0, when no weight is positive).
float weight_codes(const float* e, const float* sv, int* cw) {
  float w[kBT], amax = 0;
  for (int t = 0; t < kBT; ++t) amax = std::max(amax, w[t] = e[t] * sv[t]);
  const float s = amax / 127.f, inv = 127.f / amax;
  const bool ok = s > 0 && inv < std::numeric_limits<float>::infinity();
  for (int t = 0; t < kBT; ++t) cw[t] = ok ? int(std::clamp(std::nearbyint(w[t] * inv), 0.f, 127.f)) : 0;
  return ok ? s : 0.f;
}

// int8 values: acc += C * ws * sum_t cw_t * code_t.
void softmax_q8_and_i8_values(Ctx& c, const I8Head& hd) {
  const int D = c.D;
  for (int h = 0; h < c.G; ++h) {
    const float C = softmax_q8(c, h, 0.f);
    int cw[kBT];
    const float ws = weight_codes(c.s + h * kBT, hd.vs, cw) * C;
    for (int d = 0; d < D; ++d) {
      int32_t sum = 0;
      for (int t = 0; t < kBT; ++t) sum += cw[t] * int32_t(hd.v[size_t(t) * D + d]);
      c.acc[h * D + d] = std::fma(float(sum), ws, c.acc[h * D + d]);
    }
  }
}

// int4 values x = s[t,g] * code + z[t,g]: acc += C * ws_g * sum_t cw_t,g * code_t + C * sum_t e_t * z[t,g].
void softmax_q8_and_i4_values(Ctx& c, const I4Head& hd, const float* c0) {
  const int D = c.D, NG = D / 32;
  for (int h = 0; h < c.G; ++h) {
    const float C = softmax_q8(c, h, c0[h]);
    const float* e = c.s + h * kBT;
    for (int g = 0; g < NG; ++g) {
      float sv[kBT], zv[kBT];
      for (int t = 0; t < kBT; ++t) {
        sv[t] = fp16_to_fp32(hd.vp[(2 * g) * kBT + t]);
        zv[t] = fp16_to_fp32(hd.vp[(2 * g + 1) * kBT + t]);
      }
      int cw[kBT];
      const float ws = weight_codes(e, sv, cw) * C;
      float off = 0;
      for (int t = 0; t < kBT; ++t) off += e[t] * zv[t];
      off *= C;
      for (int d = g * 32; d < g * 32 + 32; ++d) {
        int32_t sum = 0;
        for (int t = 0; t < kBT; ++t) sum += cw[t] * u4_val(hd.v, t, d, D);
        c.acc[h * D + d] = std::fma(float(sum), ws, c.acc[h * D + d]) + off;
      }
    }
  }
}

// int8 keys: x = float(sum qc * code) * (sq * ks[t]), qc = head h's codes of qs (once per chunk).
void block_i8_q8(Ctx& c, const I8Head& hd, const int8_t* qc, const float* sq) {
  const int D = c.D;
  for (int t = 0; t < kBT; ++t) {
    for (int h = 0; h < c.G; ++h) {
      int32_t dot = 0;
      for (int d = 0; d < D; ++d) dot += int32_t(qc[h * D + d]) * i8_key(hd.k, t, d);
      c.s[h * kBT + t] = float(dot) * (sq[h] * hd.ks[t]);
    }
  }
  softmax_q8_and_i8_values(c, hd);
}

// int4 keys: qf = qs * s (the block's per-channel key scale), its codes qc and scale sqf per block;
// x = float(sum qc * code) * sqf, and the block's constant c0 = qs . z goes to the softmax.
void block_i4_q8(Ctx& c, const I4Head& hd, const float* qs, float* qf, int8_t* qc, float* c0) {
  const int D = c.D;
  for (int h = 0; h < c.G; ++h) {
    c0[h] = 0;
    for (int d = 0; d < D; ++d) {
      qf[d] = qs[h * D + d] * fp16_to_fp32(hd.kp[d]);
      c0[h] += qs[h * D + d] * fp16_to_fp32(hd.kp[D + d]);
    }
    float sqf = 0;
    quantize_q8(qf, D, qc, &sqf);
    for (int t = 0; t < kBT; ++t) {
      int32_t dot = 0;
      for (int d = 0; d < D; ++d) dot += int32_t(qc[d]) * u4_key(hd.k, t, d);
      c.s[h * kBT + t] = float(dot) * sqf;
    }
  }
  softmax_q8_and_i4_values(c, hd, c0);
}

}  // namespace

int32_t quantize_q8(const float* x, int n, int8_t* code, float* sq) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax / 127.f, inv = 127.f / amax;
  const bool ok = s > 0 && inv < std::numeric_limits<float>::infinity();
  *sq = ok ? s : 0.f;
  int32_t sum = 0;
  for (int i = 0; i < n; ++i) {
    code[i] = ok ? int8_t(std::clamp(std::nearbyint(x[i] * inv), -127.f, 127.f)) : int8_t(0);
    sum += code[i];
  }
  return sum;
}

namespace {
void run_head_scalar(const CallCtx& cc, const Chunk& ch, const float* q, float* m, float* l, float* acc,
                     float* scratch) {
  const int G = cc.G, D = cc.D, H = cc.H;
  float* qs = scratch;     // [G][D] q * scale
  float* qq = qs + G * D;  // [G][D] int4 folded query
  Ctx c{G, D, m, l, acc, qq + G * D};
  // q8 (int8/int4 blocks): query codes [G][D], scales [G] and int4 constants [G] after the scores
  // (chunk_scratch_floats leaves far more than this needs).
  auto* qc = reinterpret_cast<int8_t*>(c.s + G * kBT);
  float* sq = c.s + G * kBT + G * D / 4;
  float* c0 = sq + G;  // [G] int4 keys: qs . z of the block
  for (int i = 0; i < G * D; ++i) qs[i] = q[i] * cc.scale;
  const bool q8 = cc.q8 && cc.dtype != KVDType::F16;
  if (q8 && cc.dtype == KVDType::I8)
    for (int h = 0; h < G; ++h) quantize_q8(qs + h * D, D, qc + h * D, &sq[h]);
  for (int32_t b = ch.b0; b < ch.b1; ++b) {
    const void* blk = ch.seq->blocks[b];
    switch (cc.dtype) {
      case KVDType::F16: block_f16(c, f16_head(blk, H, D, ch.kv_head), kBT, qs); break;
      case KVDType::I8:
        if (q8) block_i8_q8(c, i8_head(blk, H, D, ch.kv_head), qc, sq);
        else block_i8(c, i8_head(blk, H, D, ch.kv_head), qs);
        break;
      case KVDType::I4:
        if (q8) block_i4_q8(c, i4_head(blk, H, D, ch.kv_head), qs, qq, qc, c0);
        else block_i4(c, i4_head(blk, H, D, ch.kv_head), qs, qq);
        break;
      default: FD_THROW("decode_attention: unknown KV dtype " << int(cc.dtype));
    }
  }
  if (ch.tail && ch.seq->n_tail > 0) block_f16(c, f16_head(ch.seq->tail, H, D, ch.kv_head), ch.seq->n_tail, qs);
}
}  // namespace

// The chunk's heads one after the other (the SIMD kernels interleave them block by block: the same math per head).
void run_chunk_scalar(const CallCtx& cc, const Chunk& ch, const float* q, float* m, float* l, float* acc,
                      float* scratch) {
  const int G = cc.G, D = cc.D;
  for (int j = 0; j < ch.n_heads; ++j) {
    Chunk one = ch;
    one.kv_head = ch.kv_head + j, one.n_heads = 1;
    run_head_scalar(cc, one, q + size_t(j) * G * D, m + j * G, l + j * G, acc + size_t(j) * G * D, scratch);
  }
}

}  // namespace fd::attn
