// CPU decode attention over a paged KV-cache: one query token per sequence against its whole cache.
// The R-worker's hot loop. Scalar reference, AVX2+F16C and AVX-512 paths; fp16, int8, int4 KV.
//
// KV-cache layout (shared with the R-worker's KV store, fastdecode/rworker/kv_store.*):
// a sequence's cache at one layer is a list of blocks of kKVBlockTokens tokens. Each *full* block is
// stored in the worker's KV dtype (layout: kv_block_bytes / kv_quantize_block below); the newest,
// partially filled block (the "tail", 0..31 tokens) is always fp16 in the fp16 block layout:
//   K: [n_kv_heads][kKVBlockTokens][head_dim] fp16, then V: same, i.e. 2*n_kv_heads*32*head_dim halves.
// For the fp16 KV dtype a full block has exactly the tail's layout.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace fd {

constexpr int kKVBlockTokens = 32;

enum class KVDType : uint8_t { F16 = 0, I8 = 1, I4 = 2 };
std::string_view kv_dtype_name(KVDType t);        // "fp16", "int8", "int4"
KVDType kv_dtype_from_name(std::string_view name);  // throws fd::Error on anything else

// Bytes of one full block of `dtype` (K and V, all kv heads, 32 tokens), including scales/offsets.
size_t kv_block_bytes(KVDType dtype, int n_kv_heads, int head_dim);
// Bytes of one fp16 block (the tail layout).
inline size_t kv_fp16_block_bytes(int n_kv_heads, int head_dim) {
  return size_t(2) * n_kv_heads * kKVBlockTokens * head_dim * 2;
}
// Converts a full fp16 block (tail layout, 32 valid tokens) into a block of `dtype` at `out`
// (kv_block_bytes bytes). For F16 it is a copy. Vectorised at the AVX-512 level when the CPU has it (the same
// bytes as the scalar code: kv_quantize_block_isa, declared below Isa, runs either for the tests).
void kv_quantize_block(KVDType dtype, const uint16_t* fp16_block, void* out, int n_kv_heads, int head_dim);
// The inverse, for tests and debugging: writes the fp16 block the quantized block stands for.
void kv_dequantize_block(KVDType dtype, const void* block, uint16_t* fp16_block, int n_kv_heads, int head_dim);
// The same in fp32, without the final rounding to fp16: the values the kernels actually compute on
// (scale*code [+ offset] with the stored scales/offsets). Tests build their golden reference from it;
// rounding to fp16 (as kv_dequantize_block must) would add ~5e-4 relative noise to an exact check.
void kv_dequantize_block_f32(KVDType dtype, const void* block, float* out, int n_kv_heads, int head_dim);

// One sequence's cache at one layer.
struct SeqKVView {
  const void* const* blocks = nullptr;  // n_full full blocks, each in the KV dtype's layout
  int32_t n_full = 0;
  const uint16_t* tail = nullptr;       // fp16 block layout; n_tail valid tokens; null when n_tail == 0
  int32_t n_tail = 0;
  int64_t n_tokens() const { return int64_t(n_full) * kKVBlockTokens + n_tail; }
};

// AVX512VNNI: AVX-512 plus the VNNI integer dot product (VPDPBUSD); at this level int8/int4 KV use the
// integer-dot kernel (int8 query, 7-bit value weights) by default (QueryQuant below), fp16 KV is the AVX-512 path.
enum class Isa { Scalar = 0, AVX2 = 1, AVX512 = 2, AVX512VNNI = 3 };
std::string_view isa_name(Isa isa);          // "scalar", "avx2", "avx512", "avx512vnni"
Isa isa_from_name(std::string_view name);    // throws fd::Error
bool isa_supported(Isa isa);                 // CPUID (and OS support for the registers)
Isa best_isa();                              // the fastest supported
// kv_quantize_block on one ISA's code: Scalar and AVX2 run the scalar quantizer, AVX512 and AVX512VNNI the
// AVX-512 one. Throws if the CPU lacks `isa`.
void kv_quantize_block_isa(KVDType dtype, const uint16_t* fp16_block, void* out, int n_kv_heads, int head_dim, Isa isa);

