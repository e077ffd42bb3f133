// The model's weight stages on a CUDA device (CUDA builds only; included by spart_cuda.cpp and the GPU-only
// engine). 16-bit weights and activations (GEMM inputs and outputs), fp16 or bf16 (the model's `act`
// type), fp32 accumulation inside the GEMMs (cuBLAS GemmEx, compute 32F), an fp32 residual stream, fp32
// logits. Fused GEMMs: one [q|k|v] projection and, for Llama, one [gate|up] projection. The o- and
// down-projections add their product straight into the fp32 residual (GEMM with an fp32 C and beta = 1),
// so no kernel reads and writes the residual just to add; the elementwise work after a GEMM is one
// kernel (bias + RoPE + split; norm; activation). (Tried: 16-bit o/down outputs added into x by the next norm, so
// that every GEMM is a 16-bit-output kernel: the layer ran 0-4 us slower at B = 64-1024 on the H200, the norms'
// extra reads costing more than the fp32-output GEMMs did; artifacts/stages/spart-residual-ab-d5980ce.)
// Work goes to one stream at a time: the constructor's, or the one use_stream() names last (the CUDA S-Part keeps a
// stream per mini-batch slot); nothing is allocated per step once a batch size (and a stream) has been seen.
// Tensor parallelism (a Communicator tp of size T > 1, weights = one rank's shard): the embedding is masked to
// the rank's vocabulary and all-reduced; rank 0 adds each residual branch (o, down) and its bias into x while
// the others write only their share, then x is all-reduced (every rank holds the same x); the LM head's
// vocabulary slices are all-gathered into the full logits. Device buffers go to the communicator on the
// stream when it takes them (nccl); otherwise through a pinned host copy (gloo), synchronising the stream.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fastdecode/core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "fastdecode/core/sampling.h"
#include "fastdecode/model/weights.h"
#include "fastdecode/spart/gemm_table.h"


namespace fd {

class Communicator;  // fastdecode/parallel/comm.h

// A device buffer of T, grown (never shrunk) by resize; freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  void resize(size_t n) {
    if (n <= n_) return;
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
    CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
    n_ = n;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Activations of one batch of T rows on the device. The *16 buffers hold the model's 16-bit activation
// type (fp16 or bf16), except q16/k16/v16, which are fp16 (the wire and the prefill attention's type).
struct DevActs {
  int64_t T = 0;
  int64_t capacity = 0;     // rows the buffers hold (ensure grows it)
  uint64_t generation = 0;  // bumped whenever ensure reallocates (graphs captured on older buffers are stale)
  DeviceBuffer<float> x, q, k, v, att, logits;
  DeviceBuffer<float> lshard, lpad, lall;  // tensor parallel: this rank's logits slice, padded, gathered
  DeviceBuffer<uint16_t> h16, a16, i16, qkv16, gu16;
  DeviceBuffer<float> e32;    // OPT's projected embeddings: the [T, P] embedding rows (fp32), before project_in
  DeviceBuffer<uint16_t> e16;  // ... the same in 16 bits; also the [n, P] head input after project_out
  DeviceBuffer<__half> q16, k16, v16;
  DeviceBuffer<int32_t> tokens, rows, starts, out_tokens;
  DeviceBuffer<int64_t> pos;
  DeviceBuffer<uint64_t> request_ids, steps;  // per sampled row: the draw's (request, step)
  DeviceBuffer<uint8_t> draws;  // per sampled row: its cuda::sampling::RowDraw, when the rows' sampling differs
};

// CUDA graphs of a stream's work, keyed by an integer: captured from `body` on first use, replayed
// after. The body must neither synchronise nor allocate (CudaModel's cuBLAS handle has a fixed workspace),
// and the buffers it touches must keep their addresses while the graph lives: clear() when they change.
// Decode batches of at most kMaxRows rows run from graphs, padded to a bucket: a power of two up to kPow2Rows
// rows, then a multiple of kRowStep (padding at most kRowStep - 1 rows, under 1/3 of a batch). Graphs pay where
// launches take time, and not only at small batches: the GPU-only decode step at B = 252 (Llama-2-7b, 2 layers)
// spent 0.26 of its 1.82 ms in launch gaps and host work eagerly (artifacts/stages/kernels-0a24775).
class GraphCache {
 public:
  static constexpr int64_t kMaxRows = 1024, kPow2Rows = 128, kRowStep = 64;
  static int64_t bucket(int64_t rows) {
    if (rows > kPow2Rows) return (rows + kRowStep - 1) / kRowStep * kRowStep;
    int64_t b = 1;
    while (b < rows) b *= 2;
    return b;
  }
  // Every bucket up to bucket(min(rows, kMaxRows)), largest first: the sizes a warm-up captures so that any decode
  // batch of at most `rows` rows finds its graph (none when rows < 1).
  static std::vector<int64_t> buckets_down(int64_t rows) {
    std::vector<int64_t> out;
    if (rows < 1) return out;
    for (int64_t b = bucket(std::min(rows, kMaxRows)); b >= 1; b = b > kPow2Rows ? b - kRowStep : b / 2) out.push_back(b);
    return out;
  }
  explicit GraphCache(cudaStream_t s) : s_(s) {}
  ~GraphCache() { clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  void run(uint64_t key, const std::function<void()>& body);
  // Captures and instantiates key's graph from `body` (and uploads it to the device) without launching it; nothing
  // when it exists. A warm-up: the first run() of that key then costs what later ones do. Returns whether it captured.
  bool capture(uint64_t key, const std::function<void()>& body);
  void clear();
  size_t size() const { return graphs_.size(); }
  bool has(uint64_t key) const { return graphs_.count(key) > 0; }  // captured already

 private:
  cudaStream_t s_;
  std::map<uint64_t, cudaGraphExec_t> graphs_;
};

class CudaModel {
 public:
  // Uploads the weights (as `act`: fp16 or bf16) to the current device; all work goes to `stream`.
  // sm_count_target > 0: the stream runs on that many SMs (a green context); cuBLAS sizes its grids for them.
  // tp: the tensor group (null or size 1: none); w must then be rank tp->rank()'s shard.
  CudaModel(const ModelWeights& w, cudaStream_t stream, int sm_count_target = 0, DType act = DType::F16,
            Communicator* tp = nullptr);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  cudaStream_t stream() const { return stream_; }
  // Later work goes to `s` (same device). Each stream has its own cuBLAS workspace (allocated here, at the first
  // use of s: never inside a graph capture) and the upload staging buffer waits on an event, so two streams' work
  // may run at once as long as they touch different DevActs. Not under tensor parallelism (one stream there: the
  // collectives of a group keep one order).
  void use_stream(cudaStream_t s);
  size_t weight_bytes() const { return weight_bytes_; }
  DType act_dtype() const { return act_; }

