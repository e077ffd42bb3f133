// The host-offload baseline engine (CUDA builds). See host_offload_engine.h.
#include "baselines/host_offload/host_offload_engine.h"

#include <algorithm>
#include <deque>
#include <map>

#include "baselines/gpu_only/gpu_only_engine.h"
#include "fastdecode/core/clock.h"
#include "fastdecode/spart/cuda_model.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/green_context.h"

namespace fd {

namespace {

// Pinned host memory, mapped into the device's address space and pinned for every context (portable:
// the green context's kernels write through the mapped pointer); freed on destruction.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(size_t bytes, const char* what) {
    const cudaError_t e = cudaHostAlloc(&p_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      p_ = nullptr;
      FD_THROW("host-offload engine: cannot pin " << double(bytes) / 1e9 << " GB of host memory for " << what << " ("
                                                  << cudaGetErrorString(e) << "); lower engine.host_kv_gb or engine.max_batch");
    }
    CUDA_CHECK(cudaHostGetDevicePointer(&dev_, p_, 0));
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& o) noexcept : p_(o.p_), dev_(o.dev_) { o.p_ = o.dev_ = nullptr; }
  ~HostBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  __half* host() const { return static_cast<__half*>(p_); }
  __half* dev() const { return static_cast<__half*>(dev_); }  // the mapped device pointer

 private:
  void* p_ = nullptr;
  void* dev_ = nullptr;
};

struct Seq {
  Request req;
  int32_t slot = 0;
  int64_t len = 0;  // tokens in the cache
  int64_t generated = 0;
  int32_t last = 0;
};

RowDraws row_draws(const std::vector<Seq*>& seqs, const SamplingParams& run) {
  RowDraws d;
  for (const Seq* s : seqs) d.add(s->req, s->generated, run);
  return d;
}

