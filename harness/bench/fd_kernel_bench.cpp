// fd-kernel-bench (CUDA builds): the GPU kernels next to their same-run ceilings, on Google Benchmark
// (bench_main.h; speed lives here, correctness in tests/gpu/). Each case registers its ceiling first,
// then the kernel, which reports ratio_to_ceiling = ceiling time / kernel time:
//   decode/...    flash-decoding split-K decode attention; ceiling: read_ceiling of the same K+V bytes
//                 (the HBM read rate the device achieves in this run). Counters: bytes/s, ratio.
//   decode-batch/... the same kernel and ceiling with B swept 1..1024 at context 1024 (Llama-2-7b heads):
//                 Fig. 3's attention curve (seconds_per_token stays flat in B: attention does not batch).
//   prefill/...   tiled causal prefill attention (fp32 CUDA cores, 4·D·Hq FLOPs per attended (query, key)
//                 pair); ceiling: fma_ceiling, fp32 FMAs on registers. Counters: FLOP/s, ratio.
//   sampling/...  cuda::sample_rows (full vocabulary, top-p 0.9, top-k 40 + top-p 0.9); ceiling: one read
//                 of the logits (every setting reads them at least once). Counters: rows/s, ratio.
//   balance/...   what a green context of N SMs (hardware-balance emulation, hardware.gpu.sm_count) can do:
//                 read_ceiling over 2 GiB (HBM read rate) and an fp16 8192^3 cuBLAS GEMM with fp32
//                 accumulation (tensor-core rate), per SM count, next to the same at all SMs. Counters:
//                 bytes/s or FLOP/s, fraction_of_device. Names which SM count matches a GPU such as the
//                 paper's A10 (125 TFLOP/s fp16 dense, 600 GB/s).
//   gemm/...      the S-Part's and GPU-only's weight GEMMs (Llama-2-7b: [q|k|v], o, [gate|up], down, LM head; y =
//                 x W^T as CudaModel::gemm calls it, fp16 inputs, fp32 accumulation, o and down adding into an fp32
//                 y) at B rows: cublasGemmEx's default (what the engines run) next to every algorithm cuBLASLt's
//                 heuristic offers for the shape (up to 16), each timed; four copies of W in turn, so that no
//                 weight is read from L2 (as in a model, where every GEMM reads other weights). Counters: bytes/s
//                 (W + x + y), best_vs_default = default time / the fastest algorithm's, algos.
// Times are CUDA events around one call per iteration (UseManualTime), after a warm-up call.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>

#include "fastdecode/core/dtype.h"
#include "fastdecode/spart/cuda_model.h"  // DeviceBuffer
#include "harness/bench/bench_main.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/green_context.h"
#include "kernels/cuda/sampling.h"
#include "harness/bench/cuda_timing.h"

