#include "fastdecode/sworker/fastdecode_engine.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <map>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/core/fault.h"
#include "fastdecode/model/reference.h"
#include "fastdecode/wire/rworker_client.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/spart/spart.h"
#include "kernels/cuda/device_info.h"

namespace fd {

namespace {

using proto::Header;
using proto::MsgType;
using proto::WireDType;

// "L3 mb1 attention input": span names (snprintf: GCC 12 warns falsely on chained std::string +).
std::string span_name(int layer, int mb, const char* what) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "L%d mb%d%s%s", layer, mb, *what ? " " : "", what);
  return buf;
}

struct Sequence {
  Request req;
  size_t worker = 0;
  int64_t len = 0;  // tokens in the KV-cache
  int64_t generated = 0;
  int32_t last = 0;
  int32_t emitted_before = -1;  // planted fault shift_tokens only: the token emitted in its place
};

// One mini-batch in flight through the layers. Its sequences are ordered by owning R-worker, so each
// worker's rows are one contiguous range of the q/k/v host buffers and are sent from there without a
// copy (the buffers live until the reply arrives: zero-copy sends). Activations live in the S-Part's
// slot of the same index.
struct MiniBatch {
  int index = 0;
  std::vector<Sequence*> seqs;
  std::vector<int64_t> pos;
  HostBuffer q, k, v;  // [T, q_dim] / [T, kv_dim] in the wire dtype
  struct Part {
    size_t begin = 0, end = 0;  // rows of this mini-batch owned by the worker
    std::vector<uint64_t> ids;
    uint64_t request = 0;
  };
  std::vector<Part> parts;  // per worker
};

// Grows a backend host buffer to at least `bytes`.
void reserve(SPart& sp, HostBuffer& b, size_t bytes) {
  if (b.size() < bytes) b = sp.alloc_host(std::max(bytes, b.size() + b.size() / 2));
}

// The config as this engine runs it: backend "auto" decided (cuda when a GPU answers), the wire dtype's
// default filled in, the hardware balance applied to spawned R-workers.
FastDecodeConfig resolve(FastDecodeConfig c, const HardwareBalance& hw) {
  if (c.backend == "auto") c.backend = cuda_devices().empty() ? "cpu" : "cuda";
  if (c.wire_dtype.empty()) c.wire_dtype = c.backend == "cuda" ? "fp16" : "fp32";
  if (hw.rworkers > 0) c.rworkers.spawn = hw.rworkers, c.rworkers.pin = true;
  if (hw.rworker_threads > 0) c.rworkers.threads = hw.rworker_threads;
  return c;
}