// The same-run pinned H2D ceiling: one copy of `bytes` from pinned host memory to the device on `s`,
// best of `reps` (GB/s, 1e9 bytes).
double measure_h2d_gbs(cudaStream_t s, size_t bytes, int reps) {
  void* host = nullptr;
  CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocPortable));
  DeviceBuffer<uint8_t> dev(bytes);
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  float best = 0;
  for (int r = 0; r <= reps; ++r) {  // r = 0: warm-up, not counted
    CUDA_CHECK(cudaEventRecord(a, s));
    CUDA_CHECK(cudaMemcpyAsync(dev.get(), host, bytes, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0 && (best == 0 || ms < best)) best = ms;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFreeHost(host);
  return double(bytes) / (double(best) * 1e-3) / 1e9;
}

class HostOffloadEngine : public Engine {
 public:
  HostOffloadEngine(const HostOffloadConfig& ec, const EngineContext& ctx)
      : ec_(ec), cfg_(ctx.model), sampling_(ctx.sampling) {
    const auto devs = cuda_devices();
    if (devs.empty()) throw ConfigError("engine.type host-offload runs on a GPU, and no CUDA device answers (the fastdecode and reference "
                                         "engines run on the CPU)");
    CUDA_CHECK(cudaSetDevice(0));
    device_name_ = devs[0].name;
    // Stream 0 computes, stream 1 copies (the copy engines need no SMs; on a green context both share it).
    streams_ = std::make_unique<cuda::SmLimitedStreams>(int(ctx.hardware.gpu_sm_count), 2);
    stream_ = streams_->stream(0);
    copy_ = streams_->stream(1);
    h2d_ceiling_gbs_ = measure_h2d_gbs(copy_, size_t(256) << 20, 3);
    model_ = std::make_unique<CudaModel>(load_model_weights(cfg_, ctx.weights), stream_,
                                         streams_->limited() ? streams_->sm_count() : 0, dtype_from_name(ec.dtype));
    model_->use_gemm_table(load_gemm_table(ctx.hardware.gpu_gemm_table));
    max_ctx_ = ec.max_context > 0 ? ec.max_context : cfg_.position_limit();
    host_bytes_ = ec.host_kv_gb * 1e9;
    slots_ = host_offload_slots(cfg_, host_bytes_, max_ctx_);
    if (slots_ < 1)
      FD_THROW("host-offload engine: engine.host_kv_gb " << ec.host_kv_gb << " GB of host memory do not hold the full-depth "
                                                         << "fp16 KV-cache of one " << cfg_.name << " sequence of max_context "
                                                         << max_ctx_);
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    gpu_budget_ = ctx.hardware.gpu_memory_gb > 0 ? ctx.hardware.gpu_memory_gb * 1e9 : double(total_b);
    gpu_rows_ = host_offload_gpu_rows(cfg_, gpu_budget_, max_ctx_);
    if (gpu_rows_ < 1)
      FD_THROW("host-offload engine: " << gpu_budget_ / 1e9 << " GB of GPU memory hold the full-depth weights of "
                                       << cfg_.name << " but not the staging of one sequence of max_context " << max_ctx_);
    // What this run allocates must also fit the real device: two staging buffers of one layer's K and V,
    // each row's activations and the attention workspace, with 2 GiB kept free.
    const int64_t kvd = cfg_.kv_dim();
    const double ws_row =
        4.0 * double(cuda::decode_attention_workspace_floats(1, int(cfg_.num_heads), int(cfg_.head_dim), max_ctx_));
    const double per_row = 2.0 * 2.0 * double(max_ctx_) * double(kvd) * 2.0 + ws_row + gpu_only_row_bytes(cfg_);
    const int64_t fit = std::max<int64_t>(0, int64_t((double(free_b) - double(2ull << 30)) / per_row));
    max_batch_ = std::min({slots_, ec.max_batch > 0 ? ec.max_batch : slots_, gpu_rows_, fit, int64_t(65535)});
    batch_bound_ = max_batch_ == slots_               ? "host slots"
                   : max_batch_ == ec.max_batch       ? "engine.max_batch"
                   : max_batch_ == gpu_rows_          ? "GPU memory budget (staging)"
                   : max_batch_ == fit                ? "free device memory (staging)"
                                                      : "decode_attention's 65535 sequences";
    if (max_batch_ < 1) FD_THROW("host-offload engine: the device has no room for the staging of one sequence");
    if (max_batch_ < slots_)
      notes_.push_back("host-offload: " + std::to_string(slots_) + " host slots, but at most " + std::to_string(max_batch_) +
                       " sequences run at once (bound: " + batch_bound_ + "); only those are allocated");
    // Only the slots that can run at once are allocated (at most the host_kv_gb budget at full depth).
    const size_t per_layer = size_t(max_batch_) * size_t(max_ctx_) * size_t(kvd) * 2;
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
      k_host_.emplace_back(per_layer, "the K cache");
      v_host_.emplace_back(per_layer, "the V cache");
    }
    allocated_bytes_ = double(per_layer) * 2 * double(cfg_.num_layers);
    for (int64_t s = max_batch_ - 1; s >= 0; --s) free_slots_.push_back(int32_t(s));
    for (size_t i = 0; i < size_t(kPerLayer) * size_t(cfg_.num_layers) + 2; ++i) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
  }

  ~HostOffloadEngine() override {
    shutdown();
    if (stream_) cudaStreamSynchronize(stream_);
    if (copy_) cudaStreamSynchronize(copy_);
    for (auto e : events_) cudaEventDestroy(e);
  }

  std::string name() const override { return "host-offload"; }
  json info() const override {
    return {{"device", device_name_},
            {"s_part", "cuda: " + ec_.dtype + " weights and activations, fused QKV and gate|up GEMMs (cuBLAS GemmEx, "
                       "fp32 accumulation, residual added in the GEMM); eager (no CUDA graphs)"},
            {"gemm_table", model_->gemm_table_info()},
            {"attention", "cuda: every KV byte in pinned host memory; per layer the batch's K/V rows copied H2D (" +
                              ec_.copy + ") into a double-buffered staging buffer on a copy stream, then flash-decoding "
                              "over it; new rows written to host memory through the mapped pointer (zero-copy); tiled causal prefill"},
            {"streams", "compute stream + copy stream, events between them"},
            {"sm_count", streams_->sm_count()},
            {"sm_limited", streams_->limited()},
            {"host_kv_budget_gb", host_bytes_ / 1e9},
            {"host_kv_allocated_gb", allocated_bytes_ / 1e9},
            {"slots", slots_},
            {"slots_accounting", "host_kv_gb / (max_context x full-depth fp16 KV per token); a reduced-layer run "
                                 "allocates only the layers it runs, for at most max_batch slots"},
            {"max_batch", max_batch_},
            {"max_batch_bound", batch_bound_},
            {"gpu_memory_budget_gb", gpu_budget_ / 1e9},
            {"gpu_rows", gpu_rows_},
            {"max_context", max_ctx_},
            {"copy", ec_.copy},
            {"h2d_ceiling_gbs", h2d_ceiling_gbs_}};
  }

  void add(const std::vector<Request>& requests) override {
    for (const auto& r : requests) {
      validate_request(r, cfg_);
      const int64_t need = int64_t(r.prompt.size()) + r.max_new_tokens - 1;
      if (need > max_ctx_)
        FD_THROW("request " << r.id << " needs " << need << " cache positions; host-offload max_context is " << max_ctx_);
    }
    queued_.insert(queued_.end(), requests.begin(), requests.end());
  }

  bool done() const override { return queued_.empty() && running_.empty(); }

  // Bounded by the sequences that run at once (it queues requests beyond them itself).
  EngineCapacity capacity(int64_t, int64_t) const override {
    EngineCapacity c;
    c.slots = max_batch_;
    c.note = "host-offload: " + std::to_string(slots_) + " slots of " + std::to_string(max_ctx_) + " positions in " +
             std::to_string(host_bytes_ / 1e9) + " GB of pinned host memory (full-depth fp16 KV), at most " +
             std::to_string(max_batch_) + " running (" + batch_bound_ + ")";
    return c;
  }

  StepResult step() override {
    StepResult out;
    if (!running_.empty()) decode(out);
    std::vector<Seq*> fresh;
    int64_t budget = ec_.prefill_tokens;  // prompt tokens per step (whole prompts, at least one)
    while (!queued_.empty() && !free_slots_.empty() &&
           (fresh.empty() || int64_t(queued_.front().prompt.size()) <= budget)) {
      budget -= int64_t(queued_.front().prompt.size());
      Seq s;
      s.req = std::move(queued_.front());
      queued_.pop_front();
      s.slot = free_slots_.back();
      free_slots_.pop_back();
      const uint64_t id = s.req.id;
      fresh.push_back(&running_.emplace(id, std::move(s)).first->second);
    }
    if (!fresh.empty()) prefill(fresh, out);
    for (const auto& t : out.tokens) {
      if (!t.finished) continue;
      free_slots_.push_back(running_.at(t.request_id).slot);
      running_.erase(t.request_id);
    }
    out.breakdown_ms = {{"h2d_ms", h2d_ms_}, {"h2d_stall_ms", stall_ms_}, {"attention_ms", att_ms_},
                        {"decode", decode_ms_}, {"prefill", prefill_ms_}};
    out.counts = {{"h2d_bytes", h2d_bytes_}, {"kv_write_bytes", kv_write_bytes_}};
    h2d_ms_ = stall_ms_ = att_ms_ = decode_ms_ = prefill_ms_ = 0;
    h2d_bytes_ = kv_write_bytes_ = 0;
    return out;
  }

  void shutdown() override {
    queued_.clear();
    running_.clear();
  }

 private:
  // Events of layer l, at 2 + kPerLayer * l + k: copy begin / end (copy stream); wait begin (before the
  // compute stream waits for the copy), attention begin / end (compute stream). events_[0], [1]: the
  // decode step's start and end (compute stream).
  enum { kCopyBegin = 0, kCopyEnd, kWait, kAttBegin, kAttEnd, kPerLayer };
  cudaEvent_t ev(int64_t l, int k) const { return events_[size_t(2 + kPerLayer * l + k)]; }

  // Grows the staging buffers and the attention workspace for B rows of `stride` positions (both streams
  // idle: a step ends synchronised). Doubling, capped at the largest batch, so growth is rare.
  void ensure_staging(int64_t B, int64_t stride) {
    const size_t need = size_t(B) * size_t(stride) * size_t(cfg_.kv_dim());
    const size_t cap = size_t(max_batch_) * size_t(max_ctx_) * size_t(cfg_.kv_dim());
    if (need > stage_elems_) {
      CUDA_CHECK(cudaStreamSynchronize(copy_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      stage_elems_ = std::min(cap, std::max(need, 2 * stage_elems_));
      for (auto* b : {&k_stage_[0], &k_stage_[1], &v_stage_[0], &v_stage_[1]}) b->resize(stage_elems_);
    }
    const size_t ws = cuda::decode_attention_workspace_floats(B, int(cfg_.num_heads), int(cfg_.head_dim), stride);
    if (ws > workspace_.size()) {
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      workspace_.resize(std::max(ws, 2 * workspace_.size()));
    }
  }

  // Queues on the copy stream layer l's K/V rows 0..len-1 of every sequence of the batch into staging
  // buffer l % 2 (row b at b * stride), after the attention of layer l - 2 (the buffer's last reader).
  void issue_copies(int64_t l, const std::vector<Seq*>& seqs, int64_t stride) {
    const int buf = int(l % 2);
    const size_t kvd = size_t(cfg_.kv_dim()), B = seqs.size();
    if (l >= 2) CUDA_CHECK(cudaStreamWaitEvent(copy_, ev(l - 2, kAttEnd), 0));
    CUDA_CHECK(cudaEventRecord(ev(l, kCopyBegin), copy_));
    auto& dsts = copy_dst_[size_t(l)];
    auto& srcs = copy_src_[size_t(l)];
    auto& sizes = copy_size_[size_t(l)];
    dsts.clear(), srcs.clear(), sizes.clear();
    for (size_t b = 0; b < B; ++b) {
      const size_t src = size_t(seqs[b]->slot) * size_t(max_ctx_) * kvd, dst = b * size_t(stride) * kvd;
      const size_t bytes = size_t(seqs[b]->len) * kvd * 2;
      dsts.push_back(k_stage_[buf].get() + dst), srcs.push_back(k_host_[size_t(l)].host() + src), sizes.push_back(bytes);
      dsts.push_back(v_stage_[buf].get() + dst), srcs.push_back(v_host_[size_t(l)].host() + src), sizes.push_back(bytes);
      h2d_bytes_ += int64_t(2 * bytes);
    }
    if (ec_.copy == "batched") {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.srcLocHint.type = cudaMemLocationTypeHost;
      attr.dstLocHint.type = cudaMemLocationTypeDevice;
      attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;  // the copies run under the other layer's compute
      size_t attr_idx = 0;
      CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &attr_idx, 1, copy_));
    } else {
      for (size_t i = 0; i < dsts.size(); ++i)
        CUDA_CHECK(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyHostToDevice, copy_));
    }
    CUDA_CHECK(cudaEventRecord(ev(l, kCopyEnd), copy_));
  }

  void decode(StepResult& out) {
    const int64_t t0 = now_ns();
    std::vector<Seq*> seqs;
    for (auto& [id, s] : running_) seqs.push_back(&s);
    const int64_t B = int64_t(seqs.size()), L = cfg_.num_layers;
    const int kvd = int(cfg_.kv_dim());
    int64_t stride = 0;  // the staging row stride: the longest context of the batch, new token included
    std::vector<int32_t> tokens, slots, pos32, lens, rows;
    std::vector<int64_t> pos;
    for (Seq* s : seqs) {
      stride = std::max(stride, s->len + 1);
      tokens.push_back(s->last), pos.push_back(s->len), slots.push_back(s->slot), pos32.push_back(int32_t(s->len));
      lens.push_back(int32_t(s->len + 1)), rows.push_back(int32_t(rows.size()));
    }
    ensure_staging(B, stride);
    model_->ensure(dec_, B);
    model_->upload(dec_.tokens.get(), tokens.data(), size_t(B) * 4);
    model_->upload(dec_.pos.get(), pos.data(), size_t(B) * 8);
    model_->upload(dec_.rows.get(), rows.data(), size_t(B) * 4);
    // aux_: host slots [0, B), positions [B, 2B), lengths [2B, 3B), staging rows 0..B-1 [3B, 4B).
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // aux_ may be reallocated
    aux_.resize(4 * size_t(B));
    model_->upload(aux_.get(), slots.data(), size_t(B) * 4);
    model_->upload(aux_.get() + B, pos32.data(), size_t(B) * 4);
    model_->upload(aux_.get() + 2 * B, lens.data(), size_t(B) * 4);
    model_->upload(aux_.get() + 3 * B, rows.data(), size_t(B) * 4);
    copy_dst_.resize(size_t(L)), copy_src_.resize(size_t(L)), copy_size_.resize(size_t(L));
    CUDA_CHECK(cudaEventRecord(events_[0], stream_));
    CUDA_CHECK(cudaStreamWaitEvent(copy_, events_[0], 0));  // the step's time covers its copies
    // Layers 0 and 1 are queued before any compute (both buffers are free), then layer l + 2 after layer
    // l's compute is queued: its copy waits only for layer l's attention, so it runs under layer l+1's compute.
    for (int64_t l = 0; l < std::min<int64_t>(L, 2); ++l) issue_copies(l, seqs, stride);
    model_->embed(dec_);
    for (int64_t l = 0; l < L; ++l) {
      const int buf = int(l % 2);
      model_->attention_input(dec_, int(l), CudaModel::kF32);
      // The new token's row: to host memory through the mapped pointer, and to the staging buffer (row b,
      // position len: disjoint from the rows the copy writes).
      cuda::append_kv({.k = dec_.k.get(), .v = dec_.v.get(), .slots = aux_.get(), .pos = aux_.get() + B, .T = B,
                       .max_ctx = max_ctx_, .kv_dim = kvd, .k_cache = k_host_[size_t(l)].dev(),
                       .v_cache = v_host_[size_t(l)].dev()},
                      stream_);
      cuda::append_kv({.k = dec_.k.get(), .v = dec_.v.get(), .slots = aux_.get() + 3 * B, .pos = aux_.get() + B,
                       .T = B, .max_ctx = stride, .kv_dim = kvd, .k_cache = k_stage_[buf].get(),
                       .v_cache = v_stage_[buf].get()},
                      stream_);
      CUDA_CHECK(cudaEventRecord(ev(l, kWait), stream_));
      CUDA_CHECK(cudaStreamWaitEvent(stream_, ev(l, kCopyEnd), 0));
      CUDA_CHECK(cudaEventRecord(ev(l, kAttBegin), stream_));
      cuda::decode_attention({.q = dec_.q.get(), .k_cache = k_stage_[buf].get(), .v_cache = v_stage_[buf].get(),
                              .slots = aux_.get() + 3 * B, .lens = aux_.get() + 2 * B, .B = B, .max_ctx = stride,
                              .Hq = int(cfg_.num_heads), .Hkv = int(cfg_.num_kv_heads), .D = int(cfg_.head_dim),
                              .workspace = workspace_.get(), .out_act = dec_.a16.get(),
                              .out_dtype = model_->act_dtype()},  // the o-projection's input, no cast between
                             stream_);
      CUDA_CHECK(cudaEventRecord(ev(l, kAttEnd), stream_));
      if (l + 2 < L) issue_copies(l + 2, seqs, stride);
      model_->attention_output_and_mlp(dec_, int(l));
    }
    const RowDraws draws = row_draws(seqs, sampling_);
    std::vector<float> recorded(draws.record.size() * size_t(cfg_.vocab_size));
    std::vector<int32_t> tok(seqs.size());
    // Synchronises the compute stream (which waited for every copy).
    model_->sample(dec_, B, draws.params, draws.ids, draws.steps, tok.data(), draws.record, recorded.data());
    CUDA_CHECK(cudaEventRecord(events_[1], stream_));
    CUDA_CHECK(cudaEventSynchronize(events_[1]));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[1]));
    decode_ms_ += ms;
    for (int64_t l = 0; l < L; ++l) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, ev(l, kCopyBegin), ev(l, kCopyEnd)));
      h2d_ms_ += ms;
      CUDA_CHECK(cudaEventElapsedTime(&ms, ev(l, kWait), ev(l, kAttBegin)));
      stall_ms_ += ms;
      CUDA_CHECK(cudaEventElapsedTime(&ms, ev(l, kAttBegin), ev(l, kAttEnd)));
      att_ms_ += ms;
    }
    size_t k = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i]->len += 1;
      emit(*seqs[i], tok[i], seqs[i]->req.record_logits ? &recorded[k++ * size_t(cfg_.vocab_size)] : nullptr, out);
      out.total_context += seqs[i]->len;
    }
    out.decode_tokens = B;
    kv_write_bytes_ += B * L * 2 * int64_t(kvd) * 2;
    out.spans.push_back({"gpu stream 0", "decode step", t0, now_ns() - t0});
  }

  // Prefill on the GPU as the GPU-only engine runs it (causal attention over the packed prompts' fp16 K/V);
  // each layer's prompt K/V rows go to host memory through the mapped pointer.
  void prefill(const std::vector<Seq*>& fresh, StepResult& out) {
    const int64_t t0 = now_ns();
    std::vector<int32_t> tokens, slots, pos32, starts, last;
    std::vector<int64_t> pos;
    int64_t max_len = 0;
    for (Seq* s : fresh) {
      starts.push_back(int32_t(tokens.size()));
      const int64_t n = int64_t(s->req.prompt.size());
      max_len = std::max(max_len, n);
      for (int64_t t = 0; t < n; ++t) {
        tokens.push_back(s->req.prompt[size_t(t)]), pos.push_back(t), pos32.push_back(int32_t(t));
        slots.push_back(s->slot);
      }
      last.push_back(int32_t(tokens.size() - 1));
    }
    starts.push_back(int32_t(tokens.size()));
    const int64_t T = int64_t(tokens.size());
    model_->ensure(pre_, T);
    model_->upload(pre_.tokens.get(), tokens.data(), size_t(T) * 4);
    model_->upload(pre_.pos.get(), pos.data(), size_t(T) * 8);
    model_->upload(pre_.starts.get(), starts.data(), starts.size() * 4);
    model_->upload(pre_.rows.get(), last.data(), last.size() * 4);
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // aux_ may be reallocated
    aux_.resize(2 * size_t(T));
    model_->upload(aux_.get(), slots.data(), size_t(T) * 4);
    model_->upload(aux_.get() + T, pos32.data(), size_t(T) * 4);
    model_->prefill_forward(pre_, int64_t(fresh.size()), max_len, [&](int l) {
      cuda::append_kv({.k = pre_.k.get(), .v = pre_.v.get(), .slots = aux_.get(), .pos = aux_.get() + T, .T = T,
                       .max_ctx = max_ctx_, .kv_dim = int(cfg_.kv_dim()), .k_cache = k_host_[size_t(l)].dev(),
                       .v_cache = v_host_[size_t(l)].dev()},
                      stream_);
    });
    const RowDraws draws = row_draws(fresh, sampling_);
    std::vector<float> recorded(draws.record.size() * size_t(cfg_.vocab_size));
    std::vector<int32_t> tok(fresh.size());
    model_->sample(pre_, int64_t(fresh.size()), draws.params, draws.ids, draws.steps, tok.data(), draws.record,
                   recorded.data());
    size_t k = 0;
    for (size_t i = 0; i < fresh.size(); ++i) {
      fresh[i]->len = int64_t(fresh[i]->req.prompt.size());
      emit(*fresh[i], tok[i], fresh[i]->req.record_logits ? &recorded[k++ * size_t(cfg_.vocab_size)] : nullptr, out);
      out.total_context += fresh[i]->len;
    }
    out.prefill_tokens = T;
    kv_write_bytes_ += T * cfg_.num_layers * 2 * cfg_.kv_dim() * 2;
    prefill_ms_ += double(now_ns() - t0) / 1e6;
    out.spans.push_back({"gpu stream 0", "prefill", t0, now_ns() - t0});
  }

  // Emits the pick; the sequence continues with it, or with its forced token (teacher forcing). logits: the
  // row the pick was made from, when the request records them.
  void emit(Seq& s, int32_t tok, const float* logits, StepResult& out) {
    emit_pick(s, tok, logits, cfg_.eos_token_id, cfg_.vocab_size, out);
  }

  HostOffloadConfig ec_;
  ModelConfig cfg_;
  SamplingParams sampling_;
  std::string device_name_, batch_bound_;
  std::unique_ptr<cuda::SmLimitedStreams> streams_;
  cudaStream_t stream_ = nullptr, copy_ = nullptr;
  std::unique_ptr<CudaModel> model_;
  int64_t max_ctx_ = 0, slots_ = 0, gpu_rows_ = 0, max_batch_ = 0;
  double host_bytes_ = 0, allocated_bytes_ = 0, gpu_budget_ = 0, h2d_ceiling_gbs_ = 0;
  std::vector<HostBuffer> k_host_, v_host_;  // per layer run: [slot][max_ctx][kv_dim] fp16, pinned and mapped
  DeviceBuffer<__half> k_stage_[2], v_stage_[2];  // per layer parity: [B][stride][kv_dim]
  size_t stage_elems_ = 0;
  DeviceBuffer<float> workspace_;
  DeviceBuffer<int32_t> aux_;
  DevActs dec_, pre_;
  std::vector<cudaEvent_t> events_;
  // Per layer: the step's copies (kept until the step ends: cudaMemcpyBatchAsync reads them at the call).
  std::vector<std::vector<void*>> copy_dst_;
  std::vector<std::vector<const void*>> copy_src_;
  std::vector<std::vector<size_t>> copy_size_;
  std::vector<int32_t> free_slots_;
  std::deque<Request> queued_;
  std::map<uint64_t, Seq> running_;
  // This step: copy stream busy, compute stream waiting for copies, decode attention, decode, prefill (ms).
  double h2d_ms_ = 0, stall_ms_ = 0, att_ms_ = 0, decode_ms_ = 0, prefill_ms_ = 0;
  // This step's bytes copied host -> device (the decode's K/V rows), and written to host memory through
  // the mapped pointer (the new rows: prompts and decoded tokens).
  int64_t h2d_bytes_ = 0, kv_write_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Engine> make_host_offload_engine(const HostOffloadConfig& c, const EngineContext& ctx) {
  return std::make_unique<HostOffloadEngine>(c, ctx);
}

}  // namespace fd
