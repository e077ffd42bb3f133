// The GPU-only baseline engine (CUDA builds). See gpu_only_engine.h.
#include "baselines/gpu_only/gpu_only_engine.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>

#include "fastdecode/core/clock.h"
#include "fastdecode/spart/cuda_model.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/green_context.h"
#include "kernels/cuda/sampling.h"

namespace fd {

namespace {

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

class GpuOnlyEngine : public Engine {
 public:
  GpuOnlyEngine(const GpuOnlyConfig& ec, const EngineContext& ctx)
      : ec_(ec), cfg_(ctx.model), sampling_(ctx.sampling) {
    const ModelConfig& model = ctx.model;
    TensorSource& weights = ctx.weights;
    const auto devs = cuda_devices();
    if (devs.empty()) FD_THROW("gpu-only engine: no CUDA device answers");
    CUDA_CHECK(cudaSetDevice(0));
    device_name_ = devs[0].name;
    streams_ = std::make_unique<cuda::SmLimitedStreams>(int(ctx.hardware.gpu_sm_count), 1);
    stream_ = streams_->stream(0);
    model_ = std::make_unique<CudaModel>(load_model_weights(model, weights), stream_,
                                         streams_->limited() ? streams_->sm_count() : 0, dtype_from_name(ec.dtype));
    max_ctx_ = ec.max_context > 0 ? ec.max_context : cfg_.position_limit();
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    budget_bytes_ = ctx.hardware.gpu_memory_gb > 0 ? ctx.hardware.gpu_memory_gb * 1e9 : double(total_b);
    slots_ = gpu_only_slots(cfg_, budget_bytes_, max_ctx_);
    if (slots_ < 1)
      FD_THROW("gpu-only engine: " << budget_bytes_ / 1e9 << " GB of GPU memory hold the full-depth weights of "
                                   << cfg_.name << " but not one sequence of max_context " << max_ctx_);
    // What this (reduced-layer) run allocates must also fit the real device: the cache of the layers run,
    // each row's activations and the attention workspace (the CUDA graphs' own buffers, at most
    // GraphCache::kMaxRows rows, come out of the 2 GiB kept free).
    const double ws_row =
        4.0 * double(cuda::decode_attention_workspace_floats(1, int(cfg_.num_heads), int(cfg_.head_dim), max_ctx_));
    const double per_slot = double(max_ctx_) * double(cfg_.num_layers) * double(cfg_.kv_dim()) * 2 * 2 +
                            gpu_only_row_bytes(cfg_) + ws_row;
    const int64_t fit = int64_t((double(free_b) - double(2ull << 30)) / per_slot);
    if (fit < slots_) {
      slots_device_limited_ = true;
      slots_ = std::max<int64_t>(fit, 0);
      if (slots_ < 1) FD_THROW("gpu-only engine: the device has no room for the KV-cache of one sequence");
    }
    const size_t cache = size_t(slots_ + 1) * size_t(max_ctx_) * size_t(cfg_.kv_dim());  // + 1: padding slot
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
      k_cache_.emplace_back(cache);
      v_cache_.emplace_back(cache);
    }
    // Decode batches: up to slots_ rows. With CUDA graphs, batches of up to GraphCache::kMaxRows rows
    // are padded to a power of two (at most slots_; one graph per size; padding rows attend over the
    // spare slot `slots_`) and run on their own buffers, sized for the largest now and never reallocated
    // (a graph keeps the addresses it was captured with). Larger batches run eagerly.
    max_batch_ = slots_;
    workspace_.resize(std::max<size_t>(
        1, cuda::decode_attention_workspace_floats(max_batch_, int(cfg_.num_heads), int(cfg_.head_dim), max_ctx_)));
    if (ec.cuda_graphs) {
      graph_rows_ = std::min<int64_t>(slots_, GraphCache::kMaxRows);
      graph_aux_.resize(size_t(3 * graph_rows_));
      model_->ensure(graph_dec_, graph_rows_);
      graph_dec_.logits.resize(size_t(graph_rows_ * cfg_.vocab_size));
      graphs_ = std::make_unique<GraphCache>(stream_);
    }
    for (int64_t s = slots_ - 1; s >= 0; --s) free_slots_.push_back(int32_t(s));
    for (int i = 0; i < 2 * int(cfg_.num_layers) + 2; ++i) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
  }

