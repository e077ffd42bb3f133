// The GPU sampler's algorithm (kernels/cuda/sampling.cu), written once for the CUDA kernel and for a sequential
// host model of it, fd::cuda::sample_row_model, that CPU tests compare with fd::sample_token. No CUDA headers:
// this file compiles in CPU-only builds (C++17, as nvcc compiles it).
//
// Order. fd::sample_token sorts candidates by logit descending, ties by lower token id. Here every token gets
// a 32-bit key, the float's bits made order-preserving (-0 and +0 share one key, as they compare equal), and the
// host's total order is (key descending, index ascending). Nothing is sorted: every quantity the host takes
// from its sorted list is a "select" over that order, found by radix selection on the key, 8 bits per pass
// from the top, with a 256-bucket histogram (counts; double weight sums) of the candidates that match the
// digits chosen so far:
//   top-k      the k-th element by count                        -> the cut "key > t, or key == t and index <= i"
//   nucleus    the first element whose cumulative weight >= top_p * (sum of the top-k weights)
//   draw       the first element whose cumulative weight >  u * (sum of the nucleus weights), u = the host's
//              53-bit fraction of splitmix64(seed, request, step)
// Weights are the host's w = exp((double(logit) - max) / T); comparing cumulative weights with top_p * sum is
// the host's comparison of cumulative probabilities w / sum up to double rounding, so a token can differ from
// the host's only when the draw or the nucleus cut lands within double rounding of a cumulative boundary.
// After the four passes the bucket is one key, i.e. a run of equal logits; the host takes them in index order
// with equal weights, so the position inside the run is found from base + m * w and the m-th index of the run.
//
// Summation order is fixed (deterministic run to run, and the host model reproduces the kernel's sums bit
// for bit, up to the device exp's last bit): candidates go in tiles of kThreads in source order; inside a tile, warp w holds positions
// [32w, 32w + 32); a warp's lanes with the same bucket are summed in lane order from 0.0 and added to warp w's
// own histogram; the block histogram is the warp histograms summed in warp order; buckets are scanned from
// 255 down. Counts, first and last index per bucket are integers (order-free).
//
// Compaction. Passes read the row from global memory; once the candidates that any later pass can need number
// at most kListCap (every token at or above the chosen bucket, within the current cut; then the top-k, the
// nucleus), they are copied, in index order, to shared memory, and later passes read that list.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fastdecode/core/error.h"
#include "fastdecode/core/host_device.h"
#include "fastdecode/core/splitmix64.h"
#include "fastdecode/core/sampling.h"

// The row driver below is a host-device template that calls either the kernel's __device__ context or the
// host model's; nvcc would warn about the host instantiation path it never emits.
#if defined(__CUDACC__)
#define FD_SAMPLING_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define FD_SAMPLING_EXEC_CHECK_DISABLE
#endif

