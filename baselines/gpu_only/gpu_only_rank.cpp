// One S-rank of the GPU-only baseline (CUDA builds). See gpu_only_rank.h.
#include "baselines/gpu_only/gpu_only_rank.h"

#include "baselines/gpu_only/gpu_only_engine.h"

#include <algorithm>

#include "fastdecode/core/clock.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/sampling.h"

namespace fd {

namespace {
constexpr size_t kPrefillBatch = 16;  // the prefill's batch index: after every wave's (at most 15)
}  // namespace

GpuOnlyRank::GpuOnlyRank(const ModelWeights& w, const GoRankOptions& o) : o_(o) {
  CUDA_CHECK(cudaSetDevice(o_.device));
  streams_ = std::make_unique<cuda::SmLimitedStreams>(o_.sm_count, 1, o_.device);
  stream_ = streams_->stream(0);
  Communicator* tp = o_.tp && o_.tp->size() > 1 ? o_.tp : nullptr;
  model_ = std::make_unique<CudaModel>(w, stream_, streams_->limited() ? streams_->sm_count() : 0, o_.act, tp);
  model_->use_gemm_table(load_gemm_table(o_.gemm_table));
  if (tp || o_.pp) o_.cuda_graphs = false;  // collectives and hand-offs synchronise: not inside a captured graph
  for (int i = 0; i < 2 * int(w.cfg.num_layers) + 2; ++i) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
}

GpuOnlyRank::~GpuOnlyRank() {
  cudaSetDevice(o_.device);
  if (!launched_.empty()) cudaStreamSynchronize(stream_);
  graphs_.reset();
  for (auto e : events_) cudaEventDestroy(e);
  for (Launch& l : ring_)
    for (cudaEvent_t e : {l.start, l.end, l.copied})
      if (e) cudaEventDestroy(e);
}

void GpuOnlyRank::current() const { CUDA_CHECK(cudaSetDevice(o_.device)); }

double GpuOnlyRank::run_bytes_per_slot() const {
  const ModelConfig& c = config();
  const double ws_row =
      4.0 * double(cuda::decode_attention_workspace_floats(1, int(c.num_heads), int(c.head_dim), o_.max_ctx));
  // With CUDA graphs a row also has its place in the graphs' own buffers (graph_dec_: up to kMaxRows rows).
  const double graph_row = o_.cuda_graphs ? gpu_only_row_bytes(c) : 0.0;
  return double(o_.max_ctx) * double(c.num_layers) * double(c.kv_dim()) * 2 * 2 + gpu_only_row_bytes(c) + graph_row +
         ws_row;
}

void GpuOnlyRank::allocate(int64_t slots) {
  current();
  const ModelConfig& c = config();
  slots_ = slots;
  const size_t cache = size_t(slots_ + 1) * size_t(o_.max_ctx) * size_t(c.kv_dim());  // + 1: padding slot
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_cache_.emplace_back(cache);
    v_cache_.emplace_back(cache);
  }
  // Decode batches: up to slots rows. With CUDA graphs, batches of up to GraphCache::kMaxRows rows are padded
  // to a power of two (at most slots; one graph per size; padding rows attend over the spare slot `slots`) and
  // run on their own buffers, sized for the largest now and never reallocated (a graph keeps the addresses it
  // was captured with). Larger batches run eagerly.
  workspace_.resize(std::max<size_t>(
      1, cuda::decode_attention_workspace_floats(slots_, int(c.num_heads), int(c.head_dim), o_.max_ctx)));
  if (o_.cuda_graphs) {
    graph_rows_ = std::min<int64_t>(slots_, GraphCache::kMaxRows);
    graph_in_.resize(size_t(5 * graph_rows_));
    model_->ensure(graph_dec_, graph_rows_);
    graph_dec_.logits.resize(size_t(graph_rows_ * c.vocab_size));
    std::vector<int32_t> rows(static_cast<size_t>(graph_rows_));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = int32_t(i);
    model_->upload(graph_dec_.rows.get(), rows.data(), rows.size() * 4);  // the LM head reads every row
    graphs_ = std::make_unique<GraphCache>(stream_);
    for (Launch& l : ring_) {
      void* p = nullptr;
      CUDA_CHECK(cudaMallocHost(&p, size_t(graph_rows_) * 4));
      l.picks = HostBuffer(p, size_t(graph_rows_) * 4, [](void* q) { cudaFreeHost(q); });
      for (cudaEvent_t* e : {&l.start, &l.end, &l.copied}) CUDA_CHECK(cudaEventCreate(e));
    }
  }
}

DeviceBuffer<int32_t>& GpuOnlyRank::aux(size_t i) {
  while (aux_.size() <= i) aux_.push_back(std::make_unique<DeviceBuffer<int32_t>>());
  return *aux_[i];
}

