// Helpers of the CPU decode-attention tests (test_decode_attention.cpp, test_decode_attention_plan.cpp): seeded
// batches in every KV dtype, the double reference built from the values the kernels compute on, the tolerance
// check, the ISAs this CPU runs.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "kernels/cpu/decode_attention.h"
#include "require_isa.h"

namespace fd {
// gtest's names for the parameters (found by ADL).
inline void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
}  // namespace fd

namespace {


using fd::Isa;
using fd::KVDType;
constexpr int kT = fd::kKVBlockTokens;

// A batch's KV-cache at one layer, its query and the exact fp32 values of K and V per sequence.
struct Batch {
  int H = 0, D = 0, Hq = 0;
  KVDType dtype = KVDType::F16;
  std::vector<std::vector<uint8_t>> blocks;          // every full block, in the dtype's layout
  std::vector<std::vector<uint16_t>> tails;          // per sequence, fp16 tail layout
  std::vector<std::vector<const void*>> block_ptrs;  // per sequence
  std::vector<fd::SeqKVView> seqs;
  std::vector<float> q;
  std::vector<std::vector<float>> k, v;  // per sequence: [ctx][H][D] exact values
  float scale = 0;

  // query: F32 by default (the exact-math grid); the q8 tests pass I8.
  fd::DecodeAttentionParams params(float* o, fd::QueryQuant query = fd::QueryQuant::F32) const {
    fd::DecodeAttentionParams p;
    p.query = query;
    p.dtype = dtype;
    p.n_seq = int(seqs.size());
    p.n_heads = Hq;
    p.n_kv_heads = H;
    p.head_dim = D;
    p.scale = scale;
    p.seqs = seqs.data();
    p.q = q.data();
    p.o = o;
    return p;
  }
};

// The seeded fp16 values of a batch's K/V blocks (every block, the tail's too, in the fp16 layout) and its
// query, drawn once: the batches of every KV dtype are made from the same values.
struct RawBatch {
  std::vector<int> ctxs;
  int Hq = 0, H = 0, D = 0;
  std::vector<std::vector<std::vector<uint16_t>>> blocks;  // per sequence, per block (full blocks, then the tail)
  std::vector<float> q;
};

inline RawBatch make_raw(const std::vector<int>& ctxs, int Hq, int H, int D, uint32_t seed) {
  RawBatch r;
  r.ctxs = ctxs, r.Hq = Hq, r.H = H, r.D = D;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t blk_halves = fd::kv_fp16_block_bytes(H, D) / 2;
  for (const int ctx : ctxs) {
    r.blocks.emplace_back();
    for (int blk = 0; blk <= ctx / kT; ++blk) {
      if (blk == ctx / kT && ctx % kT == 0) break;
      std::vector<uint16_t> f16(blk_halves);
      for (auto& x : f16) x = fd::fp32_to_fp16(nd(rng));
      r.blocks.back().push_back(std::move(f16));
    }
  }
  r.q.resize(ctxs.size() * Hq * D);
  for (auto& x : r.q) x = 2.f * nd(rng);  // sharper softmax than N(0,1) queries give
  return r;
}

inline Batch make_batch(KVDType dtype, const RawBatch& raw) {
  const std::vector<int>& ctxs = raw.ctxs;
  const int Hq = raw.Hq, H = raw.H, D = raw.D;
  Batch b;
  b.H = H, b.D = D, b.Hq = Hq, b.dtype = dtype;
  b.scale = 1.f / std::sqrt(float(D));
  const size_t blk_halves = fd::kv_fp16_block_bytes(H, D) / 2, hs = size_t(kT) * D;
  const size_t qbytes = fd::kv_block_bytes(dtype, H, D);
  b.block_ptrs.resize(ctxs.size());
  b.tails.resize(ctxs.size());
  std::vector<float> deq(blk_halves);
  for (size_t s = 0; s < ctxs.size(); ++s) {
    const int ctx = ctxs[s], n_full = ctx / kT, n_tail = ctx % kT;
    std::vector<float> k(size_t(ctx) * H * D), v(k.size());
    // One block at a time in the fp16 layout: K [H][32][D], V [H][32][D].
    for (int blk = 0; blk <= n_full; ++blk) {
      const int n = blk < n_full ? kT : n_tail;
      if (n == 0) break;
      const std::vector<uint16_t>& f16 = raw.blocks[s][size_t(blk)];
      if (blk < n_full) {
        b.blocks.emplace_back(qbytes);
        fd::kv_quantize_block(dtype, f16.data(), b.blocks.back().data(), H, D);
        fd::kv_dequantize_block_f32(dtype, b.blocks.back().data(), deq.data(), H, D);
      } else {
        b.tails[s] = f16;
        for (size_t i = 0; i < blk_halves; ++i) deq[i] = fd::fp16_to_fp32(f16[i]);
      }
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < n; ++t)
          for (int d = 0; d < D; ++d) {
            const size_t dst = (size_t(blk * kT + t) * H + h) * D + d;
            k[dst] = deq[h * hs + t * D + d];
            v[dst] = deq[H * hs + h * hs + t * D + d];
          }
    }
    b.k.push_back(std::move(k));
    b.v.push_back(std::move(v));
  }
  // Block pointers only after every block exists (emplace_back may move the vectors' buffers... their
  // data stays put, but take the pointers at the end to be plain about it).
  size_t next = 0;
  for (size_t s = 0; s < ctxs.size(); ++s) {
    const int n_full = ctxs[s] / kT;
    for (int i = 0; i < n_full; ++i) b.block_ptrs[s].push_back(b.blocks[next++].data());
    fd::SeqKVView sv;
    sv.blocks = b.block_ptrs[s].data();
    sv.n_full = n_full;
    sv.n_tail = ctxs[s] % kT;
    sv.tail = sv.n_tail ? b.tails[s].data() : nullptr;
    b.seqs.push_back(sv);
  }
  b.q = raw.q;
  return b;
}