namespace fd::cuda::sampling {

constexpr int kThreads = 256;  // one block per row
constexpr int kWarps = kThreads / 32;
constexpr int kBuckets = 256;  // 8 bits per radix pass, 4 passes over the 32-bit key
constexpr int kListCap = 2048;  // candidates copied to shared memory once this few remain
constexpr int32_t kAllIdx = INT32_MAX;
static_assert(kThreads == kBuckets, "the kernel combines bucket b in thread b");

// Parameters of a row (plain data: SamplingParams has host-only members).
struct RowParams {
  double temperature;
  int64_t top_k;
  double top_p;
  bool greedy;
};

// Members of a selection: key > t, or key == t and index <= idx (idx = kAllIdx: every index). The top-k and
// the nucleus are prefixes of the order, so one cut describes each; {0, kAllIdx} holds every token.
struct Cut {
  uint32_t t;
  int32_t idx;
  FD_HOST_DEVICE bool contains(uint32_t key, int32_t i) const { return key > t || (key == t && i <= idx); }
};
FD_HOST_DEVICE inline Cut all_cut() { return {0u, kAllIdx}; }

// cut's members with key >= lo (both are prefixes of the order, so the smaller one).
FD_HOST_DEVICE inline Cut cut_from(const Cut& cut, uint32_t lo) { return lo > cut.t ? Cut{lo, kAllIdx} : cut; }

FD_HOST_DEVICE inline uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

FD_HOST_DEVICE inline float bits_float(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// Order-preserving key: a > b  <=>  key(a) > key(b) for non-NaN floats; -0 maps to +0's key because the host's
// comparisons treat them as equal (its tie-break by index then applies).
FD_HOST_DEVICE inline uint32_t key_of(float x) {
  const uint32_t b = float_bits(x == 0.0f ? 0.0f : x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

FD_HOST_DEVICE inline float logit_of_key(uint32_t k) { return bits_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// The host's weight, same expression and operation order (no contraction is possible: subtract, divide).
FD_HOST_DEVICE inline double weight(float logit, double mx, double temperature) {
#ifdef __CUDA_ARCH__
  return ::exp((double(logit) - mx) / temperature);
#else
  return std::exp((double(logit) - mx) / temperature);
#endif
}

// Rounded multiply and add kept separate on the device (nvcc would fuse a * b + c into one FMA, which the
// host does not do).
FD_HOST_DEVICE inline double dmul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
FD_HOST_DEVICE inline double dadd(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

// The host's uniform fraction in [0, 1): 53 bits of a hash of (seed, request, step).
FD_HOST_DEVICE inline double draw_fraction(uint64_t seed, uint64_t request_id, uint64_t step) {
  const uint64_t z = splitmix64(splitmix64(splitmix64(seed) ^ request_id) ^ step);
  return double(z >> 11) * 0x1p-53;
}

// One pass's block histogram, as the row driver reads it.
struct HistView {
  const uint32_t* cnt;   // candidates per bucket
  const double* w;       // their weight sum (weighted passes)
  const int32_t* first;  // lowest index in the bucket (INT32_MAX when empty)
  const int32_t* last;   // highest index (-1 when empty)
  uint32_t max_key;      // largest candidate key (when asked for)
};

struct CountCrossing {
  int bucket;
  int64_t before;  // candidates in higher buckets
};

// The bucket holding the r-th candidate (1-based) in key-descending order.
FD_HOST_DEVICE inline CountCrossing cross_count(const HistView& h, int64_t r) {
  int64_t before = 0;
  int lowest = 0;
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (h.cnt[b] == 0) continue;
    if (before + h.cnt[b] >= r) return {b, before};
    before += h.cnt[b];
    lowest = b;
  }
  return {lowest, before - h.cnt[lowest]};  // r beyond the candidates: cannot happen (the driver's r <= count)
}

FD_HOST_DEVICE inline double hist_total(const HistView& h) {
  double s = 0.0;
  for (int b = kBuckets - 1; b >= 0; --b) s += h.w[b];
  return s;
}

struct WeightCrossing {
  int bucket;
  double base;     // cumulative weight before the bucket
  int64_t before;  // candidates before the bucket
};

// The bucket where the cumulative weight, starting from `base`, first reaches target (ge: >=, else >), scanning
// buckets from the top. After the first pass a bucket's sub-buckets sum in a different order than the bucket
// did, so the crossing can fall just past the last one by rounding; then the selection is the bucket's last
// candidate that carries weight (the last non-empty one if none does).
FD_HOST_DEVICE inline WeightCrossing cross_weight(const HistView& h, bool ge, double target, double base) {
  double cum = base;
  int64_t before = 0;
  WeightCrossing last_w{-1, 0.0, 0}, last_any{-1, 0.0, 0};
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (h.cnt[b] == 0) continue;
    const double next = cum + h.w[b];
    if (ge ? next >= target : next > target) return {b, cum, before};
    last_any = {b, cum, before};
    if (h.w[b] > 0) last_w = last_any;
    cum = next;
    before += h.cnt[b];
  }
  return last_w.bucket >= 0 ? last_w : last_any;
}

// Inside a run of `cnt` equal keys of weight wt each, starting at cumulative weight base: the smallest m in
// [1, cnt] with base + m * wt reaching target (cnt when rounding leaves none). Monotone in m: binary search.
FD_HOST_DEVICE inline int64_t tie_crossing(double base, double wt, int64_t cnt, bool ge, double target) {
  int64_t lo = 1, hi = cnt;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const double c = dadd(base, dmul(double(mid), wt));
    if (ge ? c >= target : c > target)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// A selected position: the element (t, idx) and its 1-based rank among the candidates; idx == kAllIdx means
// "every candidate with key >= t" (a top-k cut that ends at a bucket boundary, no element resolved).
struct Sel {
  uint32_t t;
  int32_t idx;
  int64_t rank;
};

// Index of the m-th (1-based, index order) candidate with key t, from a final-pass bucket of cnt such candidates.
// Candidates with one key are a prefix (by index) of all tokens with that key, so the m-th of the source's
// tokens with key t is the one.
FD_SAMPLING_EXEC_CHECK_DISABLE
template <class Ctx>
FD_HOST_DEVICE int32_t resolve(Ctx& ctx, const HistView& h, int b, uint32_t t, int64_t m) {
  if (m <= 1) return h.first[b];
  if (m >= int64_t(h.cnt[b])) return h.last[b];
  const int32_t i = ctx.find_nth(t, m);
  return i >= 0 ? i : h.last[b];
}

// The r-th candidate of cut by count. With max_key, the first pass also returns the largest key.
FD_SAMPLING_EXEC_CHECK_DISABLE
template <class Ctx>
FD_HOST_DEVICE Sel select_count(Ctx& ctx, const Cut& cut, int64_t r, uint32_t* max_key) {
  uint32_t prefix = 0;
  int64_t before = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    const HistView h = ctx.hist(cut, prefix, shift, false, 0.0, 1.0, max_key != nullptr && pass == 0);
    if (pass == 0 && max_key != nullptr) *max_key = h.max_key;
    const CountCrossing c = ctx.single([&] { return cross_count(h, r); });
    const int b = c.bucket;
    r -= c.before;
    before += c.before;
    prefix = (prefix << 8) | uint32_t(b);
    const int64_t cnt = h.cnt[b];
    if (cnt == 1) {
      const int32_t i = h.first[b];
      return {key_of(ctx.logit(i)), i, before + 1};
    }
    if (pass == 3) return {prefix, resolve(ctx, h, b, prefix, r), before + r};
    if (r == cnt) return {prefix << shift, kAllIdx, before + r};  // the whole bucket: every key >= its lowest
    if (before + cnt <= kListCap) ctx.compact(cut_from(cut, prefix << shift));
  }
  return {0u, kAllIdx, 0};  // not reached
}

// The first candidate of cut whose cumulative weight reaches factor * (total weight of cut): >= when ge, else >.
FD_SAMPLING_EXEC_CHECK_DISABLE
template <class Ctx>
FD_HOST_DEVICE Sel select_weight(Ctx& ctx, const Cut& cut, bool ge, double factor, double mx, double temperature) {
  uint32_t prefix = 0;
  int64_t before = 0;
  double base = 0.0, target = 0.0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    const HistView h = ctx.hist(cut, prefix, shift, true, mx, temperature, false);
    if (pass == 0) target = ctx.single([&] { return dmul(factor, hist_total(h)); });
    const WeightCrossing c = ctx.single([&] { return cross_weight(h, ge, target, base); });
    const int b = c.bucket;
    base = c.base;
    before += c.before;
    prefix = (prefix << 8) | uint32_t(b);
    const int64_t cnt = h.cnt[b];
    if (cnt == 1) {
      const int32_t i = h.first[b];
      return {key_of(ctx.logit(i)), i, before + 1};
    }
    if (pass == 3) {
      const int64_t m = tie_crossing(base, weight(logit_of_key(prefix), mx, temperature), cnt, ge, target);
      return {prefix, resolve(ctx, h, b, prefix, m), before + m};
    }
    if (before + cnt <= kListCap) ctx.compact(cut_from(cut, prefix << shift));
  }
  return {0u, kAllIdx, 0};  // not reached
}

// One row: greedy, or top-k cut, nucleus cut, draw. frac = draw_fraction(seed, request, step).
FD_SAMPLING_EXEC_CHECK_DISABLE
template <class Ctx>
FD_HOST_DEVICE int32_t sample_row(Ctx& ctx, int64_t V, const RowParams& p, double frac) {
  if (p.greedy) return select_count(ctx, all_cut(), 1, nullptr).idx;  // the first maximum, as fd::argmax
  Cut cut = all_cut();
  const int64_t k = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  uint32_t max_key = 0;
  if (k < V) {
    const Sel s = select_count(ctx, cut, k, &max_key);
    cut = {s.t, s.idx};
  } else {
    max_key = ctx.max_key();
  }
  if (k <= kListCap) ctx.compact(cut);
  const double mx = double(logit_of_key(max_key));
  if (p.top_p < 1.0) {
    const Sel s = select_weight(ctx, cut, true, p.top_p, mx, p.temperature);
    cut = {s.t, s.idx};
    if (s.rank <= kListCap) ctx.compact(cut);
  }
  return select_weight(ctx, cut, false, frac, mx, p.temperature).idx;
}

// The checks of fd::sample_token, plus the kernel's own limits; throws fd::Error.
inline RowParams row_params(int64_t V, const SamplingParams& p) {
  if (V <= 0 || V >= int64_t(kAllIdx))
    FD_THROW("sampling: vocabulary size " << V << " out of range (1 .. " << kAllIdx - 1 << ")");
  if (!(p.temperature >= 0 && p.top_k >= 0 && p.top_p > 0 && p.top_p <= 1))
    FD_THROW("sampling: bad sampling parameters (temperature " << p.temperature << ", top_k " << p.top_k
                                                               << ", top_p " << p.top_p << ")");
  return {p.temperature, p.top_k, p.top_p, p.greedy()};
}

// A row's whole draw: its parameters and seed (the per-row form of sample_rows; plain data, copied to the
// device as is).
struct RowDraw {
  RowParams p;
  uint64_t seed;
};
inline RowDraw row_draw(int64_t V, const SamplingParams& p) { return {row_params(V, p), p.seed}; }

// ---------------------------------------------------------------------------------------------------------
// The host model: the kernel's passes run sequentially, with the kernel's tiles, warps and summation order.
class HostModelCtx {
 public:
  HostModelCtx(const float* row, int64_t V) : row_(row), V_(V) {}

  float logit(int32_t i) const { return row_[i]; }

  template <class F>
  auto single(F&& f) -> decltype(f()) {
    return f();
  }

  HistView hist(const Cut& cut, uint32_t prefix, int shift, bool weighted, double mx, double temperature,
                bool want_max) {
    for (int b = 0; b < kBuckets; ++b) cnt_[b] = 0, first_[b] = INT32_MAX, last_[b] = -1;
    std::vector<double> whist(size_t(kWarps) * kBuckets, 0.0);
    uint32_t max_key = 0;
    const int64_t n = size();
    for (int64_t tile = 0; tile < n; tile += kThreads) {
      for (int w = 0; w < kWarps; ++w) {
        // A warp's lanes grouped by bucket, each group summed in lane order from 0.0.
        double gsum[kBuckets];
        int touched[32], nt = 0;
        for (int lane = 0; lane < 32; ++lane) {
          const int64_t p = tile + 32 * w + lane;
          if (p >= n) break;
          const float l = logit_at(p);
          const int32_t i = index_at(p);
          const uint32_t key = key_of(l);
          if (!cut.contains(key, i) || (shift != 24 && (key >> (shift + 8)) != prefix)) continue;
          if (key > max_key) max_key = key;
          const int d = int((key >> shift) & 0xffu);
          if (!seen(touched, nt, d)) touched[nt++] = d, gsum[d] = 0.0;
          ++cnt_[d];
          if (i < first_[d]) first_[d] = i;
          if (i > last_[d]) last_[d] = i;
          if (weighted) gsum[d] += weight(l, mx, temperature);
        }
        if (weighted)
          for (int j = 0; j < nt; ++j) whist[size_t(w) * kBuckets + size_t(touched[j])] += gsum[touched[j]];
      }
    }
    for (int b = 0; b < kBuckets; ++b) {
      double s = 0.0;
      for (int w = 0; w < kWarps; ++w) s += whist[size_t(w) * kBuckets + size_t(b)];
      wsum_[b] = s;
    }
    return {cnt_, wsum_, first_, last_, want_max ? max_key : 0u};
  }

  uint32_t max_key() const {
    uint32_t m = 0;
    for (int64_t p = 0; p < size(); ++p) {
      const uint32_t k = key_of(logit_at(p));
      if (k > m) m = k;
    }
    return m;
  }

  int32_t find_nth(uint32_t t, int64_t m) const {
    for (int64_t p = 0; p < size(); ++p)
      if (key_of(logit_at(p)) == t && --m == 0) return index_at(p);
    return -1;
  }

  // Switches to the list of cut's candidates in index order, when they fit (only from the full row).
  void compact(const Cut& cut) {
    if (on_list_) return;
    std::vector<float> l;
    std::vector<int32_t> i;
    for (int64_t p = 0; p < V_; ++p)
      if (cut.contains(key_of(row_[p]), int32_t(p))) l.push_back(row_[p]), i.push_back(int32_t(p));
    if (int64_t(l.size()) > kListCap) return;
    list_l_ = std::move(l), list_i_ = std::move(i), on_list_ = true;
  }

 private:
  static bool seen(const int* touched, int nt, int d) {
    for (int j = 0; j < nt; ++j)
      if (touched[j] == d) return true;
    return false;
  }
  int64_t size() const { return on_list_ ? int64_t(list_l_.size()) : V_; }
  float logit_at(int64_t p) const { return on_list_ ? list_l_[size_t(p)] : row_[p]; }
  int32_t index_at(int64_t p) const { return on_list_ ? list_i_[size_t(p)] : int32_t(p); }

  const float* row_;
  int64_t V_;
  bool on_list_ = false;
  std::vector<float> list_l_;
  std::vector<int32_t> list_i_;
  uint32_t cnt_[kBuckets];
  double wsum_[kBuckets];
  int32_t first_[kBuckets], last_[kBuckets];
};

}  // namespace fd::cuda::sampling

namespace fd::cuda {

// Sequential model of sample_rows for one row: the kernel's passes, bucket choices and summation order, so its
// token is the kernel's (up to the device exp's last bit). Throws fd::Error on the parameters sample_token
// rejects.
inline int32_t sample_row_model(const float* logits, int64_t V, const SamplingParams& p, uint64_t request_id,
                                uint64_t step) {
  const sampling::RowParams rp = sampling::row_params(V, p);
  sampling::HostModelCtx ctx(logits, V);
  return sampling::sample_row(ctx, V, rp, sampling::draw_fraction(p.seed, request_id, step));
}

// Sequential model of the per-row sample_rows: row r of logits [n, V] drawn with draws[r] (its parameters and
// seed) and (request_ids[r], steps[r]), exactly as the kernel's block r does.
inline std::vector<int32_t> sample_rows_model(const float* logits, int64_t n, int64_t V,
                                              const std::vector<sampling::RowDraw>& draws,
                                              const std::vector<uint64_t>& request_ids,
                                              const std::vector<uint64_t>& steps) {
  FD_CHECK(draws.size() >= size_t(n) && request_ids.size() >= size_t(n) && steps.size() >= size_t(n),
           "sample_rows_model: a draw, an id and a step per row");
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const sampling::RowDraw& d = draws[size_t(r)];
    sampling::HostModelCtx ctx(logits + r * V, V);
    const double frac = d.p.greedy ? 0.0 : sampling::draw_fraction(d.seed, request_ids[size_t(r)], steps[size_t(r)]);
    out[size_t(r)] = sampling::sample_row(ctx, V, d.p, frac);
  }
  return out;
}

}  // namespace fd::cuda
