#include "fastdecode/spart/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fastdecode/core/dtype.h"
#include "fastdecode/parallel/comm.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/embed.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/qkv.h"
#include "kernels/cuda/sampling.h"

namespace fd {

namespace {

// The workspace given to cuBLAS per stream (set_blas_stream); cuBLASLt's algorithms are asked for within it.
constexpr size_t kBlasWorkspace = size_t(32) << 20;

// Uploads the concatenation of `parts` (fp32 host) as the 16-bit type t.
DeviceBuffer<uint16_t> upload_16(DType t, std::initializer_list<const std::vector<float>*> parts, size_t& bytes) {
  size_t n = 0;
  for (auto* p : parts) n += p->size();
  std::vector<uint16_t> h(n);
  size_t off = 0;
  for (auto* p : parts) {
    convert_from_f32(t, p->data(), h.data() + off, p->size());
    off += p->size();
  }
  DeviceBuffer<uint16_t> d(std::max<size_t>(n, 1));
  if (n) CUDA_CHECK(cudaMemcpy(d.get(), h.data(), n * 2, cudaMemcpyHostToDevice));
  bytes += n * 2;
  return d;
}

DeviceBuffer<float> upload_f32(std::initializer_list<const std::vector<float>*> parts, size_t& bytes) {
  std::vector<float> h;
  for (auto* p : parts) h.insert(h.end(), p->begin(), p->end());
  DeviceBuffer<float> d(std::max<size_t>(1, h.size()));
  if (!h.empty()) CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  bytes += h.size() * 4;
  return d;
}

}  // namespace

CudaModel::CudaModel(const ModelWeights& w, cudaStream_t stream, int sm_count_target, DType act, Communicator* tp)
    : cfg_(w.cfg), shard_(w.shard), tp_(tp && tp->size() > 1 ? tp : nullptr), stream_(stream), act_(act) {
  const ModelConfig& c = cfg_;
  const int64_t T = tp_ ? tp_->size() : 1;
  FD_CHECK(shard_.tp_size == T, "CUDA S-Part: weights of tensor part " << shard_.tp_rank << " of " << shard_.tp_size
                                                                       << " with a tensor group of " << T);
  FD_CHECK(!tp_ || shard_.tp_rank == tp_->rank(),
           "CUDA S-Part: weights of tensor rank " << shard_.tp_rank << " on group rank " << tp_->rank());
  cuda::check_act_dtype(act, "CUDA S-Part");
  act_cuda_ = act == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const auto upload_act = [act](std::initializer_list<const std::vector<float>*> parts, size_t& bytes) {
    return upload_16(act, parts, bytes);
  };
  CUBLAS_CHECK(cublasCreate(&blas_));
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  sm_count_target_ = sm_count_target;
  if (sm_count_target > 0) CUBLAS_CHECK(cublasSetSmCountTarget(blas_, sm_count_target));
  set_blas_stream(stream_);
  CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_, cudaEventDisableTiming));
  size_t& b = weight_bytes_;
  for (const LayerWeights& L : w.layers) {
    Layer d;
    d.wqkv = upload_act({&L.wq, &L.wk, &L.wv}, b);
    d.wo = upload_act({&L.wo}, b);
    d.wgu = c.arch == Arch::Llama ? upload_act({&L.w_gate, &L.w_up}, b) : upload_act({&L.w_up}, b);
    d.wdown = upload_act({&L.w_down}, b);
    d.attn_norm_w = upload_f32({&L.attn_norm_w}, b), d.mlp_norm_w = upload_f32({&L.mlp_norm_w}, b);
    // Each bias is uploaded where the model has it (OPT: all; Llama attention_bias: q/k/v and o; qwen2:
    // q/k/v only); the kernels get null for the others.
    d.has_qkv_bias = !L.bq.empty();
    d.has_o_bias = !L.bo.empty();
    d.has_down_bias = !L.b_down.empty();
    if (c.arch == Arch::OPT)
      d.attn_norm_b = upload_f32({&L.attn_norm_b}, b), d.mlp_norm_b = upload_f32({&L.mlp_norm_b}, b);
    if (d.has_qkv_bias) d.bqkv = upload_f32({&L.bq, &L.bk, &L.bv}, b);
    if (d.has_o_bias) d.bo = upload_f32({&L.bo}, b);
    if (!L.b_up.empty()) d.b_up = upload_f32({&L.b_up}, b);
    // Llama mlp_bias: [gate|up] biases beside the fused [gate|up] GEMM's columns (silu_mul adds them)
    if (c.arch == Arch::Llama && !L.b_gate.empty()) d.b_gu = upload_f32({&L.b_gate, &L.b_up}, b);
    if (d.has_down_bias) d.b_down = upload_f32({&L.b_down}, b);
    layers_.push_back(std::move(d));
  }
  embed_ = upload_act({&w.embed}, b);
  if (!w.pos_embed.empty()) pos_embed_ = upload_act({&w.pos_embed}, b);
  if (!w.lm_head.empty()) lm_head_ = upload_act({&w.lm_head}, b);
  final_norm_w_ = upload_f32({&w.final_norm_w}, b);
  if (!w.final_norm_b.empty()) final_norm_b_ = upload_f32({&w.final_norm_b}, b);
  // OPT's projected embeddings (word_embed_proj_dim P != H, opt-350m): project_in [H, P] on the embedding's side,
  // project_out [P, H] before the head (each on the stages that hold them; whole on every tensor rank).
  if (!w.project_in.empty()) project_in_ = upload_act({&w.project_in}, b);
  if (!w.project_out.empty()) project_out_ = upload_act({&w.project_out}, b);
  const std::vector<float> inv = rope_inv_freq(c);  // the reference's frequencies (cfg.rope)
  rope_scale_ = rope_attention_scaling(c);
  inv_freq_ = upload_f32({&inv}, b);
  // The uploads above are synchronous copies on the legacy stream; work on `stream_` (non-blocking, maybe
  // a green context's) is not ordered after them, so wait for them here.
  CUDA_CHECK(cudaDeviceSynchronize());
}