HostBuffer& GpuOnlyRank::mirror(size_t i, size_t bytes) {
  while (mirrors_.size() <= i) mirrors_.emplace_back();
  HostBuffer& h = mirrors_[i];
  if (h.size() < bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    h = HostBuffer(p, bytes, [](void* q) { cudaFreeHost(q); });
  }
  return h;
}

void GpuOnlyRank::decode_body(DevActs& a, int64_t Tb, const int32_t* d_slots, const int32_t* d_lens, bool timed) {
  const ModelConfig& c = config();
  if (o_.pp_rank == 0) model_->embed(a);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    // q in fp32; the new token's k and v straight into the cache at (slot, position a.pos).
    const CudaModel::KvCacheRows cache{k_cache_[size_t(l)].get(), v_cache_[size_t(l)].get(), d_slots, o_.max_ctx};
    model_->attention_input(a, int(l), CudaModel::kF32, &cache);
    if (timed) CUDA_CHECK(cudaEventRecord(events_[size_t(2 + 2 * l)], stream_));
    cuda::decode_attention({.q = a.q.get(),
                            .k_cache = k_cache_[size_t(l)].get(),
                            .v_cache = v_cache_[size_t(l)].get(),
                            .slots = d_slots,
                            .lens = d_lens,
                            .B = Tb,
                            .max_ctx = o_.max_ctx,
                            .Hq = int(c.num_heads),
                            .Hkv = int(c.num_kv_heads),
                            .D = int(c.head_dim),
                            .workspace = workspace_.get(),
                            .out_act = a.a16.get(),  // the o-projection's 16-bit input, no cast between
                            .out_dtype = model_->act_dtype()},
                           stream_);
    if (timed) CUDA_CHECK(cudaEventRecord(events_[size_t(3 + 2 * l)], stream_));
    model_->attention_output_and_mlp(a, int(l));
  }
}

// A greedy decode wave from the graph of its padded batch size Tb (body, LM head, argmax on graph_dec_;
// graph_dec_.rows is 0, 1, ... from allocate()): rows T..Tb-1 pad the batch (token 0 at position 0 of the spare
// slot). The step's inputs go up in one copy into graph_in_ as five arrays of Tb int32 (slots, lengths, tokens,
// feed, positions), which the graph's first kernel turns into graph_dec_'s tokens and positions; a row with
// feed >= 0 (asynchronous stepping) takes its token from the previous replay's argmax output,
// graph_dec_.out_tokens, which nothing else writes. The replay runs between events `start` and `end`; the caller
// copies the picks down.
void GpuOnlyRank::replay_graph(const GoRows& r, const std::vector<int32_t>* feed, cudaEvent_t start, cudaEvent_t end) {
  const int64_t T = int64_t(r.pos.size()), Tb = std::min(GraphCache::bucket(T), graph_rows_);
  const size_t n = size_t(Tb);
  std::vector<int32_t> in(5 * n);
  int32_t *slots = in.data(), *lens = slots + n, *tokens = lens + n, *fd = tokens + n, *pos = fd + n;
  std::fill(slots, lens, int32_t(slots_));
  std::fill(lens, tokens, 1);
  std::fill(tokens, fd, 0);
  std::fill(fd, pos, -1);
  std::fill(pos, pos + n, 0);
  for (size_t i = 0; i < size_t(T); ++i) {
    slots[i] = r.slots[i], lens[i] = r.lens[i], tokens[i] = r.tokens[i], pos[i] = int32_t(r.pos[i]);
    if (feed) fd[i] = (*feed)[i];
  }
  model_->upload(graph_in_.get(), in.data(), in.size() * 4);
  model_->ensure(graph_dec_, Tb);  // sized for graph_rows_ at allocate(): sets T, never reallocates
  CUDA_CHECK(cudaEventRecord(start, stream_));
  graphs_->run(uint64_t(Tb), [&] { graph_body(Tb); });
  CUDA_CHECK(cudaEventRecord(end, stream_));
}

// What a decode graph of Tb padded rows holds: inputs from graph_in_, body, LM head, argmax.
void GpuOnlyRank::graph_body(int64_t Tb) {
  const int32_t* g = graph_in_.get();
  cuda::step_inputs(g, Tb, graph_dec_.out_tokens.get(), graph_dec_.tokens.get(), graph_dec_.pos.get(), stream_);
  decode_body(graph_dec_, Tb, g, g + Tb, false);
  model_->logits(graph_dec_, Tb);
  cuda::argmax_rows(graph_dec_.logits.get(), Tb, config().vocab_size, graph_dec_.out_tokens.get(), stream_);
}

