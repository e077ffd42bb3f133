// The GPU-only baseline engine (CUDA builds): the leader. It owns the queue, the sequences and their cache slots,
// cuts each step into waves and a prefill (a GpuOnlyStepPlan, the same for every rank), runs its S-ranks
// (gpu_only_rank.h: inline for one, a thread each with engine.parallel) and emits the tokens. See
// gpu_only_engine.h.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>

#include "baselines/gpu_only/async_chain.h"
#include "baselines/gpu_only/gpu_only_engine.h"
#include "baselines/gpu_only/gpu_only_rank.h"
#include "fastdecode/core/clock.h"
#include "fastdecode/spart/rank_layout.h"
#include "kernels/cuda/device_info.h"

namespace fd {

namespace {

struct Seq {
  Request req;
  int32_t slot = 0;
  int64_t len = 0;  // tokens in the cache
  int64_t generated = 0;
  int32_t last = 0;
};

class GpuOnlyEngine : public Engine {
 public:
  GpuOnlyEngine(const GpuOnlyConfig& ec, const EngineContext& ctx) : ec_(ec), cfg_(ctx.model), sampling_(ctx.sampling) {
    const auto devs = cuda_devices();
    if (devs.empty()) throw ConfigError("engine.type gpu-only runs on a GPU, and no CUDA device answers (the fastdecode and reference "
                                         "engines run on the CPU)");
    const ParallelConfig& pc = ec.parallel;
    // The rank layout (fastdecode/spart/rank_layout.h). Every rank runs on a GPU: with one rank, engine.parallel.devices
    // may name it.
    RankLayout layout = rank_layout(cfg_, pc);
    place_ranks(layout, pc, RankGpus::kParallelOrListed, int64_t(devs.size()), "gpu-only engine");
    const int64_t T = layout.T, P = layout.P, G = layout.G;
    const auto& stages = layout.stages;
    devices_ = layout.devices;
    device_name_ = devs[size_t(devices_[0])].name;
    max_ctx_ = ec.max_context > 0 ? ec.max_context : cfg_.position_limit();
    // The memory budget per GPU: hardware.gpu.memory_gb, else the first rank's device's.
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaSetDevice(devices_[0]));
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    budget_bytes_ = ctx.hardware.gpu_memory_gb > 0 ? ctx.hardware.gpu_memory_gb * 1e9 : double(total_b);
    slots_ = gpu_only_parallel_slots(cfg_, T, stages, devices_, budget_bytes_, max_ctx_);
    if (slots_ < 1)
      FD_THROW("gpu-only engine: " << budget_bytes_ / 1e9 << " GB of GPU memory hold the full-depth weights of "
                                   << cfg_.name << (G > 1 ? " (per rank's share)" : "") << " but not one sequence of max_context "
                                   << max_ctx_);
    if (G > 1) comms_ = RankComms(pc, devices_);
    std::vector<ModelWeights> weights = load_rank_weights(layout, ctx.model, ctx.weights);
    for (int64_t g = 0; g < G; ++g) {
      GoRankOptions o;
      o.device = devices_[size_t(g)];
      o.sm_count = int(ctx.hardware.gpu_sm_count);
      o.act = dtype_from_name(ec.dtype);
      o.cuda_graphs = ec.cuda_graphs && G == 1;
      o.gemm_table = ctx.hardware.gpu_gemm_table;
      o.max_ctx = max_ctx_;
      o.tp = comms_.tp(size_t(g));
      o.pp = comms_.pp(size_t(g));
      o.pp_rank = int(g / T), o.pp_size = int(P);
      if (G > 1) {
        const std::string id = " t" + std::to_string(g % T) + " p" + std::to_string(g / T);
        o.track = "gpu" + id, o.comm_track = "comm" + id;
      }
      ranks_.push_back(std::make_unique<GpuOnlyRank>(weights[size_t(g)], o));
      weights[size_t(g)] = ModelWeights{};  // uploaded: free the host copy
    }
    // What this (reduced-layer) run allocates must also fit the real devices: per GPU, its ranks' caches of the
    // layers run, each row's activations (twice with CUDA graphs: their own buffers) and the attention workspace.
    std::map<int, double> per_slot;
    for (const auto& r : ranks_) per_slot[r->device()] += r->run_bytes_per_slot();
    for (const auto& [dev, bytes] : per_slot) {
      CUDA_CHECK(cudaSetDevice(dev));
      CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
      const int64_t fit = int64_t((double(free_b) - double(2ull << 30)) / bytes);
      if (fit < slots_) {
        slots_device_limited_ = true;
        slots_ = std::max<int64_t>(fit, 0);
        if (slots_ < 1) FD_THROW("gpu-only engine: GPU " << dev << " has no room for the KV-cache of one sequence");
      }
    }
    for (auto& r : ranks_) r->allocate(slots_);
    for (int64_t s = slots_ - 1; s >= 0; --s) free_slots_.push_back(int32_t(s));
    for (std::string& n : rank_notes(layout, comms_)) notes_.push_back(std::move(n));
    if (G > 1 && ec.cuda_graphs) notes_.push_back("engine.parallel: CUDA graphs are off (collectives and hand-offs synchronise)");
  }

