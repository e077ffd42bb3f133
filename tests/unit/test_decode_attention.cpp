// CPU decode attention (kernels/cpu/decode_attention.h): every supported ISA and KV dtype against a
// double-precision reference computed from the exact values the kernel computes on (fp16 values for
// fp16 blocks and the tail; kv_dequantize_block_f32 for int8/int4 blocks), over batch sizes, GQA
// shapes, head dims, mixed context lengths and thread counts; the context split; bad parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
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

RawBatch make_raw(const std::vector<int>& ctxs, int Hq, int H, int D, uint32_t seed) {
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

Batch make_batch(KVDType dtype, const RawBatch& raw) {
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

Batch make_batch(KVDType dtype, const std::vector<int>& ctxs, int Hq, int H, int D, uint32_t seed) {
  return make_batch(dtype, make_raw(ctxs, Hq, H, D, seed));
}

// o[s][h] = softmax(q.K^T * scale) V in double, from the exact values.
std::vector<double> reference(const Batch& b) {
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
::testing::AssertionResult close(const std::vector<float>& o, const std::vector<double>& r, int Hq, int D) {
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

std::vector<int> contexts_for(int n_seq) {
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
void PrintTo(const GridCase& c, std::ostream* os) {
  *os << "B=" << c.n_seq << " Hq=" << c.Hq << " Hkv=" << c.H << " D=" << c.D;
}

using fd::test::isa_required;  // require_isa.h: FD_REQUIRE_ISA turns a skip into a failure

std::string isa_param_name(Isa isa) { return std::string(fd::isa_name(isa)); }

// The ISAs this CPU runs. A listed ISA it lacks fails under FD_REQUIRE_ISA; otherwise its checks are left out
// of every grid case, and DecodeAttentionIsa.Available/<isa> shows it as Skipped (never a silent pass).
std::vector<Isa> runnable_isas() {
  std::vector<Isa> r;
  for (Isa isa : kIsas) {
    if (fd::isa_supported(isa)) r.push_back(isa);
    else if (isa_required(isa)) ADD_FAILURE() << "ISA " << fd::isa_name(isa) << " not supported here, but FD_REQUIRE_ISA lists it";
  }
  return r;
}

class DecodeAttentionIsa : public ::testing::TestWithParam<Isa> {};

TEST_P(DecodeAttentionIsa, Available) {
  FD_SKIP_UNLESS_ISA(GetParam());
  EXPECT_TRUE(fd::isa_supported(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(DecodeAttention, DecodeAttentionIsa, ::testing::ValuesIn(kIsas),
                         [](const auto& info) { return isa_param_name(info.param); });

// One case per shape, every ISA this CPU runs inside it (the batch and its double reference, the costly part,
// made once per KV dtype; the K/V values drawn once for all three).
class DecodeAttentionGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(DecodeAttentionGrid, AllIsasDtypesThreadsMatchDoubleReference) {
  const GridCase gc = GetParam();
  const RawBatch raw = make_raw(contexts_for(gc.n_seq), gc.Hq, gc.H, gc.D, 1234u + gc.n_seq * 7 + gc.D);
  const std::vector<Isa> isas = runnable_isas();
  for (KVDType dt : kDtypes) {
    const Batch b = make_batch(dt, raw);
    const std::vector<double> ref = reference(b);
    for (Isa isa : isas)
      for (int threads : {1, 2, 5}) {
        if (isa == Isa::Scalar && threads == 2) continue;  // the slow path: 1 and 5 threads suffice
        std::vector<float> o(ref.size(), NAN);
        fd::DecodeAttentionWorkspace ws;
        fd::decode_attention(b.params(o.data()), isa, threads, ws);
        EXPECT_TRUE(close(o, ref, gc.Hq, gc.D))
            << fd::isa_name(isa) << ", dtype " << fd::kv_dtype_name(dt) << ", threads " << threads;
      }
  }
}

std::vector<GridCase> grid() {
  std::vector<GridCase> g;
  for (int n_seq : {1, 3, 17})
    for (auto [hq, h] : {std::pair{4, 4}, {8, 2}, {32, 32}, {32, 8}})
      for (int d : {64, 128}) g.push_back({n_seq, hq, h, d});
  // The other head dims the kernels dispatch: partial 64-byte chunks, 5..8 value groups, odd 16-word key tiles.
  for (int d : {32, 96, 160, 256})
    for (auto [hq, h] : {std::pair{4, 4}, {8, 2}}) g.push_back({3, hq, h, d});
  return g;
}

std::string grid_name(const GridCase& c) {
  return "b" + std::to_string(c.n_seq) + "_h" + std::to_string(c.Hq) + "_kv" + std::to_string(c.H) + "_d" + std::to_string(c.D);
}

INSTANTIATE_TEST_SUITE_P(DecodeAttention, DecodeAttentionGrid, ::testing::ValuesIn(grid()),
                         [](const auto& info) { return grid_name(info.param); });

// ---- The quantized query (QueryQuant::I8: integer dot products for int8/int4 blocks) ----

// The query codes as the kernels make them (decode_attention.h, QueryQuant::I8): sq = amax / 127,
// code = clamp(nearbyint(x * (127 / amax)), -127, 127), in float.
std::vector<int> q8_codes(const float* x, int D, float* sq) {
  float amax = 0;
  for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
  *sq = amax / 127.f;
  const float inv = 127.f / amax;
  std::vector<int> c(D, 0);
  if (*sq > 0 && std::isfinite(inv))
    for (int d = 0; d < D; ++d) c[d] = int(std::clamp(std::nearbyint(x[d] * inv), -127.f, 127.f));
  else
    *sq = 0;
  return c;
}

// The double reference of the q8 math and the bound of the one error it leaves out. Scores: full int8
// blocks sq * sum(code_q * k) (k the exact values), full int4 blocks sqf * sum(code_qf * c) + qs . z with
// qf = qs * s read from the block's layout (kv_quant.cpp: K params fp16 [H][2][D] after the K and V codes),
// the fp16 tail q . k exactly; softmax and V in double with the exact value weights. The kernels round
// each full block's value weights w_t = p_t * vs_t (int4: per 32-channel group) to 7 bits, amax / 127 a
// step: `bound` gets, per output element, sum over those tokens of (step / 2) * |value code|, the most that
// rounding can move it (decode_attention_qdot.h).
struct Q8Ref {
  std::vector<double> o, bound;
};
Q8Ref reference_q8(const Batch& b) {
  const int H = b.H, D = b.D, G = b.Hq / b.H;
  const size_t hs = size_t(kT) * D;
  Q8Ref r;
  r.o.assign(b.seqs.size() * b.Hq * D, 0.0);
  r.bound.assign(r.o.size(), 0.0);
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const fd::SeqKVView& sv = b.seqs[s];
    const int64_t ctx = sv.n_tokens();
    std::vector<double> sc(ctx);
    for (int h = 0; h < b.Hq; ++h) {
      const int j = h / G;
      std::vector<float> qs(D);
      for (int d = 0; d < D; ++d) qs[d] = b.q[(s * b.Hq + h) * D + d] * b.scale;
      float sq = 0;
      const std::vector<int> qc = q8_codes(qs.data(), D, &sq);
      double mx = -INFINITY;
      for (int64_t t = 0; t < ctx; ++t) {
        const float* k = &b.k[s][(t * H + j) * D];
        double dot = 0;
        if (t >= int64_t(sv.n_full) * kT) {
          for (int d = 0; d < D; ++d) dot += double(qs[d]) * k[d];
        } else if (b.dtype == KVDType::I8) {
          for (int d = 0; d < D; ++d) dot += double(sq) * qc[d] * k[d];
        } else {
          const auto* blk = static_cast<const uint8_t*>(sv.blocks[t / kT]);
          const auto* kp = reinterpret_cast<const uint16_t*>(blk + size_t(2) * H * kT * D / 2) + size_t(j) * 2 * D;
          const uint8_t* kc = blk + size_t(j) * kT * D / 2;  // head j's key words [D/8][kT][4] (kv_quant.cpp)
          std::vector<float> qf(D);
          for (int d = 0; d < D; ++d) qf[d] = qs[d] * fd::fp16_to_fp32(kp[d]);
          float sqf = 0;
          const std::vector<int> fc = q8_codes(qf.data(), D, &sqf);
          for (int d = 0; d < D; ++d) {
            const uint8_t byte = kc[((d / 8) * kT + t % kT) * 4 + d % 4];
            const int code = d % 8 < 4 ? byte & 15 : byte >> 4;
            dot += double(sqf) * fc[d] * code + double(qs[d]) * fd::fp16_to_fp32(kp[D + d]);
          }
        }
        sc[t] = dot;
        mx = std::max(mx, sc[t]);
      }
      double l = 0;
      for (auto& x : sc) l += (x = std::exp(x - mx));
      double* out = &r.o[(s * b.Hq + h) * D];
      double* bnd = &r.bound[(s * b.Hq + h) * D];
      for (int64_t t = 0; t < ctx; ++t)
        for (int d = 0; d < D; ++d) out[d] += sc[t] / l * b.v[s][(t * H + j) * D + d];
      for (int blk_i = 0; blk_i < sv.n_full; ++blk_i) {
        const auto* blk = static_cast<const uint8_t*>(sv.blocks[blk_i]);
        const double* p = &sc[size_t(blk_i) * kT];
        for (int g = 0; g < (b.dtype == KVDType::I8 ? 1 : D / 32); ++g) {
          // the token's value scale and its codes' magnitudes (layouts: kv_quant.cpp)
          auto vscale = [&](int t) -> double {
            if (b.dtype == KVDType::I8) return reinterpret_cast<const float*>(blk + 2 * H * hs)[H * kT + j * kT + t];
            const auto* vp = reinterpret_cast<const uint16_t*>(blk + 2 * H * hs / 2) + size_t(H) * 2 * D + size_t(j) * kT * (D / 32) * 2;
            return fd::fp16_to_fp32(vp[(2 * g) * kT + t]);
          };
          auto vcode = [&](int t, int d) -> double {
            if (b.dtype == KVDType::I8) return std::fabs(double(reinterpret_cast<const int8_t*>(blk)[H * hs + j * hs + t * D + d]));
            const uint8_t byte = blk[H * hs / 2 + j * hs / 2 + ((size_t(t / 4) * (D / 32) + d / 32) * 16 + d % 16) * 4 + t % 4];
            return d % 32 < 16 ? byte & 15 : byte >> 4;
          };
          double amax = 0;
          for (int t = 0; t < kT; ++t) amax = std::max(amax, p[t] / l * vscale(t));
          const int d0 = b.dtype == KVDType::I8 ? 0 : 32 * g, d1 = b.dtype == KVDType::I8 ? D : 32 * g + 32;
          for (int t = 0; t < kT; ++t)
            for (int d = d0; d < d1; ++d) bnd[d] += amax / 254 * vcode(t, d);
        }
      }
    }
  }
  return r;
}

// close() with the q8 reference's weight-rounding bound added to the tolerance of each element.
::testing::AssertionResult close_q8(const std::vector<float>& o, const Q8Ref& r, int Hq, int D) {
  double worst = 0, worst_frac = 0;
  for (size_t i = 0; i < r.o.size(); ++i) {
    const double err = std::fabs(double(o[i]) - r.o[i]), tol = kAtol + kRtol * std::fabs(r.o[i]) + r.bound[i];
    worst = std::max(worst, err);
    worst_frac = std::max(worst_frac, err / tol);
    if (!(err <= tol))
      return ::testing::AssertionFailure() << "first bad index " << i << " (seq " << i / (size_t(Hq) * D) << ", head "
                                           << (i / D) % Hq << ", channel " << i % D << "): got " << o[i]
                                           << ", want " << r.o[i] << " +- " << tol << " (weight rounding "
                                           << r.bound[i] << "), |err| " << err;
  }
  return ::testing::AssertionSuccess() << "max |err| " << worst << ", at most " << worst_frac << " of the bound";
}

// Every ISA's q8 path (the scalar one is the twin) against the double q8 reference and against the
// scalar twin, int8 and int4 blocks, the whole grid, 1 and 5 threads; fp16 blocks ignore the mode
// (the same bits as with the fp32 query).
class DecodeAttentionQ8Grid : public ::testing::TestWithParam<GridCase> {};

TEST_P(DecodeAttentionQ8Grid, QuantizedQueryMatchesQ8ReferenceAndScalarTwin) {
  const GridCase gc = GetParam();
  const RawBatch raw = make_raw(contexts_for(gc.n_seq), gc.Hq, gc.H, gc.D, 4321u + gc.n_seq * 7 + gc.D);
  const std::vector<Isa> isas = runnable_isas();
  for (KVDType dt : kDtypes) {
    const Batch b = make_batch(dt, raw);
    std::vector<float> twin(size_t(gc.n_seq) * gc.Hq * gc.D, NAN), o(twin.size(), NAN), of(twin.size(), NAN);
    fd::DecodeAttentionWorkspace ws;
    fd::decode_attention(b.params(twin.data(), fd::QueryQuant::I8), Isa::Scalar, 1, ws);
    if (dt == KVDType::F16) {
      for (Isa isa : isas) {
        fd::decode_attention(b.params(o.data(), fd::QueryQuant::I8), isa, 5, ws);
        fd::decode_attention(b.params(of.data(), fd::QueryQuant::F32), isa, 5, ws);
        EXPECT_EQ(0, std::memcmp(o.data(), of.data(), o.size() * sizeof(float)))
            << fd::isa_name(isa) << ": fp16 blocks must ignore the query mode";
      }
      continue;
    }
    const Q8Ref ref = reference_q8(b);
    std::vector<double> twin_d(twin.begin(), twin.end());
    EXPECT_TRUE(close_q8(twin, ref, gc.Hq, gc.D)) << "scalar twin, dtype " << fd::kv_dtype_name(dt);
    for (Isa isa : isas)
      for (int threads : {1, 5}) {
        std::fill(o.begin(), o.end(), NAN);
        fd::decode_attention(b.params(o.data(), fd::QueryQuant::I8), isa, threads, ws);
        EXPECT_TRUE(close_q8(o, ref, gc.Hq, gc.D))
            << fd::isa_name(isa) << " vs q8 reference, dtype " << fd::kv_dtype_name(dt) << ", threads " << threads;
        EXPECT_TRUE(close(o, twin_d, gc.Hq, gc.D))
            << fd::isa_name(isa) << " vs scalar twin, dtype " << fd::kv_dtype_name(dt) << ", threads " << threads;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(DecodeAttention, DecodeAttentionQ8Grid, ::testing::ValuesIn(grid()),
                         [](const auto& info) { return grid_name(info.param); });

// The error the quantized query adds: max |o(I8 query) - o(fp32 query)| over the grid's batches (same
// KV, the scalar twin: every ISA's q8 path matches it to 2e-5, DecodeAttentionQ8Grid), per KV dtype.
// Grid data: q ~ 2 N(0,1) (a sharp softmax), K, V ~ N(0,1), contexts 1..8192. docs/RWORKER.md quotes
// the printed numbers; the bound is ~1.5x them (seeded data: a change means the math changed).
TEST(DecodeAttention, QuantizedQueryAddedError) {
  const KVDType dts[] = {KVDType::I8, KVDType::I4};
  double worst_of[2] = {0, 0}, sum_sq_of[2] = {0, 0}, ref_sq_of[2] = {0, 0};
  for (const GridCase& gc : grid()) {
    const RawBatch raw = make_raw(contexts_for(gc.n_seq), gc.Hq, gc.H, gc.D, 4321u + gc.n_seq * 7 + gc.D);
    for (int k = 0; k < 2; ++k) {
      const Batch b = make_batch(dts[k], raw);
      std::vector<float> oq(size_t(gc.n_seq) * gc.Hq * gc.D), of(oq.size());
      fd::DecodeAttentionWorkspace ws;
      fd::decode_attention(b.params(oq.data(), fd::QueryQuant::I8), Isa::Scalar, 1, ws);
      fd::decode_attention(b.params(of.data(), fd::QueryQuant::F32), Isa::Scalar, 1, ws);
      for (size_t i = 0; i < oq.size(); ++i) {
        const double e = std::fabs(double(oq[i]) - of[i]);
        worst_of[k] = std::max(worst_of[k], e);
        sum_sq_of[k] += e * e, ref_sq_of[k] += double(of[i]) * of[i];
      }
    }
  }
  for (int k = 0; k < 2; ++k) {
    const KVDType dt = dts[k];
    const double worst = worst_of[k], sum_sq = sum_sq_of[k], ref_sq = ref_sq_of[k];
    std::printf("quantized query, %s KV: max |o_q8 - o_fp32q| = %.4f over the grid, rel. L2 %.3f%%\n",
                fd::kv_dtype_name(dt).data(), worst, 100 * std::sqrt(sum_sq / ref_sq));
    EXPECT_GT(worst, 0.0) << "the I8 query made no difference: is the quantized path running?";
    EXPECT_LT(worst, dt == KVDType::I8 ? kQ8MaxErrI8 : kQ8MaxErrI4) << fd::kv_dtype_name(dt);
  }
}

// What Auto resolves to: I8 at the VNNI level only, fp16 blocks never.
TEST(DecodeAttention, QueryQuantAuto) {
  using fd::QueryQuant;
  for (Isa isa : kIsas) {
    EXPECT_FALSE(fd::query_is_q8(QueryQuant::Auto, KVDType::F16, isa));
    EXPECT_FALSE(fd::query_is_q8(QueryQuant::I8, KVDType::F16, isa));
    EXPECT_FALSE(fd::query_is_q8(QueryQuant::F32, KVDType::I8, isa));
    EXPECT_TRUE(fd::query_is_q8(QueryQuant::I8, KVDType::I4, isa));
    for (KVDType dt : {KVDType::I8, KVDType::I4})  // the integer path at the VNNI level (decode_attention.cpp)
      EXPECT_EQ(fd::query_is_q8(QueryQuant::Auto, dt, isa), isa == Isa::AVX512VNNI) << fd::isa_name(isa);
  }
}

TEST(DecodeAttention, IsaSupport) {
  EXPECT_TRUE(fd::isa_supported(Isa::Scalar));
  for (Isa isa : kIsas) {
    EXPECT_EQ(fd::isa_from_name(fd::isa_name(isa)), isa);
    if (!fd::isa_supported(isa)) std::printf("note: ISA %s not supported here: its cases skip (visibly)\n", fd::isa_name(isa).data());
  }
  EXPECT_TRUE(fd::isa_supported(fd::best_isa()));
  EXPECT_THROW(fd::isa_from_name("sse"), fd::Error);
}

// One sequence with context 8192 must be split across threads; the split result (merged partial
// states) agrees with the unsplit one and with the reference.
class DecodeAttentionSplit : public ::testing::TestWithParam<Isa> {};

TEST_P(DecodeAttentionSplit, LongSingleSequenceIsSplitAndMerged) {
  const Isa isa = GetParam();
  FD_SKIP_UNLESS_ISA(isa);
  for (KVDType dt : kDtypes) {
    const Batch b = make_batch(dt, {8192 + 5}, 8, 2, 128, 99);
    const std::vector<double> ref = reference(b);
    std::vector<float> o1(ref.size()), o16(ref.size());
    const auto plan1 = fd::decode_attention_plan(b.params(o1.data()), 1);
    const auto plan16 = fd::decode_attention_plan(b.params(o1.data()), 16);
    EXPECT_EQ(plan1.n_split_pairs, 0);
    EXPECT_EQ(plan16.n_split_pairs, 2 / plan16.heads_per_task);  // every pair (both kv heads, one or two a pair)
    EXPECT_GE(plan16.n_tasks, 16);          // every thread gets a chunk (chunks >= 64 KiB)
    fd::DecodeAttentionWorkspace ws;
    fd::decode_attention(b.params(o1.data()), isa, 1, ws);
    fd::decode_attention(b.params(o16.data()), isa, 16, ws);
    EXPECT_TRUE(close(o1, ref, 8, 128)) << fd::kv_dtype_name(dt);
    EXPECT_TRUE(close(o16, ref, 8, 128)) << fd::kv_dtype_name(dt);
    for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o16[i], 1e-5) << "index " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(DecodeAttention, DecodeAttentionSplit, ::testing::ValuesIn(kIsas),
                         [](const auto& info) { return isa_param_name(info.param); });

// The workspace grows once; a second call of the same shape allocates nothing and gives the same bits.
TEST(DecodeAttention, WorkspaceReusedWithoutReallocation) {
  const Batch b = make_batch(KVDType::F16, {4096, 100, 33}, 32, 8, 128, 5);
  std::vector<float> o1(3 * 32 * 128), o2(o1.size());
  fd::DecodeAttentionWorkspace ws;
  fd::decode_attention(b.params(o1.data()), fd::best_isa(), 4, ws);
  const float* pp = ws.partial.data();
  const int64_t* ip = ws.index.data();
  fd::decode_attention(b.params(o2.data()), fd::best_isa(), 4, ws);
  EXPECT_EQ(pp, ws.partial.data());
  EXPECT_EQ(ip, ws.index.data());
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)));
}

// The prefetch distance and the kv heads a task reads change what is read when, never what is computed: every ISA,
// dtype and query mode gives the same bits as one head a task at distance 1, at distances 0 (none), 2 and the
// maximum and at 2 and 4 heads a task (one head's blocks in the same order either way), for sequences shorter and
// longer than the distance; split over threads, where the cut moves with the heads a task, within 1e-5.
TEST(DecodeAttention, PrefetchAndHeadsPerTaskKeepTheBits) {
  for (KVDType dt : kDtypes) {
    const Batch b = make_batch(dt, {1, 31, 32 + 7, 3 * 32, 9 * 32 + 30, 2048 + 5}, 8, 4, 128, 17);
    for (const fd::QueryQuant qq : {fd::QueryQuant::F32, fd::QueryQuant::I8})
      for (Isa isa : runnable_isas())
        for (int threads : {1, 3}) {
          fd::DecodeAttentionWorkspace ws;
          std::vector<float> base(size_t(6) * 8 * 128, NAN), o(base.size(), NAN);
          fd::DecodeAttentionParams p0 = b.params(base.data(), qq);
          p0.heads_per_task = 1;
          fd::decode_attention(p0, isa, threads, ws);
          for (const auto [pf, hpt] : {std::pair{0, 1}, {2, 1}, {fd::kMaxPrefetchBlocks, 1}, {1, 2}, {1, 4}, {2, 4}}) {
            fd::DecodeAttentionParams p = b.params(o.data(), qq);
            p.prefetch_blocks = pf, p.heads_per_task = hpt;
            EXPECT_EQ(fd::decode_attention_plan(p, threads).n_pairs, 6 * 4 / hpt);
            std::fill(o.begin(), o.end(), NAN);
            fd::decode_attention(p, isa, threads, ws);
            const std::string what = std::string(fd::isa_name(isa)) + " " + std::string(fd::kv_dtype_name(dt)) +
                                     " query " + std::string(fd::query_quant_name(qq)) + " threads " +
                                     std::to_string(threads) + ": prefetch_blocks " + std::to_string(pf) +
                                     ", heads_per_task " + std::to_string(hpt);
            // Over threads the long sequence is cut by bytes a pair, so the merge (and its rounding) moves with
            // heads_per_task; the same bits where nothing is cut.
            if (threads == 1 || hpt == 1)
              EXPECT_EQ(0, std::memcmp(o.data(), base.data(), o.size() * sizeof(float))) << what << " changed the output";
            else
              for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], base[i], 1e-5) << what << ", index " << i;
          }
        }
  }
}

// heads_per_task = 0 takes the fewest heads, a divisor of n_kv_heads, whose bytes of a full block reach 8 KiB.
TEST(DecodeAttention, HeadsPerTaskAuto) {
  auto hpt = [](KVDType dt, int H, int D, int set = 0) {
    fd::DecodeAttentionParams p;
    p.dtype = dt, p.n_heads = 4 * H, p.n_kv_heads = H, p.head_dim = D, p.heads_per_task = set;
    return fd::decode_attention_heads_per_task(p);
  };
  EXPECT_EQ(hpt(KVDType::F16, 32, 128), 1);  // 16 KiB a head
  EXPECT_EQ(hpt(KVDType::I8, 32, 128), 1);   // 8 KiB + 256 B
  EXPECT_EQ(hpt(KVDType::I4, 32, 128), 2);   // 5 KiB
  EXPECT_EQ(hpt(KVDType::I4, 8, 128), 2);
  EXPECT_EQ(hpt(KVDType::I4, 9, 128), 3);    // the next divisor up
  EXPECT_EQ(hpt(KVDType::I4, 7, 128), 7);    // 7 is prime: all 7 (at most 8)
  EXPECT_EQ(hpt(KVDType::I4, 11, 128), 1);   // no divisor in [2, 8]
  EXPECT_EQ(hpt(KVDType::I4, 2, 64), 2);     // wants 4 of 2.5 KiB: both
  EXPECT_EQ(hpt(KVDType::I4, 6, 64), 6);     // wants 4: 6 is the next divisor up
  EXPECT_EQ(hpt(KVDType::I4, 32, 64), 4);    // 2.5 KiB
  EXPECT_EQ(hpt(KVDType::I8, 32, 64), 2);    // 4 KiB + 256 B
  EXPECT_EQ(hpt(KVDType::F16, 32, 32), 2);   // 4 KiB
  EXPECT_EQ(hpt(KVDType::I4, 32, 32), 8);    // 1.25 KiB: at most 8
  EXPECT_EQ(hpt(KVDType::I4, 32, 128, 4), 4);  // set: taken as it is
}

TEST(DecodeAttention, KvBytesFormula) {
  const Batch b = make_batch(KVDType::I4, {64 + 3, 32}, 8, 2, 64, 3);
  std::vector<float> o(2 * 8 * 64);
  // full blocks at the dtype's size + tail tokens in fp16 (K and V)
  const int64_t want = 3 * int64_t(fd::kv_block_bytes(KVDType::I4, 2, 64)) + 3 * 2 * 64 * 2 * 2;
  EXPECT_EQ(fd::decode_attention_kv_bytes(b.params(o.data())), want);
}

TEST(DecodeAttention, BadParamsThrow) {
  const Batch b = make_batch(KVDType::F16, {40}, 8, 2, 64, 7);
  std::vector<float> o(8 * 64);
  fd::DecodeAttentionWorkspace ws;
  auto run = [&](auto edit) {
    fd::DecodeAttentionParams p = b.params(o.data());
    edit(p);
    fd::decode_attention(p, Isa::Scalar, 1, ws);
  };
  auto msg = [&](auto edit) {
    try {
      run(edit);
    } catch (const fd::Error& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  EXPECT_NE(msg([](auto& p) { p.head_dim = 48; }).find("head_dim"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.head_dim = 288; }).find("head_dim"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.n_kv_heads = 3; }).find("multiple of n_kv_heads"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.n_heads = 0; }).find("n_heads"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.q = nullptr; }).find("null"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.scale = NAN; }).find("scale"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.n_seq = -1; }).find("n_seq"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.dtype = KVDType(7); }).find("dtype"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.query = fd::QueryQuant(5); }).find("query quantization"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.prefetch_blocks = -1; }).find("prefetch_blocks"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.heads_per_task = 3; }).find("heads_per_task"), std::string::npos);  // 2 kv heads
  EXPECT_NE(msg([](auto& p) { p.heads_per_task = -1; }).find("heads_per_task"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.prefetch_blocks = fd::kMaxPrefetchBlocks + 1; }).find("prefetch_blocks"),
            std::string::npos);
  fd::SeqKVView bad = b.seqs[0];
  bad.n_tail = 32;
  EXPECT_NE(msg([&](auto& p) { p.seqs = &bad; }).find("n_tail"), std::string::npos);
  fd::SeqKVView empty;
  EXPECT_NE(msg([&](auto& p) { p.seqs = &empty; }).find("no tokens"), std::string::npos);
  EXPECT_THROW(fd::decode_attention(b.params(o.data()), Isa::Scalar, 0, ws), fd::Error);
  EXPECT_THROW(fd::decode_attention(b.params(o.data()), Isa(9), 1, ws), fd::Error);
  // n_seq == 0 is a documented no-op, even with null pointers.
  fd::DecodeAttentionParams none;
  none.n_heads = none.n_kv_heads = 1;
  none.head_dim = 64;
  none.scale = 0.125f;
  EXPECT_NO_THROW(fd::decode_attention(none, Isa::Scalar, 2, ws));
}

}  // namespace
