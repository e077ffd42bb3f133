// The hybrid engine (CUDA builds): the leader. See hybrid_engine.h and docs/HYBRID.md.
#include "extensions/hybrid/hybrid_engine.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>

#include "baselines/gpu_only/gpu_only_engine.h"
#include "extensions/hybrid/hybrid_rank.h"
#include "fastdecode/core/clock.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/wire/curve.h"
#include "kernels/cuda/device_info.h"

namespace fd {

namespace {

struct Seq {
  Request req;
  Placement at;       // the GPU (slot) or an R-worker
  int32_t slot = -1;  // GPU-resident: its cache slot
  int64_t len = 0;    // tokens in its KV-cache
  int64_t generated = 0;
  int32_t last = 0;
};

class HybridEngine : public Engine {
 public:
  HybridEngine(const HybridConfig& c, const EngineContext& ctx) : ec_(c), cfg_(ctx.model), sampling_(ctx.sampling) {
    const auto devs = cuda_devices();
    if (devs.empty()) throw ConfigError("engine.type hybrid runs on a GPU, and no CUDA device answers (the fastdecode and reference "
                                         "engines run on the CPU)");
    if (cfg_.head_dim % 32 != 0 || cfg_.head_dim > 256)
      FD_THROW("hybrid engine: model " << cfg_.name << " has head_dim " << cfg_.head_dim
                                       << "; the R-worker kernels need a multiple of 32, at most 256");
    RWorkersConfig rw = ec_.rworkers;
    if (ctx.hardware.rworkers > 0) rw.spawn = ctx.hardware.rworkers, rw.pin = true;
    if (ctx.hardware.rworker_threads > 0) rw.threads = ctx.hardware.rworker_threads;
    // The CPU side first (before any CUDA context): spawned or listed workers.
    std::vector<std::string> endpoints = rw.endpoints;
    if (endpoints.empty()) {
      const std::string bin = rw.binary.empty() ? default_rworker_binary() : rw.binary;
      for (int64_t i = 0; i < rw.spawn; ++i) {
        const std::vector<std::string> args = rw.spawn_args("rworker" + std::to_string(i), i * rw.threads);
        spawned_.push_back(std::make_unique<SpawnedRWorker>(bin, args));
        endpoints.push_back(spawned_.back()->endpoint());
      }
    }
    RWorkerClientOptions co;
    co.timeout_ms = int(rw.timeout_ms), co.heartbeat_ms = int(rw.heartbeat_ms), co.heartbeat_timeout_ms = int(rw.heartbeat_timeout_ms);
    co.shm_bytes = rw.shm ? kEngineShmBytes : 0;
    co.spin_us = int(rw.spin_us);  // with shm, the rings: the engagement cost calibrate() measures is then theirs
    if (!rw.curve_server_public.empty())
      co.curve_server_public = read_curve_public(rw.curve_server_public), co.curve_client = read_curve_secret(rw.curve_client_secret);
    // The GPU side: the GPU-only engine's memory rule (full-depth weights and KV in the budget).
    max_ctx_ = ec_.max_context > 0 ? ec_.max_context : cfg_.position_limit();
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    budget_bytes_ = ctx.hardware.gpu_memory_gb > 0 ? ctx.hardware.gpu_memory_gb * 1e9 : double(total_b);
    slots_ = gpu_only_slots(cfg_, budget_bytes_, max_ctx_);
    if (slots_ < 1)
      FD_THROW("hybrid engine: " << budget_bytes_ / 1e9 << " GB of GPU memory hold the full-depth weights of " << cfg_.name
                                 << " but not one sequence of max_context " << max_ctx_);
    GoRankOptions o;
    o.sm_count = int(ctx.hardware.gpu_sm_count);
    o.act = dtype_from_name(ec_.dtype);
    o.cuda_graphs = ec_.cuda_graphs;
    o.max_ctx = max_ctx_;
    o.gemm_table = ctx.hardware.gpu_gemm_table;
    rank_ = std::make_unique<HybridRank>(load_model_weights(ctx.model, ctx.weights), o,
                                         std::make_unique<RWorkerClient>(endpoints, co));
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const int64_t fit = int64_t((double(free_b) - double(2ull << 30)) / rank_->run_bytes_per_slot());
    if (fit < slots_) slots_ = std::max<int64_t>(fit, 1), slots_device_limited_ = true;
    rank_->allocate(slots_);
    for (int64_t s = slots_ - 1; s >= 0; --s) free_slots_.push_back(int32_t(s));
    // The CPU side's pools at full depth: each worker's memory over a full-depth block of 32 tokens.
    std::vector<KvPool> pools;
    for (const json& h : rank_->hello()) {
      const double per_block = h.at("kv_bytes_per_token_per_layer").get<double>() * 32 * double(cfg_.full_num_layers) +
                               h.at("kv_tail_block_bytes").get<double>() * double(cfg_.full_num_layers);
      pools.push_back({int64_t(h.at("memory_free_bytes").get<double>() / per_block), 32});
    }
    // The controller's prior: measured here; corrected by every step's measurement.
    rates_ = rank_->calibrate(slots_ + 256);
    ctl_ = std::make_unique<HybridController>(ec_.controller, rates_, KvPool{slots_, max_ctx_}, pools);
    notes_.push_back("hybrid: migration between the sides is not built: a sequence stays on the side it was placed on");
    notes_.push_back("hybrid: the controller's prior rates were measured at start (engine_info.prior) and are corrected "
                     "by every decode step's measurement");
    info_ = make_info();
  }

