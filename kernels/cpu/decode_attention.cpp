// CPU decode attention: parameter checks, ISA detection, the work split by KV bytes, the OpenMP run
// and the merge of split contexts. The per-block math lives in decode_attention_{scalar,avx2,avx512}.cpp.
//
// Work split. A pair is a sequence s and hpt consecutive kv heads (DecodeAttentionParams::heads_per_task, resolved by
// decode_attention_heads_per_task), read block by block, head after head within a block: a thread's reads of a block
// are then runs of hpt heads rather than one head's (with head-major int8/int4 blocks, one run of hpt heads), which
// int4's 5 KiB a head at d = 128 needs (the function says what was measured).
// A pair costs bytes(s) = hpt * (n_full*kv_block_bytes/H + n_tail*D*4).
// With W = the sum over pairs and n threads, the chunk target is max(W / (4n), 64 KiB): about four
// chunks per thread for dynamic balance, but never so short that the merge and per-chunk setup matter.
// A pair longer than 1.5 targets is cut into ceil(bytes/target) chunks of whole blocks (the tail goes
// with the last one). Chunks run under `omp for schedule(dynamic, 1)`, longest first when their
// sizes differ. An unsplit pair normalises straight into o; a split pair's chunks write partial
// states (m, l, unnormalised acc) per query head into 64-byte aligned slots of ws.partial, which a
// second `omp for` merges: M = max m_i, L = sum l_i e^(m_i - M), o = sum acc_i e^(m_i - M) / L.
//
// ws.index holds the plan: n_tasks records {pair, b0, b1 | tail << 40, slot (-1: unsplit)}, then
// n_split records {pair, first slot, n_chunks}. Both vectors only ever grow: no allocation per call
// once the workspace has seen the largest shape.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cpuid.h>
#include <cstring>
#include <limits>

#include "fastdecode/core/error.h"
#include "kernels/cpu/decode_attention_impl.h"

namespace fd {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::AVX2: return "avx2";
    case Isa::AVX512: return "avx512";
    case Isa::AVX512VNNI: return "avx512vnni";
  }
  FD_THROW("unknown ISA " << int(isa));
}

Isa isa_from_name(std::string_view name) {
  if (name == "scalar") return Isa::Scalar;
  if (name == "avx2") return Isa::AVX2;
  if (name == "avx512") return Isa::AVX512;
  if (name == "avx512vnni") return Isa::AVX512VNNI;
  FD_THROW("unknown ISA '" << name << "' (expected scalar, avx2, avx512 or avx512vnni)");
}