  // Sizes a's buffers for max(T, capacity) rows (allocates only when T exceeds what a has seen; then
  // a.generation changes) and sets a.T = T.
  void ensure(DevActs& a, int64_t T, int64_t capacity = 0) const;
  // a.x = embeddings of a.tokens at a.pos (both already on the device).
  void embed(DevActs& a) const;
  // q, k, v = projections of norm(a.x) (+ bias, + RoPE at a.pos), contiguous, into a.q/a.k/a.v (fp32)
  // and/or a.q16/a.k16/a.v16 (fp16) as `outputs` says.
  enum Outputs : unsigned { kF32 = 1, kF16 = 2 };
  // With `cache`: k and v go (fp16) straight into that KV-cache (cuda::QkvPostParams::slots) instead, and only q
  // comes out as `outputs` says (the GPU-only engine's decode: no fp32 k/v and no append_kv kernel).
  struct KvCacheRows {
    __half* k_cache;
    __half* v_cache;
    const int32_t* slots;  // [T] device
    int64_t max_ctx;
  };
  void attention_input(DevActs& a, int layer, unsigned outputs = kF32, const KvCacheRows* cache = nullptr) const;
  // a.x += o-proj(a.a16) (+ bias); a.x += MLP(norm(a.x)). a.a16 holds the attention output (act type).
  void attention_output_and_mlp(DevActs& a, int layer) const;
  // a.logits [n, V] = LM head of final-norm(a.x[a.rows[0..n)]).
  void logits(DevActs& a, int64_t n) const;
  // Next tokens for a.x[a.rows[0..n)], sampled on the device (only n token ids come down), row i as
  // fd::sample_token with params[i] and (request_ids[i], steps[i]): every row greedy -> an argmax; one
  // sampling for all rows -> cuda::sample_rows with it; else sample_rows with per-row parameters (a.draws).
  // record: row indices (ascending) whose fp32 logits rows also come down, to recorded[k * V] for the k-th
  // (nothing else is copied; recorded may be null when record is empty).
  void sample(DevActs& a, int64_t n, const std::vector<SamplingParams>& params,
              const std::vector<uint64_t>& request_ids, const std::vector<uint64_t>& steps, int32_t* out,
              const std::vector<int32_t>& record = {}, float* recorded = nullptr) const;
  // Copies rows `record` of a.logits (after logits() or sample()) to recorded[k * V], then synchronises.
  void download_logits(const DevActs& a, const std::vector<int32_t>& record, float* recorded) const;
  // Copies host → device through the pinned staging buffer (the sources may change once this returns). Many
  // copies in one call wait once for the buffer's previous copies and share it, each at a 16-byte offset.
  struct Upload {
    void* dst;
    const void* src;
    size_t bytes;
  };
  void upload(const std::vector<Upload>& parts) const;
  void upload(void* dst, const void* src, size_t bytes) const { upload({{dst, src, bytes}}); }
  // a.a16 = the fp32 attention output a.att (T rows) in the act type.
  void attention_from_f32(DevActs& a) const;
  // The whole prefill over packed prompts (a.tokens, a.pos, a.starts: n_seq + 1 row offsets, on the device;
  // max_len the longest prompt): embed (unless `embed_first` is false: a later pipeline stage, whose a.x came
  // from the stage before), then per layer the projections (fp32 and fp16), store_kv(layer) — the engine files
  // the prompt's K/V (a.k, a.v fp32) where its cache is —, causal attention over the packed fp16 K/V,
  // o-projection and MLP. The GPU engines differ only in store_kv.
  void prefill_forward(DevActs& a, int64_t n_seq, int64_t max_len, const std::function<void(int)>& store_kv,
                       bool embed_first = true) const;
  // The GEMMs of one layer alone ([q|k|v], o, [gate|up], down on a's buffers, all with 16-bit outputs):
  // the ceiling the S-Part layer is benchmarked against (fd-spart-bench).
  void layer_gemms_only(DevActs& a, int layer) const;
  // y[T, out] = x[T, in] · W[out, in]^T (+ beta · y), x and W of the act type, fp32 accumulation; y of the
  // act type or fp32 (y_fp32). The algorithm: the GEMM table's for this problem, else cuBLAS's default.
  void gemm(const void* x, int64_t T, int64_t in, const void* W, int64_t out, void* y, bool y_fp32 = false,
            float beta = 0.0f) const;