  ~HybridEngine() override {
    try {
      shutdown();
    } catch (...) {
    }
  }

  std::string name() const override { return "hybrid"; }
  json info() const override { return info_; }  // made at construction: it outlives shutdown()

 private:
  json make_info() const {
    json prior = {{"s_part_per_layer", rates_.s_part.points()}, {"gpu_s_per_token", rates_.gpu_s_per_token},
                  {"gpu_s_per_seq", rates_.gpu_s_per_seq},      {"engage_s", rates_.engage_s},
                  {"move_s_per_token", rates_.move_s_per_token}};
    json w = json::array();
    for (const auto& x : rates_.workers)
      w.push_back({{"s_per_token", x.s_per_token}, {"s_per_seq", x.s_per_seq}, {"s_per_call", x.s_per_call}});
    prior["workers"] = w;
    json workers = json::array();
    for (size_t i = 0; i < rank_->hello().size(); ++i)
      workers.push_back({{"endpoint", rank_->client().endpoint(i)}, {"hello", rank_->hello()[i]}});
    return {{"controller", ec_.controller.to_json()}, {"prior", prior}, {"slots", slots_}, {"max_context", max_ctx_},
            {"memory_budget_gb", budget_bytes_ / 1e9}, {"slots_limited_by_device", slots_device_limited_},
            {"combined_capacity_tokens", ctl_->combined_capacity_tokens()}, {"rworkers", workers},
            {"cuda_graphs", rank_->graphs()}, {"sm_count", rank_->sm_count()},
            {"gemm_table", rank_->model().gemm_table_info()}};
  }

 public:

  void add(const std::vector<Request>& requests) override {
    for (const auto& r : requests) {
      validate_request(r, cfg_);
      const int64_t need = int64_t(r.prompt.size()) + r.max_new_tokens - 1;
      if (need > max_ctx_)
        FD_THROW("request " << r.id << " needs " << need << " cache positions; hybrid max_context is " << max_ctx_);
    }
    queued_.insert(queued_.end(), requests.begin(), requests.end());
  }
  bool done() const override { return queued_.empty() && running_.empty(); }
  EngineCapacity capacity(int64_t, int64_t) const override { return {}; }  // it admits by its controller's pools

  StepResult step() override;
  void shutdown() override {
    if (!rank_) return;
    std::vector<std::string> tokens;
    for (const auto& p : spawned_) tokens.push_back(p->token());
    rank_->shutdown(!spawned_.empty(), tokens);
    for (auto& p : spawned_) p->wait_exit();
    spawned_.clear();
    queued_.clear();
    running_.clear();
    rank_.reset();
  }

 private:
  void plan_decode(HybridStepPlan& plan, std::vector<std::vector<Seq*>>& mbs);
  void plan_prefill(HybridStepPlan& plan, std::vector<Seq*>& fresh);
  void emit(Seq& s, int32_t tok, const float* logits, StepResult& out) {
    emit_pick(s, tok, logits, cfg_.eos_token_id, cfg_.vocab_size, out);
  }