  ~GpuOnlyEngine() override {
    shutdown();
    ranks_.clear();
    comms_.clear();
  }

  std::string name() const override { return "gpu-only"; }
  json info() const override {
    const GpuOnlyRank& r0 = *ranks_.front();
    json j = {{"device", device_name_},
              {"s_part", "cuda: " + ec_.dtype + " weights and activations, fused QKV and gate|up GEMMs (cuBLAS GemmEx, "
                         "fp32 accumulation, residual added in the GEMM)"},
              {"attention", "cuda: flash-decoding split-K over a contiguous fp16 KV-cache; tiled causal prefill"},
              {"sm_count", r0.sm_count()},
              {"sm_limited", r0.sm_limited()},
              {"memory_budget_gb", budget_bytes_ / 1e9},
              {"max_context", max_ctx_},
              {"slots", slots_},
              {"cuda_graphs", r0.graphs()},
              {"async_steps", async_enabled()},  // whether decode steps can be launched ahead
              {"gemm_table", r0.model().gemm_table_info()},
              {"slots_limited_by_device", slots_device_limited_}};
    if (ranks_.size() > 1) {
      const ParallelConfig& pc = ec_.parallel;
      json r = json::array();
      for (size_t g = 0; g < ranks_.size(); ++g) {
        const ModelConfig& c = ranks_[g]->config();
        r.push_back({{"t", int64_t(g) % pc.tensor}, {"p", int64_t(g) / pc.tensor}, {"device", devices_[g]},
                     {"layers", c.num_layers}, {"heads", c.num_heads}, {"kv_heads", c.num_kv_heads}});
      }
      j["parallel"] = {{"tensor", pc.tensor}, {"pipeline", pc.pipeline}, {"waves", pc.wave_count()},
                       {"comm", {{"tensor", comms_.tensor_describe()}, {"pipeline", comms_.pipeline_describe()}}}};
      j["ranks"] = r;
    }
    return j;
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
  json warm_up(int64_t max_batch) override {
    int64_t graphs = 0;
    for (auto& r : ranks_) graphs += r->warm_up(std::min(max_batch, slots_));
    return graphs ? json{{"graphs", graphs}} : json::object();
  }

  // Bounded by slots (it queues requests beyond them itself), not by a KV token budget.
  EngineCapacity capacity(int64_t, int64_t) const override {
    EngineCapacity c;
    c.slots = slots_;
    return c;
  }

  StepResult step() override {
    if (!inflight_.empty()) return step_async();
    StepResult out;
    GpuOnlyStepPlan plan;
    std::vector<std::vector<Seq*>> waves;
    if (!running_.empty()) plan_decode(plan, waves);
    std::vector<Seq*> fresh;
    int64_t budget = ec_.prefill_tokens;  // prompt tokens per step (whole prompts, at least one)
    while (!queued_.empty() && !free_slots_.empty() && (fresh.empty() || int64_t(queued_.front().prompt.size()) <= budget)) {
      budget -= int64_t(queued_.front().prompt.size());
      Seq s;
      s.req = std::move(queued_.front());
      queued_.pop_front();
      s.slot = free_slots_.back();
      free_slots_.pop_back();
      const uint64_t id = s.req.id;
      fresh.push_back(&running_.emplace(id, std::move(s)).first->second);
    }
    if (!fresh.empty()) plan_prefill(plan, fresh);
    // Every rank runs the plan; the tokens are the last stage's tensor rank 0's (its peers picked the same).
    std::vector<GoRankStep> res(ranks_.size());
    run_on_ranks(ranks_.size(), size_t(ec_.parallel.tensor), "gpu-only engine",
                 [&](size_t g) { res[g] = ranks_[g]->run(plan); }, [&](size_t g) { comms_.abort(g); });
    const GoRankStep& last = res[size_t((ec_.parallel.pipeline - 1) * ec_.parallel.tensor)];
    for (size_t w = 0; w < waves.size(); ++w) {
      const GoRows& r = plan.waves[w];
      for (size_t i = 0, k = 0; i < waves[w].size(); ++i) {
        Seq& s = *waves[w][i];
        s.len += 1;
        emit(s, last.tokens[w].at(i), s.req.record_logits ? &last.recorded[w].at(k++ * size_t(cfg_.vocab_size)) : nullptr, out);
        out.total_context += s.len;
      }
      out.decode_tokens += int64_t(r.pos.size());
    }
    for (size_t i = 0, k = 0; i < fresh.size(); ++i) {
      fresh[i]->len = int64_t(fresh[i]->req.prompt.size());
      emit(*fresh[i], last.prefill_tokens.at(i),
           fresh[i]->req.record_logits ? &last.prefill_recorded.at(k++ * size_t(cfg_.vocab_size)) : nullptr, out);
      out.total_context += fresh[i]->len;
    }
    if (plan.has_prefill) out.prefill_tokens = int64_t(plan.prefill.pos.size());
    for (const auto& t : out.tokens) {
      if (!t.finished) continue;
      free_slots_.push_back(running_.at(t.request_id).slot);
      running_.erase(t.request_id);
    }
    // Each the largest over the ranks (the step waits for the slowest); comm: the longest time a rank spent in
    // stage hand-offs.
    double att = 0, dec = 0, pre = 0, comm = 0;
    for (auto& r : res) {
      att = std::max(att, r.attention_ms), dec = std::max(dec, r.decode_ms), pre = std::max(pre, r.prefill_ms);
      comm = std::max(comm, r.comm_ms);
      out.spans.insert(out.spans.end(), std::make_move_iterator(r.spans.begin()), std::make_move_iterator(r.spans.end()));
    }
    out.breakdown_ms = {{"gpu_attention", att}, {"gpu_decode", dec}, {"prefill", pre}};
    if (ranks_.size() > 1) out.breakdown_ms["comm"] = comm;
    if (async_ok()) {  // the next decode step starts now, from the tokens just emitted (its graph captured before)
      InFlight f;
      GoRows r;
      std::vector<int32_t> feed;
      for (auto& [id, s] : running_) {
        if (!async_row(s)) return out;
        f.ids.push_back(id), f.pos.push_back(s.len), feed.push_back(-1);
        add_row(r, s, s.last, s.len, s.generated);
      }
      if (ranks_[0]->can_launch(r, true)) launch(std::move(f), r, feed);
    }
    return out;
  }

  void shutdown() override {
    drain();
    queued_.clear();
    running_.clear();
  }

 private:
  // The running sequences in W waves of consecutive rows (W = engine.parallel's waves; fewer when fewer run).
  void plan_decode(GpuOnlyStepPlan& plan, std::vector<std::vector<Seq*>>& waves) {
    std::vector<Seq*> seqs;
    for (auto& [id, s] : running_) seqs.push_back(&s);
    const std::vector<size_t> b = wave_bounds(seqs.size(), ec_.parallel.wave_count());
    for (size_t w = 0; w + 1 < b.size(); ++w) {
      waves.emplace_back(seqs.begin() + long(b[w]), seqs.begin() + long(b[w + 1]));
      GoRows r;
      for (Seq* s : waves.back()) {
        r.tokens.push_back(s->last), r.pos.push_back(s->len), r.slots.push_back(s->slot);
        r.lens.push_back(int32_t(s->len + 1)), r.sample.push_back(int32_t(r.sample.size()));
        r.draws.add(s->req, s->generated, sampling_);
      }
      plan.waves.push_back(std::move(r));
    }
  }

  void plan_prefill(GpuOnlyStepPlan& plan, const std::vector<Seq*>& fresh) {
    GoRows& r = plan.prefill;
    plan.has_prefill = true;
    for (Seq* s : fresh) {
      r.starts.push_back(int32_t(r.tokens.size()));
      const int64_t n = int64_t(s->req.prompt.size());
      r.max_len = std::max(r.max_len, n);
      for (int64_t t = 0; t < n; ++t) r.tokens.push_back(s->req.prompt[size_t(t)]), r.pos.push_back(t), r.slots.push_back(s->slot);
      r.sample.push_back(int32_t(r.tokens.size() - 1));
      r.draws.add(s->req, s->generated, sampling_);
    }
    r.starts.push_back(int32_t(r.tokens.size()));
  }

  // Asynchronous stepping (engine.async_steps): a greedy decode step of the whole running batch is launched before
  // the host reads the step before's tokens, its input tokens taken on the device from that step's picks, so the
  // GPU goes from one step to the next without waiting for the host. A row whose sequence turns out to have ended
  // at the step before (eos) is computed and dropped; a sequence reaching max_new_tokens is left out ahead. Only
  // with one rank and graphs, one wave, every row greedy without forced tokens or recorded logits, and nothing
  // queued that could start (the queue empty, or no slot free and none freeing at the step read: then the next step
  // is synchronous and starts the queued as the synchronous engine does). A request that arrives while a step is in
  // flight, or a slot freed by eos, starts a step later than it would have.
  struct InFlight {
    std::vector<uint64_t> ids;  // per row: its request
    std::vector<int64_t> pos;   // per row: the position its token went to
    int64_t t0 = 0;             // launched (now_ns)
  };

  // engine.async_steps with one rank, graphs and one wave: whether decode steps can ever be launched ahead.
  bool async_enabled() const {
    return ec_.async_steps && ranks_.size() == 1 && ranks_[0]->graphs() && ec_.parallel.wave_count() == 1;
  }
  // ... and now: something runs, and nothing queued could start.
  bool async_ok() const { return async_enabled() && (queued_.empty() || free_slots_.empty()) && !running_.empty(); }
  bool async_row(const Seq& s) const {
    return s.req.forced.empty() && !s.req.record_logits && s.req.sampling_or(sampling_).greedy();
  }
  void add_row(GoRows& r, const Seq& s, int32_t token, int64_t pos, int64_t generated) const {
    r.tokens.push_back(token), r.pos.push_back(pos), r.slots.push_back(s.slot);
    r.lens.push_back(int32_t(pos + 1)), r.sample.push_back(int32_t(r.sample.size()));
    r.draws.add(s.req, generated, sampling_);
  }
  void launch(InFlight f, const GoRows& r, const std::vector<int32_t>& feed) {
    if (r.pos.empty() || !ranks_[0]->can_launch(r)) return;
    f.t0 = now_ns();
    ranks_[0]->launch_decode(r, feed);
    inflight_.push_back(std::move(f));
  }
  // Waits for what is in flight and drops it.
  void drain() {
    GoRankStep ignored;
    while (!inflight_.empty()) ranks_[0]->wait_decode(ignored), inflight_.pop_front();
  }

  // A step whose decode was launched by the call before: launch the one after it (when it may run), then read it.
  StepResult step_async() {
    StepResult out;
    const InFlight& cur = inflight_.front();
    if (async_ok()) {
      std::vector<ChainRow> rows(cur.ids.size());
      for (size_t i = 0; i < cur.ids.size(); ++i) {
        auto it = running_.find(cur.ids[i]);
        if (it == running_.end()) continue;  // ended before cur: its row was computed and dropped
        rows[i] = {true, async_row(it->second), it->second.generated, it->second.req.max_new_tokens};
      }
      InFlight next;
      GoRows r;
      std::vector<int32_t> feed = chain_rows(rows, !queued_.empty());
      for (int32_t i : feed) {
        const Seq& s = running_.at(cur.ids[size_t(i)]);
        next.ids.push_back(cur.ids[size_t(i)]), next.pos.push_back(cur.pos[size_t(i)] + 1);
        add_row(r, s, 0, cur.pos[size_t(i)] + 1, s.generated + 1);
      }
      launch(std::move(next), r, feed);  // nothing when feed is empty
    }
    GoRankStep res;
    const int32_t* picks = ranks_[0]->wait_decode(res);
    const InFlight done_step = std::move(inflight_.front());
    inflight_.pop_front();
    int64_t dropped = 0;
    for (size_t i = 0; i < done_step.ids.size(); ++i) {
      auto it = running_.find(done_step.ids[i]);
      if (it == running_.end()) {
        ++dropped;
        continue;
      }
      Seq& s = it->second;
      s.len += 1;
      emit(s, picks[i], nullptr, out);
      out.total_context += s.len;
      ++out.decode_tokens;
    }
    for (const auto& t : out.tokens) {
      if (!t.finished) continue;
      free_slots_.push_back(running_.at(t.request_id).slot);
      running_.erase(t.request_id);
    }
    if (running_.empty()) drain();  // every row of a step launched after this one ended here
    out.breakdown_ms = {{"gpu_attention", 0.0}, {"gpu_decode", res.decode_ms}, {"prefill", 0.0}};
    out.counts = {{"async_steps", 1}, {"async_dropped_rows", dropped}};
    // The step ran on the GPU from its launch or the step before's end, whichever was later: spans on the track
    // follow one another, not overlap (a launch ahead of time is not the step running).
    const int64_t end = now_ns(), start = std::max(done_step.t0, last_read_ns_);
    out.spans.push_back({"gpu stream 0", "decode step (async)", start, end - start});
    last_read_ns_ = end;
    return out;
  }

  // Emits the pick; the sequence continues with it, or with its forced token (teacher forcing). logits: the
  // row the pick was made from, when the request records them.
  void emit(Seq& s, int32_t tok, const float* logits, StepResult& out) {
    emit_pick(s, tok, logits, cfg_.eos_token_id, cfg_.vocab_size, out);
  }

  GpuOnlyConfig ec_;
  ModelConfig cfg_;
  SamplingParams sampling_;
  std::string device_name_;
  std::vector<int> devices_;  // the GPU of rank g
  RankComms comms_;
  std::vector<std::unique_ptr<GpuOnlyRank>> ranks_;  // rank g = p * T + t
  int64_t max_ctx_ = 0, slots_ = 0;
  double budget_bytes_ = 0;
  bool slots_device_limited_ = false;
  std::vector<int32_t> free_slots_;
  std::deque<Request> queued_;
  std::map<uint64_t, Seq> running_;
  std::deque<InFlight> inflight_;  // launched decode steps not yet read (async_steps; at most two)
  int64_t last_read_ns_ = 0;       // when step_async last read a step (its span's end)
};

}  // namespace

std::unique_ptr<Engine> make_gpu_only_engine(const GpuOnlyConfig& c, const EngineContext& ctx) {
  return std::make_unique<GpuOnlyEngine>(c, ctx);
}

}  // namespace fd