int64_t GpuOnlyRank::warm_up(int64_t max_rows) {
  if (!graphs_ || max_rows < 1) return 0;
  current();
  int64_t captured = 0;
  for (const int64_t b : GraphCache::buckets_down(std::min(max_rows, graph_rows_))) {
    const int64_t Tb = std::min(b, graph_rows_);  // as replay_graph pads
    model_->ensure(graph_dec_, Tb);               // sized for graph_rows_ at allocate(): sets T, never reallocates
    captured += graphs_->capture(uint64_t(Tb), [&] { graph_body(Tb); });
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return captured;
}

// The replay, then the picks and the logits rows in `record` down, waited for.
void GpuOnlyRank::decode_graph(const GoRows& r, int32_t* tok, float* recorded, GoRankStep& out) {
  replay_graph(r, nullptr, events_[0], events_[1]);
  CUDA_CHECK(cudaMemcpyAsync(tok, graph_dec_.out_tokens.get(), r.pos.size() * 4, cudaMemcpyDeviceToHost, stream_));
  model_->download_logits(graph_dec_, r.draws.record, recorded);  // synchronises the stream
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[1]));
  out.decode_ms += ms;
}

// The replay and its picks' copy to this launch's pinned buffer, not waited for.
void GpuOnlyRank::launch_decode(const GoRows& r, const std::vector<int32_t>& feed) {
  FD_CHECK(can_launch(r) && feed.size() == r.pos.size() && launched_.size() < 2, "launch_decode: not a launchable wave");
  const int k = launched_.empty() ? 0 : 1 - launched_.back();
  Launch& l = ring_[k];
  replay_graph(r, &feed, l.start, l.end);
  CUDA_CHECK(cudaMemcpyAsync(l.picks.data(), graph_dec_.out_tokens.get(), r.pos.size() * 4, cudaMemcpyDeviceToHost,
                             stream_));
  CUDA_CHECK(cudaEventRecord(l.copied, stream_));
  launched_.push_back(k);
}

const int32_t* GpuOnlyRank::wait_decode(GoRankStep& out) {
  FD_CHECK(!launched_.empty(), "wait_decode: nothing launched");
  Launch& l = ring_[launched_.front()];
  launched_.pop_front();
  CUDA_CHECK(cudaEventSynchronize(l.copied));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, l.start, l.end));
  out.decode_ms += ms;
  return reinterpret_cast<const int32_t*>(l.picks.data());
}

DevActs& GpuOnlyRank::acts(size_t i) {
  while (acts_.size() <= i) acts_.push_back(std::make_unique<DevActs>());
  return *acts_[i];
}