  ~GpuOnlyEngine() override {
    shutdown();
    graphs_.reset();
    for (auto e : events_) cudaEventDestroy(e);
  }

  std::string name() const override { return "gpu-only"; }
  json info() const override {
    return {{"device", device_name_},
            {"s_part", "cuda: " + ec_.dtype + " weights and activations, fused QKV and gate|up GEMMs (cuBLAS GemmEx, "
                       "fp32 accumulation, residual added in the GEMM)"},
            {"attention", "cuda: flash-decoding split-K over a contiguous fp16 KV-cache; tiled causal prefill"},
            {"sm_count", streams_->sm_count()},
            {"sm_limited", streams_->limited()},
            {"memory_budget_gb", budget_bytes_ / 1e9},
            {"max_context", max_ctx_},
            {"slots", slots_},
            {"cuda_graphs", ec_.cuda_graphs},
            {"slots_limited_by_device", slots_device_limited_}};
  }

  void add(const std::vector<Request>& requests) override {
    for (const auto& r : requests) {
      validate_request(r, cfg_);
      const int64_t need = int64_t(r.prompt.size()) + r.max_new_tokens - 1;
      if (need > max_ctx_)
        FD_THROW("request " << r.id << " needs " << need << " cache positions; gpu-only max_context is " << max_ctx_);
    }
    queued_.insert(queued_.end(), requests.begin(), requests.end());
  }

  bool done() const override { return queued_.empty() && running_.empty(); }

  // Bounded by slots (it queues requests beyond them itself), not by a KV token budget.
  EngineCapacity capacity(int64_t, int64_t) const override {
    EngineCapacity c;
    c.slots = slots_;
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
    out.breakdown_ms = {{"gpu_attention", att_ms_}, {"gpu_decode", total_ms_}, {"prefill", prefill_ms_}};
    att_ms_ = total_ms_ = prefill_ms_ = 0;
    return out;
  }

  void shutdown() override {
    queued_.clear();
    running_.clear();
  }

 private:

  // The decode step's GPU work for the Tb rows of `a` (inputs already on the device: slots, positions,
  // lengths per row): no host synchronisation and no allocation, so it can be captured into a CUDA
  // graph. `timed` records per-layer attention events (eager only).
  void decode_body(DevActs& a, int64_t Tb, const int32_t* d_slots, const int32_t* d_pos, const int32_t* d_lens,
                   bool timed) {
    model_->embed(a);
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
      model_->attention_input(a, int(l), CudaModel::kF32);
      cuda::append_kv({.k = a.k.get(),
                       .v = a.v.get(),
                       .slots = d_slots,
                       .pos = d_pos,
                       .T = Tb,
                       .max_ctx = max_ctx_,
                       .kv_dim = int(cfg_.kv_dim()),
                       .k_cache = k_cache_[size_t(l)].get(),
                       .v_cache = v_cache_[size_t(l)].get()},
                      stream_);
      if (timed) CUDA_CHECK(cudaEventRecord(events_[size_t(2 + 2 * l)], stream_));
      cuda::decode_attention({.q = a.q.get(),
                              .k_cache = k_cache_[size_t(l)].get(),
                              .v_cache = v_cache_[size_t(l)].get(),
                              .slots = d_slots,
                              .lens = d_lens,
                              .B = Tb,
                              .max_ctx = max_ctx_,
                              .Hq = int(cfg_.num_heads),
                              .Hkv = int(cfg_.num_kv_heads),
                              .D = int(cfg_.head_dim),
                              .out = a.att.get(),
                              .workspace = workspace_.get()},
                             stream_);
      if (timed) CUDA_CHECK(cudaEventRecord(events_[size_t(3 + 2 * l)], stream_));
      model_->attention_from_f32(a);
      model_->attention_output_and_mlp(a, int(l));
    }
  }

