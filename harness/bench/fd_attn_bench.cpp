// fd-attn-bench: CPU decode attention (kernels/cpu/decode_attention.h) against the same machine's
// STREAM-like read ceiling, measured in the same run with the same threads, alternating A B A B.
//
// For each (isa, kv dtype, batch B, context C) with H query heads, Hkv kv heads, head dim D:
//   KV bytes read   = B * Hkv * (floor(C/32) * kv_block_bytes(dtype, Hkv, D) / Hkv + (C % 32) * D * 2 * 2)
//                     (full blocks in the dtype incl. scales, plus the fp16 tail's valid tokens, K and V)
//   tokens/s        = B / kernel time (one decode token per sequence per call)
//   kernel GB/s     = KV bytes read / kernel time;  ceiling GB/s = same bytes / read-reduction time
//   ratio           = kernel GB/s / ceiling GB/s;   speedup = tokens/s of int8/int4 / tokens/s of fp16
// Caches: the cache is replicated until the replicas cover >= --cold-gb (default 1 GB) and each
// repetition uses the next replica, so small shapes are read from DRAM like the R-worker's per-layer
// caches are; the ceiling reads the replica half a turn away (for one replica: the same bytes).
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/core/json_util.h"
#include "fastdecode/core/cli_main.h"
#include "harness/provenance.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/decode_attention_impl.h"

