// fd-attn-bench: CPU decode attention (kernels/cpu/decode_attention.h) against the same machine's
// STREAM-like read ceiling, measured in the same run with the same threads, on Google Benchmark
// (bench_main.h).
//
// For each (isa, kv dtype, batch B, context C) with H query heads, Hkv kv heads, head dim D, two
// benchmarks, registered and run one right after the other:
//   read_ceiling/ISA/KV/B:B/ctx:C       a read-only reduction of exactly kv_bytes of the same cache
//                                       replicas, with the same OpenMP threads (AVX-512 loads where the
//                                       CPU has them, else AVX2, whatever the kernel's ISA)
//   decode_attention/ISA/KV/B:B/ctx:C   one decode step: fd::decode_attention over the B sequences
// Both time each iteration themselves (UseManualTime: only the kernel call, or only the reduction, is
// inside the clock) for --reps iterations after --warmup untimed ones, and report, from the median
// (fd::median) of those iterations:
//   kv_bytes         = B * Hkv * (floor(C/32) * kv_block_bytes(dtype, Hkv, D) / Hkv + (C % 32) * D * 2 * 2)
//                      (full blocks in the dtype incl. scales, plus the fp16 tail's valid tokens, K and V)
//   bytes_per_second = kv_bytes / seconds_median;  tokens_per_second = B / seconds_median (kernel only)
//   ratio_to_ceiling = ceiling seconds_median / kernel seconds_median
//                    = kernel bytes_per_second / ceiling bytes_per_second (same bytes)
//   speedup_vs_fp16  = tokens_per_second / that of fp16 at the same (isa, B, C) in this run (int8, int4); in a
//                      sweep (--prefetch-blocks / --heads-per-task with more than one value) at the same setting too
//   speedup_vs_fp16_default (sweeps only) = tokens_per_second / that of fp16 at the same (isa, B, C) and the
//                      library's defaults as fp16 resolves them (prefetch_blocks 1, heads_per_task auto), when the
//                      sweep ran fp16 there (the first such run): so every setting compares with one base
// Google Benchmark's own real_time is the mean of the same timed iterations.
//
// With --quantize, per (isa, kv dtype) one more benchmark, single-threaded (the R-worker's APPEND_KV path):
//   kv_quantize/ISA/KV   kv_quantize_block_isa over 256 fp16 blocks (Hkv heads, D) that fill as a prompt does:
//                        fp16_bytes_per_second = fp16 block bytes / seconds per block; ratio_to_copy = the same
//                        run's memcpy of a block (what an fp16 store does) / quantizing it. Scalar and avx2 run
//                        the scalar quantizer, avx512 and avx512vnni the AVX-512 one.
//
// With --append, per kv dtype one more, single-threaded (the R-worker's ATTEND append of a decode token):
//   kv_append/KV/B:256   KVStore::append_f16 of one token to each of 256 sequences (one layer, 40 tokens held at the
//                        start), every iteration after a read of --cold-gb has evicted the caches, as a decode visit
//                        finds them: ns_per_sequence; copy_ns_per_sequence = memcpy of the same bytes into one
//                        contiguous cold buffer, the same way; ratio_to_copy = copy / append.
//
// Why two benchmarks and not A B A B inside one: the earlier tool alternated kernel and ceiling calls.
// Within Google Benchmark that is honest only if one benchmark times both and reports the ceiling as
// a counter (then the ceiling is not a benchmark of its own, with its own row and time), or if each
// of the two runs the other untimed between its iterations (twice the run time). The ceiling is a
// benchmark beside its kernel instead, measured seconds before it on the same bytes; what that loses
// against alternation is cover from a burst of load hitting one block only, which shows as a spread
// between seconds_median and seconds_p90.
//
// Caches: the cache is replicated until the replicas cover >= --cold-gb (default 1 GB) and each
// iteration (ceiling and kernel alike, one rotation across the pair) reads the next replica, so small
// shapes are read from DRAM like the R-worker's per-layer caches are.
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/core/json_util.h"
#include "fastdecode/core/stats.h"
#include "fastdecode/rworker/kv_store.h"
#include "harness/bench/bench_main.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/decode_attention_impl.h"