// Frees a batch's exact K/V copies (the references' input, as large as its fp16 blocks twice over) once its
// references are made, for a batch that is kept.
inline void drop_exact_values(Batch& b) {
  std::vector<std::vector<float>>().swap(b.k);
  std::vector<std::vector<float>>().swap(b.v);
}

inline Batch make_batch(KVDType dtype, const std::vector<int>& ctxs, int Hq, int H, int D, uint32_t seed) {
  return make_batch(dtype, make_raw(ctxs, Hq, H, D, seed));
}

// o[s][h] = softmax(q.K^T * scale) V in double, from the exact values.
inline std::vector<double> reference(const Batch& b) {
  const int H = b.H, D = b.D, G = b.Hq / b.H;
  std::vector<double> o(b.seqs.size() * b.Hq * D, 0.0);
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const int64_t ctx = b.seqs[s].n_tokens();
    std::vector<double> sc(ctx);
    for (int h = 0; h < b.Hq; ++h) {
      const int j = h / G;
      const float* q = &b.q[(s * b.Hq + h) * D];
      double mx = -INFINITY;
      for (int64_t t = 0; t < ctx; ++t) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(q[d]) * b.k[s][(t * H + j) * D + d];
        sc[t] = dot * b.scale;
        mx = std::max(mx, sc[t]);
      }
      double l = 0;
      for (auto& x : sc) l += (x = std::exp(x - mx));
      double* out = &o[(s * b.Hq + h) * D];
      for (int64_t t = 0; t < ctx; ++t)
        for (int d = 0; d < D; ++d) out[d] += sc[t] / l * b.v[s][(t * H + j) * D + d];
    }
  }
  return o;
}

// |o - r| <= atol + rtol*|r| everywhere; reports the first bad index as (seq, head, channel).
// Values are O(1) (V ~ N(0,1)); fp32 accumulation over up to 8192 tokens stays well inside 2e-5.
constexpr double kAtol = 2e-5, kRtol = 2e-5;
// Bounds of the quantized query's added error (QuantizedQueryAddedError); set from its printed numbers.
constexpr double kQ8MaxErrI8 = 0.075, kQ8MaxErrI4 = 0.15;  // measured 0.0501, 0.0984 (dev machine)
inline ::testing::AssertionResult close(const std::vector<float>& o, const std::vector<double>& r, int Hq, int D) {
  double worst = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double err = std::fabs(double(o[i]) - r[i]);
    worst = std::max(worst, err);
    if (!(err <= kAtol + kRtol * std::fabs(r[i])))
      return ::testing::AssertionFailure() << "first bad index " << i << " (seq " << i / (size_t(Hq) * D) << ", head "
                                           << (i / D) % Hq << ", channel " << i % D << "): got " << o[i]
                                           << ", want " << r[i] << ", |err| " << err;
  }
  return ::testing::AssertionSuccess() << "max |err| " << worst;
}

const Isa kIsas[] = {Isa::Scalar, Isa::AVX2, Isa::AVX512, Isa::AVX512VNNI};
const KVDType kDtypes[] = {KVDType::F16, KVDType::I8, KVDType::I4};

inline std::vector<int> contexts_for(int n_seq) {
  // Mixed lengths within a batch: every listed length appears in the 17-sequence batch.
  if (n_seq == 1) return {1000};
  if (n_seq == 3) return {33, 8192, 1};
  const int base[] = {1, 2, 31, 32, 33, 100, 1000, 8192};
  std::vector<int> c;
  for (int i = 0; i < n_seq; ++i) c.push_back(i < 8 ? base[i] : base[i % 6]);  // one 8192, several short
  return c;
}

struct GridCase {
  int n_seq, Hq, H, D;
};
inline bool same_shape(const GridCase& a, const GridCase& b) {
  return a.n_seq == b.n_seq && a.Hq == b.Hq && a.H == b.H && a.D == b.D;
}
inline void PrintTo(const GridCase& c, std::ostream* os) {
  *os << "B=" << c.n_seq << " Hq=" << c.Hq << " Hkv=" << c.H << " D=" << c.D;
}

inline std::string isa_param_name(Isa isa) { return std::string(fd::isa_name(isa)); }

// A kernel grid's case: one ISA on one shape, named "<isa>_<shape>", so that an ISA this CPU lacks skips each of its
// cases visibly (FD_SKIP_UNLESS_ISA, require_isa.h) while the others run.
struct IsaGridCase {
  Isa isa;
  GridCase shape;
};
inline void PrintTo(const IsaGridCase& c, std::ostream* os) {
  *os << fd::isa_name(c.isa) << " ";
  PrintTo(c.shape, os);
}
// Shape-major: a shape's ISA cases one after another, so that a test can keep the shape's costly data for the next.
inline std::vector<IsaGridCase> isa_grid(const std::vector<GridCase>& shapes) {
  std::vector<IsaGridCase> g;
  for (const GridCase& s : shapes)
    for (Isa isa : kIsas) g.push_back({isa, s});
  return g;
}

}  // namespace