namespace {

// XCR0 via xgetbv (inline asm: no -mxsave needed); valid only when CPUID says OSXSAVE.
uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

struct CpuFeatures {
  bool avx2 = false, avx512 = false, avx512vnni = false;
  CpuFeatures() {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const bool osxsave = c & bit_OSXSAVE, fma = c & bit_FMA, f16c = c & bit_F16C, avx = c & bit_AVX;
    if (!osxsave || !avx) return;
    const uint64_t xcr0 = xgetbv0();
    const bool ymm_os = (xcr0 & 0x6) == 0x6;     // XMM and YMM state
    const bool zmm_os = (xcr0 & 0xe6) == 0xe6;   // + opmask, ZMM_Hi256, Hi16_ZMM
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    avx2 = ymm_os && fma && f16c && (b & bit_AVX2);
    avx512 = avx2 && zmm_os && (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) && (b & bit_AVX512DQ);
    avx512vnni = avx512 && (c & bit_AVX512VNNI);  // CPUID.(7,0):ECX[11]
  }
};
const CpuFeatures& cpu() {
  static const CpuFeatures f;
  return f;
}

constexpr int64_t kMinChunkBytes = 64 * 1024;
constexpr int64_t kTailFlag = int64_t(1) << 40;

struct Task {
  int64_t pair, b0, b1, slot;  // b1 carries kTailFlag when the chunk includes the tail
};
struct Split {
  int64_t pair, first_slot, n_chunks;
};

int64_t head_block_bytes(const DecodeAttentionParams& p) {
  return int64_t(kv_block_bytes(p.dtype, p.n_kv_heads, p.head_dim)) / p.n_kv_heads;
}
// A pair's bytes: hbb = one full block's bytes of its heads (hpt of them).
int64_t pair_bytes(const DecodeAttentionParams& p, const SeqKVView& s, int64_t hbb, int hpt = 1) {
  return s.n_full * hbb + int64_t(s.n_tail) * p.head_dim * 4 * hpt;
}

void validate(const DecodeAttentionParams& p, int n_threads) {
  FD_CHECK(n_threads >= 1, "decode_attention: n_threads must be >= 1, got " << n_threads);
  FD_CHECK(p.dtype == KVDType::F16 || p.dtype == KVDType::I8 || p.dtype == KVDType::I4,
           "decode_attention: unknown KV dtype " << int(p.dtype));
  FD_CHECK(p.n_seq >= 0, "decode_attention: n_seq must be >= 0, got " << p.n_seq);
  FD_CHECK(p.n_heads > 0 && p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0,
           "decode_attention: n_heads (" << p.n_heads << ") must be a positive multiple of n_kv_heads ("
                                         << p.n_kv_heads << ")");
  FD_CHECK(p.head_dim >= 32 && p.head_dim <= 256 && p.head_dim % 32 == 0,
           "decode_attention: head_dim must be a multiple of 32 in [32, 256], got " << p.head_dim);
  FD_CHECK(std::isfinite(p.scale), "decode_attention: scale must be finite, got " << p.scale);
  FD_CHECK(p.query == QueryQuant::Auto || p.query == QueryQuant::F32 || p.query == QueryQuant::I8,
           "decode_attention: unknown query quantization " << int(p.query));
  FD_CHECK(p.prefetch_blocks >= 0 && p.prefetch_blocks <= kMaxPrefetchBlocks,
           "decode_attention: prefetch_blocks must be in [0, " << kMaxPrefetchBlocks << "], got " << p.prefetch_blocks);
  FD_CHECK(p.heads_per_task == 0 || (p.heads_per_task > 0 && p.heads_per_task <= kMaxHeadsPerTask &&
                                      p.n_kv_heads % p.heads_per_task == 0),
           "decode_attention: heads_per_task must be 0 (auto) or a divisor of n_kv_heads (" << p.n_kv_heads
                                                                                           << ") up to " << kMaxHeadsPerTask
                                                                                           << ", got " << p.heads_per_task);
  if (p.n_seq == 0) return;  // documented no-op: pointers may be null
  FD_CHECK(p.seqs && p.q && p.o, "decode_attention: seqs, q and o must not be null when n_seq > 0");
  for (int i = 0; i < p.n_seq; ++i) {
    const SeqKVView& s = p.seqs[i];
    FD_CHECK(s.n_full >= 0 && s.n_tail >= 0 && s.n_tail < kKVBlockTokens,
             "decode_attention: sequence " << i << " has n_full " << s.n_full << ", n_tail " << s.n_tail
                                           << " (need n_full >= 0, 0 <= n_tail < " << kKVBlockTokens << ")");
    FD_CHECK(s.n_tokens() >= 1, "decode_attention: sequence " << i << " has no tokens");
    FD_CHECK(s.n_full == 0 || s.blocks, "decode_attention: sequence " << i << " has n_full > 0 but no blocks");
    FD_CHECK(s.n_tail == 0 || s.tail, "decode_attention: sequence " << i << " has n_tail > 0 but no tail");
    for (int b = 0; b < s.n_full; ++b)
      FD_CHECK(s.blocks[b], "decode_attention: sequence " << i << " block " << b << " is null");
  }
}

// Builds the plan into ws.index; returns {n_tasks, n_split, n_slots} via out-params.
DecodeAttentionPlan make_plan(const DecodeAttentionParams& p, int n_threads, DecodeAttentionWorkspace& ws,
                              int64_t* n_slots_out) {
  DecodeAttentionPlan plan;
  plan.heads_per_task = decode_attention_heads_per_task(p);
  const int H = p.n_kv_heads / plan.heads_per_task;  // pairs per sequence
  plan.n_pairs = int64_t(p.n_seq) * H;
  const int64_t hbb = head_block_bytes(p) * plan.heads_per_task;  // a pair's bytes of one full block
  int64_t total = 0;
  const int hpt = plan.heads_per_task;
  for (int i = 0; i < p.n_seq; ++i) total += pair_bytes(p, p.seqs[i], hbb, hpt) * H;
  const int64_t target = n_threads == 1 ? std::max<int64_t>(total, 1)
                                        : std::max<int64_t>(total / (4 * int64_t(n_threads)), kMinChunkBytes);
  plan.chunk_target_bytes = target;
  // Count first so ws.index is sized once.
  int64_t n_tasks = 0, n_split = 0;
  auto chunks_of = [&](const SeqKVView& s) -> int64_t {
    const int64_t b = pair_bytes(p, s, hbb, hpt);
    if (b * 2 <= target * 3 || s.n_full < 2) return 1;
    return std::min<int64_t>((b + target - 1) / target, s.n_full);
  };
  for (int i = 0; i < p.n_seq; ++i) {
    const int64_t c = chunks_of(p.seqs[i]);
    n_tasks += c * H;
    if (c > 1) n_split += H;
  }
  plan.n_tasks = n_tasks;
  plan.n_split_pairs = n_split;
  const size_t need = size_t(n_tasks) * 4 + size_t(n_split) * 3;
  if (ws.index.size() < need) ws.index.resize(need);
  Task* tasks = reinterpret_cast<Task*>(ws.index.data());
  Split* splits = reinterpret_cast<Split*>(ws.index.data() + n_tasks * 4);
  int64_t t = 0, sp = 0, slot = 0;
  bool uniform = true;
  int64_t first_len = -1;
  for (int i = 0; i < p.n_seq; ++i) {
    const SeqKVView& s = p.seqs[i];
    const int64_t c = chunks_of(s);
    for (int j = 0; j < H; ++j) {
      const int64_t pair = int64_t(i) * H + j;
      if (c > 1) splits[sp++] = {pair, slot, c};
      for (int64_t k = 0; k < c; ++k) {
        const int64_t b0 = s.n_full * k / c, b1 = s.n_full * (k + 1) / c;
        const bool tail = k == c - 1 && s.n_tail > 0;
        tasks[t++] = {pair, b0, b1 | (tail ? kTailFlag : 0), c > 1 ? slot++ : -1};
        const int64_t len = (b1 - b0) * hbb + (tail ? int64_t(s.n_tail) * p.head_dim * 4 * hpt : 0);
        if (first_len < 0) first_len = len;
        uniform = uniform && len == first_len;
      }
    }
  }
  if (!uniform) {
    const int64_t tb = int64_t(p.head_dim) * 4 * hpt;
    auto len = [&](const Task& x) {
      const SeqKVView& s = p.seqs[x.pair / H];
      return ((x.b1 & (kTailFlag - 1)) - x.b0) * hbb + ((x.b1 & kTailFlag) ? s.n_tail * tb : 0);
    };
    std::sort(tasks, tasks + n_tasks, [&](const Task& a, const Task& b) { return len(a) > len(b); });
  }
  *n_slots_out = slot;
  return plan;
}

attn::ChunkFn chunk_fn(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return attn::run_chunk_scalar;
#if !defined(FD_SCALAR_KERNELS_ONLY)
    case Isa::AVX2: return attn::run_chunk_avx2;
    case Isa::AVX512: return attn::run_chunk_avx512;
    case Isa::AVX512VNNI: return attn::run_chunk_avx512vnni;
#else
    default: break;  // not built (FD_CPU_SIMD_KERNELS=OFF): isa_supported() said no before this
#endif
  }
  FD_THROW("decode_attention: unknown ISA " << int(isa));
}

