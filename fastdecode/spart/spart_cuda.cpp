// The CUDA S-Part backend: CudaModel's stages (fp16 weights, fused QKV and gate|up GEMMs, fp32
// accumulation and residual) with each slot's activations resident in device memory. Per layer only
// q/k/v go down and the attention output comes up, in the wire dtype, through pinned host buffers;
// sampling runs on the device, each row with its own parameters (only token ids come down, and the logits
// rows of the requests that record them).
// With cuda_graphs, the two stages between R-Part round trips (attention_input, attention_output_and_mlp)
// of a batch of at most GraphCache::kMaxRows rows are replayed from a graph per (slot, stage, layer,
// padded rows): one launch instead of five to eight, which is what such batches wait on.
#include <algorithm>
#include <cstring>

#include "fastdecode/parallel/comm.h"
#include "fastdecode/spart/cuda_model.h"
#include "fastdecode/spart/spart.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/green_context.h"

namespace fd {

namespace {

class CudaSPart : public SPart {
 public:
  CudaSPart(ModelWeights w, const CudaSPartOptions& o)
      : cfg_(w.cfg), device_(o.device), tp_(o.comms.tp && o.comms.tp->size() > 1 ? o.comms.tp : nullptr),
        graphs_on_(o.cuda_graphs && !tp_) {  // collectives inside captured stages: not under T > 1
    const auto devs = cuda_devices();
    if (devs.empty()) FD_THROW("CUDA S-Part: no CUDA device answers");
    if (device_ < 0 || size_t(device_) >= devs.size())
      FD_THROW_BAD_INPUT("CUDA S-Part: device " << device_ << " does not answer (" << devs.size() << " CUDA device(s))");
    CUDA_CHECK(cudaSetDevice(device_));
    device_name_ = devs[size_t(device_)].name;
    streams_ = std::make_unique<cuda::SmLimitedStreams>(o.sm_count, 1, device_);
    stream_ = streams_->stream(0);
    model_ = std::make_unique<CudaModel>(w, stream_, streams_->limited() ? streams_->sm_count() : 0, o.act, tp_);
    for (auto& e : copy_ev_) CUDA_CHECK(cudaEventCreate(&e));
  }
  ~CudaSPart() override {
    cudaSetDevice(device_);
    for (auto& e : copy_ev_) cudaEventDestroy(e);
    graphs_.clear();
    model_.reset();
    slots_.clear();
    mirrors_.clear();
  }

  const ModelConfig& config() const override { return cfg_; }
  std::string describe() const override {
    std::string tp;
    if (tp_) tp = ", tensor rank " + std::to_string(tp_->rank()) + " of " + std::to_string(tp_->size()) + " (" +
                  tp_->describe() + (tp_->device_buffers() ? "" : ", through pinned host copies") + ")";
    return "cuda (GPU " + std::to_string(device_) + ": " + device_name_ + ", " + std::to_string(streams_->sm_count()) +
           " SMs" + tp + "): " + std::string(dtype_name(model_->act_dtype())) +
           " weights and GEMM inputs, fp32 accumulation (cuBLAS GemmEx), fused QKV and gate|up GEMMs, residual added "
           "in the GEMM, activations resident on the device" + std::string(graphs_on_ ? ", CUDA graphs" : "");
  }

  HostBuffer alloc_host(size_t bytes) override {
    current();
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
    return HostBuffer(p, bytes, [](void* q) { cudaFreeHost(q); });
  }

  void embed(int slot, const int32_t* tokens, const int64_t* pos, int64_t T) override {
    current();
    DevActs& a = at(slot);
    const uint64_t gen = a.generation;
    model_->ensure(a, T, graphed(T) ? GraphCache::bucket(T) : 0);  // padding rows for the graphs
    if (a.generation != gen) graphs_for(slot).clear();             // captured on the old buffers
    model_->upload({{a.tokens.get(), tokens, size_t(T) * 4}, {a.pos.get(), pos, size_t(T) * 8}});
    model_->embed(a);
  }

