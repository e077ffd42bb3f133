#include "fastdecode/sworker/fastdecode_engine.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/model/reference.h"
#include "fastdecode/sworker/rworker_client.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/sworker/spart.h"

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
};

// One mini-batch in flight through the layers: its activations and, per R-worker, the staging
// buffers of the request in flight (they must live until the reply arrives: zero-copy sends).
struct MiniBatch {
  int index = 0;
  std::vector<Sequence*> seqs;
  std::vector<int64_t> pos;
  std::vector<float> x, q, k, v, att;
  struct Part {
    std::vector<size_t> rows;  // rows of this mini-batch owned by the worker
    std::vector<uint64_t> ids;
    std::vector<uint8_t> q, k, v;
    uint64_t request = 0;
  };
  std::vector<Part> parts;  // per worker
};

class FastDecodeEngine : public Engine {
 public:
  FastDecodeEngine(const EngineConfig& ec, const ModelConfig& model, TensorSource& weights, const SamplingParams& sp)
      : ec_(ec), cfg_(model), sampling_(sp),
        spart_(ec.backend == "cuda" ? make_cuda_spart(load_model_weights(model, weights))
                                    : make_cpu_spart(load_model_weights(model, weights))),
        wire_(ec.wire_dtype == "fp16" ? WireDType::F16 : WireDType::F32) {
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
    return {{"s_part", spart_->describe()}, {"mini_batches", ec_.mini_batches}, {"wire_dtype", ec_.wire_dtype},
            {"rworkers_spawned", !spawned_.empty()}, {"rworkers", w}};
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
    s_ns_ = r_wait_ns_ = r_compute_ns_ = 0;
    if (!running_.empty()) decode(out);
    if (!queued_.empty()) prefill(out);
    release_finished(out);
    out.breakdown_ms = {{"s_compute", s_ns_ / 1e6}, {"r_wait", r_wait_ns_ / 1e6}, {"r_compute_max", r_compute_ns_ / 1e6}};
    return out;
  }

  void shutdown() override {
    if (!client_) return;
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
  }

