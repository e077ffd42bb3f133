// The CUDA S-Part backend: CudaModel's stages (fp16 weights, fused QKV and gate|up GEMMs, fp32
// accumulation and residual) with each slot's activations resident in device memory. Per layer only
// q/k/v go down and the attention output comes up, in the wire dtype, through pinned host buffers;
// sampling runs on the device, each row with its own parameters (only token ids come down, and the logits
// rows of the requests that record them).
// With cuda_graphs, the two stages between R-Part round trips (attention_input, attention_output_and_mlp)
// of a batch of at most GraphCache::kMaxRows rows are replayed from a graph per (slot, stage, layer,
// padded rows): one launch instead of five to eight, which is what such batches wait on.
// Each slot's work goes to a CUDA stream of its own (the pipeline's two mini-batches are two slots), so the
// device work of one mini-batch may run while the other's is queued; every public call still ends its slot's
// work the way its contract says (attention_input and set_attention wait for their copies), so what overlaps
// today is a slot's asynchronous tail (attention_output_and_mlp, prefill_attention) with the next call's slot.
// With trace_device(true), CUDA events at each stage boundary of a slot give the trace its per-stream tracks.
#include <algorithm>
#include <array>
#include <cstring>
#include <set>

#include "fastdecode/core/clock.h"

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
    if (devs.empty()) throw ConfigError("engine.backend is cuda, but no CUDA device answers: set engine.backend to cpu, or to auto "
                                         "(the GPU when one answers, else the CPU)");
    if (device_ < 0 || size_t(device_) >= devs.size())
      FD_THROW_BAD_INPUT("CUDA S-Part: device " << device_ << " does not answer (" << devs.size() << " CUDA device(s))");
    CUDA_CHECK(cudaSetDevice(device_));
    device_name_ = devs[size_t(device_)].name;
    // One stream under tensor parallelism: the group's collectives must keep one order on every rank.
    streams_ = std::make_unique<cuda::SmLimitedStreams>(o.sm_count, tp_ ? 1 : kStreams, device_);
    stream_ = streams_->stream(0);
    model_ = std::make_unique<CudaModel>(w, stream_, streams_->limited() ? streams_->sm_count() : 0, o.act, tp_);
    model_->use_gemm_table(load_gemm_table(o.gemm_table));
    CUDA_CHECK(cudaEventCreate(&anchor_));
  }
  ~CudaSPart() override {
    cudaSetDevice(device_);
    cudaDeviceSynchronize();
    for (void* p : registered_) cudaHostUnregister(p);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (anchor_) cudaEventDestroy(anchor_);
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
           "in the GEMM, activations resident on the device, " + std::to_string(streams_->n_streams()) +
           " CUDA stream(s) (a slot's work on stream slot % " + std::to_string(streams_->n_streams()) + ")" +
           std::string(graphs_on_ ? ", CUDA graphs" : "") + "; " + model_->gemm_table_describe();
  }

  HostBuffer alloc_host(size_t bytes) override {
    current();
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
    return HostBuffer(p, bytes, [](void* q) { cudaFreeHost(q); });
  }

  void embed(int slot, const int32_t* tokens, const int64_t* pos, int64_t T) override {
    DevActs& a = enter(slot);
    const uint64_t gen = a.generation;
    model_->ensure(a, T, graphed(T) ? GraphCache::bucket(T) : 0);  // padding rows for the graphs
    if (a.generation != gen) graphs_for(slot).clear();             // captured on the old buffers
    model_->upload({{a.tokens.get(), tokens, size_t(T) * 4}, {a.pos.get(), pos, size_t(T) * 8}});
    mark(slot, -1, "embed");
    model_->embed(a);
    mark(slot, -1, nullptr);  // every span ends when its work is queued: a later mark may come after idle time
  }

  using SPart::attention_input;
  void attention_input(int slot, int layer, DType dt, const std::vector<HostRowsOut>& parts) override {
    DevActs& a = enter(slot);
    const ModelConfig& c = cfg_;
    const std::vector<HostRowsOut> out = resolve_rows(parts, a.T);
    const size_t qd = size_t(c.q_dim()), kvd = size_t(c.kv_dim());
    FD_CHECK(dt == DType::F16 || dt == DType::F32, "CUDA S-Part: host tensors are fp32 or fp16");
    // A prefill (no q wanted on the host) also keeps fp32 q and fp16 k/v for prefill_attention.
    unsigned outputs = dt == DType::F16 ? CudaModel::kF16 : CudaModel::kF32;
    if (!out[0].q) outputs |= CudaModel::kF32 | CudaModel::kF16;
    layer_[size_t(slot)] = layer;
    mark(slot, layer, "q/k/v");
    run(slot, a, 0, layer, outputs, [&] { model_->attention_input(a, layer, outputs); });
    const size_t es = dt == DType::F16 ? 2 : 4;
    const void* dq = dt == DType::F16 ? static_cast<const void*>(a.q16.get()) : a.q.get();
    const void* dk = dt == DType::F16 ? static_cast<const void*>(a.k16.get()) : a.k.get();
    const void* dv = dt == DType::F16 ? static_cast<const void*>(a.v16.get()) : a.v.get();
    const cudaEvent_t e0 = mark(slot, layer, "d2h", true);
    // One copy per part and tensor (each part a worker's rows, perhaps in its shared-memory region: registered with
    // the device by SRank, so these stay DMA).
    size_t row = 0;
    for (const HostRowsOut& p : out) {
      const size_t n = size_t(p.rows);
      if (n == 0) continue;
      if (p.q) CUDA_CHECK(cudaMemcpyAsync(p.q, static_cast<const char*>(dq) + row * qd * es, n * qd * es, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaMemcpyAsync(p.k, static_cast<const char*>(dk) + row * kvd * es, n * kvd * es, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaMemcpyAsync(p.v, static_cast<const char*>(dv) + row * kvd * es, n * kvd * es, cudaMemcpyDeviceToHost, stream_));
      row += n;
    }
    const cudaEvent_t e1 = mark(slot, layer, nullptr, true);  // the stream idles until the attention comes back
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    copies_.d2h_ns += elapsed_ns(e0, e1);
  }

  CopyTimes copy_times() const override { return copies_; }

  // The buffers sized for max_rows' bucket first (so no later embed() reallocates them and drops the graphs), then
  // each bucket's graphs, largest first, captured as attention_input / attention_output_and_mlp would capture them.
  int64_t warm_up(int slot, int64_t max_rows, DType wire) override {
    if (max_rows < 1 || !graphed(1)) return 0;
    DevActs& a = enter(slot);
    const std::vector<int64_t> sizes = GraphCache::buckets_down(max_rows);
    const uint64_t gen = a.generation;
    model_->ensure(a, sizes.front(), sizes.front());
    if (a.generation != gen) graphs_for(slot).clear();
    const unsigned outputs = wire == DType::F16 ? CudaModel::kF16 : CudaModel::kF32;
    int64_t captured = 0;
    for (const int64_t Tb : sizes) {
      a.T = Tb;
      for (int layer = 0; layer < int(cfg_.num_layers); ++layer) {
        captured += graphs_for(slot).capture(graph_key(Tb, layer, outputs, 0),
                                             [&] { model_->attention_input(a, layer, outputs); });
        captured += graphs_for(slot).capture(graph_key(Tb, layer, 0, 1), [&] { model_->attention_output_and_mlp(a, layer); });
      }
    }
    a.T = 0;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return captured;
  }

  void set_attention(int slot, DType dt, const std::vector<HostRows>& parts) override {
    DevActs& a = enter(slot);
    const size_t qd = size_t(cfg_.q_dim()), es = dt == DType::F16 ? 2 : 4;
    const bool direct = dt == DType::F16 && model_->act_dtype() == DType::F16;
    const int layer = layer_[size_t(slot)];
    size_t row = 0;
    const cudaEvent_t e2 = mark(slot, layer, "h2d", true);
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
    const cudaEvent_t e3 = mark(slot, layer, direct ? nullptr : "attention cast", true);
    if (dt == DType::F32) model_->attention_from_f32(a);
    else if (!direct) cuda::cast(a.q16.get(), DType::F16, a.a16.get(), model_->act_dtype(), a.T * cfg_.q_dim(), stream_);
    if (!direct) mark(slot, layer, nullptr);
    // The sources may be freed once this returns (they are the R-workers' reply messages). Copied from them as they
    // are (pageable): gathering them into a pinned buffer first was measured no faster on the GPU machine (h2d 4.1-4.4
    // ms of an 8-layer step with the gather against 3.6 without; its one-core memcpy is the bound either way).
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    copies_.h2d_ns += elapsed_ns(e2, e3);
  }

  void prefill_attention(int slot, const std::vector<int64_t>& starts) override {
    DevActs& a = enter(slot);
    const ModelConfig& c = cfg_;
    std::vector<int32_t> s32(starts.begin(), starts.end());
    int64_t max_len = 0;
    for (size_t i = 0; i + 1 < starts.size(); ++i) max_len = std::max(max_len, starts[i + 1] - starts[i]);
    upload(a.starts.get(), s32.data(), s32.size() * 4);  // q (fp32), k16, v16: from attention_input(q = null)
    mark(slot, layer_[size_t(slot)], "prefill attention");
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
    mark(slot, layer_[size_t(slot)], nullptr);
  }

  void attention_output_and_mlp(int slot, int layer) override {
    DevActs& a = enter(slot);
    mark(slot, layer, "output+MLP");
    run(slot, a, 1, layer, 0, [&] { model_->attention_output_and_mlp(a, layer); });
    mark(slot, layer, nullptr);
  }

  void logits(int slot, const std::vector<int32_t>& rows, float* out) override {
    DevActs& a = enter(slot);
    upload(a.rows.get(), rows.data(), rows.size() * 4);
    mark(slot, -1, "logits");
    model_->logits(a, int64_t(rows.size()));
    CUDA_CHECK(cudaMemcpyAsync(out, a.logits.get(), rows.size() * size_t(cfg_.vocab_size) * 4, cudaMemcpyDeviceToHost,
                               stream_));
    mark(slot, -1, nullptr);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void prepare(int slot, const int64_t* pos, int64_t T) override {
    DevActs& a = enter(slot);
    const uint64_t gen = a.generation;
    model_->ensure(a, T, graphed(T) ? GraphCache::bucket(T) : 0);
    if (a.generation != gen) graphs_for(slot).clear();
    upload(a.pos.get(), pos, size_t(T) * 8);
  }

  // The residual x [T, hidden] fp32 stays on the device: a communicator that takes device buffers gets it on
  // the stream; any other gets a pinned host copy (one per slot: it must stay unchanged until flush_sends).
  void send_residual(int slot, Communicator& c, int peer) override {
    DevActs& a = enter(slot);
    const size_t bytes = size_t(a.T * cfg_.hidden_size) * 4;
    mark(slot, -1, "residual out");
    const Closer close{this, slot};  // the span ends after the hand-off's device work
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
    DevActs& a = enter(slot);
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
    DevActs& a = enter(slot);
    upload(a.rows.get(), rows.data(), rows.size() * 4);
    mark(slot, -1, "sample");
    const Closer close{this, slot};  // model_->sample synchronises: the span ends when it returns (microseconds late)
    model_->sample(a, int64_t(rows.size()), params, request_ids, steps, out, record, recorded);
  }

  void trace_device(bool on) override { tracing_ = on; }

  bool register_host(void* p, size_t bytes) override {
    current();
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it, the copies stay staged
      return false;
    }
    registered_.insert(p);
    return true;
  }
  void unregister_host(void* p) override {
    if (!registered_.erase(p)) return;
    current();
    for (int i = 0; i < streams_->n_streams(); ++i) cudaStreamSynchronize(streams_->stream(i));  // no copy reads it now
    cudaHostUnregister(p);
  }

  // Every stream is idle once synchronised; an anchor event recorded then completes at once, and its host time
  // places the spans: a span's start is the anchor's host time less the device time from its start to the anchor.
  std::vector<DeviceSpan> device_spans() override {
    current();
    std::vector<DeviceSpan> spans;
    for (int i = 0; i < streams_->n_streams(); ++i) CUDA_CHECK(cudaStreamSynchronize(streams_->stream(i)));
    if (!done_.empty()) {
      CUDA_CHECK(cudaEventRecord(anchor_, streams_->stream(0)));
      CUDA_CHECK(cudaEventSynchronize(anchor_));
      const int64_t host = now_ns();
      for (const Pending& p : done_) {
        const int64_t to_anchor = elapsed_ns(p.begin, anchor_), dur = elapsed_ns(p.begin, p.end);
        spans.push_back({p.stream, p.slot, p.layer, p.what, host - to_anchor, std::max<int64_t>(dur, 0)});
      }
    }
    done_.clear();
    for (Open& o : open_) o = {};  // a span still open here ended with no mark: dropped, not guessed
    next_event_ = 0;
    return spans;
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
  // A call on slot `slot`: the device current, the slot's stream the one work goes to (the model's too).
  DevActs& enter(int slot) {
    current();
    DevActs& a = at(slot);
    stream_index_ = slot % streams_->n_streams();
    stream_ = streams_->stream(stream_index_);
    model_->use_stream(stream_);
    return a;
  }
  // A stage boundary on the slot's stream: the slot's open span (if any) ends here and, when `what` is set, a span
  // named `what` starts. Records an event only when tracing or when `timed` (the copies' times need theirs).
  cudaEvent_t mark(int slot, int layer, const char* what, bool timed = false) {
    if (!tracing_ && !timed) return nullptr;
    // Untraced, events time only the copies (a pair, read as soon as the copies are done): two, alternating.
    const size_t i = tracing_ ? next_event_++ : (untraced_ ^= 1);
    while (events_.size() <= i) {
      events_.emplace_back();
      CUDA_CHECK(cudaEventCreate(&events_.back()));
    }
    const cudaEvent_t e = events_[i];
    CUDA_CHECK(cudaEventRecord(e, stream_));
    if (!tracing_) return e;
    if (open_.size() <= size_t(slot)) open_.resize(size_t(slot) + 1);
    Open& o = open_[size_t(slot)];
    if (o.what) done_.push_back({stream_index_, slot, o.layer, o.what, o.begin, e});
    o = {what, layer, e};
    return e;
  }
  struct Closer {  // ends the slot's open span when a call leaves (after its device work was queued)
    CudaSPart* self;
    int slot;
    ~Closer() {
      try {
        self->mark(slot, -1, nullptr);
      } catch (...) {
      }
    }
  };
  HostBuffer& mirror(int slot, size_t bytes) {
    HostBuffer& h = mirrors_[slot];
    if (h.size() < bytes) h = alloc_host(bytes);
    return h;
  }
  bool graphed(int64_t T) const { return graphs_on_ && T <= GraphCache::kMaxRows; }
  // A decode stage's graph: (padded rows, layer, outputs, stage 0 = attention_input / 1 = attention_output_and_mlp).
  static uint64_t graph_key(int64_t Tb, int layer, unsigned outputs, unsigned stage) {
    return uint64_t(Tb) << 32 | uint64_t(layer) << 4 | uint64_t(outputs) << 1 | stage;
  }
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
    const uint64_t key = graph_key(Tb, layer, outputs, stage);
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
  cudaStream_t stream_ = nullptr;  // the current call's slot's, streams_->stream(stream_index_)
  int stream_index_ = 0;
  CopyTimes copies_;
  static constexpr int kStreams = 4;
  std::array<int, 16> layer_{};  // per slot: the layer of its last attention_input (set_attention's layer)
  // Device tracing: an event pool (reused after each device_spans()), the span open on each slot, those ended.
  bool tracing_ = false;
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0, untraced_ = 0;
  cudaEvent_t anchor_ = nullptr;
  struct Open {
    const char* what = nullptr;
    int layer = -1;
    cudaEvent_t begin = nullptr;
  };
  struct Pending {
    int stream, slot, layer;
    const char* what;
    cudaEvent_t begin, end;
  };
  std::vector<Open> open_;
  std::vector<Pending> done_;
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
  std::set<void*> registered_;                         // register_host's, until unregister_host
};

}  // namespace

std::unique_ptr<SPart> make_cuda_spart(ModelWeights weights, const CudaSPartOptions& options) {
  return std::make_unique<CudaSPart>(std::move(weights), options);
}

}  // namespace fd