class FastDecodeEngine : public Engine {
 public:
  FastDecodeEngine(const FastDecodeConfig& config, const EngineContext& ctx)
      : ec_(resolve(config, ctx.hardware)), cfg_(ctx.model), sampling_(ctx.sampling),
        spart_(ec_.backend == "cuda"
                   ? make_cuda_spart(load_model_weights(ctx.model, ctx.weights),
                                     {int(ctx.hardware.gpu_sm_count), dtype_from_name(ec_.dtype), ec_.cuda_graphs})
                   : make_cpu_spart(load_model_weights(ctx.model, ctx.weights))),
        wire_(ec_.wire_dtype == "fp16" ? WireDType::F16 : WireDType::F32) {
    const FastDecodeConfig& ec = ec_;
    if ((ctx.hardware.gpu_memory_gb > 0 || ctx.hardware.gpu_sm_count > 0) && ec.backend != "cuda")
      notes_.push_back("hardware.gpu is not applied: the fastdecode engine runs nothing on a GPU here");
    if (ctx.hardware.gpu_memory_gb > 0)
      notes_.push_back("hardware.gpu.memory_gb bounds FastDecode's full-depth weights only: its KV-cache lives on the R-workers");
    notes_.push_back("rworker tracks in trace.json: each span's duration is the R-worker's own compute time; its "
                     "placement (ending when the reply was in hand) is approximate");
    if (cfg_.head_dim % 32 != 0 || cfg_.head_dim > 256)
      FD_THROW("fastdecode engine: model " << cfg_.name << " has head_dim " << cfg_.head_dim
                                           << "; the R-worker kernels need a multiple of 32, at most 256");
    std::vector<std::string> endpoints = ec.rworkers.endpoints;
    if (endpoints.empty()) {
      const std::string bin = ec.rworkers.binary.empty() ? default_rworker_binary() : ec.rworkers.binary;
      for (int64_t i = 0; i < ec.rworkers.spawn; ++i) {
        std::vector<std::string> args = {"--threads", std::to_string(ec.rworkers.threads), "--kv-dtype",
                                          ec.rworkers.kv_dtype, "--memory-gb", std::to_string(ec.rworkers.memory_gb),
                                          "--name", "rworker" + std::to_string(i)};
        if (ec.rworkers.pin) {  // disjoint cores per worker: the emulated CPU count is exact
          const int64_t first = i * ec.rworkers.threads, last = first + ec.rworkers.threads - 1;
          char cpus[48];
          std::snprintf(cpus, sizeof cpus, "%lld-%lld", (long long)first, (long long)last);
          args.insert(args.end(), {"--cpus", cpus});
        }
        spawned_.push_back(std::make_unique<SpawnedRWorker>(bin, args));
        endpoints.push_back(spawned_.back()->endpoint());
      }
    }
    client_ = std::make_unique<RWorkerClient>(endpoints, int(ec.rworkers.timeout_ms), int(endpoints.size()) + 1);
    endpoints_ = endpoints;
    for (size_t w = 0; w < client_->size(); ++w)
      hello_.push_back(
          client_->hello(w, int(cfg_.num_layers), int(cfg_.num_heads), int(cfg_.num_kv_heads), int(cfg_.head_dim), wire_));
    load_.assign(client_->size(), 0);
  }

  ~FastDecodeEngine() override {
    try {
      shutdown();
    } catch (...) {
    }
  }

  std::string name() const override { return "fastdecode"; }
  json info() const override {
    json w = json::array();
    for (size_t i = 0; i < endpoints_.size(); ++i) w.push_back({{"endpoint", endpoints_[i]}, {"hello", hello_[i]}});
    return {{"backend", ec_.backend},          {"s_part", spart_->describe()}, {"mini_batches", ec_.mini_batches},
            {"wire_dtype", ec_.wire_dtype},    {"rworkers_spawned", !spawned_.empty()}, {"rworkers", w}};
  }