namespace {

constexpr const char* kBytesFormula =
    "kv_bytes = B * Hkv * (floor(C/32) * kv_block_bytes(dtype,Hkv,D)/Hkv + (C%32)*D*2*2)";

struct Options {
  std::vector<std::string> isas, dtypes = {"fp16", "int8", "int4"};
  std::vector<int> batches = {1, 4, 16, 64, 256, 1024}, contexts = {128, 256, 512, 1024, 2048, 4096, 8192};
  int threads = int(std::max(1u, std::thread::hardware_concurrency())), heads = 32, kv_heads = 32, head_dim = 128,
      reps = 5, warmup = 1;
  double memory_gb = 16, cold_gb = 1.0;
  bool quick = false;
  bool quantize = false, append = false;
  std::string query = "auto";  // how int8/int4 blocks take the query (fd::QueryQuant)
  std::vector<int> prefetch = {fd::DecodeAttentionParams{}.prefetch_blocks};  // DecodeAttentionParams::prefetch_blocks
  std::vector<int> hpt = {0};  // DecodeAttentionParams::heads_per_task (0 = auto)
};

// A 2 MiB-aligned buffer that only grows; pages are touched in parallel once (first touch).
struct Arena {
  uint8_t* p = nullptr;
  size_t cap = 0;
  void reserve(size_t bytes, int threads) {
    if (bytes <= cap) return;
    std::free(p);
    p = nullptr, cap = 0;
    const size_t want = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    p = static_cast<uint8_t*>(std::aligned_alloc(2u << 20, want));
    if (!p) FD_THROW("out of memory allocating " << want / 1e9 << " GB");
    cap = want;
    madvise(p, cap, MADV_HUGEPAGE);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < int64_t(cap >> 21); ++i) std::memset(p + (size_t(i) << 21), 0, 2u << 20);
  }
  ~Arena() {
    std::free(p);
  }
};

double mem_total_gb() {
  std::ifstream f("/proc/meminfo");
  std::string k;
  double kb = 0;
  while (f >> k >> kb)
    if (k == "MemTotal:") return kb / 1e6;
  return 16;
}

volatile uint64_t g_sink = 0;

// Read-only reduction of exactly [p, p + bytes): whole 64-byte lines split evenly over `threads` OpenMP
// threads, the last partial line (kv_bytes need not be a multiple of 64) read byte by byte.
void read_ceiling(const uint8_t* p, size_t bytes, int threads, fd::Isa isa) {
  uint64_t sum = 0;
  const size_t lines = bytes / 64;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
  {
    const size_t n = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
    const size_t b0 = lines * t / n * 64, b1 = lines * (t + 1) / n * 64;
    sum += isa == fd::Isa::AVX512 ? fd::attn::read_reduce_avx512(p + b0, b1 - b0)
                                  : fd::attn::read_reduce_avx2(p + b0, b1 - b0);
  }
  for (size_t i = lines * 64; i < bytes; ++i) sum += p[i];
  g_sink = g_sink + sum;
}

// The KV cache of one (B, C, dtype): R replicas of B sequences' blocks in the arena. Built when a
// benchmark of that shape first runs, kept while the next ones (other ISAs, ceiling and kernel) use it.
struct Shape {
  int B = 0, C = 0;
  fd::KVDType dt = fd::KVDType::F16;
  std::string dname;
  bool operator==(const Shape& o) const { return B == o.B && C == o.C && dt == o.dt; }
};

struct CacheData {
  Shape shape;
  size_t replica = 0;    // bytes of one replica (blocks laid out back to back)
  int R = 1;             // replicas
  int64_t kv_bytes = 0;  // bytes one decode step reads (the formula above)
  std::vector<const void*> ptrs;
  std::vector<fd::SeqKVView> views;  // [R][B]
  std::vector<float> q, o;
  int next = 0;  // the replica the next timed or warm-up call reads
  int take() {
    const int r = next;
    next = (next + 1) % R;
    return r;
  }
};