  // A greedy decode step from the graph of its padded batch size Tb (body, LM head, argmax on graph_dec_;
  // graph_aux_ holds slots, positions and lengths at 0, graph_rows_, 2·graph_rows_): rows T..Tb-1 pad the
  // batch (token 0 at position 0 of the spare slot). The logits rows in `record` come down after the replay.
  void decode_graph(const std::vector<Seq*>& seqs, int32_t* tok, const std::vector<int32_t>& record, float* recorded) {
    const int64_t T = int64_t(seqs.size()), Tb = std::min(GraphCache::bucket(T), graph_rows_);
    const size_t n = static_cast<size_t>(Tb);
    std::vector<int32_t> tokens(n, 0), slots(n, static_cast<int32_t>(slots_)), pos32(n, 0), lens(n, 1), rows(n, 0);
    std::vector<int64_t> pos(n, 0);
    for (size_t i = 0; i < n; ++i) rows[i] = int32_t(i);
    for (size_t i = 0; i < seqs.size(); ++i) {
      tokens[i] = seqs[i]->last, pos[i] = seqs[i]->len, slots[i] = seqs[i]->slot;
      pos32[i] = int32_t(seqs[i]->len), lens[i] = int32_t(seqs[i]->len + 1);
    }
    model_->upload(graph_dec_.tokens.get(), tokens.data(), n * 4);
    model_->upload(graph_dec_.pos.get(), pos.data(), n * 8);
    model_->upload(graph_dec_.rows.get(), rows.data(), n * 4);
    model_->upload(graph_aux_.get(), slots.data(), n * 4);
    model_->upload(graph_aux_.get() + graph_rows_, pos32.data(), n * 4);
    model_->upload(graph_aux_.get() + 2 * graph_rows_, lens.data(), n * 4);
    model_->ensure(graph_dec_, Tb);  // sized for graph_rows_ at start: sets T, never reallocates
    CUDA_CHECK(cudaEventRecord(events_[0], stream_));
    graphs_->run(uint64_t(Tb), [&] {
      decode_body(graph_dec_, Tb, graph_aux_.get(), graph_aux_.get() + graph_rows_, graph_aux_.get() + 2 * graph_rows_,
                  false);
      model_->logits(graph_dec_, Tb);
      cuda::argmax_rows(graph_dec_.logits.get(), Tb, cfg_.vocab_size, graph_dec_.out_tokens.get(), stream_);
    });
    CUDA_CHECK(cudaEventRecord(events_[1], stream_));
    CUDA_CHECK(cudaMemcpyAsync(tok, graph_dec_.out_tokens.get(), size_t(T) * 4, cudaMemcpyDeviceToHost, stream_));
    model_->download_logits(graph_dec_, record, recorded);  // synchronises the stream
  }

  // Uploads the per-row int32 arrays of a batch into aux_: slots [0, T), positions [T, 2T), lengths [2T, 3T).
  void upload_rows(const std::vector<int32_t>& slots, const std::vector<int32_t>& pos32,
                   const std::vector<int32_t>& lens) {
    const size_t T = slots.size();
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // aux_ may be reallocated
    aux_.resize(3 * std::max<size_t>(T, 1));
    model_->upload(aux_.get(), slots.data(), T * 4);
    model_->upload(aux_.get() + T, pos32.data(), T * 4);
    if (!lens.empty()) model_->upload(aux_.get() + 2 * T, lens.data(), T * 4);
  }