  // The R-workers' KV memory (from their HELLO replies): worker w holds C_w = memory_w / (layers x bytes
  // per token per layer) tokens of full blocks; each sequence also holds at most one fp16 partial block
  // per layer (slack s_w tokens), and at most W / min(prompt + 1) sequences run at a W load, so
  // C'_w = C_w / (1 + s_w / min(prompt + 1)); placement by least projected load keeps a worker within one
  // sequence (max_len) of the mean: the capacity is P x (min_w C'_w - max_len).
  EngineCapacity capacity(int64_t min_prompt, int64_t max_len) const override {
    EngineCapacity cap;
    double min_c = 1e300;
    for (const json& h : hello_) {
      const double per_token = double(cfg_.num_layers) * h.at("kv_bytes_per_token_per_layer").get<double>();
      const double slack = h.at("kv_tail_block_bytes").get<double>() * double(cfg_.num_layers) / per_token;
      const double c = std::floor(h.at("memory_limit_bytes").get<double>() / per_token);
      min_c = std::min(min_c, c / (1.0 + slack / double(min_prompt + 1)));
    }
    cap.kv_tokens = int64_t(double(hello_.size()) * (std::floor(min_c) - double(max_len)));
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "schedule.kv_capacity_tokens = %lld, derived from the R-workers' memory (%zu workers, at most %.0f "
                  "tokens each after partial-block slack; minus one longest sequence each for placement imbalance)",
                  (long long)cap.kv_tokens, hello_.size(), std::floor(min_c));
    cap.note = buf;
    if (cap.kv_tokens < max_len) {
      std::snprintf(buf, sizeof buf,
                    "the R-workers' KV memory holds %lld tokens in the worst case, less than one request of %lld "
                    "tokens: raise engine.rworkers.memory_gb (or set schedule.kv_capacity_tokens)",
                    (long long)cap.kv_tokens, (long long)max_len);
      cap.error = buf;
    }
    return cap;
  }

  void add(const std::vector<Request>& requests) override {
    for (const auto& r : requests) {
      validate_request(r, cfg_);
      if (running_.count(r.id)) FD_THROW("request " << r.id << " is already running");
    }
    queued_.insert(queued_.end(), requests.begin(), requests.end());
  }

  bool done() const override { return queued_.empty() && running_.empty(); }

  StepResult step() override {
    StepResult out;
    s_ns_ = r_wait_ns_ = 0;
    worker_ns_.assign(client_->size(), 0);
    collect_frees();
    if (!running_.empty()) decode(out);
    if (!queued_.empty()) prefill(out);
    release_finished(out);
    // r_compute_max: the busiest R-worker's compute this step (its requests run one after another), the
    // R side's critical path; r_wait: time the S-worker waited for replies; s_compute: S-Part time.
    const int64_t busiest = worker_ns_.empty() ? 0 : *std::max_element(worker_ns_.begin(), worker_ns_.end());
    out.breakdown_ms = {{"s_compute", s_ns_ / 1e6}, {"r_wait", r_wait_ns_ / 1e6}, {"r_compute_max", busiest / 1e6}};
    return out;
  }

  void shutdown() override {
    if (!client_) return;
    std::exception_ptr failed;  // a failed FREE_SEQ still lets the workers be shut down, then is reported
    try {
      collect_frees();
    } catch (...) {
      failed = std::current_exception();
      pending_frees_.clear();
    }
    std::map<size_t, std::vector<uint64_t>> by_worker;
    for (auto& [id, s] : running_) by_worker[s.worker].push_back(id);
    running_.clear();
    queued_.clear();
    if (spawned_.empty()) {
      for (auto& [w, ids] : by_worker) client_->free_seqs(w, ids);  // users' workers stay up, clean
    } else {
      for (size_t w = 0; w < client_->size(); ++w) client_->shutdown(w);
      for (auto& p : spawned_) p->wait_exit();
      spawned_.clear();
    }
    client_.reset();
    if (failed) std::rethrow_exception(failed);
  }

 private:
  DType host_dtype() const { return wire_ == WireDType::F16 ? DType::F16 : DType::F32; }
  size_t row_bytes(int64_t width) const { return size_t(width) * proto::wire_dtype_size(wire_); }

  Header header(MsgType t, int layer, size_t n_seq) const {
    Header h = proto::make_header(t, int(cfg_.num_heads), int(cfg_.num_kv_heads), int(cfg_.head_dim), wire_);
    h.layer = uint32_t(layer);
    h.n_seq = uint32_t(n_seq);
    return h;
  }

  // S-Part of layer l for a mini-batch, then ATTEND to every worker owning some of its sequences.
  void launch(MiniBatch& mb, int l, StepResult& out) {
    const size_t qb = row_bytes(cfg_.q_dim()), kvb = row_bytes(cfg_.kv_dim());
    const int64_t t0 = now_ns();
    spart_->attention_input(mb.index, l, host_dtype(), mb.q.data(), mb.k.data(), mb.v.data());
    s_ns_ += now_ns() - t0;
    out.spans.push_back({"s-part", span_name(l, mb.index, "attention input"), t0, now_ns() - t0});
    for (size_t w = 0; w < mb.parts.size(); ++w) {
      auto& p = mb.parts[w];
      if (p.begin == p.end) continue;
      const size_t n = p.end - p.begin;
      p.request = client_->send(w, header(MsgType::Attend, l, n),
                                {{p.ids.data(), p.ids.size() * 8}, {mb.q.data() + p.begin * qb, n * qb},
                                 {mb.k.data() + p.begin * kvb, n * kvb}, {mb.v.data() + p.begin * kvb, n * kvb}});
    }
  }

  // Waits for layer l's attention of a mini-batch, then the rest of the layer on the S-Part.
  void finish(MiniBatch& mb, int l, StepResult& out) {
    std::vector<std::pair<size_t, uint64_t>> reqs;
    for (size_t w = 0; w < mb.parts.size(); ++w)
      if (mb.parts[w].begin != mb.parts[w].end) reqs.push_back({w, mb.parts[w].request});
    const int64_t t0 = now_ns();
    std::vector<RWorkerReply> replies = client_->wait(reqs);
    const int64_t t1 = now_ns();
    r_wait_ns_ += t1 - t0;
    std::vector<HostRows> rows;  // workers in row order: their ranges are consecutive
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto& p = mb.parts[reqs[i].first];
      const RWorkerReply& r = replies[i];
      worker_ns_[reqs[i].first] += int64_t(r.h.compute_ns);
      // The worker's own compute time, drawn ending when its reply was in hand (clocks differ
      // between processes; the duration is the worker's, the placement approximate).
      out.spans.push_back({"rworker " + std::to_string(reqs[i].first), span_name(l, mb.index, ""),
                           t1 - int64_t(r.h.compute_ns), int64_t(r.h.compute_ns)});
      FD_CHECK(r.frames.at(0).size() == (p.end - p.begin) * row_bytes(cfg_.q_dim()),
               "rworker " << reqs[i].first << ": attention reply of " << r.frames.at(0).size() << " bytes");
      rows.push_back({r.frames.at(0).data(), int64_t(p.end - p.begin)});
    }
    spart_->set_attention(mb.index, host_dtype(), rows);
    spart_->attention_output_and_mlp(mb.index, l);
    s_ns_ += now_ns() - t1;
    out.spans.push_back({"s-part", span_name(l, mb.index, "output+MLP"), t1, now_ns() - t1});
  }

  // Samples the next token of each sequence from rows of an S-Part slot (each with its request's sampling,
  // else the run's) and records it; the logits rows of the sequences that record them come back with it
  // (none copied when none does). A forced sequence continues with its forced token, not the pick.
  void sample_and_emit(int slot, const std::vector<Sequence*>& seqs, const std::vector<int32_t>& rows, StepResult& out) {
    RowDraws d;
    for (const Sequence* s : seqs) d.add(s->req, s->generated, sampling_);
    std::vector<int32_t> tok(seqs.size());
    const size_t V = size_t(cfg_.vocab_size);
    std::vector<float> recorded(d.record.size() * V);
    spart_->sample(slot, rows, d.params, d.ids, d.steps, tok.data(), d.record,
                   d.record.empty() ? nullptr : recorded.data());
    size_t next_record = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = *seqs[i];
      s.last = s.req.next_input(s.generated, tok[i]);
      ++s.generated;
      const bool eos = s.req.stop_at_eos && tok[i] == cfg_.eos_token_id;
      int64_t max_new = s.req.max_new_tokens;
      int32_t emit = tok[i];
#ifdef FD_FAULT_DROP_LAST_TOKEN  // planted fault: every request ends one token short
      max_new = std::max<int64_t>(1, max_new - 1);
#endif
#ifdef FD_FAULT_SHIFT_TOKENS  // planted fault: request 0 mod 3's tokens come one step late
      if (s.req.id % 3 == 0) std::swap(emit, s.emitted_before), emit = emit < 0 ? s.req.prompt.back() : emit;
#endif
      out.tokens.push_back({s.req.id, emit, s.generated >= max_new || eos, {}});
      if (s.req.record_logits) {
        const float* row = &recorded[next_record++ * V];
        out.tokens.back().logits.assign(row, row + V);
      }
    }
  }

  void decode(StepResult& out) {
    const int64_t L = cfg_.num_layers;
    const int64_t t_start = now_ns();
    // Split the running sequences into mini-batches: each worker's sequences alternate between them,
    // so every worker has work in both (it attends for one while the S-Part runs the other); each
    // mini-batch is ordered by owning worker.
    const size_t n_mb = size_t(std::min<int64_t>(ec_.mini_batches, int64_t(running_.size())));
    mbs_.resize(std::max(mbs_.size(), n_mb));
    for (auto& mb : mbs_) mb.seqs.clear();
    std::vector<size_t> turn(client_->size(), 0);
    for (auto& [id, s] : running_) mbs_[turn[s.worker]++ % n_mb].seqs.push_back(&s);
    const int64_t t0 = now_ns();
    for (size_t m = 0; m < n_mb; ++m) {
      MiniBatch& mb = mbs_[m];
      mb.index = int(m);
      std::stable_sort(mb.seqs.begin(), mb.seqs.end(), [](const Sequence* a, const Sequence* b) { return a->worker < b->worker; });
      const int64_t T = int64_t(mb.seqs.size());
      std::vector<int32_t> tokens;
      mb.pos.clear();
      for (Sequence* s : mb.seqs) {
        tokens.push_back(s->last);
        mb.pos.push_back(s->len);
      }
      reserve(*spart_, mb.q, size_t(T) * row_bytes(cfg_.q_dim()));
      reserve(*spart_, mb.k, size_t(T) * row_bytes(cfg_.kv_dim()));
      reserve(*spart_, mb.v, size_t(T) * row_bytes(cfg_.kv_dim()));
      spart_->embed(mb.index, tokens.data(), mb.pos.data(), T);
      mb.parts.assign(client_->size(), {});
      for (size_t r = 0; r < mb.seqs.size(); ++r) {
        auto& p = mb.parts[mb.seqs[r]->worker];
        if (p.ids.empty()) p.begin = r;
        p.end = r + 1;
        p.ids.push_back(mb.seqs[r]->req.id);
      }
    }
    s_ns_ += now_ns() - t0;
    // The pipeline: while the R-workers attend for one mini-batch, the S-Part runs the other.
    for (size_t m = 0; m < n_mb; ++m) launch(mbs_[m], 0, out);
    for (int l = 0; l < L; ++l)
      for (size_t m = 0; m < n_mb; ++m) {
        finish(mbs_[m], l, out);
        if (l + 1 < L) launch(mbs_[m], l + 1, out);
      }
    const int64_t t1 = now_ns();
    for (size_t m = 0; m < n_mb; ++m) {
      MiniBatch& mb = mbs_[m];
      std::vector<int32_t> rows(mb.seqs.size());
      for (size_t r = 0; r < rows.size(); ++r) rows[r] = int32_t(r);
      for (Sequence* s : mb.seqs) s->len += 1;
      sample_and_emit(mb.index, mb.seqs, rows, out);
      for (Sequence* s : mb.seqs) out.total_context += s->len;
    }
    s_ns_ += now_ns() - t1;
    out.decode_tokens = int64_t(running_.size());
    out.spans.push_back({"s-worker", "decode step", t_start, now_ns() - t_start});
  }

  // New requests: placed on the least-loaded R-worker, prompt run through the S-Part with its own
  // causal attention (the prompt is compute-bound: the S-Part's device is good at it), the prompt's
  // K/V shipped to the owning worker per layer (APPEND_KV), the first token sampled.
  void prefill(StepResult& out) {
    const int64_t t_start = now_ns();
    const int slot = int(std::max<int64_t>(ec_.mini_batches, 1));  // after the decode mini-batches' slots
    std::vector<Sequence*> fresh;
    std::map<size_t, std::vector<uint64_t>> adds;
    // At most prefill_tokens prompt tokens per step (whole prompts, at least one): bounds the S-Part's
    // activation memory; the rest start on the following steps.
    int64_t budget = ec_.prefill_tokens;
    while (!queued_.empty() && (fresh.empty() || int64_t(queued_.front().prompt.size()) <= budget)) {
      budget -= int64_t(queued_.front().prompt.size());
      Sequence s;
      s.req = std::move(queued_.front());
      queued_.pop_front();
      s.worker = size_t(std::min_element(load_.begin(), load_.end()) - load_.begin());
      load_[s.worker] += int64_t(s.req.prompt.size()) + s.req.max_new_tokens;
      adds[s.worker].push_back(s.req.id);
      const uint64_t id = s.req.id;
      fresh.push_back(&running_.emplace(id, std::move(s)).first->second);
    }
    for (auto& [w, ids] : adds) client_->add_seqs(w, ids);
    // Ordered by worker: each worker's prompt rows are one contiguous range of the K/V buffers.
    std::stable_sort(fresh.begin(), fresh.end(), [](const Sequence* a, const Sequence* b) { return a->worker < b->worker; });

    std::vector<int32_t> tokens;
    std::vector<int64_t> pos, start;  // start: first row of each sequence
    for (Sequence* s : fresh) {
      start.push_back(int64_t(tokens.size()));
      for (size_t t = 0; t < s->req.prompt.size(); ++t) {
        tokens.push_back(s->req.prompt[t]);
        pos.push_back(int64_t(t));
      }
    }
    start.push_back(int64_t(tokens.size()));
    const int64_t T = int64_t(tokens.size());
    const size_t kvb = row_bytes(cfg_.kv_dim());
    spart_->embed(slot, tokens.data(), pos.data(), T);
    // APPEND_KV per (layer, worker) from two alternating K/V buffers: before a buffer is refilled, the
    // sends of two layers earlier (its readers, zero-copy) are answered.
    struct Append {
      std::vector<uint64_t> ids;
      std::vector<uint32_t> counts;
      size_t begin = 0, end = 0;  // rows
    };
    std::map<size_t, Append> per_worker;
    for (size_t si = 0; si < fresh.size(); ++si) {
      Append& a = per_worker[fresh[si]->worker];
      if (a.ids.empty()) a.begin = size_t(start[si]);
      a.end = size_t(start[si + 1]);
      a.ids.push_back(fresh[si]->req.id);
      a.counts.push_back(uint32_t(start[si + 1] - start[si]));
    }
    std::vector<std::pair<size_t, uint64_t>> pending[2];
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const int b = l % 2;
      if (!pending[b].empty()) {
        const int64_t tw = now_ns();
        client_->wait(pending[b]);
        r_wait_ns_ += now_ns() - tw;
        pending[b].clear();
      }
      reserve(*spart_, prefill_k_[b], size_t(T) * kvb);
      reserve(*spart_, prefill_v_[b], size_t(T) * kvb);
      spart_->attention_input(slot, l, host_dtype(), nullptr, prefill_k_[b].data(), prefill_v_[b].data());
      spart_->prefill_attention(slot, start);
      spart_->attention_output_and_mlp(slot, l);
      for (auto& [w, a] : per_worker) {
        Header h = header(MsgType::AppendKV, l, a.ids.size());
        h.n_tokens = uint32_t(a.end - a.begin);
        const size_t n = a.end - a.begin;
        pending[b].push_back({w, client_->send(w, h, {{a.ids.data(), a.ids.size() * 8}, {a.counts.data(), a.counts.size() * 4},
                                                      {prefill_k_[b].data() + a.begin * kvb, n * kvb},
                                                      {prefill_v_[b].data() + a.begin * kvb, n * kvb}})});
      }
    }
    std::vector<int32_t> last;
    for (size_t si = 0; si < fresh.size(); ++si) last.push_back(int32_t(start[si + 1] - 1));
    for (size_t si = 0; si < fresh.size(); ++si) fresh[si]->len = int64_t(fresh[si]->req.prompt.size());
    sample_and_emit(slot, fresh, last, out);
    const int64_t t1 = now_ns();
    for (auto& p : pending) client_->wait(p);
    r_wait_ns_ += now_ns() - t1;
    s_ns_ += t1 - t_start;
    for (Sequence* s : fresh) out.total_context += s->len;
    out.prefill_tokens = T;
    out.spans.push_back({"s-worker", "prefill", t_start, now_ns() - t_start});
  }

  // Finished sequences free their R-worker memory at once. The S-worker does not wait for the
  // FREE_SEQ replies (a worker handles its requests in order, so later requests see the memory freed);
  // they are collected at the next step or at shutdown, where an error still fails the run.
  void release_finished(const StepResult& out) {
    std::map<size_t, std::vector<uint64_t>> frees;
    for (const auto& t : out.tokens) {
      if (!t.finished) continue;
      Sequence& s = running_.at(t.request_id);
      frees[s.worker].push_back(t.request_id);
      load_[s.worker] -= int64_t(s.req.prompt.size()) + s.req.max_new_tokens;
      running_.erase(t.request_id);
    }
    for (auto& [w, ids] : frees) {
      pending_frees_.push_back({w, 0, std::move(ids)});
      pending_frees_.back().request = client_->send_free_seqs(w, pending_frees_.back().ids);
    }
  }

  void collect_frees() {
    if (pending_frees_.empty()) return;
    std::vector<std::pair<size_t, uint64_t>> reqs;
    for (const auto& f : pending_frees_) reqs.push_back({f.worker, f.request});
    client_->wait(reqs);
    pending_frees_.clear();
  }

  FastDecodeConfig ec_;
  ModelConfig cfg_;
  SamplingParams sampling_;
  std::unique_ptr<SPart> spart_;
  WireDType wire_;
  std::vector<std::unique_ptr<SpawnedRWorker>> spawned_;
  std::unique_ptr<RWorkerClient> client_;
  std::vector<std::string> endpoints_;
  std::vector<json> hello_;  // each worker's HELLO reply (kv dtype, ISA, threads, memory)
  std::vector<int64_t> load_;  // projected tokens per worker (prompt + max new of its sequences)
  std::deque<Request> queued_;
  std::map<uint64_t, Sequence> running_;
  std::vector<MiniBatch> mbs_;      // decode mini-batches (host buffers kept between steps)
  HostBuffer prefill_k_[2], prefill_v_[2];
  struct PendingFree {
    size_t worker;
    uint64_t request;
    std::vector<uint64_t> ids;  // alive until the reply (zero-copy send)
  };
  std::deque<PendingFree> pending_frees_;
  int64_t s_ns_ = 0, r_wait_ns_ = 0;
  std::vector<int64_t> worker_ns_;  // this step's compute per R-worker (from its replies)
};

}  // namespace

std::unique_ptr<Engine> make_fastdecode_engine(const FastDecodeConfig& c, const EngineContext& ctx) {
  // The S-Part's weights live on the GPU: under a GPU memory budget (hardware balance) the full-depth fp16
  // weights and 1 GiB of workspaces must fit, as every GPU engine's accounting asks (gpu-only, paged-swap,
  // vanilla, host-offload). Its KV-cache does not count: it is on the R-workers.
  if (ctx.hardware.gpu_memory_gb > 0 && resolve(c, ctx.hardware).backend == "cuda") {
    const double weights = double(with_layers(ctx.model, ctx.model.full_num_layers).num_params()) * 2;
    const double need = weights + double(1ull << 30);
    if (need > ctx.hardware.gpu_memory_gb * 1e9)
      FD_THROW("fastdecode engine: " << ctx.hardware.gpu_memory_gb << " GB of GPU memory do not hold the full-depth fp16 "
                                     << "weights of " << ctx.model.name << " (" << weights / 1e9
                                     << " GB) and 1 GiB of workspaces");
  }
  return std::make_unique<FastDecodeEngine>(c, ctx);
}

}  // namespace fd
