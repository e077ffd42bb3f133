// Seeded top-k / top-p / temperature sampling on the GPU (see sampling.h; the algorithm, shared with its host
// model, is in sampling_model.h). One block of kThreads per row; this file supplies the block-cooperative
// passes the row driver calls: a radix-histogram pass, a max pass, the m-th index of a key, compaction.
#include "kernels/cuda/sampling.h"

#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling_model.h"

namespace fd::cuda {

namespace {

using namespace sampling;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kItems = 4;  // row elements each thread loads before processing them (loads in flight)

struct Smem {
  double whist[kWarps][kBuckets];  // per-warp weight histograms: no atomics on doubles, a fixed summation order
  double wsum[kBuckets];
  uint32_t cnt[kBuckets];
  int32_t first[kBuckets], last[kBuckets];
  double stage_w[kWarps][32];  // a warp's weights, for its group leaders to sum in lane order
  int32_t stage_i[kWarps][32];
  float list_l[kListCap];  // compacted candidates, index order
  int32_t list_i[kListCap];
  uint32_t warp_cnt[kWarps];
  uint32_t max_key;
  int32_t found;
  alignas(8) unsigned char bcast[32];  // single()'s result
};

struct Pass {
  Cut cut;
  uint32_t prefix;
  int shift;
  bool weighted, want_max;
  double mx, temperature;
};

// The row driver's context on the device: every method is called by all threads of the block (uniform control
// flow) and returns the same value to all of them.
class DeviceCtx {
 public:
  __device__ DeviceCtx(Smem& sm, const float* row, int64_t V) : sm_(sm), row_(row), V_(V) {}

  __device__ float logit(int32_t i) const { return __ldg(row_ + i); }

  // f() evaluated by thread 0, broadcast.
  template <class F>
  __device__ auto single(F&& f) -> decltype(f()) {
    using R = decltype(f());
    static_assert(sizeof(R) <= sizeof(Smem::bcast), "broadcast slot too small");
    __syncthreads();  // every thread has read the previous broadcast
    if (threadIdx.x == 0) {
      const R r = f();
      memcpy(sm_.bcast, &r, sizeof r);
    }
    __syncthreads();
    R r;
    memcpy(&r, sm_.bcast, sizeof r);
    return r;
  }

  __device__ HistView hist(const Cut& cut, uint32_t prefix, int shift, bool weighted, double mx, double temperature,
                           bool want_max) {
    const int tid = int(threadIdx.x);
    __syncthreads();  // the previous histogram has been read
    sm_.cnt[tid] = 0;
    sm_.first[tid] = INT32_MAX;
    sm_.last[tid] = -1;
    for (int w = 0; w < kWarps; ++w) sm_.whist[w][tid] = 0.0;
    if (tid == 0) sm_.max_key = 0;
    __syncthreads();
    const Pass ps{cut, prefix, shift, weighted, want_max, mx, temperature};
    if (list_n_ >= 0) {
      for (int base = 0; base < list_n_; base += kThreads) {
        const int p = base + tid;
        const bool v = p < list_n_;
        step(ps, v, v ? sm_.list_l[p] : 0.0f, v ? sm_.list_i[p] : 0);
      }
    } else {
      // Sub-tile j of a kItems tile is tile (kItems * t + j) of kThreads: the summation order is the plain one.
      for (int64_t base = 0; base < V_; base += int64_t(kThreads) * kItems) {
        float l[kItems];
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          const int64_t p = base + j * kThreads + tid;
          l[j] = p < V_ ? __ldg(row_ + p) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          const int64_t p = base + j * kThreads + tid;
          step(ps, p < V_, l[j], int32_t(p));
        }
      }
    }
    __syncthreads();
    if (weighted) {
      double s = 0.0;
      for (int w = 0; w < kWarps; ++w) s += sm_.whist[w][tid];
      sm_.wsum[tid] = s;
    }
    __syncthreads();
    return {sm_.cnt, sm_.wsum, sm_.first, sm_.last, sm_.max_key};
  }

  __device__ uint32_t max_key() {
    __syncthreads();
    if (threadIdx.x == 0) sm_.max_key = 0;
    __syncthreads();
    uint32_t m = 0;
    const int64_t n = size();
    for (int64_t p = threadIdx.x; p < n; p += kThreads) m = max(m, key_of(logit_at(p)));
    m = __reduce_max_sync(kFull, m);
    if ((threadIdx.x & 31) == 0) atomicMax(&sm_.max_key, m);
    __syncthreads();
    return sm_.max_key;
  }