float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

}  // namespace

bool isa_supported(Isa isa) {
#if defined(FD_SCALAR_KERNELS_ONLY)
  if (isa != Isa::Scalar) return false;  // built with FD_CPU_SIMD_KERNELS=OFF
#endif
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::AVX2: return cpu().avx2;
    case Isa::AVX512: return cpu().avx512;
    case Isa::AVX512VNNI: return cpu().avx512vnni;
  }
  return false;
}

Isa best_isa() {
  if (isa_supported(Isa::AVX512VNNI)) return Isa::AVX512VNNI;
  if (isa_supported(Isa::AVX512)) return Isa::AVX512;
  if (isa_supported(Isa::AVX2)) return Isa::AVX2;
  return Isa::Scalar;
}

bool query_is_q8(QueryQuant qq, KVDType dtype, Isa isa) {
  if (dtype == KVDType::F16) return false;
  // Auto: the integer path at the AVX512-VNNI level, where both dot products are VPDPBUSD: on the GPU machine's
  // Xeon it ran 1.50-2.70x fp16 against 1.47-2.49x for the fp32 query in the same run, GQA int8 2.03x vs 1.63x
  // (artifacts/rworker/gpu-machine-q8pv/); its added error is in docs/RWORKER.md and artifacts/accuracy/. Below
  // VNNI the exact fp32 path (VPMADDUBSW's pairs were not measured to win).
  if (qq == QueryQuant::Auto) return isa == Isa::AVX512VNNI;
  return qq == QueryQuant::I8;
}