 private:
  // Packs `rows` of a [T, width] fp32 matrix into wire-dtype bytes.
  void pack(const std::vector<float>& src, const std::vector<size_t>& rows, int64_t width, std::vector<uint8_t>& dst) const {
    const size_t es = proto::wire_dtype_size(wire_);
    dst.resize(rows.size() * size_t(width) * es);
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* s = &src[rows[i] * size_t(width)];
      if (wire_ == WireDType::F32) std::memcpy(&dst[i * size_t(width) * 4], s, size_t(width) * 4);
      else convert_from_f32(DType::F16, s, &dst[i * size_t(width) * 2], size_t(width));
    }
  }

  Header header(MsgType t, int layer, size_t n_seq) const {
    Header h = make_header(t, int(cfg_.num_heads), int(cfg_.num_kv_heads), int(cfg_.head_dim), wire_);
    h.layer = uint32_t(layer);
    h.n_seq = uint32_t(n_seq);
    return h;
  }

  // S-Part of layer l for a mini-batch, then ATTEND to every worker owning some of its sequences.
  void launch(MiniBatch& mb, int l, StepResult& out) {
    const int64_t T = int64_t(mb.seqs.size()), qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
    const int64_t t0 = now_ns();
    spart_->attention_input(l, mb.x.data(), mb.pos.data(), T, mb.q.data(), mb.k.data(), mb.v.data());
    for (size_t w = 0; w < mb.parts.size(); ++w) {
      auto& p = mb.parts[w];
      if (p.rows.empty()) continue;
      pack(mb.q, p.rows, qd, p.q);
      pack(mb.k, p.rows, kvd, p.k);
      pack(mb.v, p.rows, kvd, p.v);
    }
    s_ns_ += now_ns() - t0;
    out.spans.push_back({"s-part", span_name(l, mb.index, "attention input"), t0, now_ns() - t0});
    for (size_t w = 0; w < mb.parts.size(); ++w) {
      auto& p = mb.parts[w];
      if (p.rows.empty()) continue;
      p.request = client_->send(w, header(MsgType::Attend, l, p.rows.size()),
                                {{p.ids.data(), p.ids.size() * 8}, {p.q.data(), p.q.size()}, {p.k.data(), p.k.size()},
                                 {p.v.data(), p.v.size()}});
    }
  }

  // Waits for layer l's attention of a mini-batch, then the rest of the layer on the S-Part.
  void finish(MiniBatch& mb, int l, StepResult& out) {
    const int64_t qd = cfg_.q_dim();
    std::vector<std::pair<size_t, uint64_t>> reqs;
    for (size_t w = 0; w < mb.parts.size(); ++w)
      if (!mb.parts[w].rows.empty()) reqs.push_back({w, mb.parts[w].request});
    const int64_t t0 = now_ns();
    std::vector<RWorkerReply> replies = client_->wait(reqs);
    const int64_t t1 = now_ns();
    r_wait_ns_ += t1 - t0;
    uint64_t slowest = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto& p = mb.parts[reqs[i].first];
      const RWorkerReply& r = replies[i];
      slowest = std::max(slowest, r.h.compute_ns);
      // The worker's own compute time, drawn ending when its reply was in hand (clocks differ
      // between processes; the duration is the worker's, the placement approximate).
      out.spans.push_back({"rworker " + std::to_string(reqs[i].first), span_name(l, mb.index, ""),
                           t1 - int64_t(r.h.compute_ns), int64_t(r.h.compute_ns)});
      const auto* o = static_cast<const uint8_t*>(r.frames.at(0).data());
      for (size_t j = 0; j < p.rows.size(); ++j) {
        float* dst = &mb.att[p.rows[j] * size_t(qd)];
        if (wire_ == WireDType::F32) std::memcpy(dst, o + j * size_t(qd) * 4, size_t(qd) * 4);
        else convert_to_f32(DType::F16, o + j * size_t(qd) * 2, dst, size_t(qd));
      }
    }
    r_compute_ns_ += int64_t(slowest);
    spart_->attention_output_and_mlp(l, mb.att.data(), int64_t(mb.seqs.size()), mb.x.data());
    s_ns_ += now_ns() - t1;
    out.spans.push_back({"s-part", span_name(l, mb.index, "output+MLP"), t1, now_ns() - t1});
  }

  void decode(StepResult& out) {
    const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size, L = cfg_.num_layers;
    const int64_t t_start = now_ns();
    // Split the running sequences into mini-batches (alternating, so both have work on every worker).
    std::vector<MiniBatch> mbs(size_t(std::min<int64_t>(ec_.mini_batches, int64_t(running_.size()))));
    size_t i = 0;
    for (auto& [id, s] : running_) mbs[i++ % mbs.size()].seqs.push_back(&s);
    for (size_t m = 0; m < mbs.size(); ++m) mbs[m].index = int(m);
    const int64_t t0 = now_ns();
    for (auto& mb : mbs) {
      const int64_t T = int64_t(mb.seqs.size());
      std::vector<int32_t> tokens;
      for (Sequence* s : mb.seqs) {
        tokens.push_back(s->last);
        mb.pos.push_back(s->len);
      }
      mb.x.resize(size_t(T * H));
      mb.q.resize(size_t(T * cfg_.q_dim()));
      mb.att.resize(mb.q.size());
      mb.k.resize(size_t(T * cfg_.kv_dim()));
      mb.v.resize(mb.k.size());
      spart_->embed(tokens.data(), mb.pos.data(), T, mb.x.data());
      mb.parts.resize(client_->size());
      for (size_t r = 0; r < mb.seqs.size(); ++r) {
        mb.parts[mb.seqs[r]->worker].rows.push_back(r);
        mb.parts[mb.seqs[r]->worker].ids.push_back(mb.seqs[r]->req.id);
      }
    }
    s_ns_ += now_ns() - t0;
    // The pipeline: while the R-workers attend for one mini-batch, the S-Part runs the other.
    for (auto& mb : mbs) launch(mb, 0, out);
    for (int l = 0; l < L; ++l)
      for (auto& mb : mbs) {
        finish(mb, l, out);
        if (l + 1 < L) launch(mb, l + 1, out);
      }
    const int64_t t1 = now_ns();
    for (auto& mb : mbs) {
      std::vector<float> logits(mb.seqs.size() * size_t(V));
      spart_->lm_head(mb.x.data(), int64_t(mb.seqs.size()), logits.data());
      for (size_t r = 0; r < mb.seqs.size(); ++r) {
        Sequence& s = *mb.seqs[r];
        s.len += 1;
        emit(s, &logits[r * size_t(V)], out);
        out.total_context += s.len;
      }
    }
    s_ns_ += now_ns() - t1;
    out.decode_tokens = int64_t(running_.size());
    out.spans.push_back({"s-worker", "decode step", t_start, now_ns() - t_start});
  }

  void emit(Sequence& s, const float* logits, StepResult& out) {
    const int32_t tok = sample_token(logits, cfg_.vocab_size, sampling_, s.req.id, uint64_t(s.generated));
    ++s.generated;
    s.last = tok;
    const bool eos = s.req.stop_at_eos && tok == cfg_.eos_token_id;
    out.tokens.push_back({s.req.id, tok, s.generated >= s.req.max_new_tokens || eos});
  }

  // New requests: placed on the least-loaded R-worker, prompt run through the S-Part with its own
  // causal attention (the prompt is compute-bound: the S-Part's device is good at it), the prompt's
  // K/V shipped to the owning worker per layer (APPEND_KV), the first token sampled.
  void prefill(StepResult& out) {
    const int64_t t_start = now_ns();
    const int64_t H = cfg_.hidden_size, qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), V = cfg_.vocab_size;
    std::vector<Sequence*> fresh;
    std::map<size_t, std::vector<uint64_t>> adds;
    while (!queued_.empty()) {
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
    std::vector<float> x(size_t(T * H)), q(size_t(T * qd)), k(size_t(T * kvd)), v(k.size()), att(q.size());
    spart_->embed(tokens.data(), pos.data(), T, x.data());
    // APPEND_KV staging per (layer, worker): alive until every reply is in.
    struct Append {
      std::vector<uint64_t> ids;
      std::vector<uint32_t> counts;
      std::vector<uint8_t> k, v;
      size_t worker;
      uint64_t request;
    };
    std::deque<Append> appends;
    std::vector<std::pair<size_t, uint64_t>> pending;
    for (int l = 0; l < cfg_.num_layers; ++l) {
      spart_->attention_input(l, x.data(), pos.data(), T, q.data(), k.data(), v.data());
      // Attention sees the KV as the R-worker will store it (fp16).
      for (auto* buf : {&k, &v})
        for (auto& e : *buf) e = fp16_to_fp32(fp32_to_fp16(e));
      for (size_t si = 0; si < fresh.size(); ++si)
        for (int64_t t = start[si]; t < start[si + 1]; ++t)
          ref_decode_attention(&q[size_t(t * qd)], &k[size_t(start[si] * kvd)], &v[size_t(start[si] * kvd)],
                               t - start[si] + 1, cfg_, &att[size_t(t * qd)]);
      spart_->attention_output_and_mlp(l, att.data(), T, x.data());
      for (auto& [w, ids] : adds) {
        Append& a = appends.emplace_back();
        a.worker = w;
        std::vector<size_t> rows;
        for (size_t si = 0; si < fresh.size(); ++si) {
          if (fresh[si]->worker != w) continue;
          a.ids.push_back(fresh[si]->req.id);
          a.counts.push_back(uint32_t(start[si + 1] - start[si]));
          for (int64_t t = start[si]; t < start[si + 1]; ++t) rows.push_back(size_t(t));
        }
        pack(k, rows, kvd, a.k);
        pack(v, rows, kvd, a.v);
        Header h = header(MsgType::AppendKV, l, a.ids.size());
        h.n_tokens = uint32_t(rows.size());
        a.request = client_->send(w, h, {{a.ids.data(), a.ids.size() * 8}, {a.counts.data(), a.counts.size() * 4},
                                         {a.k.data(), a.k.size()}, {a.v.data(), a.v.size()}});
        pending.push_back({w, a.request});
      }
    }
    std::vector<float> last(fresh.size() * size_t(H)), logits(fresh.size() * size_t(V));
    for (size_t si = 0; si < fresh.size(); ++si)
      std::memcpy(&last[si * size_t(H)], &x[size_t((start[si + 1] - 1) * H)], size_t(H) * 4);
    spart_->lm_head(last.data(), int64_t(fresh.size()), logits.data());
    const int64_t t1 = now_ns();
    client_->wait(pending);
    r_wait_ns_ += now_ns() - t1;
    s_ns_ += t1 - t_start;
    for (size_t si = 0; si < fresh.size(); ++si) {
      Sequence& s = *fresh[si];
      s.len = int64_t(s.req.prompt.size());
      emit(s, &logits[si * size_t(V)], out);
      out.total_context += s.len;
    }
    out.prefill_tokens = T;
    out.spans.push_back({"s-worker", "prefill", t_start, now_ns() - t_start});
  }

  // Finished sequences free their R-worker memory at once.
  void release_finished(const StepResult& out) {
    std::map<size_t, std::vector<uint64_t>> frees;
    for (const auto& t : out.tokens) {
      if (!t.finished) continue;
      Sequence& s = running_.at(t.request_id);
      frees[s.worker].push_back(t.request_id);
      load_[s.worker] -= int64_t(s.req.prompt.size()) + s.req.max_new_tokens;
      running_.erase(t.request_id);
    }
    for (auto& [w, ids] : frees) client_->free_seqs(w, ids);
  }

  EngineConfig ec_;
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
  int64_t s_ns_ = 0, r_wait_ns_ = 0, r_compute_ns_ = 0;
};

}  // namespace

std::unique_ptr<Engine> make_fastdecode_engine(const EngineConfig& ec, const ModelConfig& model, TensorSource& weights,
                                               const SamplingParams& sampling) {
  return std::make_unique<FastDecodeEngine>(ec, model, weights, sampling);
}

}  // namespace fd