// What one shape needs, without building it (for the memory cap at registration).
void size_shape(const Options& o, const Shape& s, CacheData& c) {
  const int H = o.kv_heads, D = o.head_dim, n_full = s.C / 32, n_tail = s.C % 32;
  const size_t blk = fd::kv_block_bytes(s.dt, H, D), f16_blk = fd::kv_fp16_block_bytes(H, D);
  c.shape = s;
  c.replica = size_t(s.B) * (size_t(n_full) * blk + (n_tail ? f16_blk : 0));
  c.kv_bytes = int64_t(s.B) * H * (int64_t(n_full) * int64_t(blk / size_t(H)) + int64_t(n_tail) * D * 4);
  c.R = int(std::clamp<double>(std::floor(o.cold_gb * 1e9 / double(c.replica)), 1, 4096));
}

class Bench {
 public:
  explicit Bench(Options o) : o_(std::move(o)) {
    ceil_isa_ = fd::isa_supported(fd::Isa::AVX512) ? fd::Isa::AVX512 : fd::Isa::AVX2;
  }
  fd::Isa ceiling_isa() const { return ceil_isa_; }

  CacheData& cache(const Shape& s) {
    if (data_ && data_->shape == s) return *data_;
    data_.reset();  // the previous shape's views before the arena is rewritten
    auto c = std::make_unique<CacheData>();
    size_shape(o_, s, *c);
    const int H = o_.kv_heads, D = o_.head_dim, B = s.B, n_full = s.C / 32, n_tail = s.C % 32;
    const size_t blk = fd::kv_block_bytes(s.dt, H, D), f16_blk = fd::kv_fp16_block_bytes(H, D);
    arena_.reserve(c->replica * size_t(c->R), o_.threads);
    // A pool of random blocks in the dtype, copied over every block slot (values do not matter for
    // speed; distinct pool entries keep the data from being trivially compressible).
    std::mt19937 rng(uint32_t(42 + 7919 * B + 131 * s.C + int(s.dt)));
    std::normal_distribution<float> nd(0.f, 1.f);
    const int pool_n = 8;
    std::vector<uint8_t> pool(pool_n * blk);
    std::vector<uint16_t> f16(f16_blk / 2);
    for (int i = 0; i < pool_n; ++i) {
      for (auto& x : f16) x = fd::fp32_to_fp16(nd(rng));
      fd::kv_quantize_block(s.dt, f16.data(), pool.data() + size_t(i) * blk, H, D);
    }
    const size_t seq_bytes = size_t(n_full) * blk + (n_tail ? f16_blk : 0);
    c->ptrs.resize(size_t(c->R) * B * n_full);
    c->views.resize(size_t(c->R) * B);
    uint8_t* const base0 = arena_.p;
    CacheData* const cp = c.get();
#pragma omp parallel for num_threads(o_.threads) schedule(static)
    for (int64_t rs = 0; rs < int64_t(cp->R) * B; ++rs) {
      uint8_t* base = base0 + size_t(rs) * seq_bytes;
      for (int b = 0; b < n_full; ++b) {
        std::memcpy(base + size_t(b) * blk, pool.data() + size_t((rs + b) % pool_n) * blk, blk);
        cp->ptrs[size_t(rs) * n_full + b] = base + size_t(b) * blk;
      }
      uint16_t* tail = reinterpret_cast<uint16_t*>(base + size_t(n_full) * blk);
      if (n_tail) std::memcpy(tail, f16.data(), f16_blk);
      cp->views[size_t(rs)] = {n_full ? &cp->ptrs[size_t(rs) * n_full] : nullptr, n_full, n_tail ? tail : nullptr,
                               n_tail};
    }
    c->q.resize(size_t(B) * o_.heads * D);
    c->o.resize(c->q.size());
    for (auto& x : c->q) x = nd(rng);
    data_ = std::move(c);
    return *data_;
  }

  void ceiling(benchmark::State& st, const Shape& s, const std::string& key) {
    CacheData& c = cache(s);
    const auto pass = [&] {
      const uint8_t* p = arena_.p + size_t(c.take()) * c.replica;
      const int64_t t0 = fd::now_ns();
      read_ceiling(p, size_t(c.kv_bytes), o_.threads, ceil_isa_);
      return double(fd::now_ns() - t0) * 1e-9;
    };
    for (int i = 0; i < o_.warmup; ++i) pass();
    std::vector<double> ts;
    for (auto _ : st) {
      ts.push_back(pass());
      st.SetIterationTime(ts.back());
    }
    const double t = fd::median(ts);
    ceilings_.set(key, t);
    common_counters(st, c, ts);
  }