namespace {

constexpr const char* kBytesFormula =
    "kv_bytes = B * Hkv * (floor(C/32) * kv_block_bytes(dtype,Hkv,D)/Hkv + (C%32)*D*2*2)";

// A 2 MiB-aligned buffer that only grows; pages are touched in parallel once (first touch).
struct Arena {
  uint8_t* p = nullptr;
  size_t cap = 0;
  void reserve(size_t bytes, int threads) {
    if (bytes <= cap) return;
    std::free(p);
    cap = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    p = static_cast<uint8_t*>(std::aligned_alloc(2u << 20, cap));
    if (!p) FD_THROW("out of memory allocating " << cap / 1e9 << " GB");
    madvise(p, cap, MADV_HUGEPAGE);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < int64_t(cap >> 21); ++i) std::memset(p + (size_t(i) << 21), 0, 2u << 20);
  }
  ~Arena() { std::free(p); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mem_total_gb() {
  std::ifstream f("/proc/meminfo");
  std::string k;
  double kb = 0;
  while (f >> k >> kb)
    if (k == "MemTotal:") return kb / 1e6;
  return 16;
}

volatile uint64_t g_sink = 0;

// Read-only reduction of [p, p + bytes) split evenly over `threads` OpenMP threads.
void read_ceiling(const uint8_t* p, size_t bytes, int threads, fd::Isa isa) {
  uint64_t sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
  {
    const int n = omp_get_num_threads(), t = omp_get_thread_num();
    const size_t lines = bytes / 64, b0 = lines * t / n * 64, b1 = lines * (t + 1) / n * 64;
    sum += isa == fd::Isa::AVX512 ? fd::attn::read_reduce_avx512(p + b0, b1 - b0)
                                  : fd::attn::read_reduce_avx2(p + b0, b1 - b0);
  }
  g_sink = g_sink + sum;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{std::string("fd-attn-bench: CPU decode attention vs the same-run read ceiling.\n") + kBytesFormula +
                   "; tokens/s = B / time; GB/s = kv_bytes / time",
               "fd-attn-bench"};
  std::vector<std::string> isas, dtypes = {"fp16", "int8", "int4"};
  std::vector<int> batches = {1, 4, 16, 64, 256, 1024}, contexts = {128, 256, 512, 1024, 2048, 4096, 8192};
  int threads = int(std::thread::hardware_concurrency()), heads = 32, kv_heads = 32, head_dim = 128, reps = 5,
      warmup = 1;
  double memory_gb = 0.6 * mem_total_gb(), cold_gb = 1.0;
  std::string json_out;
  bool quick = false;
  app.add_option("--isa", isas, "ISAs to run (scalar avx2 avx512); default: the best supported");
  app.add_option("--kv-dtype", dtypes, "KV dtypes (fp16 int8 int4)")->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads (kernel and ceiling)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch", batches, "Batch sizes (sequences)")->capture_default_str();
  app.add_option("--context", contexts, "Context lengths (tokens per sequence)")->capture_default_str();
  app.add_option("--heads", heads, "Query heads")->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "KV heads (GQA when < heads)")->capture_default_str();
  app.add_option("--head-dim", head_dim, "Head dim (multiple of 32, <= 256)")->capture_default_str();
  app.add_option("--reps", reps, "Timed repetitions (median reported)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "Untimed warm-up repetitions")->capture_default_str();
  app.add_option("--memory-gb", memory_gb, "Skip shapes whose KV replicas need more than this")->capture_default_str();
  app.add_option("--cold-gb", cold_gb, "Replicate small caches up to this size to read from DRAM")->capture_default_str();
  app.add_option("--json", json_out, "Write the records (with formulas and provenance) here");
  app.add_flag("--quick", quick, "Small sweep for a 2-core dev machine: batch 1 16 64, context 512 2048 8192, reps 5");

  return fd::guarded_main(app, argc, argv, [&]() {
    if (quick) {
      if (app.count("--batch") == 0) batches = {1, 16, 64};
      if (app.count("--context") == 0) contexts = {512, 2048, 8192};
    }
    if (isas.empty()) isas = {std::string(fd::isa_name(fd::best_isa()))};
    const int H = kv_heads, D = head_dim;
    if (heads <= 0 || H <= 0 || heads % H) throw fd::ConfigError("--heads must be a positive multiple of --kv-heads");
    if (D % 32 || D < 32 || D > 256) throw fd::ConfigError("--head-dim must be a multiple of 32 in [32, 256]");
    const fd::Isa ceil_isa = fd::isa_supported(fd::Isa::AVX512) ? fd::Isa::AVX512 : fd::Isa::AVX2;
    if (!fd::isa_supported(ceil_isa)) FD_THROW("the read ceiling needs AVX2");
    std::printf("fd-attn-bench: %d threads, heads %d/%d, head_dim %d, reps %d (+%d warm-up), memory cap %.1f GB\n"
                "  %s; ceiling = %s read-reduction of the same bytes, alternating with the kernel\n",
                threads, heads, H, D, reps, warmup, memory_gb, kBytesFormula, std::string(fd::isa_name(ceil_isa)).c_str());
    std::printf("%-7s %-5s %5s %5s %10s %11s %9s %9s %6s %7s\n", "isa", "kv", "B", "ctx", "ms", "tokens/s", "GB/s",
                "ceil", "ratio", "x fp16");
    fd::json records = fd::json::array(), skipped = fd::json::array();
    std::map<std::string, double> fp16_tps;  // (isa, B, ctx) -> tokens/s of fp16 in this run
    Arena arena;
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.f, 1.f);
    const size_t f16_blk = fd::kv_fp16_block_bytes(H, D);
    fd::DecodeAttentionWorkspace ws;

    for (int B : batches)
      for (int C : contexts)
        for (const std::string& dname : dtypes) {
          const fd::KVDType dt = fd::kv_dtype_from_name(dname);
          const int n_full = C / 32, n_tail = C % 32;
          const size_t blk = fd::kv_block_bytes(dt, H, D);
          const size_t replica = size_t(B) * (size_t(n_full) * blk + (n_tail ? f16_blk : 0));
          const int64_t kv_bytes = int64_t(B) * H * (int64_t(n_full) * int64_t(blk / H) + int64_t(n_tail) * D * 4);
          const int R = int(std::clamp<double>(std::floor(cold_gb * 1e9 / double(replica)), 1, 4096));
          const double need_gb = double(replica) * R / 1e9;
          if (need_gb > memory_gb) {
            std::printf("%-7s %-5s %5d %5d   skipped: %.1f GB of KV over the %.1f GB cap\n", "-", dname.c_str(), B, C,
                        need_gb, memory_gb);
            skipped.push_back({{"kv_dtype", dname}, {"batch", B}, {"context", C}, {"needed_gb", need_gb}});
            continue;
          }
          arena.reserve(replica * R, threads);
          // A pool of random blocks in the dtype, copied over every block slot (values do not matter for
          // speed; distinct pool entries keep the data from being trivially compressible).
          const int pool_n = 8;
          std::vector<uint8_t> pool(pool_n * blk);
          std::vector<uint16_t> f16(f16_blk / 2);
          for (int i = 0; i < pool_n; ++i) {
            for (auto& x : f16) x = fd::fp32_to_fp16(nd(rng));
            fd::kv_quantize_block(dt, f16.data(), pool.data() + i * blk, H, D);
          }
          std::vector<const void*> ptrs(size_t(R) * B * n_full);
          std::vector<fd::SeqKVView> views(size_t(R) * B);
#pragma omp parallel for num_threads(threads) schedule(static)
          for (int64_t rs = 0; rs < int64_t(R) * B; ++rs) {
            uint8_t* base = arena.p + size_t(rs) * (size_t(n_full) * blk + (n_tail ? f16_blk : 0));
            for (int b = 0; b < n_full; ++b) {
              std::memcpy(base + size_t(b) * blk, pool.data() + ((rs + b) % pool_n) * blk, blk);
              ptrs[size_t(rs) * n_full + b] = base + size_t(b) * blk;
            }
            uint16_t* tail = reinterpret_cast<uint16_t*>(base + size_t(n_full) * blk);
            if (n_tail) std::memcpy(tail, f16.data(), f16_blk);
            views[rs] = {n_full ? &ptrs[size_t(rs) * n_full] : nullptr, n_full, n_tail ? tail : nullptr, n_tail};
          }
          std::vector<float> q(size_t(B) * heads * D), o(q.size());
          for (auto& x : q) x = nd(rng);
          for (const std::string& iname : isas) {
            const fd::Isa isa = fd::isa_from_name(iname);
            if (!fd::isa_supported(isa)) {
              std::printf("%-7s not supported here: skipped\n", iname.c_str());
              continue;
            }
            fd::DecodeAttentionParams p;
            p.dtype = dt, p.n_seq = B, p.n_heads = heads, p.n_kv_heads = H, p.head_dim = D;
            p.scale = 1.f / std::sqrt(float(D)), p.q = q.data(), p.o = o.data();
            p.seqs = views.data();
            if (fd::decode_attention_kv_bytes(p) != kv_bytes) FD_THROW("internal: KV bytes formula mismatch");
            const fd::DecodeAttentionPlan plan = fd::decode_attention_plan(p, threads);
            std::vector<double> tk, tc;
            for (int i = 0; i < warmup + reps; ++i) {  // A B A B: kernel, ceiling, kernel, ceiling, ...
              const int r = i % R, rc = (i + R / 2) % R;
              p.seqs = views.data() + size_t(r) * B;
              int64_t t0 = fd::now_ns();
              fd::decode_attention(p, isa, threads, ws);
              int64_t t1 = fd::now_ns();
              if (i >= warmup) tk.push_back((t1 - t0) * 1e-9);
              const uint8_t* cbase = arena.p + size_t(rc) * replica;
              t0 = fd::now_ns();
              read_ceiling(cbase, size_t(kv_bytes) / 64 * 64, threads, ceil_isa);
              t1 = fd::now_ns();
              if (i >= warmup) tc.push_back((t1 - t0) * 1e-9);
            }
            const double t = median(tk), tcm = median(tc);
            const double tps = B / t, gbps = kv_bytes / t / 1e9, cgbps = kv_bytes / tcm / 1e9;
            const std::string key = iname + "/" + std::to_string(B) + "/" + std::to_string(C);
            if (dt == fd::KVDType::F16) fp16_tps[key] = tps;
            fd::json rec = {{"isa", iname}, {"kv_dtype", dname}, {"batch", B}, {"context", C}, {"n_heads", heads},
                            {"n_kv_heads", H}, {"head_dim", D}, {"threads", threads}, {"reps", reps},
                            {"warmup", warmup}, {"replicas", R}, {"kv_bytes", kv_bytes},
                            {"kernel_s_median", t}, {"kernel_s", tk}, {"tokens_per_s", tps}, {"kernel_GBps", gbps},
                            {"ceiling_s_median", tcm}, {"ceiling_s", tc}, {"ceiling_GBps", cgbps},
                            {"ratio_to_ceiling", gbps / cgbps}, {"plan_tasks", plan.n_tasks},
                            {"plan_split_pairs", plan.n_split_pairs}, {"plan_chunk_target_bytes", plan.chunk_target_bytes}};
            std::string sp = "";
            if (dt != fd::KVDType::F16 && fp16_tps.count(key)) {
              rec["speedup_vs_fp16"] = tps / fp16_tps[key];
              char b[32];
              std::snprintf(b, sizeof b, "%.2f", tps / fp16_tps[key]);
              sp = b;
            }
            records.push_back(rec);
            std::printf("%-7s %-5s %5d %5d %10.3f %11.0f %9.1f %9.1f %6.2f %7s\n", iname.c_str(), dname.c_str(), B, C,
                        t * 1e3, tps, gbps, cgbps, gbps / cgbps, sp.c_str());
            std::fflush(stdout);
          }
        }
    if (!json_out.empty()) {
      fd::json out = {{"tool", "fd-attn-bench"},
                      {"provenance", fd::collect_provenance(fd::join_args(argc, argv))},
                      {"threads", threads},
                      {"ceiling_isa", fd::isa_name(ceil_isa)},
                      {"formulas",
                       {{"kv_bytes", kBytesFormula},
                        {"tokens_per_s", "batch / kernel_s_median"},
                        {"kernel_GBps", "kv_bytes / kernel_s_median / 1e9"},
                        {"ceiling_GBps", "kv_bytes / ceiling_s_median / 1e9 (read-only reduction of kv_bytes, same threads)"},
                        {"ratio_to_ceiling", "kernel_GBps / ceiling_GBps"},
                        {"speedup_vs_fp16", "tokens_per_s / tokens_per_s of fp16 at the same (isa, batch, context) in this run"}}},
                      {"records", records},
                      {"skipped", skipped}};
      fd::write_json_file(json_out, out);
      std::printf("wrote %s\n", json_out.c_str());
    }
    return 0;
  });
}