QueryQuant query_quant_from_name(std::string_view name) {
  if (name == "auto") return QueryQuant::Auto;
  if (name == "fp32") return QueryQuant::F32;
  if (name == "int8") return QueryQuant::I8;
  throw ConfigError("query " + std::string(name) + ": expected auto, fp32 or int8");
}

std::string_view query_quant_name(QueryQuant qq) {
  switch (qq) {
    case QueryQuant::F32: return "fp32";
    case QueryQuant::I8: return "int8";
    default: return "auto";
  }
}

int64_t decode_attention_kv_bytes(const DecodeAttentionParams& p) {
  validate(p, 1);
  const int64_t hbb = head_block_bytes(p);
  int64_t total = 0;
  for (int i = 0; i < p.n_seq; ++i) total += pair_bytes(p, p.seqs[i], hbb) * p.n_kv_heads;
  return total;
}

int decode_attention_heads_per_task(const DecodeAttentionParams& p) {
  if (p.heads_per_task > 0) return p.heads_per_task;
  // Before the blocks were head-major, a task read a block as runs of one head's K, V and scales: 2, 2 and 2 x 0.5 KiB
  // for int4 at d = 128, against fp16's two 8 KiB. On the GPU machine's Xeon (16 threads) that pattern alone read at
  // 0.71-0.91 of fp16's, and the int4 kernel at 111 GB/s against 138 for fp16; 2 heads a task read 124-125 GB/s, 4
  // or 8 no better than 1 (why was not found: in cache, on one thread, 1 to 8 heads a task run alike on the dev
  // Xeon). So: the fewest heads whose bytes of a block reach 8 KiB (fp16 and int8 1, int4 2 at d = 128), as a
  // divisor of n_kv_heads (else the most that divide it, up to that count).
  // artifacts/rworker/gpu-machine-prefetch-d846a34/ and gpu-machine-hg-54a9b76/ hold the measurements. With the blocks
  // head-major since 0c7afb6 (one run a head) the sweep gave the same choice (gpu-machine-hg-e85de20/).
  const int64_t head_bytes = head_block_bytes(p);
  const int want = int(std::clamp<int64_t>((8192 + head_bytes - 1) / head_bytes, 1, kMaxHeadsPerTask));
  for (int d = want; d <= kMaxHeadsPerTask; ++d)
    if (p.n_kv_heads % d == 0) return d;
  for (int d = std::min(want, kMaxHeadsPerTask); d > 1; --d)  // none reaches it: as many as divide n_kv_heads
    if (p.n_kv_heads % d == 0) return d;
  return 1;
}

DecodeAttentionPlan decode_attention_plan(const DecodeAttentionParams& p, int n_threads) {
  validate(p, n_threads);
  DecodeAttentionWorkspace ws;
  int64_t n_slots = 0;
  return make_plan(p, n_threads, ws, &n_slots);
}