  void kernel(benchmark::State& st, const Shape& s, fd::Isa isa, int prefetch, int hpt, const std::string& key) {
    CacheData& c = cache(s);
    fd::DecodeAttentionParams p;
    p.dtype = s.dt, p.n_seq = s.B, p.n_heads = o_.heads, p.n_kv_heads = o_.kv_heads, p.head_dim = o_.head_dim;
    p.scale = 1.f / std::sqrt(float(o_.head_dim)), p.q = c.q.data(), p.o = c.o.data();
    p.seqs = c.views.data();
    p.query = fd::query_quant_from_name(o_.query);
    p.prefetch_blocks = prefetch, p.heads_per_task = hpt;
    if (fd::decode_attention_kv_bytes(p) != c.kv_bytes) FD_THROW("internal: KV bytes formula mismatch");
    const fd::DecodeAttentionPlan plan = fd::decode_attention_plan(p, o_.threads);
    const auto call = [&] {
      p.seqs = c.views.data() + size_t(c.take()) * size_t(s.B);
      const int64_t t0 = fd::now_ns();
      fd::decode_attention(p, isa, o_.threads, ws_);
      return double(fd::now_ns() - t0) * 1e-9;
    };
    for (int i = 0; i < o_.warmup; ++i) call();
    std::vector<double> ts;
    for (auto _ : st) {
      ts.push_back(call());
      st.SetIterationTime(ts.back());
    }
    const double t = fd::median(ts), tps = s.B / t;
    common_counters(st, c, ts);
    st.counters["tokens_per_second"] = tps;
    if (const double tc = ceilings_.get(key); tc > 0) {
      st.counters["ratio_to_ceiling"] = tc / t;
      st.counters["ceiling_bytes_per_second"] = double(c.kv_bytes) / tc;
    }
    const std::string shape_key = std::string(fd::isa_name(isa)) + "/" + std::to_string(s.B) + "/" + std::to_string(s.C);
    const std::string fp16_key = shape_key + "/" + std::to_string(prefetch) + "/" + std::to_string(hpt);
    if (s.dt == fd::KVDType::F16)
      fp16_tps_[fp16_key] = tps;
    else if (fp16_tps_.count(fp16_key))
      st.counters["speedup_vs_fp16"] = tps / fp16_tps_[fp16_key];
    // fp16 by the settings it resolved to, and (in sweeps) int8/int4 against fp16 at the defaults as resolved.
    if (s.dt == fd::KVDType::F16) {
      // the first fp16 run at those settings (an auto run and an explicit one can resolve alike)
      fp16_resolved_tps_.emplace(shape_key + "/" + std::to_string(prefetch) + "/" + std::to_string(plan.heads_per_task), tps);
    } else if (o_.prefetch.size() > 1 || o_.hpt.size() > 1) {
      fd::DecodeAttentionParams d = p;
      d.dtype = fd::KVDType::F16, d.prefetch_blocks = fd::DecodeAttentionParams{}.prefetch_blocks;
      d.heads_per_task = fd::DecodeAttentionParams{}.heads_per_task;
      const auto it = fp16_resolved_tps_.find(shape_key + "/" + std::to_string(d.prefetch_blocks) + "/" +
                                              std::to_string(fd::decode_attention_heads_per_task(d)));
      if (it != fp16_resolved_tps_.end()) st.counters["speedup_vs_fp16_default"] = tps / it->second;
    }
    st.counters["query_int8"] = fd::query_is_q8(p.query, s.dt, isa) ? 1 : 0;  // what the call ran
    st.counters["prefetch_blocks"] = prefetch;
    st.counters["heads_per_task"] = plan.heads_per_task;  // as resolved
    st.counters["plan_tasks"] = double(plan.n_tasks);
    st.counters["plan_split_pairs"] = double(plan.n_split_pairs);
    st.counters["plan_chunk_target_bytes"] = double(plan.chunk_target_bytes);
  }

