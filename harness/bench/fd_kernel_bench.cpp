// fd-kernel-bench (CUDA builds): the GPU kernels' speed next to their ceilings, timed with CUDA events
// after a warm-up (these were printed-only "tests" before; speed lives in benchmarks, not in tests):
//   decode     flash-decoding split-K decode attention: achieved K+V read bandwidth (every sequence at
//              full length) and its share of the device's HBM bandwidth (--hbm-gbs, default the H200's 4800)
//   prefill    tiled causal prefill attention: TFLOP/s (4·D·Hq FLOPs per attended (query, key) pair)
//   sampling   cuda::sample_rows: µs per call, full vocabulary, top-p 0.9, top-k 40 + top-p 0.9
// Correctness of the same kernels is in the gpu-labelled tests (tests/gpu/). Writes JSON with provenance.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <numeric>
#include <random>

#include "fastdecode/core/dtype.h"
#include "fastdecode/spart/cuda_model.h"
#include "fastdecode/core/cli_main.h"
#include "harness/bench/cuda_timing.h"
#include "harness/provenance.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/sampling.h"

namespace {

using fd::DeviceBuffer;

double ms_per_call(const std::function<void()>& call, int reps) { return fd::cuda_ms_per_call(nullptr, reps, call); }

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& h) {
  DeviceBuffer<T> d(std::max<size_t>(h.size(), 1));
  CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> uniform(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

fd::json bench_decode(int reps, double hbm_gbs) {
  struct Case {
    int64_t B, ctx;
    int Hq, Hkv, D;
  };
  fd::json rows = fd::json::array();
  std::printf("decode attention (fp16 KV, fp32 math)\n%6s %6s %4s %4s %4s %10s %9s %7s\n", "B", "ctx", "Hq", "Hkv", "D",
              "us/call", "KV GB/s", "of HBM");
  // The first row is the reference configuration (B=256, ctx=1024, MHA 32 heads, D=128).
  for (const Case c : {Case{256, 1024, 32, 32, 128}, Case{256, 1024, 32, 8, 128}, Case{64, 4096, 32, 32, 128},
                       Case{32, 1024, 32, 32, 128}, Case{256, 1024, 32, 32, 64}}) {
    const int64_t kvd = int64_t(c.Hkv) * c.D, cache_n = c.B * c.ctx * kvd;
    DeviceBuffer<__half> kc(static_cast<size_t>(cache_n)), vc(static_cast<size_t>(cache_n));
    CUDA_CHECK(cudaMemset(kc.get(), 0x3C, size_t(cache_n) * 2));  // 0x3C3C: ~1.06, finite
    CUDA_CHECK(cudaMemset(vc.get(), 0x3C, size_t(cache_n) * 2));
    std::vector<int32_t> slots(size_t(c.B)), lens(size_t(c.B), int32_t(c.ctx));
    std::iota(slots.begin(), slots.end(), 0);
    std::mt19937 rng(1);
    auto q = upload(uniform(size_t(c.B * c.Hq * c.D), 1.0f, rng));
    DeviceBuffer<float> out(size_t(c.B * c.Hq * c.D));
    auto ds = upload(slots), dl = upload(lens);
    DeviceBuffer<float> ws(std::max<size_t>(fd::cuda::decode_attention_workspace_floats(c.B, c.Hq, c.D, c.ctx), 1));
    const double ms = ms_per_call(
        [&] {
          fd::cuda::decode_attention({.q = q.get(),
                                      .k_cache = kc.get(),
                                      .v_cache = vc.get(),
                                      .slots = ds.get(),
                                      .lens = dl.get(),
                                      .B = c.B,
                                      .max_ctx = c.ctx,
                                      .Hq = c.Hq,
                                      .Hkv = c.Hkv,
                                      .D = c.D,
                                      .out = out.get(),
                                      .workspace = ws.get()},
                                     nullptr);
        },
        reps);
    const double bytes = 2.0 * double(cache_n) * 2.0, gbs = bytes / (ms * 1e-3) / 1e9;
    std::printf("%6lld %6lld %4d %4d %4d %10.1f %9.0f %6.0f%%\n", (long long)c.B, (long long)c.ctx, c.Hq, c.Hkv, c.D,
                ms * 1e3, gbs, gbs / hbm_gbs * 100);
    rows.push_back({{"B", c.B}, {"ctx", c.ctx}, {"Hq", c.Hq}, {"Hkv", c.Hkv}, {"D", c.D}, {"ms", ms},
                    {"kv_gbs", gbs}, {"of_hbm", gbs / hbm_gbs}});
  }
  return rows;
}

fd::json bench_prefill(int reps) {
  const int64_t n_seq = 8, len = 1024, T = n_seq * len;
  fd::json rows = fd::json::array();
  std::printf("causal prefill attention, %lld x %lld tokens\n%4s %4s %4s %10s %9s\n", (long long)n_seq, (long long)len,
              "Hq", "Hkv", "D", "ms/call", "TFLOP/s");
  for (const int Hkv : {32, 8}) {
    const int Hq = 32, D = 128;
    std::vector<int32_t> starts(size_t(n_seq + 1));
    for (int64_t i = 0; i <= n_seq; ++i) starts[size_t(i)] = int32_t(i * len);
    std::mt19937 rng(2);
    auto q = upload(uniform(size_t(T * Hq * D), 1.0f, rng));
    DeviceBuffer<float> out(size_t(T * Hq * D));
    DeviceBuffer<__half> k(size_t(T * Hkv * D)), v(size_t(T * Hkv * D));
    CUDA_CHECK(cudaMemset(k.get(), 0x3C, k.size() * 2));
    CUDA_CHECK(cudaMemset(v.get(), 0x3C, v.size() * 2));
    auto ds = upload(starts);
    const double ms = ms_per_call(
        [&] {
          fd::cuda::prefill_attention({.q = q.get(),
                                       .k = k.get(),
                                       .v = v.get(),
                                       .starts = ds.get(),
                                       .n_seq = n_seq,
                                       .max_len = len,
                                       .Hq = Hq,
                                       .Hkv = Hkv,
                                       .D = D,
                                       .out = out.get()},
                                      nullptr);
        },
        reps);
    const double flops = 4.0 * D * Hq * double(n_seq) * double(len * (len + 1) / 2), tf = flops / (ms * 1e-3) / 1e12;
    std::printf("%4d %4d %4d %10.2f %9.1f\n", Hq, Hkv, D, ms, tf);
    rows.push_back({{"n_seq", n_seq}, {"len", len}, {"Hq", Hq}, {"Hkv", Hkv}, {"D", D}, {"ms", ms}, {"tflops", tf}});
  }
  return rows;
}

fd::json bench_sampling(int reps) {
  struct Shape {
    int64_t n, V;
  };
  struct Setting {
    const char* name;
    int64_t top_k;
    double top_p;
  };
  fd::json rows = fd::json::array();
  std::printf("sampling (cuda::sample_rows, temperature 1)\n%6s %7s %18s %9s\n", "rows", "vocab", "setting", "us/call");
  for (const Shape sh : {Shape{256, 32000}, Shape{1024, 128256}}) {
    // 16 distinct rows of N(0, 3^2) logits rounded to fp16 (ties, as fp16 logits have), repeated.
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> h(size_t(sh.n * sh.V));
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t i = 0; i < sh.V; ++i) h[size_t(r * sh.V + i)] = fd::fp16_to_fp32(fd::fp32_to_fp16(nd(rng)));
    for (int64_t r = 16; r < sh.n; ++r)
      std::copy(h.begin() + (r % 16) * sh.V, h.begin() + (r % 16 + 1) * sh.V, h.begin() + r * sh.V);
    std::vector<uint64_t> rid(size_t(sh.n)), step(size_t(sh.n), 7);
    std::iota(rid.begin(), rid.end(), uint64_t(1000));
    auto logits = upload(h);
    auto rids = upload(rid), steps = upload(step);
    DeviceBuffer<int32_t> out(size_t(sh.n));
    for (const Setting st : {Setting{"full", 0, 1.0}, Setting{"top_p0.9", 0, 0.9}, Setting{"top_k40+top_p0.9", 40, 0.9}}) {
      fd::SamplingParams p;
      p.temperature = 1.0, p.top_k = st.top_k, p.top_p = st.top_p, p.seed = 1;
      const double ms = ms_per_call(
          [&] { fd::cuda::sample_rows(logits.get(), sh.n, sh.V, p, rids.get(), steps.get(), out.get(), nullptr); }, reps);
      std::printf("%6lld %7lld %18s %9.1f\n", (long long)sh.n, (long long)sh.V, st.name, ms * 1e3);
      rows.push_back({{"rows", sh.n}, {"vocab", sh.V}, {"setting", st.name}, {"top_k", st.top_k}, {"top_p", st.top_p},
                      {"us", ms * 1e3}});
    }
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU kernels (decode and prefill attention, sampling) next to their ceilings"};
  app.name("fd-kernel-bench");
  std::vector<std::string> only = {"decode", "prefill", "sampling"};
  int reps = 20;
  double hbm_gbs = 4800;
  std::string out;
  app.add_option("--only", only, "Which benchmarks: decode, prefill, sampling")
      ->check(CLI::IsMember({"decode", "prefill", "sampling"}))
      ->capture_default_str();
  app.add_option("--reps", reps, "Timed calls per case (after one warm-up)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--hbm-gbs", hbm_gbs, "The device's HBM bandwidth in GB/s, for the decode ceiling")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--out", out, "JSON file to write");
  return fd::guarded_main(app, argc, argv, [&]() {
    const auto probe = fd::cuda_probe();
    if (probe.devices.empty()) FD_THROW("no CUDA device answers (" << probe.error << ")");
    fd::json result = {{"device", probe.devices[0].name},
                       {"reps", reps},
                       {"hbm_gbs", hbm_gbs},
                       {"method", "CUDA events around reps back-to-back calls after one warm-up call"}};
    for (const auto& b : only) {
      if (b == "decode") result["decode_attention"] = bench_decode(reps, hbm_gbs);
      if (b == "prefill") result["prefill_attention"] = bench_prefill(std::max(1, reps / 4));
      if (b == "sampling") result["sampling"] = bench_sampling(std::max(1, reps / 2));
    }
    result["provenance"] = fd::collect_provenance(fd::join_args(argc, argv));
    if (!out.empty()) fd::write_json_file(out, result);
    return 0;
  });
}