// An explicit workspace per stream: cuBLAS then never allocates inside a step (required under graph capture), and
// GEMMs on two streams never share one. cublasSetStream resets the handle to its own pool: set ours after it.
void CudaModel::set_blas_stream(cudaStream_t s) {
  CUBLAS_CHECK(cublasSetStream(blas_, s));
  DeviceBuffer<uint8_t>& w = blas_workspaces_[s];
  w.resize(kBlasWorkspace);
  CUBLAS_CHECK(cublasSetWorkspace(blas_, w.get(), w.size()));
}

void CudaModel::use_stream(cudaStream_t s) {
  if (s == stream_) return;
  FD_CHECK(!tp_, "CUDA S-Part: one stream under tensor parallelism");
  stream_ = s;
  set_blas_stream(s);
}

CudaModel::~CudaModel() {
  for (auto& [p, l] : lt_plans_) {
    if (l.desc) cublasLtMatmulDescDestroy(l.desc);
    for (auto m : {l.a, l.b, l.c})
      if (m) cublasLtMatrixLayoutDestroy(m);
  }
  if (lt_) cublasLtDestroy(lt_);
  if (blas_) cublasDestroy(blas_);
  if (staging_done_) cudaEventDestroy(staging_done_);
  if (staging_) cudaFreeHost(staging_);
  if (tp_stage_) cudaFreeHost(tp_stage_);
}

float* CudaModel::host_stage(size_t floats) const {
  const size_t bytes = std::max<size_t>(floats * 4, 1 << 16);
  if (tp_stage_bytes_ < bytes) {
    if (tp_stage_) cudaFreeHost(tp_stage_);
    tp_stage_ = nullptr;
    tp_stage_bytes_ = 0;
    CUDA_CHECK(cudaMallocHost(&tp_stage_, bytes));
    tp_stage_bytes_ = bytes;
  }
  return static_cast<float*>(tp_stage_);
}