 private:
  void common_counters(benchmark::State& st, const CacheData& c, const std::vector<double>& ts) const {
    const double t = fd::median(ts);
    st.counters["batch"] = c.shape.B;
    st.counters["context"] = c.shape.C;
    st.counters["n_heads"] = o_.heads;
    st.counters["n_kv_heads"] = o_.kv_heads;
    st.counters["head_dim"] = o_.head_dim;
    st.counters["omp_threads"] = o_.threads;  // not "threads": Google Benchmark's own key
    st.counters["replicas"] = c.R;
    st.counters["warmup"] = o_.warmup;
    st.counters["kv_bytes"] = double(c.kv_bytes);
    st.counters["seconds_median"] = t;
    st.counters["seconds_p90"] = fd::percentile(ts, 90);
    st.counters["bytes_per_second"] = double(c.kv_bytes) / t;
  }

  Options o_;
  fd::Isa ceil_isa_;
  Arena arena_;
  std::unique_ptr<CacheData> data_;
  fd::DecodeAttentionWorkspace ws_;
  fd::bench::Ceilings ceilings_;
  std::map<std::string, double> fp16_tps_;  // (isa, B, C, prefetch, heads a task as asked) -> fp16 tokens/s
  std::map<std::string, double> fp16_resolved_tps_;  // (isa, B, C, prefetch, heads a task as resolved) -> the same
};

std::unique_ptr<Bench> g_bench;

// kv_quantize/ISA/KV: see the header comment.
void register_quantize(const Options& o, const std::vector<fd::Isa>& isas, const std::vector<fd::KVDType>& dts) {
  constexpr int kBlocks = 256;
  const int H = o.kv_heads, D = o.head_dim;
  const size_t f16 = fd::kv_fp16_block_bytes(H, D);
  auto src = std::make_shared<std::vector<uint16_t>>(f16 / 2 * kBlocks);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : *src) x = fd::fp32_to_fp16(nd(rng));
  for (const fd::Isa isa : isas) {
    if (!fd::isa_supported(isa)) continue;
    for (const fd::KVDType dt : dts) {
      const std::string name = "kv_quantize/" + std::string(fd::isa_name(isa)) + "/" + std::string(fd::kv_dtype_name(dt));
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
        fd::bench::run_guarded(st, name, [&] {
          const size_t out_bytes = fd::kv_block_bytes(dt, H, D);
          std::vector<uint8_t> out(out_bytes * kBlocks), copy(f16 * kBlocks);
          std::vector<double> tq, tc;
          for (auto _ : st) {
            int64_t t0 = fd::now_ns();
            for (int b = 0; b < kBlocks; ++b) std::memcpy(copy.data() + b * f16, src->data() + b * (f16 / 2), f16);
            int64_t t1 = fd::now_ns();
            for (int b = 0; b < kBlocks; ++b)
              fd::kv_quantize_block_isa(dt, src->data() + b * (f16 / 2), out.data() + b * out_bytes, H, D, isa);
            const int64_t t2 = fd::now_ns();
            tc.push_back(double(t1 - t0) / 1e9 / kBlocks);
            tq.push_back(double(t2 - t1) / 1e9 / kBlocks);
            st.SetIterationTime(double(t2 - t1) / 1e9);
          }
          const double q = fd::median(tq), c = fd::median(tc);
          st.counters["fp16_bytes_per_second"] = double(f16) / q;
          st.counters["ns_per_block"] = q * 1e9;
          st.counters["copy_ns_per_block"] = c * 1e9;
          st.counters["ratio_to_copy"] = c / q;
          st.counters["n_kv_heads"] = H;
          st.counters["head_dim"] = D;
        });
      })->UseManualTime()->Iterations(o.reps)->Unit(benchmark::kMicrosecond);
    }
  }
}