// How int8/int4 blocks take the query (fp16 blocks and the fp16 tail always use the fp32 query):
//   F32   fp32 query, keys dequantized in registers, fp32 p . V (exact math on the stored codes)
//   I8    both dot products on integers: q * scale quantized per query head to int8 (127 / amax, round to
//         nearest even; for int4 keys with the block's per-channel key scale folded in, per block), q . K as
//         integer dot products; the value weights p * (the token's value scale) quantized to 7 bits per block
//         and head (int4: per 32-channel group), p . V as integer dot products; both rescaled in fp32. Adds
//         the two roundings' error (docs/RWORKER.md states it, measured by test_decode_attention's
//         QuantizedQueryAddedError and artifacts/accuracy/). Every ISA has it with the same codes: scalar (the
//         twin), AVX2 and AVX-512 (VPMADDUBSW), AVX512VNNI (VPDPBUSD).
//   Auto  I8 at the AVX512VNNI level (faster there: decode_attention.cpp), F32 below it.
enum class QueryQuant : uint8_t { Auto = 0, F32 = 1, I8 = 2 };
bool query_is_q8(QueryQuant qq, KVDType dtype, Isa isa);  // what Auto resolves to for this call
QueryQuant query_quant_from_name(std::string_view name);   // "auto", "fp32", "int8"; ConfigError otherwise
std::string_view query_quant_name(QueryQuant qq);

struct DecodeAttentionParams {
  KVDType dtype = KVDType::F16;
  int n_seq = 0;
  int n_heads = 0;      // query heads; n_heads % n_kv_heads == 0 (GQA group = n_heads / n_kv_heads)
  int n_kv_heads = 0;
  int head_dim = 0;     // multiple of 32, at most 256
  float scale = 0;      // usually 1/sqrt(head_dim)
  const SeqKVView* seqs = nullptr;  // [n_seq]; every sequence has >= 1 token
  const float* q = nullptr;         // [n_seq, n_heads, head_dim]
  float* o = nullptr;               // [n_seq, n_heads, head_dim]
  QueryQuant query = QueryQuant::Auto;
  // Software prefetch distance of the SIMD kernels, in blocks: while block b of a (sequence, kv head) is
  // read, block b + prefetch_blocks is requested into L2 (0: none; at most kMaxPrefetchBlocks). The scalar
  // twin does not prefetch. Results do not depend on it; speed does (docs/RWORKER.md).
  int prefetch_blocks = 1;
  // KV heads one task reads, block by block (each block: head after head), so that a thread's reads of a block are
  // runs of heads_per_task heads' K (and V) rather than one head's: 0 = auto (the fewest heads, a divisor of
  // n_kv_heads, whose bytes of a block reach 8 KiB, else the most that divide it: fp16 and int8 1, int4 2 at
  // head_dim 128), else a divisor of n_kv_heads, at most kMaxHeadsPerTask. Results do not depend on it
  // (docs/RWORKER.md says why it exists).
  int heads_per_task = 0;
};
constexpr int kMaxPrefetchBlocks = 8;
constexpr int kMaxHeadsPerTask = 8;
// What heads_per_task = 0 resolves to for these params (p.heads_per_task when it is set).
int decode_attention_heads_per_task(const DecodeAttentionParams& p);

// Reusable scratch (partial softmax states of context splits); owned by the caller, one per worker.
struct DecodeAttentionWorkspace {
  std::vector<float> partial;
  std::vector<int64_t> index;
};

// o = softmax(q·Kᵀ·scale)·V per sequence and query head, fp32 accumulation, online softmax. Each KV
// head is read once for its whole query group. Work is split across `n_threads` OpenMP threads by KV
// bytes: long sequences are split along the context and the partial states merged, so one sequence
// with a long context uses every thread. Throws fd::Error on invalid params or an unsupported ISA.
void decode_attention(const DecodeAttentionParams& p, Isa isa, int n_threads, DecodeAttentionWorkspace& ws);

// Bytes of KV a call reads: sum over sequences of n_kv_heads*(n_full*kv_block_bytes/n_kv_heads
// + n_tail*head_dim*2*2), i.e. full blocks in the KV dtype plus the fp16 tail's valid tokens.
int64_t decode_attention_kv_bytes(const DecodeAttentionParams& p);

// The work split decode_attention uses for these params and thread count (validates p like it).
// A pair (a sequence and heads_per_task kv heads) is cut into chunks of whole blocks when it is longer than the chunk
// target; split pairs go through the merge pass. For tests, benchmarks and the R-worker's logs.
struct DecodeAttentionPlan {
  int64_t n_pairs = 0;             // n_seq * n_kv_heads / heads_per_task
  int64_t n_tasks = 0;             // chunks run under OpenMP (>= n_pairs)
  int64_t n_split_pairs = 0;       // pairs cut into more than one chunk
  int64_t chunk_target_bytes = 0;  // the size a chunk aims at
  int heads_per_task = 1;          // kv heads per pair (DecodeAttentionParams::heads_per_task, resolved)
};
DecodeAttentionPlan decode_attention_plan(const DecodeAttentionParams& p, int n_threads);

}  // namespace fd