  void attention_input(int slot, int layer, DType dt, void* q, void* k, void* v) override {
    current();
    DevActs& a = at(slot);
    const ModelConfig& c = cfg_;
    const size_t T = size_t(a.T), qd = size_t(c.q_dim()), kvd = size_t(c.kv_dim());
    FD_CHECK(dt == DType::F16 || dt == DType::F32, "CUDA S-Part: host tensors are fp32 or fp16");
    // A prefill (no q wanted on the host) also keeps fp32 q and fp16 k/v for prefill_attention.
    unsigned outputs = dt == DType::F16 ? CudaModel::kF16 : CudaModel::kF32;
    if (!q) outputs |= CudaModel::kF32 | CudaModel::kF16;
    run(slot, a, 0, layer, outputs, [&] { model_->attention_input(a, layer, outputs); });
    const size_t es = dt == DType::F16 ? 2 : 4;
    const void* dq = dt == DType::F16 ? static_cast<const void*>(a.q16.get()) : a.q.get();
    const void* dk = dt == DType::F16 ? static_cast<const void*>(a.k16.get()) : a.k.get();
    const void* dv = dt == DType::F16 ? static_cast<const void*>(a.v16.get()) : a.v.get();
    CUDA_CHECK(cudaEventRecord(copy_ev_[0], stream_));
    if (q) CUDA_CHECK(cudaMemcpyAsync(q, dq, T * qd * es, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(k, dk, T * kvd * es, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(v, dv, T * kvd * es, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaEventRecord(copy_ev_[1], stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    copies_.d2h_ns += elapsed_ns(copy_ev_[0], copy_ev_[1]);
  }

  CopyTimes copy_times() const override { return copies_; }

  void set_attention(int slot, DType dt, const std::vector<HostRows>& parts) override {
    current();
    DevActs& a = at(slot);
    const size_t qd = size_t(cfg_.q_dim()), es = dt == DType::F16 ? 2 : 4;
    const bool direct = dt == DType::F16 && model_->act_dtype() == DType::F16;
    size_t row = 0;
    CUDA_CHECK(cudaEventRecord(copy_ev_[2], stream_));
    for (const HostRows& p : parts) {
      FD_CHECK(row + size_t(p.rows) <= size_t(a.T), "set_attention: more rows than the slot holds");
      // fp16 parts land in the act buffer directly when the model's act type is fp16, else in q16 (free
      // now: q went to the R-workers) and are cast; fp32 parts land in att and are cast.
      void* dst = dt == DType::F32 ? static_cast<void*>(a.att.get() + row * qd)
                  : direct    ? static_cast<void*>(a.a16.get() + row * qd)
                              : static_cast<void*>(a.q16.get() + row * qd);
      CUDA_CHECK(cudaMemcpyAsync(dst, p.data, size_t(p.rows) * qd * es, cudaMemcpyHostToDevice, stream_));
      row += size_t(p.rows);
    }
    FD_CHECK(row == size_t(a.T), "set_attention: " << row << " rows for a slot of " << a.T);
    CUDA_CHECK(cudaEventRecord(copy_ev_[3], stream_));
    if (dt == DType::F32) model_->attention_from_f32(a);
    else if (!direct) cuda::cast(a.q16.get(), DType::F16, a.a16.get(), model_->act_dtype(), a.T * cfg_.q_dim(), stream_);
    // The sources may be freed once this returns (they are the R-workers' reply messages). Copied from them as they
    // are (pageable): gathering them into a pinned buffer first was measured no faster on the GPU machine (h2d 4.1-4.4
    // ms of an 8-layer step with the gather against 3.6 without; its one-core memcpy is the bound either way).
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    copies_.h2d_ns += elapsed_ns(copy_ev_[2], copy_ev_[3]);
  }

  void prefill_attention(int slot, const std::vector<int64_t>& starts) override {
    current();
    DevActs& a = at(slot);
    const ModelConfig& c = cfg_;
    std::vector<int32_t> s32(starts.begin(), starts.end());
    int64_t max_len = 0;
    for (size_t i = 0; i + 1 < starts.size(); ++i) max_len = std::max(max_len, starts[i + 1] - starts[i]);
    upload(a.starts.get(), s32.data(), s32.size() * 4);  // q (fp32), k16, v16: from attention_input(q = null)
    cuda::prefill_attention({.q = a.q.get(),
                             .k = a.k16.get(),
                             .v = a.v16.get(),
                             .starts = a.starts.get(),
                             .n_seq = int64_t(starts.size()) - 1,
                             .max_len = max_len,
                             .Hq = int(c.num_heads),
                             .Hkv = int(c.num_kv_heads),
                             .D = int(c.head_dim),
                             .out = a.att.get()},
                            stream_);
    model_->attention_from_f32(a);
  }

  void attention_output_and_mlp(int slot, int layer) override {
    current();
    DevActs& a = at(slot);
    run(slot, a, 1, layer, 0, [&] { model_->attention_output_and_mlp(a, layer); });
  }

  void logits(int slot, const std::vector<int32_t>& rows, float* out) override {
    current();
    DevActs& a = at(slot);
    upload(a.rows.get(), rows.data(), rows.size() * 4);
    model_->logits(a, int64_t(rows.size()));
    CUDA_CHECK(cudaMemcpyAsync(out, a.logits.get(), rows.size() * size_t(cfg_.vocab_size) * 4, cudaMemcpyDeviceToHost,
                               stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void prepare(int slot, const int64_t* pos, int64_t T) override {
    current();
    DevActs& a = at(slot);
    const uint64_t gen = a.generation;
    model_->ensure(a, T, graphed(T) ? GraphCache::bucket(T) : 0);
    if (a.generation != gen) graphs_for(slot).clear();
    upload(a.pos.get(), pos, size_t(T) * 8);
  }

  // The residual x [T, hidden] fp32 stays on the device: a communicator that takes device buffers gets it on
  // the stream; any other gets a pinned host copy (one per slot: it must stay unchanged until flush_sends).
  void send_residual(int slot, Communicator& c, int peer) override {
    current();
    DevActs& a = at(slot);
    const size_t bytes = size_t(a.T * cfg_.hidden_size) * 4;
    if (c.device_buffers()) {
      c.send(a.x.get(), bytes, peer, stream_);
      return;
    }
    HostBuffer& h = mirror(slot, bytes);
    CUDA_CHECK(cudaMemcpyAsync(h.data(), a.x.get(), bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    c.send(h.data(), bytes, peer);
  }
  void recv_residual(int slot, Communicator& c, int peer) override {
    current();
    DevActs& a = at(slot);
    const size_t bytes = size_t(a.T * cfg_.hidden_size) * 4;
    if (c.device_buffers()) {
      c.recv(a.x.get(), bytes, peer, stream_);
      return;
    }
    HostBuffer& h = mirror(slot, bytes);
    c.recv(h.data(), bytes, peer);
    CUDA_CHECK(cudaMemcpyAsync(a.x.get(), h.data(), bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  using SPart::sample;
  void sample(int slot, const std::vector<int32_t>& rows, const std::vector<SamplingParams>& params,
              const std::vector<uint64_t>& request_ids, const std::vector<uint64_t>& steps, int32_t* out,
              const std::vector<int32_t>& record, float* recorded) override {
    current();
    DevActs& a = at(slot);
    upload(a.rows.get(), rows.data(), rows.size() * 4);
    model_->sample(a, int64_t(rows.size()), params, request_ids, steps, out, record, recorded);
  }

 private:
  DevActs& at(int slot) {
    FD_CHECK(slot >= 0 && slot < 16, "S-Part slot " << slot << " out of range");
    while (slots_.size() <= size_t(slot)) slots_.push_back(std::make_unique<DevActs>());
    return *slots_[size_t(slot)];
  }
  void upload(void* dst, const void* src, size_t bytes) { model_->upload(dst, src, bytes); }
  // Rank threads change from step to step: every call makes this S-Part's device current first.
  void current() const { CUDA_CHECK(cudaSetDevice(device_)); }
  HostBuffer& mirror(int slot, size_t bytes) {
    HostBuffer& h = mirrors_[slot];
    if (h.size() < bytes) h = alloc_host(bytes);
    return h;
  }
  bool graphed(int64_t T) const { return graphs_on_ && T <= GraphCache::kMaxRows; }
  GraphCache& graphs_for(int slot) {
    auto& g = graphs_[slot];
    if (!g) g = std::make_unique<GraphCache>(stream_);
    return *g;
  }
  // Runs a stage's device work for a's rows: eagerly, or from the graph of (stage, layer, outputs,
  // padded rows), with a.T set to the padded rows while it runs (the padding rows compute on whatever
  // they hold; every stage is row-independent, and only a.T rows are read back).
  template <class F>
  void run(int slot, DevActs& a, unsigned stage, int layer, unsigned outputs, F&& body) {
    if (!graphed(a.T)) return body();
    const int64_t T = a.T, Tb = GraphCache::bucket(T);
    const uint64_t key = uint64_t(Tb) << 32 | uint64_t(layer) << 4 | uint64_t(outputs) << 1 | stage;
    a.T = Tb;
    try {
      graphs_for(slot).run(key, body);
    } catch (...) {
      a.T = T;
      throw;
    }
    a.T = T;
  }

  ModelConfig cfg_;
  int device_ = 0;
  Communicator* tp_ = nullptr;
  std::string device_name_;
  std::unique_ptr<cuda::SmLimitedStreams> streams_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t copy_ev_[4] = {};  // around attention_input's copies down (0, 1) and set_attention's up (2, 3)
  CopyTimes copies_;
  static int64_t elapsed_ns(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return int64_t(double(ms) * 1e6);
  }
  std::unique_ptr<CudaModel> model_;
  std::vector<std::unique_ptr<DevActs>> slots_;
  bool graphs_on_ = false;
  std::map<int, std::unique_ptr<GraphCache>> graphs_;  // per slot
  std::map<int, HostBuffer> mirrors_;                  // per slot: pipeline hand-offs through host memory
};

}  // namespace

std::unique_ptr<SPart> make_cuda_spart(ModelWeights weights, const CudaSPartOptions& options) {
  return std::make_unique<CudaSPart>(std::move(weights), options);
}

}  // namespace fd