  void decode(StepResult& out) {
    const int64_t t0 = now_ns();
    std::vector<Seq*> seqs;
    for (auto& [id, s] : running_) seqs.push_back(&s);
    const int64_t T = int64_t(seqs.size()), L = cfg_.num_layers;
    std::vector<int32_t> tok(seqs.size());
    const RowDraws draws = row_draws(seqs, sampling_);
    std::vector<float> recorded(draws.record.size() * size_t(cfg_.vocab_size));  // nothing when none records
    if (graphs_ && draws.greedy && T <= graph_rows_) {  // the graph's argmax serves only all-greedy steps
      decode_graph(seqs, tok.data(), draws.record, recorded.data());
    } else {
      std::vector<int32_t> tokens, slots, pos32, lens, rows;
      std::vector<int64_t> pos;
      for (Seq* s : seqs) {
        tokens.push_back(s->last), pos.push_back(s->len), slots.push_back(s->slot), pos32.push_back(int32_t(s->len));
        lens.push_back(int32_t(s->len + 1)), rows.push_back(int32_t(rows.size()));
      }
      model_->ensure(dec_, T);
      model_->upload(dec_.tokens.get(), tokens.data(), size_t(T) * 4);
      model_->upload(dec_.pos.get(), pos.data(), size_t(T) * 8);
      model_->upload(dec_.rows.get(), rows.data(), size_t(T) * 4);
      upload_rows(slots, pos32, lens);
      CUDA_CHECK(cudaEventRecord(events_[0], stream_));
      decode_body(dec_, T, aux_.get(), aux_.get() + T, aux_.get() + 2 * T, true);
      // Synchronises the stream.
      model_->sample(dec_, T, draws.params, draws.ids, draws.steps, tok.data(), draws.record, recorded.data());
      CUDA_CHECK(cudaEventRecord(events_[1], stream_));
      CUDA_CHECK(cudaEventSynchronize(events_[1]));
      float ms = 0;
      for (int64_t l = 0; l < L; ++l) {
        CUDA_CHECK(cudaEventElapsedTime(&ms, events_[size_t(2 + 2 * l)], events_[size_t(3 + 2 * l)]));
        att_ms_ += ms;
      }
    }
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[1]));
    total_ms_ += ms;
    size_t k = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i]->len += 1;
      emit(*seqs[i], tok[i], seqs[i]->req.record_logits ? &recorded[k++ * size_t(cfg_.vocab_size)] : nullptr, out);
      out.total_context += seqs[i]->len;
    }
    out.decode_tokens = T;
    out.spans.push_back({"gpu stream 0", "decode step", t0, now_ns() - t0});
  }

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
    upload_rows(slots, pos32, {});
    model_->prefill_forward(pre_, int64_t(fresh.size()), max_len, [&](int l) {
      cuda::append_kv({.k = pre_.k.get(),
                       .v = pre_.v.get(),
                       .slots = aux_.get(),
                       .pos = aux_.get() + T,
                       .T = T,
                       .max_ctx = max_ctx_,
                       .kv_dim = int(cfg_.kv_dim()),
                       .k_cache = k_cache_[size_t(l)].get(),
                       .v_cache = v_cache_[size_t(l)].get()},
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
    prefill_ms_ += double(now_ns() - t0) / 1e6;
    out.spans.push_back({"gpu stream 0", "prefill", t0, now_ns() - t0});
  }

  // Emits the pick; the sequence continues with it, or with its forced token (teacher forcing). logits: the
  // row the pick was made from, when the request records them.
  void emit(Seq& s, int32_t tok, const float* logits, StepResult& out) {
    s.last = s.req.next_input(s.generated, tok);
    ++s.generated;
    const bool eos = s.req.stop_at_eos && tok == cfg_.eos_token_id;
    out.tokens.push_back({s.req.id, tok, s.generated >= s.req.max_new_tokens || eos, {}});
    if (logits) out.tokens.back().logits.assign(logits, logits + cfg_.vocab_size);
  }

  GpuOnlyConfig ec_;
  ModelConfig cfg_;
  SamplingParams sampling_;
  std::string device_name_;
  std::unique_ptr<cuda::SmLimitedStreams> streams_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaModel> model_;
  int64_t max_ctx_ = 0, slots_ = 0, max_batch_ = 0, graph_rows_ = 0;
  double budget_bytes_ = 0;
  bool slots_device_limited_ = false;
  std::vector<DeviceBuffer<__half>> k_cache_, v_cache_;
  DeviceBuffer<float> workspace_;
  DeviceBuffer<int32_t> aux_, graph_aux_;  // per-row slots | positions | lengths: eager steps; graphs
  DevActs graph_dec_;                  // the graphs' activations (sized for graph_rows_ rows)
  std::unique_ptr<GraphCache> graphs_;  // greedy decode step per padded batch size (cuda_graphs)
  DevActs dec_, pre_;
  std::vector<cudaEvent_t> events_;
  std::vector<int32_t> free_slots_;
  std::deque<Request> queued_;
  std::map<uint64_t, Seq> running_;
  double att_ms_ = 0, total_ms_ = 0, prefill_ms_ = 0;  // this step: decode attention, decode, prefill
};

}  // namespace

std::unique_ptr<Engine> make_gpu_only_engine(const GpuOnlyConfig& c, const EngineContext& ctx) {
  return std::make_unique<GpuOnlyEngine>(c, ctx);
}

}  // namespace fd
