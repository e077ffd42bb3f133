// CPU decode attention (kernels/cpu/decode_attention.h): every supported ISA and KV dtype against a
// double-precision reference computed from the exact values the kernel computes on (fp16 values for
// fp16 blocks and the tail; kv_dequantize_block_f32 for int8/int4 blocks), over batch sizes, GQA
// shapes, head dims, mixed context lengths and thread counts; the integer path. The work split, its knobs and bad
// parameters: test_decode_attention_plan.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "kernels/cpu/decode_attention.h"
#include "decode_attention_test_util.h"
#include "require_isa.h"

namespace {

// One case per ISA and shape, "<isa>_<shape>": an ISA this CPU lacks skips each of its cases (require_isa.h), the
// others run. The costly part, the batch of each KV dtype and its double reference (the K/V values drawn once for
// all three), is made once per shape and kept for the next case (grid_data): the ISA cases of a shape come one after
// another and ctest runs the suite in one process (tests/CMakeLists.txt), so splitting the ISAs into cases costs no
// more than running them all in one case did.
class DecodeAttentionGrid : public ::testing::TestWithParam<IsaGridCase> {};

struct GridData {
  std::vector<Batch> batches;  // kDtypes' order, without their exact K/V copies (the references are made)
  std::vector<std::vector<double>> refs;
};

const GridData& grid_data(const GridCase& gc) {
  static GridCase key{};
  static std::unique_ptr<GridData> data;
  if (!data || !same_shape(key, gc)) {
    data.reset();
    auto d = std::make_unique<GridData>();
    const RawBatch raw = make_raw(contexts_for(gc.n_seq), gc.Hq, gc.H, gc.D, 1234u + gc.n_seq * 7 + gc.D);
    d->batches.reserve(std::size(kDtypes));
    for (KVDType dt : kDtypes) {
      d->batches.push_back(make_batch(dt, raw));
      d->refs.push_back(reference(d->batches.back()));
      drop_exact_values(d->batches.back());
    }
    key = gc, data = std::move(d);
  }
  return *data;
}

TEST_P(DecodeAttentionGrid, DtypesThreadsMatchDoubleReference) {
  const Isa isa = GetParam().isa;
  const GridCase gc = GetParam().shape;
  FD_SKIP_UNLESS_ISA(isa);
  const GridData& data = grid_data(gc);
  for (size_t i = 0; i < data.batches.size(); ++i) {
    const Batch& b = data.batches[i];
    const KVDType dt = b.dtype;
    const std::vector<double>& ref = data.refs[i];
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
  // Other group sizes: 2 and 16 query heads a kv head.
  for (auto [hq, h] : {std::pair{6, 3}, {32, 2}}) g.push_back({3, hq, h, 128});
  return g;
}

std::string grid_name(const GridCase& c) {
  return "b" + std::to_string(c.n_seq) + "_h" + std::to_string(c.Hq) + "_kv" + std::to_string(c.H) + "_d" + std::to_string(c.D);
}

std::string isa_grid_name(const IsaGridCase& c) { return isa_param_name(c.isa) + "_" + grid_name(c.shape); }

INSTANTIATE_TEST_SUITE_P(DecodeAttention, DecodeAttentionGrid, ::testing::ValuesIn(isa_grid(grid())),
                         [](const auto& info) { return isa_grid_name(info.param); });

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
// qf = qs * s read from the block's layout (kv_quant.cpp: head-major, a head's K params fp16 [2][D] after its K and V codes),
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
          const uint8_t* kc = blk + size_t(j) * (kT * D + 8 * D);  // head j's run: key words [D/8][kT][4] first
          const auto* kp = reinterpret_cast<const uint16_t*>(kc + size_t(kT) * D);  // after K and V codes (kv_quant.cpp)
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
        // head j's run of the block (head-major, kv_quant.cpp): int8 K, V codes, K, V scales; int4 K, V codes, K, V params
        const auto* blk = static_cast<const uint8_t*>(sv.blocks[blk_i]) +
                          size_t(j) * (b.dtype == KVDType::I8 ? 2 * hs + 8 * kT : hs + 8 * size_t(D));
        const double* p = &sc[size_t(blk_i) * kT];
        for (int g = 0; g < (b.dtype == KVDType::I8 ? 1 : D / 32); ++g) {
          // the token's value scale and its codes' magnitudes (layouts: kv_quant.cpp)
          auto vscale = [&](int t) -> double {
            if (b.dtype == KVDType::I8) return reinterpret_cast<const float*>(blk + 2 * hs)[kT + t];
            const auto* vp = reinterpret_cast<const uint16_t*>(blk + hs) + size_t(2) * D;
            return fd::fp16_to_fp32(vp[(2 * g) * kT + t]);
          };
          auto vcode = [&](int t, int d) -> double {
            if (b.dtype == KVDType::I8) return std::fabs(double(reinterpret_cast<const int8_t*>(blk)[hs + t * D + d]));
            const uint8_t byte = blk[hs / 2 + ((size_t(t / 4) * (D / 32) + d / 32) * 16 + d % 16) * 4 + t % 4];
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

// Each ISA's q8 path (the scalar one is the twin) against the double q8 reference and against the
// scalar twin, int8 and int4 blocks, the whole grid, 1 and 5 threads; fp16 blocks ignore the mode
// (the same bits as with the fp32 query). One case per ISA and shape, the costly part made once per shape, as
// DecodeAttentionGrid.
class DecodeAttentionQ8Grid : public ::testing::TestWithParam<IsaGridCase> {};

struct Q8GridData {
  std::vector<Batch> batches;  // kDtypes' order, without their exact K/V copies
  std::vector<Q8Ref> refs;     // empty for fp16 blocks
  std::vector<std::vector<float>> twins;  // the scalar q8 path, 1 thread
};

const Q8GridData& q8_grid_data(const GridCase& gc) {
  static GridCase key{};
  static std::unique_ptr<Q8GridData> data;
  if (!data || !same_shape(key, gc)) {
    data.reset();
    auto d = std::make_unique<Q8GridData>();
    const RawBatch raw = make_raw(contexts_for(gc.n_seq), gc.Hq, gc.H, gc.D, 4321u + gc.n_seq * 7 + gc.D);
    d->batches.reserve(std::size(kDtypes));
    for (KVDType dt : kDtypes) {
      d->batches.push_back(make_batch(dt, raw));
      const Batch& b = d->batches.back();
      std::vector<float> twin(size_t(gc.n_seq) * gc.Hq * gc.D, NAN);
      fd::DecodeAttentionWorkspace ws;
      fd::decode_attention(b.params(twin.data(), fd::QueryQuant::I8), Isa::Scalar, 1, ws);
      d->twins.push_back(std::move(twin));
      d->refs.push_back(dt == KVDType::F16 ? Q8Ref{} : reference_q8(b));
      drop_exact_values(d->batches.back());
    }
    key = gc, data = std::move(d);
  }
  return *data;
}

TEST_P(DecodeAttentionQ8Grid, QuantizedQueryMatchesQ8ReferenceAndScalarTwin) {
  const Isa isa = GetParam().isa;
  const GridCase gc = GetParam().shape;
  FD_SKIP_UNLESS_ISA(isa);
  const Q8GridData& data = q8_grid_data(gc);
  for (size_t i = 0; i < data.batches.size(); ++i) {
    const Batch& b = data.batches[i];
    const KVDType dt = b.dtype;
    const std::vector<float>& twin = data.twins[i];
    std::vector<float> o(twin.size(), NAN), of(twin.size(), NAN);
    fd::DecodeAttentionWorkspace ws;
    if (dt == KVDType::F16) {
      fd::decode_attention(b.params(o.data(), fd::QueryQuant::I8), isa, 5, ws);
      fd::decode_attention(b.params(of.data(), fd::QueryQuant::F32), isa, 5, ws);
      EXPECT_EQ(0, std::memcmp(o.data(), of.data(), o.size() * sizeof(float)))
          << fd::isa_name(isa) << ": fp16 blocks must ignore the query mode";
      continue;
    }
    const Q8Ref& ref = data.refs[i];
    std::vector<double> twin_d(twin.begin(), twin.end());
    EXPECT_TRUE(close_q8(twin, ref, gc.Hq, gc.D)) << "scalar twin, dtype " << fd::kv_dtype_name(dt);
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

INSTANTIATE_TEST_SUITE_P(DecodeAttention, DecodeAttentionQ8Grid, ::testing::ValuesIn(isa_grid(grid())),
                         [](const auto& info) { return isa_grid_name(info.param); });

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
    if (!fd::isa_supported(isa)) std::printf("note: ISA %s not supported here: each of its cases skips (visibly)\n", fd::isa_name(isa).data());
  }
  EXPECT_TRUE(fd::isa_supported(fd::best_isa()));
  EXPECT_THROW(fd::isa_from_name("sse"), fd::Error);
}

}  // namespace