// kv_append/KV/B:256: see the header comment.
void register_append(const Options& o, const std::vector<fd::KVDType>& dts) {
  constexpr int kSeqs = 256, kHeld = 40;
  const int H = o.kv_heads, D = o.head_dim;
  const size_t row = size_t(H) * D * 2;  // bytes of K (or V) of one token
  for (const fd::KVDType dt : dts) {
    const std::string name = "kv_append/" + std::string(fd::kv_dtype_name(dt)) + "/B:" + std::to_string(kSeqs);
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
      fd::bench::run_guarded(st, name, [&] {
        fd::KVStore store(dt, 1, H, D, size_t(kSeqs) * (kHeld + 64) * row * 2 + (size_t(1) << 30));
        std::vector<uint8_t> held(row * kHeld, 0x3c), k(row * kSeqs, 0x3b), v(k.size(), 0x3a), copy(row * 2 * kSeqs);
        for (int i = 0; i < kSeqs; ++i) store.add(uint64_t(i)), store.append_f16(uint64_t(i), 0, held.data(), held.data(), kHeld);
        std::vector<uint8_t> cold(size_t(o.cold_gb * 1e9));
        volatile uint8_t sink = 0;
        const auto evict = [&] {
          for (size_t i = 0; i < cold.size(); i += 64) sink = uint8_t(sink + cold[i]);
        };
        std::vector<double> ta, tc;
        for (auto _ : st) {
          evict();
          const int64_t t0 = fd::now_ns();
          for (int i = 0; i < kSeqs; ++i) {
            std::memcpy(copy.data() + size_t(i) * row * 2, k.data() + size_t(i) * row, row);
            std::memcpy(copy.data() + size_t(i) * row * 2 + row, v.data() + size_t(i) * row, row);
          }
          const int64_t t1 = fd::now_ns();
          evict();
          const int64_t t2 = fd::now_ns();
          for (int i = 0; i < kSeqs; ++i) store.append_f16(uint64_t(i), 0, k.data() + size_t(i) * row, v.data() + size_t(i) * row, 1);
          const int64_t t3 = fd::now_ns();
          tc.push_back(double(t1 - t0) / kSeqs);
          ta.push_back(double(t3 - t2) / kSeqs);
          st.SetIterationTime(double(t3 - t2) / 1e9);
        }
        st.counters["ns_per_sequence"] = fd::median(ta);
        st.counters["copy_ns_per_sequence"] = fd::median(tc);
        st.counters["ratio_to_copy"] = fd::median(tc) / fd::median(ta);
        st.counters["token_bytes"] = double(row * 2);
      });
    })->UseManualTime()->Iterations(o.reps)->Unit(benchmark::kMicrosecond);
  }
}