void GpuOnlyRank::take_input(size_t i, DevActs& a, const GoRows& r, GoRankStep& out) {
  const int64_t T = int64_t(r.pos.size());
  model_->ensure(a, T);
  model_->upload({{a.tokens.get(), r.tokens.data(), o_.pp_rank == 0 ? size_t(T) * 4 : 0},
                  {a.pos.get(), r.pos.data(), size_t(T) * 8}});
  if (o_.pp_rank == 0) return;
  const size_t bytes = size_t(T * config().hidden_size) * 4;
  HostBuffer& h = mirror(i, bytes);
  const int64_t t0 = now_ns();
  o_.pp->recv(h.data(), bytes, o_.pp_rank - 1);
  CUDA_CHECK(cudaMemcpyAsync(a.x.get(), h.data(), bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  out.comm_ms += double(now_ns() - t0) / 1e6;
  out.spans.push_back({o_.comm_track, r.starts.empty() ? "residual in" : "prefill residual in", t0, now_ns() - t0});
}

// The batch's residual stream to the next stage, through pinned host memory (the local mailbox copies it at once;
// the buffer is rewritten only at the next step, after flush_sends).
void GpuOnlyRank::hand_on(size_t i, DevActs& a, GoRankStep& out) {
  const size_t bytes = size_t(a.T * config().hidden_size) * 4;
  HostBuffer& h = mirror(i, bytes);
  const int64_t t0 = now_ns();
  CUDA_CHECK(cudaMemcpyAsync(h.data(), a.x.get(), bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  o_.pp->send(h.data(), bytes, o_.pp_rank + 1);
  out.comm_ms += double(now_ns() - t0) / 1e6;
}

// Uploads the batch's per-row int32 arrays into aux(i): slots [0, n), positions [n, 2n), lengths [2n, 3n).
static void upload_rows(const CudaModel& m, DeviceBuffer<int32_t>& aux, const GoRows& r) {
  const size_t n = r.slots.size();
  std::vector<int32_t> pos32(r.pos.begin(), r.pos.end());
  aux.resize(3 * std::max<size_t>(n, 1));  // a batch index's previous use ended with a synchronised step
  m.upload(aux.get(), r.slots.data(), n * 4);
  m.upload(aux.get() + n, pos32.data(), n * 4);
  if (!r.lens.empty()) m.upload(aux.get() + 2 * n, r.lens.data(), n * 4);
}

void GpuOnlyRank::decode_wave(size_t i, const GoRows& r, GoRankStep& out) {
  const int64_t t0 = now_ns();
  const int64_t T = int64_t(r.pos.size()), L = config().num_layers, V = config().vocab_size;
  std::vector<int32_t>& tok = out.tokens[i];
  std::vector<float>& recorded = out.recorded[i];
  if (last_stage()) tok.resize(size_t(T)), recorded.resize(r.draws.record.size() * size_t(V));
  if (graphs_ && r.draws.greedy && T <= graph_rows_) {  // the graph's argmax serves only all-greedy batches
    decode_graph(r, tok.data(), recorded.data(), out);
  } else {
    DevActs& a = acts(i);
    take_input(i, a, r, out);
    std::vector<int32_t> rows(static_cast<size_t>(T));
    for (size_t k = 0; k < rows.size(); ++k) rows[k] = int32_t(k);
    model_->upload(a.rows.get(), rows.data(), size_t(T) * 4);
    DeviceBuffer<int32_t>& x = aux(i);
    upload_rows(*model_, x, r);
    CUDA_CHECK(cudaEventRecord(events_[0], stream_));
    decode_body(a, T, x.get(), x.get() + 2 * T, true);
    CUDA_CHECK(cudaEventRecord(events_[1], stream_));
    if (last_stage())  // synchronises the stream
      model_->sample(a, T, r.draws.params, r.draws.ids, r.draws.steps, tok.data(), r.draws.record, recorded.data());
    else
      hand_on(i, a, out);
    CUDA_CHECK(cudaEventSynchronize(events_[1]));
    float ms = 0;
    for (int64_t l = 0; l < L; ++l) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, events_[size_t(2 + 2 * l)], events_[size_t(3 + 2 * l)]));
      out.attention_ms += ms;
    }
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[1]));
    out.decode_ms += ms;
  }
  out.spans.push_back({o_.track, out.tokens.size() == 1 ? std::string("decode step") : "decode wave " + std::to_string(i), t0,
                       now_ns() - t0});
}

void GpuOnlyRank::prefill(size_t i, const GoRows& r, GoRankStep& out) {
  const int64_t t0 = now_ns();
  const int64_t T = int64_t(r.pos.size()), n_seq = int64_t(r.sample.size());
  DevActs& a = acts(i);
  take_input(i, a, r, out);
  model_->upload(a.starts.get(), r.starts.data(), r.starts.size() * 4);
  model_->upload(a.rows.get(), r.sample.data(), r.sample.size() * 4);
  DeviceBuffer<int32_t>& x = aux(i);
  upload_rows(*model_, x, r);
  const ModelConfig& c = config();
  model_->prefill_forward(a, n_seq, r.max_len, [&](int l) {
    cuda::append_kv({.k = a.k.get(),
                     .v = a.v.get(),
                     .slots = x.get(),
                     .pos = x.get() + T,
                     .T = T,
                     .max_ctx = o_.max_ctx,
                     .kv_dim = int(c.kv_dim()),
                     .k_cache = k_cache_[size_t(l)].get(),
                     .v_cache = v_cache_[size_t(l)].get()},
                    stream_);
  }, o_.pp_rank == 0);
  if (last_stage()) {
    out.prefill_tokens.resize(size_t(n_seq));
    out.prefill_recorded.resize(r.draws.record.size() * size_t(c.vocab_size));
    model_->sample(a, n_seq, r.draws.params, r.draws.ids, r.draws.steps, out.prefill_tokens.data(), r.draws.record,
                   out.prefill_recorded.data());
  } else {
    hand_on(i, a, out);
  }
  out.prefill_ms += double(now_ns() - t0) / 1e6;
  out.spans.push_back({o_.track, "prefill", t0, now_ns() - t0});
}

GoRankStep GpuOnlyRank::run(const GpuOnlyStepPlan& plan) {
  current();
  GoRankStep out;
  const size_t W = plan.waves.size();
  out.tokens.resize(W), out.recorded.resize(W);
  for (size_t w = 0; w < W; ++w) decode_wave(w, plan.waves[w], out);
  if (plan.has_prefill) prefill(kPrefillBatch, plan.prefill, out);
  if (o_.pp && !last_stage()) {
    const int64_t t0 = now_ns();
    o_.pp->flush_sends();
    out.comm_ms += double(now_ns() - t0) / 1e6;
  }
  return out;
}

}  // namespace fd