  // Block-wide rank of this thread's predicate within a tile of kThreads elements: the number of true
  // predicates before it (in thread order) plus `running`; *total = the tile's true predicates. The caller
  // syncs before the next tile (warp_cnt is rewritten there).
  __device__ int64_t tile_rank(bool pred, int64_t running, int64_t* total) {
    const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
    const unsigned bal = __ballot_sync(kFull, pred);
    if (lane == 0) sm_.warp_cnt[warp] = __popc(bal);
    __syncthreads();
    int64_t off = running, tot = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) off += sm_.warp_cnt[w];
      tot += sm_.warp_cnt[w];
    }
    *total = tot;
    return off + __popc(bal & ((1u << lane) - 1));
  }

  // Index of the m-th (1-based) source element with key t, in index order; -1 if there are fewer.
  __device__ int32_t find_nth(uint32_t t, int64_t m) {
    __syncthreads();
    if (threadIdx.x == 0) sm_.found = -1;
    __syncthreads();
    const int64_t n = size();
    int64_t running = 0;
    for (int64_t base = 0; base < n && running < m; base += kThreads) {  // running is uniform
      const int64_t p = base + threadIdx.x;
      const bool pred = p < n && key_of(logit_at(p)) == t;
      int64_t total = 0;
      const int64_t rank = tile_rank(pred, running, &total);  // every thread: it synchronises the block
      if (pred && rank + 1 == m) sm_.found = index_at(p);
      running += total;
      __syncthreads();  // warp_cnt is rewritten next tile
    }
    return sm_.found;
  }

  // Copies cut's elements of the row, in index order, to the shared list, when there are at most kListCap.
  __device__ void compact(const Cut& cut) {
    if (list_n_ >= 0) return;
    __syncthreads();
    int64_t running = 0;
    for (int64_t base = 0; base < V_ && running <= kListCap; base += kThreads) {
      const int64_t p = base + threadIdx.x;
      const float l = p < V_ ? __ldg(row_ + p) : 0.0f;
      const bool pred = p < V_ && cut.contains(key_of(l), int32_t(p));
      int64_t total = 0;
      const int64_t pos = tile_rank(pred, running, &total);
      if (pred && pos < kListCap) sm_.list_l[pos] = l, sm_.list_i[pos] = int32_t(p);
      running += total;
      __syncthreads();
    }
    if (running <= kListCap) list_n_ = int(running);
  }

 private:
  // One element of a histogram pass. Lanes of a warp with the same bucket form a group (match_any); its leader
  // (lowest lane, i.e. lowest index) adds the group's count, first and last index, and the group's weights
  // summed in lane order, to the warp's own histogram.
  __device__ void step(const Pass& ps, bool valid, float l, int32_t i) {
    const uint32_t key = key_of(l);
    const bool part =
        valid && ps.cut.contains(key, i) && (ps.shift == 24 || (key >> (ps.shift + 8)) == ps.prefix);
    if (__ballot_sync(kFull, part) == 0) return;  // warp-uniform
    const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
    if (ps.want_max) {
      const uint32_t m = __reduce_max_sync(kFull, part ? key : 0u);
      if (lane == 0) atomicMax(&sm_.max_key, m);
    }
    const unsigned digit = part ? (key >> ps.shift) & 0xffu : unsigned(kBuckets);
    const unsigned peers = __match_any_sync(kFull, digit);
    sm_.stage_i[warp][lane] = i;
    if (ps.weighted) sm_.stage_w[warp][lane] = part ? weight(l, ps.mx, ps.temperature) : 0.0;
    __syncwarp();
    if (part && lane == __ffs(peers) - 1) {
      atomicAdd(&sm_.cnt[digit], unsigned(__popc(peers)));
      atomicMin(&sm_.first[digit], i);
      atomicMax(&sm_.last[digit], sm_.stage_i[warp][31 - __clz(peers)]);
      if (ps.weighted) {
        double s = 0.0;
        for (unsigned m = peers; m != 0; m &= m - 1) s += sm_.stage_w[warp][__ffs(m) - 1];
        sm_.whist[warp][digit] += s;
      }
    }
    __syncwarp();  // stage_* are rewritten next step
  }

  __device__ int64_t size() const { return list_n_ >= 0 ? list_n_ : V_; }
  __device__ float logit_at(int64_t p) const { return list_n_ >= 0 ? sm_.list_l[p] : __ldg(row_ + p); }
  __device__ int32_t index_at(int64_t p) const { return list_n_ >= 0 ? sm_.list_i[p] : int32_t(p); }

  Smem& sm_;
  const float* row_;
  int64_t V_;
  int list_n_ = -1;  // >= 0: the source is the shared list
};

// Row blockIdx.x drawn with `uniform`, or with per_row[blockIdx.x] when per_row is given.
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t V, RowDraw uniform, const RowDraw* per_row, const uint64_t* request_ids,
                  const uint64_t* steps, int32_t* out) {
  __shared__ Smem sm;
  const RowDraw d = per_row ? per_row[blockIdx.x] : uniform;
  DeviceCtx ctx(sm, logits + int64_t(blockIdx.x) * V, V);
  const double frac = d.p.greedy ? 0.0 : draw_fraction(d.seed, request_ids[blockIdx.x], steps[blockIdx.x]);
  const int32_t token = sample_row(ctx, V, d.p, frac);
  if (threadIdx.x == 0) out[blockIdx.x] = token;
}

}  // namespace

void sample_rows(const float* logits, int64_t n, int64_t V, const SamplingParams& p, const uint64_t* request_ids,
                 const uint64_t* steps, int32_t* out, cudaStream_t s) {
  if (n < 0 || n > int64_t(INT32_MAX)) FD_THROW("sample_rows: row count " << n << " out of range");
  const RowDraw d = row_draw(V, p);
  if (n == 0) return;
  sample_kernel<<<unsigned(n), kThreads, 0, s>>>(logits, V, d, nullptr, request_ids, steps, out);
  check_launch("sample_rows");
}

void sample_rows(const float* logits, int64_t n, int64_t V, const RowDraw* draws, const uint64_t* request_ids,
                 const uint64_t* steps, int32_t* out, cudaStream_t s) {
  if (n < 0 || n > int64_t(INT32_MAX)) FD_THROW("sample_rows: row count " << n << " out of range");
  if (V <= 0 || V >= int64_t(kAllIdx))
    FD_THROW("sample_rows: vocabulary size " << V << " out of range (1 .. " << kAllIdx - 1 << ")");
  if (n == 0) return;
  FD_CHECK(draws, "sample_rows: per-row draws missing");
  sample_kernel<<<unsigned(n), kThreads, 0, s>>>(logits, V, RowDraw{}, draws, request_ids, steps, out);
  check_launch("sample_rows");
}

}  // namespace fd::cuda