void register_all(Options& o, CLI::App& app) {
  if (o.quick) {
    if (app.count("--batch") == 0) o.batches = {1, 16, 64};
    if (app.count("--context") == 0) o.contexts = {512, 2048, 8192};
  }
  if (o.isas.empty()) o.isas = {std::string(fd::isa_name(fd::best_isa()))};
  if (o.heads <= 0 || o.kv_heads <= 0 || o.heads % o.kv_heads)
    throw fd::ConfigError("--heads must be a positive multiple of --kv-heads");
  if (o.head_dim % 32 || o.head_dim < 32 || o.head_dim > 256)
    throw fd::ConfigError("--head-dim must be a multiple of 32 in [32, 256]");
  for (int b : o.batches)
    if (b < 1) throw fd::ConfigError("--batch values must be >= 1");
  for (int c : o.contexts)
    if (c < 1) throw fd::ConfigError("--context values must be >= 1");
  for (int pf : o.prefetch)
    if (pf < 0 || pf > fd::kMaxPrefetchBlocks)
      throw fd::ConfigError("--prefetch-blocks values must be in [0, " + std::to_string(fd::kMaxPrefetchBlocks) + "]");
  for (int hg : o.hpt)
    if (hg < 0 || hg > fd::kMaxHeadsPerTask || (hg > 0 && o.kv_heads % hg))
      throw fd::ConfigError("--heads-per-task values must be 0 (auto) or divisors of --kv-heads up to " +
                            std::to_string(fd::kMaxHeadsPerTask));
  std::vector<fd::Isa> isas;
  for (const auto& n : o.isas) isas.push_back(fd::isa_from_name(n));  // names checked by CLI11
  std::vector<fd::KVDType> dts;
  for (const auto& n : o.dtypes) dts.push_back(fd::kv_dtype_from_name(n));
  g_bench = std::make_unique<Bench>(o);
  if (!fd::isa_supported(g_bench->ceiling_isa())) FD_THROW("the read ceiling needs AVX2");

  const std::string ceil_isa(fd::isa_name(g_bench->ceiling_isa()));
  std::printf(
      "fd-attn-bench: %d threads, heads %d/%d, head_dim %d, %d timed iterations (+%d warm-up) per benchmark, "
      "memory cap %.1f GB\n  %s; read_ceiling = %s read-reduction of the same bytes, same threads, run right "
      "before each decode_attention\n",
      o.threads, o.heads, o.kv_heads, o.head_dim, o.reps, o.warmup, o.memory_gb, kBytesFormula, ceil_isa.c_str());
  fd::json skipped = fd::json::array();
  for (size_t i = 0; i < isas.size(); ++i)
    if (!fd::isa_supported(isas[i])) {
      std::printf("skipped: --isa %s is not supported by this CPU\n", o.isas[i].c_str());
      skipped.push_back({{"isa", o.isas[i]}, {"reason", "not supported by this CPU"}});
    }
  for (int B : o.batches)
    for (int C : o.contexts)
      for (size_t d = 0; d < dts.size(); ++d) {
        const Shape s{B, C, dts[d], o.dtypes[d]};
        CacheData need;
        size_shape(o, s, need);
        const double need_gb = double(need.replica) * need.R / 1e9;
        if (need_gb > o.memory_gb) {
          std::printf("skipped: kv %s B %d ctx %d: %.3g GB of KV over the %.3g GB cap (--memory-gb)\n", s.dname.c_str(),
                      B, C, need_gb, o.memory_gb);
          skipped.push_back({{"kv_dtype", s.dname},
                             {"batch", B},
                             {"context", C},
                             {"needed_gb", need_gb},
                             {"reason", "over --memory-gb"}});
          continue;
        }
        for (size_t i = 0; i < isas.size(); ++i) {
          if (!fd::isa_supported(isas[i])) continue;
          const fd::Isa isa = isas[i];
          const std::string key =
              std::string(fd::isa_name(isa)) + "/" + s.dname + "/B:" + std::to_string(B) + "/ctx:" + std::to_string(C);
          // The ceiling, then the kernel at each prefetch distance and heads a task (named /pf:N, /hg:N when more
          // than one of them is asked).
          const int nv = int(o.prefetch.size() * o.hpt.size());
          for (int vi = -1; vi < nv; ++vi) {
            const bool is_ceiling = vi < 0;
            const int pf = is_ceiling ? 0 : o.prefetch[size_t(vi) / o.hpt.size()];
            const int hg = is_ceiling ? 0 : o.hpt[size_t(vi) % o.hpt.size()];
            const std::string name = (is_ceiling ? "read_ceiling/" : "decode_attention/") + key +
                                     (!is_ceiling && o.prefetch.size() > 1 ? "/pf:" + std::to_string(pf) : "") +
                                     (!is_ceiling && o.hpt.size() > 1 ? "/hg:" + std::to_string(hg) : "");
            benchmark::RegisterBenchmark(name.c_str(),
                                         [=](benchmark::State& st) {
                                           fd::bench::run_guarded(st, name, [&] {
                                             if (is_ceiling)
                                               g_bench->ceiling(st, s, key);
                                             else
                                               g_bench->kernel(st, s, isa, pf, hg, key);
                                           });
                                         })
                ->UseManualTime()
                ->Iterations(o.reps)
                ->Unit(benchmark::kMicrosecond);
          }
        }
      }
  if (o.quantize) register_quantize(o, isas, dts);
  if (o.append) register_append(o, dts);
  benchmark::AddCustomContext("fd_tool", "fd-attn-bench");
  benchmark::AddCustomContext("fd_threads", std::to_string(o.threads));
  benchmark::AddCustomContext("fd_ceiling_isa", ceil_isa);
  benchmark::AddCustomContext("fd_query", o.query);
  benchmark::AddCustomContext("fd_skipped", skipped.dump());
  benchmark::AddCustomContext(
      "fd_formulas",
      fd::json{{"kv_bytes", kBytesFormula},
               {"seconds_median", "fd::median of the timed iterations (Google Benchmark's real_time is their mean)"},
               {"bytes_per_second", "kv_bytes / seconds_median"},
               {"tokens_per_second", "batch / seconds_median"},
               {"ratio_to_ceiling", "read_ceiling seconds_median / decode_attention seconds_median (same kv_bytes)"},
               {"ceiling_bytes_per_second", "kv_bytes / read_ceiling seconds_median"},
               {"speedup_vs_fp16", "tokens_per_second / tokens_per_second of fp16 at the same (isa, batch, context) "
                                   "and, in a sweep, the same prefetch_blocks and heads_per_task as asked"},
               {"speedup_vs_fp16_default",
                "sweeps: tokens_per_second / tokens_per_second of fp16 at the same (isa, batch, context) at the "
                "defaults as fp16 resolves them (prefetch_blocks 1, heads_per_task auto), when the sweep ran them"}}
          .dump());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{std::string("fd-attn-bench: CPU decode attention vs the same-run read ceiling (Google Benchmark).\n") +
                   kBytesFormula + "; bytes_per_second = kv_bytes / median time; tokens_per_second = B / median time",
               "fd-attn-bench"};
  Options o;
  o.memory_gb = 0.6 * mem_total_gb();
  app.add_option("--isa", o.isas, "ISAs to run (scalar avx2 avx512 avx512vnni); default: the best supported")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "avx512vnni"}));
  app.add_option("--kv-dtype", o.dtypes, "KV dtypes (fp16 int8 int4); fp16 first gives int8/int4 their speedup_vs_fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp16", "int8", "int4"}));
  app.add_option("--query", o.query,
                 "How int8/int4 blocks take the query: fp32 (the exact math), int8 (both dot products on integers: an "
                 "int8 query and 7-bit value weights), auto (int8 at avx512vnni, else fp32); fp16 blocks always use fp32")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fp32", "int8"}));
  app.add_option("--threads", o.threads, "OpenMP threads (kernel and ceiling)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batches, "Batch sizes (sequences)")->capture_default_str();
  app.add_option("--context", o.contexts, "Context lengths (tokens per sequence)")->capture_default_str();
  app.add_option("--prefetch-blocks", o.prefetch,
                 "Software prefetch distances in blocks (DecodeAttentionParams::prefetch_blocks; 0 = none), each a "
                 "decode_attention run after the shape's ceiling, named /pf:N when more than one")
      ->capture_default_str();
  app.add_option("--heads-per-task", o.hpt,
                 "KV heads a task reads block by block (DecodeAttentionParams::heads_per_task; 0 = auto), each a "
                 "decode_attention run, named /hg:N when more than one")
      ->capture_default_str();
  app.add_option("--heads", o.heads, "Query heads")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "KV heads (GQA when < heads)")->capture_default_str();
  app.add_option("--head-dim", o.head_dim, "Head dim (multiple of 32, <= 256)")->capture_default_str();
  app.add_option(
         "--reps", o.reps,
         "Timed iterations per benchmark (its Iterations: --benchmark_min_time does not apply; median reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "Untimed warm-up calls before them")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--memory-gb", o.memory_gb, "Skip shapes whose KV replicas need more than this (listed in fd_skipped)")
      ->capture_default_str();
  app.add_option("--cold-gb", o.cold_gb, "Replicate small caches up to this size to read from DRAM")
      ->capture_default_str();
  app.add_flag("--quantize", o.quantize,
               "Also time kv_quantize_block per ISA and KV dtype, one thread, against a memcpy of the block (kv_quantize/...)");
  app.add_flag("--append", o.append,
               "Also time a decode token's append (KVStore) to 256 sequences per KV dtype, one thread, caches cold, "
               "against a memcpy of the same bytes (kv_append/...)");
  app.add_flag("--quick", o.quick, "Small sweep for a 2-core dev machine: batch 1 16 64, context 512 2048 8192");
  return fd::bench::bench_main(
      argc, argv, app, [&] { register_all(o, app); }, [] { g_bench.reset(); });
}