void decode_attention(const DecodeAttentionParams& p, Isa isa, int n_threads, DecodeAttentionWorkspace& ws) {
  validate(p, n_threads);
  FD_CHECK(isa == Isa::Scalar || isa == Isa::AVX2 || isa == Isa::AVX512 || isa == Isa::AVX512VNNI,
           "decode_attention: unknown ISA " << int(isa));
  if (!isa_supported(isa)) FD_THROW("decode_attention: ISA " << isa_name(isa) << " is not supported by this CPU/OS");
  if (p.n_seq == 0) return;
  const attn::ChunkFn fn = chunk_fn(isa);
  int64_t n_slots = 0;
  const DecodeAttentionPlan plan = make_plan(p, n_threads, ws, &n_slots);
  // A pair: a sequence and hpt kv heads, i.e. GP = hpt * G consecutive query heads; H pairs per sequence.
  const int hpt = plan.heads_per_task, H = p.n_kv_heads / hpt, G = p.n_heads / p.n_kv_heads, GP = G * hpt,
            D = p.head_dim;
  const Task* tasks = reinterpret_cast<const Task*>(ws.index.data());
  const Split* splits = reinterpret_cast<const Split*>(ws.index.data() + plan.n_tasks * 4);

  // ws.partial: [n_slots] slots of (m [GP], l [GP], acc [GP][D]) and [n_threads] thread areas of
  // (m, l, acc, hpt heads' scratch); each a multiple of 16 floats (64 bytes) from a 64-byte aligned base.
  const size_t slot_f = (size_t(GP) * (D + 2) + 15) / 16 * 16;
  const size_t thread_f = slot_f + attn::chunk_scratch_floats(G, D) * hpt;
  const size_t need = size_t(n_slots) * slot_f + size_t(n_threads) * thread_f + 16;
  if (ws.partial.size() < need) ws.partial.resize(need);
  float* const slots = align64(ws.partial.data());
  float* const thread_areas = slots + size_t(n_slots) * slot_f;
  const attn::CallCtx ctx{p.dtype, p.n_kv_heads, D, G, p.scale, query_is_q8(p.query, p.dtype, isa), p.prefetch_blocks};
  const int64_t n_tasks = plan.n_tasks, n_split = plan.n_split_pairs;

#pragma omp parallel num_threads(n_threads)
  {
    float* const area = thread_areas + size_t(omp_get_thread_num()) * thread_f;
#pragma omp for schedule(dynamic, 1)
    for (int64_t ti = 0; ti < n_tasks; ++ti) {
      const Task& tk = tasks[ti];
      const int seq = int(tk.pair / H), kvh = int(tk.pair % H) * hpt;
      float* st = tk.slot >= 0 ? slots + size_t(tk.slot) * slot_f : area;
      float *m = st, *l = st + GP, *acc = st + 2 * GP;
      std::fill(m, m + GP, -std::numeric_limits<float>::infinity());
      std::fill(l, l + GP, 0.f);
      std::fill(acc, acc + size_t(GP) * D, 0.f);
      const attn::Chunk ch{&p.seqs[seq], kvh, int32_t(tk.b0), int32_t(tk.b1 & (kTailFlag - 1)),
                           (tk.b1 & kTailFlag) != 0, hpt};
      const float* q = p.q + (size_t(seq) * p.n_heads + size_t(kvh) * G) * D;
      fn(ctx, ch, q, m, l, acc, area + slot_f);
      if (tk.slot < 0) {
        float* o = p.o + (size_t(seq) * p.n_heads + size_t(kvh) * G) * D;
        for (int h = 0; h < GP; ++h) {
          const float inv = 1.f / l[h];
          for (int d = 0; d < D; ++d) o[h * D + d] = acc[h * D + d] * inv;
        }
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t si = 0; si < n_split; ++si) {
      const Split& sp = splits[si];
      const int seq = int(sp.pair / H), kvh = int(sp.pair % H) * hpt;
      float* o = p.o + (size_t(seq) * p.n_heads + size_t(kvh) * G) * D;
      for (int h = 0; h < GP; ++h) {
        float M = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < sp.n_chunks; ++c) M = std::max(M, slots[size_t(sp.first_slot + c) * slot_f + h]);
        float L = 0;
        for (int d = 0; d < D; ++d) o[h * D + d] = 0.f;
        for (int64_t c = 0; c < sp.n_chunks; ++c) {
          const float* st = slots + size_t(sp.first_slot + c) * slot_f;
          const float w = std::exp(st[h] - M);
          L += st[GP + h] * w;
          const float* acc = st + 2 * GP + size_t(h) * D;
          for (int d = 0; d < D; ++d) o[h * D + d] += acc[d] * w;
        }
        const float inv = 1.f / L;
        for (int d = 0; d < D; ++d) o[h * D + d] *= inv;
      }
    }
  }
}

}  // namespace fd