  HybridConfig ec_;
  json info_;
  ModelConfig cfg_;
  SamplingParams sampling_;
  std::vector<std::unique_ptr<SpawnedRWorker>> spawned_;
  std::unique_ptr<HybridRank> rank_;
  std::unique_ptr<HybridController> ctl_;
  HybridRates rates_;
  int64_t max_ctx_ = 0, slots_ = 0;
  double budget_bytes_ = 0;
  bool slots_device_limited_ = false;
  std::vector<int32_t> free_slots_;
  std::deque<Request> queued_;
  std::map<uint64_t, Seq> running_;
  std::vector<std::pair<size_t, std::vector<uint64_t>>> frees_;  // CPU-resident sequences finished last step
};

// The running sequences in batches: every GPU row first, then each worker's rows. With sequences on both sides, two
// mini-batches (each side's sequences alternate between them); all on the GPU: one batch, as GPU-only runs.
void HybridEngine::plan_decode(HybridStepPlan& plan, std::vector<std::vector<Seq*>>& mbs) {
  bool cpu = false;
  for (auto& [id, s] : running_) cpu = cpu || !s.at.on_gpu;
  const size_t n_mb = cpu ? size_t(std::min<int64_t>(ec_.mini_batches, int64_t(running_.size()))) : 1;
  mbs.assign(n_mb, {});
  std::map<int, size_t> turn;
  for (auto& [id, s] : running_) mbs[turn[s.at.on_gpu ? -1 : s.at.worker]++ % n_mb].push_back(&s);
  for (auto& mb : mbs) {
    std::stable_sort(mb.begin(), mb.end(), [](const Seq* a, const Seq* b) {
      const int wa = a->at.on_gpu ? -1 : a->at.worker, wb = b->at.on_gpu ? -1 : b->at.worker;
      return wa < wb;
    });
    HyBatch b;
    for (Seq* s : mb) {
      GoRows& r = b.rows;
      if (s->at.on_gpu) ++b.n_gpu;
      else if (b.parts.empty() || b.parts.back().worker != size_t(s->at.worker))
        b.parts.push_back({size_t(s->at.worker), r.pos.size(), r.pos.size(), {}, {}});
      if (!s->at.on_gpu) b.parts.back().end = r.pos.size() + 1, b.parts.back().ids.push_back(s->req.id);
      r.tokens.push_back(s->last), r.pos.push_back(s->len), r.slots.push_back(std::max(s->slot, 0));
      r.lens.push_back(int32_t(s->len + 1)), r.sample.push_back(int32_t(r.sample.size()));
      r.draws.add(s->req, s->generated, sampling_);
    }
    plan.decode.push_back(std::move(b));
  }
}

// New requests, in order, while the controller admits them (within prefill_tokens): each on the GPU (a free slot)
// or an R-worker, as it places them; the first it turns away waits, and so do the ones after it.
void HybridEngine::plan_prefill(HybridStepPlan& plan, std::vector<Seq*>& fresh) {
  int64_t budget = ec_.prefill_tokens;
  std::map<size_t, std::vector<uint64_t>> adds;
  while (!queued_.empty() && (fresh.empty() || int64_t(queued_.front().prompt.size()) <= budget)) {
    const Request& q = queued_.front();
    const Admission a = ctl_->admit(int64_t(q.id), int64_t(q.prompt.size()), int64_t(q.prompt.size()) + q.max_new_tokens);
    if (!a.admitted) break;
    budget -= int64_t(q.prompt.size());
    Seq s;
    s.req = std::move(queued_.front());
    queued_.pop_front();
    s.at = a.where;
    if (s.at.on_gpu) {
      FD_CHECK(!free_slots_.empty(), "hybrid engine: the controller placed a sequence on a full GPU pool");
      s.slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      adds[size_t(s.at.worker)].push_back(s.req.id);
    }
    const uint64_t id = s.req.id;
    fresh.push_back(&running_.emplace(id, std::move(s)).first->second);
  }
  if (fresh.empty()) return;
  plan.adds.assign(adds.begin(), adds.end());
  std::stable_sort(fresh.begin(), fresh.end(), [](const Seq* a, const Seq* b) {
    return (a->at.on_gpu ? -1 : a->at.worker) < (b->at.on_gpu ? -1 : b->at.worker);
  });
  plan.has_prefill = true;
  HyBatch& b = plan.prefill;
  GoRows& r = b.rows;
  for (Seq* s : fresh) {
    const int64_t n = int64_t(s->req.prompt.size());
    if (!s->at.on_gpu) {
      if (b.parts.empty() || b.parts.back().worker != size_t(s->at.worker))
        b.parts.push_back({size_t(s->at.worker), r.pos.size(), r.pos.size(), {}, {}});
      b.parts.back().end = r.pos.size() + size_t(n);
      b.parts.back().ids.push_back(s->req.id);
      b.parts.back().counts.push_back(uint32_t(n));
    } else {
      b.n_gpu += size_t(n);
    }
    r.starts.push_back(int32_t(r.tokens.size()));
    r.max_len = std::max(r.max_len, n);
    for (int64_t t = 0; t < n; ++t)
      r.tokens.push_back(s->req.prompt[size_t(t)]), r.pos.push_back(t), r.slots.push_back(std::max(s->slot, 0));
    r.sample.push_back(int32_t(r.tokens.size() - 1));
    r.draws.add(s->req, s->generated, sampling_);
  }
  r.starts.push_back(int32_t(r.tokens.size()));
}

StepResult HybridEngine::step() {
  StepResult out;
  HybridStepPlan plan;
  plan.frees = std::move(frees_);
  frees_.clear();
  std::vector<std::vector<Seq*>> mbs;
  if (!running_.empty()) plan_decode(plan, mbs);
  std::vector<Seq*> fresh;
  if (!queued_.empty()) plan_prefill(plan, fresh);
  const StepCost predicted = ctl_->predict();
  HyStep res = rank_->run(plan);
  // What the controller learns from the decode part: the S-Part, the GPU's attention, each worker's compute.
  StepMeasure m;
  m.layers = cfg_.num_layers;
  m.workers.resize(rank_->client().size());
  int64_t n_cpu = 0;
  for (size_t b = 0; b < mbs.size(); ++b) {
    for (Seq* s : mbs[b]) {
      ++m.batch;
      if (s->at.on_gpu) ++m.gpu_seqs, m.gpu_tokens += s->len + 1;
      else ++n_cpu, ++m.workers[size_t(s->at.worker)].seqs, m.workers[size_t(s->at.worker)].tokens += s->len + 1;
      s->len += 1;
    }
    const GoRows& r = plan.decode[b].rows;
    for (size_t i = 0, k = 0; i < mbs[b].size(); ++i) {
      Seq& s = *mbs[b][i];
      emit(s, res.tokens[b].at(i), s.req.record_logits ? &res.recorded[b].at(k++ * size_t(cfg_.vocab_size)) : nullptr, out);
      out.total_context += s.len;
    }
    out.decode_tokens += int64_t(r.pos.size());
  }
  if (m.batch > 0) {
    m.s_part_s = res.s_part_ms / 1e3;
    if (m.gpu_seqs > 0) m.gpu_attn_s = res.gpu_attn_ms / 1e3;
    for (size_t w = 0; w < m.workers.size(); ++w)
      if (m.workers[w].seqs > 0) m.workers[w].compute_s = res.worker_ms[w] / 1e3;
    ctl_->observe(m);
  }
  for (size_t i = 0, k = 0; i < fresh.size(); ++i) {
    Seq& s = *fresh[i];
    s.len = int64_t(s.req.prompt.size());
    emit(s, res.prefill_tokens.at(i), s.req.record_logits ? &res.prefill_recorded.at(k++ * size_t(cfg_.vocab_size)) : nullptr, out);
    out.total_context += s.len;
  }
  if (plan.has_prefill) out.prefill_tokens = int64_t(plan.prefill.rows.pos.size());
  ctl_->advance();
  std::map<size_t, std::vector<uint64_t>> frees;
  for (const auto& t : out.tokens) {
    if (!t.finished) continue;
    Seq& s = running_.at(t.request_id);
    if (s.at.on_gpu) free_slots_.push_back(s.slot);
    else frees[size_t(s.at.worker)].push_back(t.request_id);
    ctl_->finish(int64_t(t.request_id));
    running_.erase(t.request_id);
  }
  frees_.assign(frees.begin(), frees.end());
  out.breakdown_ms = {{"s_part", res.s_part_ms},   {"gpu_attention", res.gpu_attn_ms}, {"r_wait", res.r_wait_ms},
                      {"gpu_decode", res.decode_ms}, {"prefill", res.prefill_ms},
                      {"modelled_step", predicted.step * 1e3 * double(cfg_.num_layers)}};
  double busiest = 0;
  for (double w : res.worker_ms) busiest = std::max(busiest, w);
  out.breakdown_ms["r_compute_max"] = busiest;
  out.counts = {{"cpu_seqs", n_cpu}, {"gpu_seqs", m.gpu_seqs}};
  out.spans = std::move(res.spans);
  return out;
}

}  // namespace

std::unique_ptr<Engine> make_hybrid_engine(const HybridConfig& c, const EngineContext& ctx) {
  return std::make_unique<HybridEngine>(c, ctx);
}

}  // namespace fd