void CudaModel::all_reduce(float* buf, int64_t n) const {
  if (tp_->device_buffers()) {
    tp_->all_reduce_sum(buf, size_t(n), CommType::F32, stream_);
    return;
  }
  float* h = host_stage(size_t(n));
  CUDA_CHECK(cudaMemcpyAsync(h, buf, size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  tp_->all_reduce_sum(h, size_t(n), CommType::F32);
  CUDA_CHECK(cudaMemcpyAsync(buf, h, size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // h is reused by the next call
}

void CudaModel::all_gather(const float* in, float* out, int64_t n) const {
  if (tp_->device_buffers()) {
    tp_->all_gather(in, out, size_t(n), CommType::F32, stream_);
    return;
  }
  const int64_t T = tp_->size();
  float* h = host_stage(size_t(n * (T + 1)));  // [T][n] gathered, then this rank's n
  float* mine = h + T * n;
  CUDA_CHECK(cudaMemcpyAsync(mine, in, size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  tp_->all_gather(mine, h, size_t(n), CommType::F32);
  CUDA_CHECK(cudaMemcpyAsync(out, h, size_t(n * T) * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::upload(const std::vector<Upload>& parts) const {
  size_t total = 0;
  for (const Upload& u : parts) total += (u.bytes + 15) / 16 * 16;
  if (total == 0) return;
  CUDA_CHECK(cudaEventSynchronize(staging_done_));  // the staging buffer's previous copies are done
  if (staging_bytes_ < total) {
    if (staging_) cudaFreeHost(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    CUDA_CHECK(cudaMallocHost(&staging_, std::max<size_t>(total, 1 << 16)));
    staging_bytes_ = std::max<size_t>(total, 1 << 16);
  }
  size_t off = 0;
  for (const Upload& u : parts) {
    if (u.bytes == 0) continue;
    char* at = static_cast<char*>(staging_) + off;
    std::memcpy(at, u.src, u.bytes);
    CUDA_CHECK(cudaMemcpyAsync(u.dst, at, u.bytes, cudaMemcpyHostToDevice, stream_));
    off += (u.bytes + 15) / 16 * 16;
  }
  CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
}

void CudaModel::sample(DevActs& a, int64_t n, const std::vector<SamplingParams>& params,
                       const std::vector<uint64_t>& request_ids, const std::vector<uint64_t>& steps, int32_t* out,
                       const std::vector<int32_t>& record, float* recorded) const {
  const int64_t V = cfg_.vocab_size;
  FD_CHECK(params.size() >= size_t(n), "sample: sampling parameters per row");
  for (int32_t r : record) FD_CHECK(r >= 0 && r < n, "sample: record index " << r << " out of range");
  bool greedy = true, uniform = true;
  for (int64_t i = 0; i < n; ++i) {
    const SamplingParams& p = params[size_t(i)];
    greedy = greedy && p.greedy();
    uniform = uniform && p.temperature == params[0].temperature && p.top_k == params[0].top_k &&
              p.top_p == params[0].top_p && p.seed == params[0].seed;
  }
  if (!greedy) {
    FD_CHECK(request_ids.size() >= size_t(n) && steps.size() >= size_t(n), "sample: an id and a step per row");
    a.request_ids.resize(size_t(std::max<int64_t>(n, 1))), a.steps.resize(size_t(std::max<int64_t>(n, 1)));
    upload(a.request_ids.get(), request_ids.data(), size_t(n) * 8);
    upload(a.steps.get(), steps.data(), size_t(n) * 8);
  }
  if (!greedy && !uniform) {  // per-row parameters, checked on the host as sample_token checks them
    std::vector<cuda::sampling::RowDraw> d;
    for (int64_t i = 0; i < n; ++i) d.push_back(cuda::sampling::row_draw(V, params[size_t(i)]));
    a.draws.resize(size_t(n) * sizeof(cuda::sampling::RowDraw));
    upload(a.draws.get(), d.data(), d.size() * sizeof(cuda::sampling::RowDraw));
  }
  logits(a, n);
  if (greedy) {
    cuda::argmax_rows(a.logits.get(), n, V, a.out_tokens.get(), stream_);
  } else if (uniform) {
    cuda::sample_rows(a.logits.get(), n, V, params[0], a.request_ids.get(), a.steps.get(), a.out_tokens.get(), stream_);
  } else {
    cuda::sample_rows(a.logits.get(), n, V, reinterpret_cast<const cuda::sampling::RowDraw*>(a.draws.get()),
                      a.request_ids.get(), a.steps.get(), a.out_tokens.get(), stream_);
  }
  CUDA_CHECK(cudaMemcpyAsync(out, a.out_tokens.get(), size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
  download_logits(a, record, recorded);
}

void CudaModel::download_logits(const DevActs& a, const std::vector<int32_t>& record, float* recorded) const {
  const size_t V = size_t(cfg_.vocab_size);
  FD_CHECK(record.empty() || recorded, "sample: rows to record but nowhere to put them");
  // One copy per run of consecutive rows (they land consecutively in `recorded` too).
  for (size_t k = 0; k < record.size();) {
    size_t e = k + 1;
    while (e < record.size() && record[e] == record[e - 1] + 1) ++e;
    CUDA_CHECK(cudaMemcpyAsync(recorded + k * V, a.logits.get() + size_t(record[k]) * V, (e - k) * V * 4,
                               cudaMemcpyDeviceToHost, stream_));
    k = e;
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool GraphCache::capture(uint64_t key, const std::function<void()>& body) {
  if (graphs_.count(key)) return false;
  cudaGraph_t g = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    cudaStreamEndCapture(s_, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(s_, &g));
  cudaGraphExec_t e = nullptr;
  const cudaError_t r = cudaGraphInstantiate(&e, g, 0);
  cudaGraphDestroy(g);
  CUDA_CHECK(r);
  graphs_.emplace(key, e);
  CUDA_CHECK(cudaGraphUpload(e, s_));
  return true;
}

void GraphCache::run(uint64_t key, const std::function<void()>& body) {
  capture(key, body);
  CUDA_CHECK(cudaGraphLaunch(graphs_.at(key), s_));
}

void GraphCache::clear() {
  for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
}

void CudaModel::ensure(DevActs& a, int64_t T, int64_t capacity) const {
  const ModelConfig& c = cfg_;
  a.T = T;
  const int64_t want = std::max<int64_t>({T, capacity, 1});
  if (want <= a.capacity) return;
  a.capacity = want;
  ++a.generation;
  const size_t t = size_t(want), H = size_t(c.hidden_size), I = size_t(c.intermediate_size);
  const size_t qd = size_t(c.q_dim()), kvd = size_t(c.kv_dim());
  a.x.resize(t * H), a.h16.resize(t * H);
  a.qkv16.resize(t * (qd + 2 * kvd)), a.q.resize(t * qd), a.att.resize(t * qd), a.a16.resize(t * qd), a.q16.resize(t * qd);
  a.k.resize(t * kvd), a.v.resize(t * kvd), a.k16.resize(t * kvd), a.v16.resize(t * kvd);
  a.gu16.resize(t * 2 * I), a.i16.resize(t * I);
  if (c.has_projections()) a.e32.resize(t * size_t(c.embed_dim())), a.e16.resize(t * size_t(c.embed_dim()));
  a.tokens.resize(t), a.rows.resize(t), a.out_tokens.resize(t), a.pos.resize(t), a.starts.resize(t + 1);
}

void CudaModel::embed(DevActs& a) const {
  // Tensor parallel: this rank's vocabulary rows (0 for other tokens), OPT's learned positions on rank 0 only: the sum
  // over the ranks is the embedding, exactly (one non-zero term besides the position).
  const int64_t vb = tp_ ? shard_.vocab_begin : 0, ve = tp_ ? shard_.vocab_end : INT64_MAX;
  const bool pos = pos_embed_.size() > 1 && (!tp_ || tp_->rank() == 0);
  const void* pt = pos ? pos_embed_.get() : nullptr;
  if (!cfg_.has_projections()) {
    cuda::embed(a.tokens.get(), a.pos.get(), embed_.get(), pt, act_, 2, a.T, cfg_.hidden_size, a.x.get(), stream_, vb, ve);
  } else {
    // OPT's projected embeddings: x = positions + project_in(embed[token]); the [T, P] rows go through 16 bits (exact:
    // the table is 16-bit) into the GEMM, which adds its fp32 product into x. Linear, so masked rows sum correctly.
    const int64_t P = cfg_.embed_dim();
    cuda::embed(a.tokens.get(), a.pos.get(), embed_.get(), nullptr, act_, 0, a.T, P, a.e32.get(), stream_, vb, ve);
    cuda::cast(a.e32.get(), DType::F32, a.e16.get(), act_, a.T * P, stream_);
    cuda::embed(a.tokens.get(), a.pos.get(), nullptr, pt, act_, 2, a.T, cfg_.hidden_size, a.x.get(), stream_);
    gemm(a.e16.get(), a.T, P, project_in_.get(), cfg_.hidden_size, a.x.get(), true, 1.0f);
  }
  if (tp_) all_reduce(a.x.get(), a.T * cfg_.hidden_size);
}

void CudaModel::norm(float* x, const float* add_bias, const float* w, const float* b, int64_t T, void* out,
                     const int32_t* rows) const {
  if (cfg_.arch == Arch::Llama)
    cuda::rmsnorm(x, add_bias, w, float(cfg_.norm_eps), T, cfg_.hidden_size, out, act_, stream_, rows);
  else
    cuda::layernorm(x, add_bias, w, b, float(cfg_.norm_eps), T, cfg_.hidden_size, out, act_, stream_, rows);
}

void CudaModel::attention_from_f32(DevActs& a) const {
  cuda::cast(a.att.get(), DType::F32, a.a16.get(), act_, a.T * cfg_.q_dim(), stream_);
}

void CudaModel::gemm(const void* x, int64_t T, int64_t in, const void* W, int64_t out, void* y, bool y_fp32,
                     float beta) const {
  gemm_with(table_ ? table_->find({out, in, T, act_, y_fp32, beta != 0.0f}) : -1, x, T, in, W, out, y, y_fp32, beta);
}

const CudaModel::LtPlan& CudaModel::lt_plan(const GemmProblem& p) const {
  auto it = lt_plans_.find(p);
  if (it != lt_plans_.end()) return it->second;
  LtPlan& l = lt_plans_[p];
  const cudaDataType_t yt = p.y_fp32 ? CUDA_R_32F : act_cuda_;
  // The same product as cublasGemmEx below: column-major y^T [out, T] = W^T [out, in] · x^T [in, T].
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&l.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l.a, act_cuda_, uint64_t(p.in), uint64_t(p.out), int64_t(p.in)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l.b, act_cuda_, uint64_t(p.in), uint64_t(p.rows), int64_t(p.in)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l.c, yt, uint64_t(p.out), uint64_t(p.rows), int64_t(p.out)));
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kBlasWorkspace,
                                                    sizeof kBlasWorkspace));
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, l.desc, l.a, l.b, l.c, l.c, pref, 16, l.algos, &l.n);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) l.n = 0;  // none offered: gemm_with runs cuBLAS's default
  return l;
}

int CudaModel::gemm_algos(const GemmProblem& p) const { return lt_plan(p).n; }

// Row-major y = x · W^T as column-major: Y^T (out x T) = op(W) · X^T with W viewed as [in x out] col-major.
void CudaModel::gemm_with(int algo, const void* x, int64_t T, int64_t in, const void* W, int64_t out, void* y,
                          bool y_fp32, float beta) const {
  const float one = 1.0f;
  if (algo >= 0) {
    const LtPlan& l = lt_plan({out, in, T, act_, y_fp32, beta != 0.0f});
    if (algo < l.n) {
      void* ws = blas_workspaces_.at(stream_).get();
      CUBLAS_CHECK(cublasLtMatmul(lt_, l.desc, &one, W, l.a, x, l.b, &beta, y, l.c, y, l.c, &l.algos[algo].algo, ws,
                                  kBlasWorkspace, stream_));
      ++lt_gemms_;
      return;
    }
  }
  CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(T), int(in), &one, W, act_cuda_, int(in), x,
                            act_cuda_, int(in), &beta, y, y_fp32 ? CUDA_R_32F : act_cuda_, int(out), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

void CudaModel::use_gemm_table(std::shared_ptr<const GemmTable> table) {
  table_.reset();
  table_note_.clear();
  table_file_ = table ? table->source : "";
  if (!table) return;
  cudaDeviceProp prop{};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const int64_t version = int64_t(cublasLtGetVersion());
  if (table->device != prop.name)
    table_note_ = "tuned on " + table->device + ", this is " + prop.name + ": cuBLAS's default algorithms";
  else if (table->cublaslt_version != version)
    table_note_ = "tuned with cuBLASLt " + std::to_string(table->cublaslt_version) + ", this is " +
                  std::to_string(version) + ": cuBLAS's default algorithms";
  else if (sm_count_target_ > 0)
    table_note_ = "a green context of " + std::to_string(sm_count_target_) +
                  " SMs (the table is tuned at all SMs): cuBLAS's default algorithms";
  else
    table_ = std::move(table);
}

std::string CudaModel::gemm_table_describe() const {
  if (table_) return "GEMM algorithms from " + table_file_ + " (" + std::to_string(table_->size()) + " problems; cuBLAS's "
                     "default for the others)";
  return table_note_.empty() ? "cuBLAS's default GEMM algorithms" : "GEMM table " + table_file_ + ": " + table_note_;
}

json CudaModel::gemm_table_info() const {
  json j = {{"file", table_file_.empty() ? json(nullptr) : json(table_file_)}, {"used", table_ != nullptr},
            {"entries", table_ ? table_->size() : 0}};
  if (!table_note_.empty()) j["note"] = table_note_;
  return j;
}

void CudaModel::attention_input(DevActs& a, int layer, unsigned outputs, const KvCacheRows* cache) const {
  const ModelConfig& c = cfg_;
  const Layer& L = layers_[size_t(layer)];
  const int64_t T = a.T, H = c.hidden_size, ld = c.q_dim() + 2 * c.kv_dim();
  if (c.pre_norm()) norm(a.x.get(), nullptr, L.attn_norm_w.get(), L.attn_norm_b.get(), T, a.h16.get());
  else cuda::cast(a.x.get(), DType::F32, a.h16.get(), act_, T * H, stream_);  // post-LN: the stream is normalized
  gemm(a.h16.get(), T, H, L.wqkv.get(), ld, a.qkv16.get());
  const bool f32 = outputs & kF32, f16 = outputs & kF16;
  cuda::qkv_post({.qkv = a.qkv16.get(),
                  .dtype = act_,
                  .bias = L.has_qkv_bias ? L.bqkv.get() : nullptr,
                  .pos = a.pos.get(),
                  .inv_freq = c.arch == Arch::Llama ? inv_freq_.get() : nullptr,
                  .rope_scale = rope_scale_,
                  .T = T,
                  .Hq = c.num_heads,
                  .Hkv = c.num_kv_heads,
                  .D = c.head_dim,
                  .q = f32 ? a.q.get() : nullptr,
                  .k = f32 && !cache ? a.k.get() : nullptr,
                  .v = f32 && !cache ? a.v.get() : nullptr,
                  .q16 = f16 ? a.q16.get() : nullptr,
                  .k16 = cache ? cache->k_cache : f16 ? a.k16.get() : nullptr,
                  .v16 = cache ? cache->v_cache : f16 ? a.v16.get() : nullptr,
                  .slots = cache ? cache->slots : nullptr,
                  .max_ctx = cache ? cache->max_ctx : 0},
                 stream_);
}

void CudaModel::attention_output_and_mlp(DevActs& a, int layer) const {
  const ModelConfig& c = cfg_;
  const Layer& L = layers_[size_t(layer)];
  const int64_t T = a.T, H = c.hidden_size, I = c.intermediate_size, qd = c.q_dim();
  // Tensor parallel: rank 0 adds its share and the bias to x, the others write their share alone; the sum
  // over the ranks is then x + o-proj + bias (the bias lives on rank 0 only: shard.cpp).
  const float beta = tp_ && tp_->rank() != 0 ? 0.0f : 1.0f;
  gemm(a.a16.get(), T, qd, L.wo.get(), H, a.x.get(), true, beta);  // x += o-proj
  if (tp_) {
    if (L.has_o_bias) cuda::add_bias_rows(a.x.get(), L.bo.get(), T, H, stream_);
    all_reduce(a.x.get(), T * H);
  }
  // (+ the o-proj bias, stored back into x), then the MLP's norm, in one pass. Post-LayerNorm OPT: x = the attention
  // LayerNorm of it (stored back), which is also the MLP's input.
  const float* bo = L.has_o_bias && !tp_ ? L.bo.get() : nullptr;
  if (c.pre_norm()) norm(a.x.get(), bo, L.mlp_norm_w.get(), L.mlp_norm_b.get(), T, a.h16.get());
  else
    cuda::layernorm(a.x.get(), bo, L.attn_norm_w.get(), L.attn_norm_b.get(), float(c.norm_eps), T, H, a.h16.get(), act_,
                    stream_, nullptr, true);
  if (c.arch == Arch::Llama) {
    gemm(a.h16.get(), T, H, L.wgu.get(), 2 * I, a.gu16.get());
    cuda::silu_mul(a.gu16.get(), act_, T, I, a.i16.get(), stream_, L.b_gu.size() ? L.b_gu.get() : nullptr);
  } else {
    gemm(a.h16.get(), T, H, L.wgu.get(), I, a.gu16.get());
    cuda::relu_bias(a.gu16.get(), act_, L.b_up.get(), T, I, a.i16.get(), stream_);
  }
  gemm(a.i16.get(), T, I, L.wdown.get(), H, a.x.get(), true, beta);  // x += down-proj
  if (L.has_down_bias) cuda::add_bias_rows(a.x.get(), L.b_down.get(), T, H, stream_);
  if (tp_) all_reduce(a.x.get(), T * H);
  if (!c.pre_norm())  // post-LayerNorm: x = the MLP LayerNorm of the residual sum (h16 gets it too, unread)
    cuda::layernorm(a.x.get(), nullptr, L.mlp_norm_w.get(), L.mlp_norm_b.get(), float(c.norm_eps), T, H, a.h16.get(),
                    act_, stream_, nullptr, true);
}

void CudaModel::layer_gemms_only(DevActs& a, int layer) const {
  const ModelConfig& c = cfg_;
  const Layer& L = layers_[size_t(layer)];
  const int64_t T = a.T, H = c.hidden_size, I = c.intermediate_size, qd = c.q_dim();
  // Each GEMM reads what the layer gives it (h16: the norm's output; a16: the attention's; i16: the
  // activation's); the o and down outputs go to gu16, which none of them reads. Written into h16, they became the
  // next GEMM's input: [gate|up] ran on zeros (o of a zeroed a16), 110.8 us against the layer's 127.0 at B = 512.
  gemm(a.h16.get(), T, H, L.wqkv.get(), qd + 2 * c.kv_dim(), a.qkv16.get());
  gemm(a.a16.get(), T, qd, L.wo.get(), H, a.gu16.get());
  gemm(a.h16.get(), T, H, L.wgu.get(), c.arch == Arch::Llama ? 2 * I : I, a.gu16.get());
  gemm(a.i16.get(), T, I, L.wdown.get(), H, a.gu16.get());
}

void CudaModel::logits(DevActs& a, int64_t n) const {
  const ModelConfig& c = cfg_;
  a.logits.resize(size_t(std::max<int64_t>(n, 1) * c.vocab_size));
  // The final norm of the rows the LM head reads, gathered as it reads them (post-LayerNorm OPT: no final norm).
  if (c.has_final_norm())
    norm(a.x.get(), nullptr, final_norm_w_.get(), final_norm_b_.size() ? final_norm_b_.get() : nullptr, n, a.h16.get(),
         a.rows.get());
  else
    cuda::rows_to_act(a.x.get(), a.rows.get(), n, c.hidden_size, a.h16.get(), act_, stream_);
  // The head's input: OPT's projected embeddings map the [n, H] rows to [n, P] first (project_out, into e16).
  const void* hin = a.h16.get();
  const int64_t hw = c.embed_dim();
  if (c.has_projections()) {
    gemm(a.h16.get(), n, c.hidden_size, project_out_.get(), hw, a.e16.get());
    hin = a.e16.get();
  }
  const void* head = lm_head_.size() ? lm_head_.get() : embed_.get();
  if (!tp_) {
    gemm(hin, n, hw, head, c.vocab_size, a.logits.get(), true);
    return;
  }
  // This rank's slice [v0, v1) of the vocabulary, padded to Vp columns, gathered rank-major [T][n][Vp], then
  // laid out as [n, V] (the last slice may be shorter) for the sampler.
  const int64_t V = c.vocab_size, vr = shard_.vocab_end - shard_.vocab_begin, T = tp_->size();
  const int64_t Vp = shard_.vocab_padded > 0 ? shard_.vocab_padded : vr, m = std::max<int64_t>(n, 1);
  a.lshard.resize(size_t(m * std::max<int64_t>(vr, 1))), a.lpad.resize(size_t(m * Vp)), a.lall.resize(size_t(T * m * Vp));
  if (vr > 0) gemm(hin, n, hw, head, vr, a.lshard.get(), true);
  CUDA_CHECK(cudaMemsetAsync(a.lpad.get(), 0, size_t(n * Vp) * 4, stream_));
  if (vr > 0 && n > 0)
    CUDA_CHECK(cudaMemcpy2DAsync(a.lpad.get(), size_t(Vp) * 4, a.lshard.get(), size_t(vr) * 4, size_t(vr) * 4, size_t(n),
                                 cudaMemcpyDeviceToDevice, stream_));
  all_gather(a.lpad.get(), a.lall.get(), n * Vp);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t cols = std::min(Vp, V - t * Vp);
    if (cols > 0 && n > 0)
      CUDA_CHECK(cudaMemcpy2DAsync(a.logits.get() + t * Vp, size_t(V) * 4, a.lall.get() + t * n * Vp, size_t(Vp) * 4,
                                   size_t(cols) * 4, size_t(n), cudaMemcpyDeviceToDevice, stream_));
  }
}

void CudaModel::prefill_forward(DevActs& a, int64_t n_seq, int64_t max_len, const std::function<void(int)>& store_kv,
                                bool embed_first) const {
  if (embed_first) embed(a);
  for (int l = 0; l < int(cfg_.num_layers); ++l) {
    attention_input(a, l, kF32 | kF16);
    store_kv(l);
    cuda::prefill_attention({.q = a.q.get(),
                             .k = a.k16.get(),
                             .v = a.v16.get(),
                             .starts = a.starts.get(),
                             .n_seq = n_seq,
                             .max_len = max_len,
                             .Hq = int(cfg_.num_heads),
                             .Hkv = int(cfg_.num_kv_heads),
                             .D = int(cfg_.head_dim),
                             .out = a.att.get()},
                            stream_);
    attention_from_f32(a);
    attention_output_and_mlp(a, l);
  }
}

}  // namespace fd