  // The GEMM table (gemm_table.h): each GEMM whose problem it lists runs that cuBLASLt algorithm. Not used (and
  // gemm_table_info() says why) when it was tuned on another device or cuBLASLt version, or when the model runs on
  // a green context (the table is tuned at all SMs). Null: none.
  void use_gemm_table(std::shared_ptr<const GemmTable> table);
  json gemm_table_info() const;  // {"file", "entries", "used", "note"}
  int64_t lt_gemms() const { return lt_gemms_; }  // GEMMs issued with a cuBLASLt algorithm so far (table or gemm_with)
  std::string gemm_table_describe() const;  // the same in words, for an engine's description
  // For tuning (fd-spart-bench --tune-gemm): how many algorithms cuBLASLt's heuristic offers for p (at most 16),
  // and the GEMM run with the i-th of them (-1: cuBLAS's default), as gemm() runs it.
  int gemm_algos(const GemmProblem& p) const;
  void gemm_with(int algo, const void* x, int64_t T, int64_t in, const void* W, int64_t out, void* y, bool y_fp32,
                 float beta) const;

 private:
  struct Layer {
    DeviceBuffer<uint16_t> wqkv, wo, wgu, wdown;  // act type; wgu: [gate|up] (Llama) or up (OPT)
    DeviceBuffer<float> attn_norm_w, attn_norm_b, mlp_norm_w, mlp_norm_b, bqkv, bo, b_up, b_down;
    DeviceBuffer<float> b_gu;  // Llama mlp_bias: [gate|up] (empty: none)
    bool has_qkv_bias = false, has_o_bias = false, has_down_bias = false;
  };
  // out (act type) = norm(x), after x += add_bias when given.
  // rows: the source row of each output row (null: the same row), as cuda::rmsnorm.
  void norm(float* x, const float* add_bias, const float* w, const float* b, int64_t T, void* out,
            const int32_t* rows = nullptr) const;
  // Tensor parallel: buf (device, n floats) = its sum over the group's ranks / out = [rank 0's in | ...].
  void all_reduce(float* buf, int64_t n) const;
  void all_gather(const float* in, float* out, int64_t n) const;
  float* host_stage(size_t floats) const;  // pinned, for communicators that take host buffers

  ModelConfig cfg_;
  WeightShard shard_;
  Communicator* tp_ = nullptr;  // size > 1 only
  mutable void* tp_stage_ = nullptr;  // pinned
  mutable size_t tp_stage_bytes_ = 0;
  cudaStream_t stream_;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;  // the GEMM table's algorithms
  int sm_count_target_ = 0;
  std::shared_ptr<const GemmTable> table_;  // null: none, or not usable here (table_note_ says why)
  std::string table_file_, table_note_;
  struct LtPlan {  // one problem's descriptors and the heuristic's algorithms, made at its first use
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulHeuristicResult_t algos[16];
    int n = 0;
  };
  mutable std::map<GemmProblem, LtPlan> lt_plans_;
  mutable int64_t lt_gemms_ = 0;
  const LtPlan& lt_plan(const GemmProblem& p) const;
  std::map<cudaStream_t, DeviceBuffer<uint8_t>> blas_workspaces_;  // per stream used
  void set_blas_stream(cudaStream_t s);
  std::vector<Layer> layers_;
  DeviceBuffer<uint16_t> embed_, pos_embed_, lm_head_, project_in_, project_out_;
  DType act_ = DType::F16;
  cudaDataType_t act_cuda_ = CUDA_R_16F;
  DeviceBuffer<float> final_norm_w_, final_norm_b_, inv_freq_;
  float rope_scale_ = 1.0f;  // rope_attention_scaling (yarn), applied to cos and sin
  size_t weight_bytes_ = 0;
  mutable void* staging_ = nullptr;  // pinned
  mutable size_t staging_bytes_ = 0;
  cudaEvent_t staging_done_ = nullptr;  // after the staging buffer's last copies (on whichever stream they went)
};

}  // namespace fd