namespace {

using fd::DeviceBuffer;

// One call of `call` timed with CUDA events on the legacy stream, in seconds.
class EventTimer {
 public:
  EventTimer() {
    CUDA_CHECK(cudaEventCreate(&e0_));
    CUDA_CHECK(cudaEventCreate(&e1_));
  }
  ~EventTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }
  double seconds(const std::function<void()>& call) {
    CUDA_CHECK(cudaEventRecord(e0_, nullptr));
    call();
    CUDA_CHECK(cudaEventRecord(e1_, nullptr));
    CUDA_CHECK(cudaEventSynchronize(e1_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
    return double(ms) * 1e-3;
  }

 private:
  cudaEvent_t e0_, e1_;
};

// The benchmark loop: a warm-up call, then one timed call per iteration; returns seconds per iteration.
double run_timed(benchmark::State& st, const std::function<void()>& call) {
  EventTimer t;
  call();
  double total = 0;
  for (auto _ : st) {
    const double s = t.seconds(call);
    st.SetIterationTime(s);
    total += s;
  }
  return fd::bench::seconds_per_iteration(st, total);
}

template <typename T>
std::shared_ptr<DeviceBuffer<T>> upload(const std::vector<T>& h) {
  auto d = std::make_shared<DeviceBuffer<T>>(std::max<size_t>(h.size(), 1));
  CUDA_CHECK(cudaMemcpy(d->get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> uniform(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

fd::bench::Ceilings g_ceilings;
std::shared_ptr<DeviceBuffer<float>> g_sink;

void set_ratio(benchmark::State& st, const std::string& key, double kernel_s) {
  const double c = g_ceilings.get(key);
  if (c > 0 && kernel_s > 0) st.counters["ratio_to_ceiling"] = c / kernel_s;
}

struct DecodeCase {
  int64_t B, ctx;
  int Hq, Hkv, D;
};

// group "decode": the kernel's shapes; "decode-batch": Fig. 3's second curve, B swept at one context
// (Llama-2-7b's heads), so attention time per token can be read against B next to the S-Part's.
void register_decode(const std::string& group, const std::vector<DecodeCase>& cases) {
  using Case = DecodeCase;
  for (const Case c : cases) {
    char name[96];
    std::snprintf(name, sizeof name, "B%lld/ctx%lld/Hq%d/Hkv%d/D%d", (long long)c.B, (long long)c.ctx, c.Hq, c.Hkv, c.D);
    const std::string key = name;
    const int64_t kvd = int64_t(c.Hkv) * c.D, cache_n = c.B * c.ctx * kvd;
    const double bytes = 2.0 * double(cache_n) * 2.0;  // K and V, fp16
    // Buffers are made when the benchmark first runs (not at registration), shared by ceiling and kernel.
    auto kc = std::make_shared<std::shared_ptr<DeviceBuffer<__half>>>(), vc = std::make_shared<std::shared_ptr<DeviceBuffer<__half>>>();
    auto make = [=] {
      if (*kc) return;
      *kc = std::make_shared<DeviceBuffer<__half>>(size_t(cache_n));
      *vc = std::make_shared<DeviceBuffer<__half>>(size_t(cache_n));
      CUDA_CHECK(cudaMemset((*kc)->get(), 0x3C, size_t(cache_n) * 2));  // 0x3C3C: ~1.06, finite
      CUDA_CHECK(cudaMemset((*vc)->get(), 0x3C, size_t(cache_n) * 2));
    };
    benchmark::RegisterBenchmark((group + "/ceiling_read/" + key).c_str(), [=](benchmark::State& st) {
      make();
      const double s = run_timed(st, [&] {
        fd::cuda::read_ceiling((*kc)->get(), size_t(cache_n) * 2, g_sink->get(), nullptr);
        fd::cuda::read_ceiling((*vc)->get(), size_t(cache_n) * 2, g_sink->get(), nullptr);
      });
      g_ceilings.set(group + "/" + key, s);
      st.counters["bytes_per_second"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
    })->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((group + "/attention/" + key).c_str(), [=](benchmark::State& st) {
      make();
      std::vector<int32_t> slots(size_t(c.B)), lens(size_t(c.B), int32_t(c.ctx));
      std::iota(slots.begin(), slots.end(), 0);
      std::mt19937 rng(1);
      auto q = upload(uniform(size_t(c.B * c.Hq * c.D), 1.0f, rng));
      DeviceBuffer<float> out(size_t(c.B * c.Hq * c.D));
      auto ds = upload(slots), dl = upload(lens);
      DeviceBuffer<float> ws(std::max<size_t>(fd::cuda::decode_attention_workspace_floats(c.B, c.Hq, c.D, c.ctx), 1));
      const double s = run_timed(st, [&] {
        fd::cuda::decode_attention({.q = q->get(), .k_cache = (*kc)->get(), .v_cache = (*vc)->get(), .slots = ds->get(),
                                    .lens = dl->get(), .B = c.B, .max_ctx = c.ctx, .Hq = c.Hq, .Hkv = c.Hkv, .D = c.D,
                                    .out = out.get(), .workspace = ws.get()},
                                   nullptr);
      });
      st.counters["bytes_per_second"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
      st.counters["seconds_per_token"] = s / double(c.B);
      set_ratio(st, group + "/" + key, s);
    })->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
}

void register_prefill() {
  const int64_t n_seq = 8, len = 1024, T = n_seq * len;
  for (const int Hkv : {32, 8}) {
    const int Hq = 32, D = 128;
    char name[96];
    std::snprintf(name, sizeof name, "seq%lldx%lld/Hq%d/Hkv%d/D%d", (long long)n_seq, (long long)len, Hq, Hkv, D);
    const std::string key = name;
    const double flops = 4.0 * D * Hq * double(n_seq) * double(len * (len + 1) / 2);
    benchmark::RegisterBenchmark(("prefill/ceiling_fma/" + key).c_str(), [=](benchmark::State& st) {
      DeviceBuffer<float> sink(fd::cuda::fma_ceiling_sink_floats());
      int64_t done = 0;
      const double s = run_timed(st, [&] { done = fd::cuda::fma_ceiling(int64_t(flops), sink.get(), nullptr); });
      g_ceilings.set("prefill/" + key, s * flops / double(done));  // the ceiling's time for the kernel's FLOPs
      st.counters["flops_per_second"] = benchmark::Counter(double(done), benchmark::Counter::kIsIterationInvariantRate);
    })->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("prefill/attention/" + key).c_str(), [=](benchmark::State& st) {
      std::vector<int32_t> starts(size_t(n_seq + 1));
      for (int64_t i = 0; i <= n_seq; ++i) starts[size_t(i)] = int32_t(i * len);
      std::mt19937 rng(2);
      auto q = upload(uniform(size_t(T * Hq * D), 1.0f, rng));
      DeviceBuffer<float> out(size_t(T * Hq * D));
      DeviceBuffer<__half> k(size_t(T * Hkv * D)), v(size_t(T * Hkv * D));
      CUDA_CHECK(cudaMemset(k.get(), 0x3C, k.size() * 2));
      CUDA_CHECK(cudaMemset(v.get(), 0x3C, v.size() * 2));
      auto ds = upload(starts);
      const double s = run_timed(st, [&] {
        fd::cuda::prefill_attention({.q = q->get(), .k = k.get(), .v = v.get(), .starts = ds->get(), .n_seq = n_seq,
                                     .max_len = len, .Hq = Hq, .Hkv = Hkv, .D = D, .out = out.get()},
                                    nullptr);
      });
      st.counters["flops_per_second"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
      set_ratio(st, "prefill/" + key, s);
    })->UseManualTime()->Unit(benchmark::kMillisecond);
  }
}

void register_sampling() {
  struct Shape {
    int64_t n, V;
  };
  struct Setting {
    const char* name;
    int64_t top_k;
    double top_p;
  };
  for (const Shape sh : {Shape{256, 32000}, Shape{1024, 128256}}) {
    char name[64];
    std::snprintf(name, sizeof name, "rows%lld/V%lld", (long long)sh.n, (long long)sh.V);
    const std::string key = name;
    // 16 distinct rows of N(0, 3^2) logits rounded to fp16 (ties, as fp16 logits have), repeated.
    auto logits = std::make_shared<std::shared_ptr<DeviceBuffer<float>>>();
    auto make = [=] {
      if (*logits) return;
      std::mt19937 rng(11);
      std::normal_distribution<float> nd(0.0f, 3.0f);
      std::vector<float> h(size_t(sh.n * sh.V));
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t i = 0; i < sh.V; ++i) h[size_t(r * sh.V + i)] = fd::fp16_to_fp32(fd::fp32_to_fp16(nd(rng)));
      for (int64_t r = 16; r < sh.n; ++r)
        std::copy(h.begin() + (r % 16) * sh.V, h.begin() + (r % 16 + 1) * sh.V, h.begin() + r * sh.V);
      *logits = upload(h);
    };
    benchmark::RegisterBenchmark(("sampling/ceiling_read/" + key).c_str(), [=](benchmark::State& st) {
      make();
      const double s = run_timed(st, [&] {
        fd::cuda::read_ceiling((*logits)->get(), size_t(sh.n * sh.V) * 4, g_sink->get(), nullptr);
      });
      g_ceilings.set("sampling/" + key, s);
      st.counters["rows_per_second"] = benchmark::Counter(double(sh.n), benchmark::Counter::kIsIterationInvariantRate);
    })->UseManualTime()->Unit(benchmark::kMicrosecond);
    for (const Setting se : {Setting{"full", 0, 1.0}, Setting{"top_p0.9", 0, 0.9}, Setting{"top_k40+top_p0.9", 40, 0.9}}) {
      benchmark::RegisterBenchmark(("sampling/" + std::string(se.name) + "/" + key).c_str(), [=](benchmark::State& st) {
        make();
        std::vector<uint64_t> rid(size_t(sh.n)), step(size_t(sh.n), 7);
        std::iota(rid.begin(), rid.end(), uint64_t(1000));
        auto rids = upload(rid), steps = upload(step);
        DeviceBuffer<int32_t> out(size_t(sh.n));
        fd::SamplingParams p;
        p.temperature = 1.0, p.top_k = se.top_k, p.top_p = se.top_p, p.seed = 1;
        const double s = run_timed(st, [&] {
          fd::cuda::sample_rows((*logits)->get(), sh.n, sh.V, p, rids->get(), steps->get(), out.get(), nullptr);
        });
        st.counters["rows_per_second"] = benchmark::Counter(double(sh.n), benchmark::Counter::kIsIterationInvariantRate);
        set_ratio(st, "sampling/" + key, s);
      })->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
  }
}

// Each SM count's rates, timed on a stream of its own green context; the whole device (registered first, so
// it runs first) is the reference of fraction_of_device.
void register_balance(const std::vector<int>& sm_counts) {
  const size_t read_bytes = size_t(2) << 30;
  const int n = 8192;
  auto buf = std::make_shared<std::shared_ptr<DeviceBuffer<uint8_t>>>();
  auto mats = std::make_shared<std::shared_ptr<DeviceBuffer<__half>>>();
  auto whole = std::make_shared<std::map<std::string, double>>();  // rate at all SMs, per kind
  std::vector<int> counts = {0};
  counts.insert(counts.end(), sm_counts.begin(), sm_counts.end());
  for (const int sm : counts) {
    const std::string tag = sm > 0 ? "sm" + std::to_string(sm) : "all";
    benchmark::RegisterBenchmark(("balance/read/" + tag).c_str(), [=](benchmark::State& st) {
      if (!*buf) {
        *buf = std::make_shared<DeviceBuffer<uint8_t>>(read_bytes);
        CUDA_CHECK(cudaMemset((*buf)->get(), 0x3C, read_bytes));
      }
      fd::cuda::SmLimitedStreams g(sm, 1);
      double total = 0;
      for (auto _ : st) {
        const double ms = fd::cuda_ms_per_call(g.stream(0), 3, [&] {
          fd::cuda::read_ceiling((*buf)->get(), read_bytes, g_sink->get(), g.stream(0));
        });
        st.SetIterationTime(ms * 1e-3);
        total += ms * 1e-3;
      }
      const double rate = double(read_bytes) / fd::bench::seconds_per_iteration(st, total);
      if (sm == 0) (*whole)["read"] = rate;
      st.counters["sm_count"] = g.sm_count();
      st.counters["bytes_per_second"] = rate;
      if (whole->count("read")) st.counters["fraction_of_device"] = rate / whole->at("read");
    })->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
    benchmark::RegisterBenchmark(("balance/gemm_fp16/" + tag).c_str(), [=](benchmark::State& st) {
      if (!*mats) {
        *mats = std::make_shared<DeviceBuffer<__half>>(size_t(3) * n * n);
        // Random operands: on zeros the tensor cores draw less power and the GEMM runs faster (ceilings.h).
        fd::cuda::fill_uniform16((*mats)->get(), size_t(2) * n * n, 1.0f, 3, false, nullptr);
        CUDA_CHECK(cudaMemset((*mats)->get() + size_t(2) * n * n, 0, size_t(n) * n * 2));
        CUDA_CHECK(cudaDeviceSynchronize());  // the timed streams do not wait for the legacy stream's fill
      }
      fd::cuda::SmLimitedStreams g(sm, 1);
      cublasHandle_t h;
      CUBLAS_CHECK(cublasCreate(&h));
      CUBLAS_CHECK(cublasSetStream(h, g.stream(0)));
      if (g.limited()) CUBLAS_CHECK(cublasSetSmCountTarget(h, g.sm_count()));
      const float one = 1, zero = 0;
      __half* a = (*mats)->get();
      double total = 0;
      for (auto _ : st) {
        const double ms = fd::cuda_ms_per_call(g.stream(0), 3, [&] {
          CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16F, n, a + size_t(n) * n,
                                    CUDA_R_16F, n, &zero, a + 2 * size_t(n) * n, CUDA_R_16F, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
        });
        st.SetIterationTime(ms * 1e-3);
        total += ms * 1e-3;
      }
      cublasDestroy(h);
      const double rate = 2.0 * n * double(n) * n / fd::bench::seconds_per_iteration(st, total);
      if (sm == 0) (*whole)["gemm"] = rate;
      st.counters["sm_count"] = g.sm_count();
      st.counters["flop_per_second"] = rate;
      if (whole->count("gemm")) st.counters["fraction_of_device"] = rate / whole->at("gemm");
    })->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
  }
}

struct GemmShape {
  const char* name;
  int in, out;
  bool y_fp32;  // fp32 y (the residual, or the logits)
  float beta;   // 1: y += x W^T (the o and down projections add into the residual)
};

void register_gemm(const std::vector<int>& rows) {
  // Llama-2-7b: hidden 4096, intermediate 11008, vocabulary 32000 (the baselines' model).
  const std::vector<GemmShape> shapes = {{"qkv", 4096, 3 * 4096, false, 0.0f}, {"o", 4096, 4096, true, 1.0f},
                                         {"gate_up", 4096, 2 * 11008, false, 0.0f}, {"down", 11008, 4096, true, 1.0f},
                                         {"lm_head", 4096, 32000, true, 0.0f}};
  constexpr int kCopies = 4;
  constexpr size_t kWorkspace = size_t(32) << 20;  // CudaModel's
  for (const int T : rows)
    for (const GemmShape& g : shapes) {
      const std::string key = std::string(g.name) + "/B" + std::to_string(T);
      benchmark::RegisterBenchmark(("gemm/" + key).c_str(), [=](benchmark::State& st) {
        std::vector<std::unique_ptr<DeviceBuffer<__half>>> W;
        for (int c = 0; c < kCopies; ++c) {
          W.push_back(std::make_unique<DeviceBuffer<__half>>(size_t(g.in) * size_t(g.out)));
          fd::cuda::fill_uniform16(W.back()->get(), size_t(g.in) * size_t(g.out), 0.05f, uint64_t(c + 1), false, nullptr);
        }
        DeviceBuffer<__half> x(size_t(T) * size_t(g.in));
        DeviceBuffer<float> y(size_t(T) * size_t(g.out));
        DeviceBuffer<uint8_t> ws(kWorkspace);
        fd::cuda::fill_uniform16(x.get(), size_t(T) * size_t(g.in), 1.0f, 7, false, nullptr);  // not zeros (ceilings.h)
        CUDA_CHECK(cudaDeviceSynchronize());  // the timed stream (non-blocking) does not wait for the fills
        CUDA_CHECK(cudaMemset(y.get(), 0, size_t(T) * size_t(g.out) * 4));
        cudaStream_t s;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        cublasHandle_t h;
        CUBLAS_CHECK(cublasCreate(&h));
        CUBLAS_CHECK(cublasSetStream(h, s));
        CUBLAS_CHECK(cublasSetWorkspace(h, ws.get(), kWorkspace));
        cublasLtHandle_t lt;
        CUBLAS_CHECK(cublasLtCreate(&lt));
        const cudaDataType_t yt = g.y_fp32 ? CUDA_R_32F : CUDA_R_16F;
        const float one = 1.0f, beta = g.beta;
        int turn = 0;
        auto time = [&](const std::function<void(const __half*)>& call) {
          return fd::cuda_ms_per_call(s, 24, [&] { call(W[size_t(turn++ % kCopies)]->get()); });
        };
        auto gemmex = [&](const __half* w) {
          CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, g.out, T, g.in, &one, w, CUDA_R_16F, g.in, x.get(),
                                    CUDA_R_16F, g.in, &beta, y.get(), yt, g.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
        // cuBLASLt: the same product (column-major: y^T [out, T] = W^T [out, in] x^T [in, T]).
        cublasLtMatmulDesc_t d;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        cublasLtMatrixLayout_t A, B, C;
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&A, CUDA_R_16F, g.in, g.out, g.in));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&B, CUDA_R_16F, g.in, T, g.in));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&C, yt, g.out, T, g.out));
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                          sizeof kWorkspace));
        cublasLtMatmulHeuristicResult_t algos[16];
        int n_algos = 0;
        CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, d, A, B, C, C, pref, 16, algos, &n_algos));
        double total = 0, best_ms = 0;
        int best = -1;
        for (auto _ : st) {
          const double ms = time(gemmex);
          st.SetIterationTime(ms * 1e-3);
          total += ms * 1e-3;
        }
        for (int i = 0; i < n_algos; ++i) {
          const double ms = time([&](const __half* w) {
            CUBLAS_CHECK(cublasLtMatmul(lt, d, &one, w, A, x.get(), B, &beta, y.get(), C, y.get(), C, &algos[i].algo,
                                        ws.get(), kWorkspace, s));
          });
          if (best < 0 || ms < best_ms) best = i, best_ms = ms;
        }
        const double default_s = fd::bench::seconds_per_iteration(st, total);
        const double bytes = double(g.in) * g.out * 2 + double(T) * g.in * 2 +
                             double(T) * g.out * (g.y_fp32 ? 4.0 : 2.0) * (g.beta != 0 ? 2 : 1);
        st.counters["bytes_per_second"] = bytes / default_s;
        st.counters["algos"] = n_algos;
        st.counters["best_algo"] = best;
        st.counters["best_vs_default"] = best >= 0 ? default_s / (best_ms * 1e-3) : 0.0;
        st.counters["best_bytes_per_second"] = best >= 0 ? bytes / (best_ms * 1e-3) : 0.0;
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(A), cublasLtMatrixLayoutDestroy(B), cublasLtMatrixLayoutDestroy(C);
        cublasLtMatmulDescDestroy(d);
        cublasLtDestroy(lt);
        cublasDestroy(h);
        CUDA_CHECK(cudaStreamDestroy(s));
      })->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(3);
    }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU kernels (decode and prefill attention, sampling) next to their same-run ceilings (Google Benchmark)"};
  app.name("fd-kernel-bench");
  std::vector<std::string> only = {"decode", "prefill", "sampling"};
  app.add_option("--only", only,
                 "Which groups: decode, prefill, sampling; balance, gemm and decode-batch (B 1-1024 at context 1024, "
                 "Fig. 3) are not run by default")
      ->check(CLI::IsMember({"decode", "prefill", "sampling", "balance", "decode-batch", "gemm"}))
      ->capture_default_str();
  std::vector<int> sm_counts = {8, 16, 24, 32, 48, 64};
  app.add_option("--sm-counts", sm_counts, "balance: the SM counts measured (green contexts), besides the whole device")
      ->capture_default_str();
  return fd::bench::bench_main(argc, argv, app, [&] {
    const auto probe = fd::cuda_probe();
    if (probe.devices.empty()) FD_THROW("no CUDA device answers (" << probe.error << ")");
    benchmark::AddCustomContext("fd_device", probe.devices[0].name);
    g_sink = std::make_shared<DeviceBuffer<float>>(fd::cuda::read_ceiling_sink_floats());
    for (const auto& g : only) {
      // The first "decode" row is the reference configuration (B=256, ctx=1024, MHA 32 heads, D=128).
      if (g == "decode")
        register_decode("decode", {{256, 1024, 32, 32, 128}, {256, 1024, 32, 8, 128}, {64, 4096, 32, 32, 128},
                                   {32, 1024, 32, 32, 128}, {256, 1024, 32, 32, 64}});
      if (g == "decode-batch")
        register_decode("decode-batch", {{1, 1024, 32, 32, 128}, {4, 1024, 32, 32, 128}, {16, 1024, 32, 32, 128},
                                         {64, 1024, 32, 32, 128}, {256, 1024, 32, 32, 128}, {1024, 1024, 32, 32, 128}});
      if (g == "prefill") register_prefill();
      if (g == "sampling") register_sampling();
      if (g == "balance") register_balance(sm_counts);
      if (g == "gemm") register_gemm({64, 256, 512});
    }
  });
}
