// The hybrid engine's S-rank (CUDA builds). See hybrid_rank.h.
#include "extensions/hybrid/hybrid_rank.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cast.h"

namespace fd {

using proto::Header;
using proto::MsgType;
using proto::WireDType;

namespace {
// Uploads a batch's per-row int32 arrays into aux: slots [0, n), positions [n, 2n), lengths [2n, 3n).
void upload_rows(const CudaModel& m, DeviceBuffer<int32_t>& aux, const GoRows& r) {
  const size_t n = r.slots.size();
  std::vector<int32_t> pos32(r.pos.begin(), r.pos.end());
  aux.resize(3 * std::max<size_t>(n, 1));
  m.upload(aux.get(), r.slots.data(), n * 4);
  m.upload(aux.get() + n, pos32.data(), n * 4);
  if (!r.lens.empty()) m.upload(aux.get() + 2 * n, r.lens.data(), n * 4);
}
}  // namespace

HybridRank::HybridRank(const ModelWeights& w, const GoRankOptions& o, std::unique_ptr<RWorkerClient> client)
    : GpuOnlyRank(w, o), client_(std::move(client)) {
  const ModelConfig& c = config();
  for (size_t k = 0; k < client_->size(); ++k) {
    try {
      hello_.push_back(client_->hello(k, int(c.num_layers), int(c.num_heads), int(c.num_kv_heads), int(c.head_dim), WireDType::F16));
    } catch (const RWorkerLost& e) {
      throw ConfigError(std::string("hybrid engine: no R-worker answers HELLO: ") + e.what());
    }
  }
}

HybridRank::~HybridRank() {
  cudaSetDevice(o_.device);
  for (auto e : timing_) cudaEventDestroy(e);
}

Header HybridRank::header(MsgType t, int layer, size_t n) const {
  const ModelConfig& c = config();
  Header h = proto::make_header(t, int(c.num_heads), int(c.num_kv_heads), int(c.head_dim), WireDType::F16);
  h.layer = uint32_t(layer);
  h.n_seq = uint32_t(n);
  return h;
}

cudaEvent_t HybridRank::event(size_t k) {
  while (timing_.size() <= k) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    timing_.push_back(e);
  }
  return timing_[k];
}

void HybridRank::reserve(HostBuffer& h, size_t bytes) {
  if (h.size() >= bytes) return;
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, std::max(bytes, h.size() + h.size() / 2)));
  h = HostBuffer(p, bytes, [](void* q) { cudaFreeHost(q); });
}

void HybridRank::shutdown(bool spawned, const std::vector<std::string>& tokens) {
  for (size_t w = 0; w < client_->size(); ++w) {
    if (client_->lost(w)) continue;
    if (spawned) client_->shutdown(w, tokens.at(w));
    else client_->close_session(w);
  }
}

// The S-Part's [q|k|v] for every row; the R-worker rows' q, k, v (fp16) down and out; the GPU rows' attention on
// the GPU (into the o-projection's input a.a16, rows [0, n_gpu)).
void HybridRank::launch(size_t i, const HyBatch& b, int l, HyStep& out) {
  (void)out;
  DevActs& a = acts(i);
  const ModelConfig& c = config();
  const int64_t T = int64_t(b.rows.pos.size()), ng = int64_t(b.n_gpu), nc = T - ng;
  const size_t qd = size_t(c.q_dim()), kvd = size_t(c.kv_dim());
  const size_t ev = s_part_spans_.size() * 2 + attn_spans_.size() * 2;
  CUDA_CHECK(cudaEventRecord(event(ev), stream_));
  model_->attention_input(a, l, CudaModel::kF32 | CudaModel::kF16);
  CUDA_CHECK(cudaEventRecord(event(ev + 1), stream_));
  s_part_spans_.push_back({ev, ev + 1});
  if (nc > 0) {
    Flight& f = flights_[i];
    reserve(f.q, size_t(nc) * qd * 2), reserve(f.k, size_t(nc) * kvd * 2), reserve(f.v, size_t(nc) * kvd * 2);
    CUDA_CHECK(cudaMemcpyAsync(f.q.data(), a.q16.get() + size_t(ng) * qd, size_t(nc) * qd * 2, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(f.k.data(), a.k16.get() + size_t(ng) * kvd, size_t(nc) * kvd * 2, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(f.v.data(), a.v16.get() + size_t(ng) * kvd, size_t(nc) * kvd * 2, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    f.requests.assign(b.parts.size(), 0);
    for (size_t p = 0; p < b.parts.size(); ++p) {
      const HyBatch::Part& part = b.parts[p];
      const size_t r0 = part.begin - size_t(ng), n = part.end - part.begin;
      f.requests[p] = client_->send(part.worker, header(MsgType::Attend, l, n),
                                    {{part.ids.data(), n * 8}, {f.q.data() + r0 * qd * 2, n * qd * 2},
                                     {f.k.data() + r0 * kvd * 2, n * kvd * 2}, {f.v.data() + r0 * kvd * 2, n * kvd * 2}});
    }
  }
  if (ng > 0) {
    const DeviceBuffer<int32_t>& x = aux(i);
    const size_t n_rows = b.rows.slots.size();
    const size_t ea = ev + 2;
    CUDA_CHECK(cudaEventRecord(event(ea), stream_));
    cuda::append_kv({.k = a.k.get(), .v = a.v.get(), .slots = x.get(), .pos = x.get() + n_rows, .T = ng, .max_ctx = o_.max_ctx,
                     .kv_dim = int(c.kv_dim()), .k_cache = k_cache_[size_t(l)].get(), .v_cache = v_cache_[size_t(l)].get()},
                    stream_);
    cuda::decode_attention({.q = a.q.get(), .k_cache = k_cache_[size_t(l)].get(), .v_cache = v_cache_[size_t(l)].get(),
                            .slots = x.get(), .lens = x.get() + 2 * n_rows, .B = ng, .max_ctx = o_.max_ctx,
                            .Hq = int(c.num_heads), .Hkv = int(c.num_kv_heads), .D = int(c.head_dim),
                            .workspace = workspace_.get(), .out_act = a.a16.get(),  // the o-projection's input
                            .out_dtype = model_->act_dtype()},
                           stream_);
    CUDA_CHECK(cudaEventRecord(event(ea + 1), stream_));
    attn_spans_.push_back({ea, ea + 1});
  }
}

// The R-worker rows' attention output (fp16) up into the o-projection's input a.a16 after the GPU rows' (which
// decode_attention wrote there): as it lies when the activations are fp16, else through a.q16 and one cast; then
// the o-projection and the MLP for every row.
void HybridRank::finish(size_t i, const HyBatch& b, int l, HyStep& out) {
  DevActs& a = acts(i);
  const ModelConfig& c = config();
  const int64_t T = int64_t(b.rows.pos.size()), ng = int64_t(b.n_gpu), nc = T - ng;
  const size_t qd = size_t(c.q_dim());
  const bool f16 = model_->act_dtype() == DType::F16;  // the replies are fp16: a.a16 takes them as they lie
  if (nc > 0) {
    std::vector<std::pair<size_t, uint64_t>> reqs;
    for (size_t p = 0; p < b.parts.size(); ++p) reqs.push_back({b.parts[p].worker, flights_[i].requests[p]});
    const int64_t t0 = now_ns();
    std::vector<RWorkerReply> replies = client_->wait(reqs);
    out.r_wait_ms += double(now_ns() - t0) / 1e6;
    for (size_t p = 0; p < b.parts.size(); ++p) {
      const HyBatch::Part& part = b.parts[p];
      out.worker_ms[part.worker] += double(replies[p].h.compute_ns) / 1e6;
      const size_t n = part.end - part.begin;
      FD_CHECK(replies[p].frames.at(0).size() == n * qd * 2, "hybrid engine: R-worker " << part.worker << " sent "
                                                             << replies[p].frames.at(0).size() << " bytes of attention");
      void* dst = f16 ? static_cast<void*>(a.a16.get() + part.begin * qd) : static_cast<void*>(a.q16.get() + part.begin * qd);
      CUDA_CHECK(cudaMemcpyAsync(dst, replies[p].frames[0].data(), n * qd * 2, cudaMemcpyHostToDevice, stream_));
    }
    if (!f16)
      cuda::cast(a.q16.get() + size_t(ng) * qd, DType::F16, a.a16.get() + size_t(ng) * qd, model_->act_dtype(),
                 nc * int64_t(qd), stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the replies' buffers go with `replies`
  }
  const size_t ev = s_part_spans_.size() * 2 + attn_spans_.size() * 2;
  CUDA_CHECK(cudaEventRecord(event(ev), stream_));
  model_->attention_output_and_mlp(a, l);
  CUDA_CHECK(cudaEventRecord(event(ev + 1), stream_));
  s_part_spans_.push_back({ev, ev + 1});
}

void HybridRank::decode_pipelined(const HybridStepPlan& plan, HyStep& out) {
  const int64_t L = config().num_layers, V = config().vocab_size;
  const size_t n_mb = plan.decode.size();
  flights_.resize(std::max(flights_.size(), n_mb));
  for (size_t m = 0; m < n_mb; ++m) {
    const HyBatch& b = plan.decode[m];
    DevActs& a = acts(m);
    GoRankStep tmp;
    take_input(m, a, b.rows, tmp);  // tokens and positions up (embedded in the first launch's S-Part)
    std::vector<int32_t> rows(b.rows.pos.size());
    for (size_t k = 0; k < rows.size(); ++k) rows[k] = int32_t(k);
    model_->upload(a.rows.get(), rows.data(), rows.size() * 4);
    upload_rows(*model_, aux(m), b.rows);
    model_->embed(a);
    launch(m, b, 0, out);
  }
  for (int l = 0; l < L; ++l)
    for (size_t m = 0; m < n_mb; ++m) {
      finish(m, plan.decode[m], l, out);
      if (l + 1 < L) launch(m, plan.decode[m], l + 1, out);
    }
  out.tokens.resize(n_mb), out.recorded.resize(n_mb);
  for (size_t m = 0; m < n_mb; ++m) {
    const GoRows& r = plan.decode[m].rows;
    out.tokens[m].resize(r.pos.size());
    out.recorded[m].resize(r.draws.record.size() * size_t(V));
    model_->sample(acts(m), int64_t(r.pos.size()), r.draws.params, r.draws.ids, r.draws.steps, out.tokens[m].data(),
                   r.draws.record, out.recorded[m].data());
  }
}

// A prefill: the GPU sequences' prompt KV into the GPU pool (rows [0, n_gpu)), the others' shipped to their workers
// per layer (APPEND_KV from two alternating buffers); every sequence's first token sampled on the GPU.
void HybridRank::prefill_hybrid(const HyBatch& b, HyStep& out) {
  const int64_t t0 = now_ns();
  const ModelConfig& c = config();
  const GoRows& r = b.rows;
  const int64_t T = int64_t(r.pos.size()), n_seq = int64_t(r.sample.size()), ng = int64_t(b.n_gpu);
  const size_t kvd = size_t(c.kv_dim());
  const size_t idx = 16;  // the prefill's batch index (after every decode batch's)
  DevActs& a = acts(idx);
  GoRankStep tmp;
  take_input(idx, a, r, tmp);
  model_->upload(a.starts.get(), r.starts.data(), r.starts.size() * 4);
  model_->upload(a.rows.get(), r.sample.data(), r.sample.size() * 4);
  DeviceBuffer<int32_t>& x = aux(idx);
  upload_rows(*model_, x, r);
  std::vector<std::pair<size_t, uint64_t>> pending[2];
  std::vector<std::vector<AppendChunk>> chunks;  // per part: its APPEND_KV messages, the same at every layer
  for (const HyBatch::Part& part : b.parts)
    chunks.push_back(chunk_appends(part.ids, part.counts, part.begin, client_->append_bytes(part.worker, SIZE_MAX) / (kvd * 2 * 2)));
  model_->prefill_forward(a, n_seq, r.max_len, [&](int l) {
    if (ng > 0)
      cuda::append_kv({.k = a.k.get(), .v = a.v.get(), .slots = x.get(), .pos = x.get() + T, .T = ng, .max_ctx = o_.max_ctx,
                       .kv_dim = int(c.kv_dim()), .k_cache = k_cache_[size_t(l)].get(), .v_cache = v_cache_[size_t(l)].get()},
                      stream_);
    if (!b.has_cpu()) return;
    const int p = l % 2;
    if (!pending[p].empty()) {  // the sends of two layers ago read this buffer (zero-copy): answered first
      client_->wait(pending[p]);
      pending[p].clear();
    }
    const size_t n = size_t(T - ng);
    reserve(pk_[p], n * kvd * 2), reserve(pv_[p], n * kvd * 2);
    CUDA_CHECK(cudaMemcpyAsync(pk_[p].data(), a.k16.get() + size_t(ng) * kvd, n * kvd * 2, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(pv_[p].data(), a.v16.get() + size_t(ng) * kvd, n * kvd * 2, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t pi = 0; pi < b.parts.size(); ++pi) {
      const HyBatch::Part& part = b.parts[pi];
      // Within the worker's largest message (a longer share goes in pieces, appended in order).
      for (const AppendChunk& a : chunks[pi]) {
        const size_t r0 = a.begin - size_t(ng), nt = a.end - a.begin;
        Header h = header(MsgType::AppendKV, l, a.ids.size());
        h.n_tokens = uint32_t(nt);
        pending[p].push_back({part.worker, client_->send(part.worker, h, {{a.ids.data(), a.ids.size() * 8},
                                                                          {a.counts.data(), a.counts.size() * 4},
                                                                          {pk_[p].data() + r0 * kvd * 2, nt * kvd * 2},
                                                                          {pv_[p].data() + r0 * kvd * 2, nt * kvd * 2}})});
      }
    }
  });
  out.prefill_tokens.resize(size_t(n_seq));
  out.prefill_recorded.resize(r.draws.record.size() * size_t(c.vocab_size));
  model_->sample(a, n_seq, r.draws.params, r.draws.ids, r.draws.steps, out.prefill_tokens.data(), r.draws.record,
                 out.prefill_recorded.data());
  for (auto& p : pending) client_->wait(p);
  out.prefill_ms += double(now_ns() - t0) / 1e6;
  out.spans.push_back({o_.track, "prefill", t0, now_ns() - t0});
}

HyStep HybridRank::run(const HybridStepPlan& plan) {
  current();
  HyStep out;
  out.worker_ms.assign(client_->size(), 0);
  s_part_spans_.clear(), attn_spans_.clear();
  for (const auto& [w, ids] : plan.frees) client_->free_seqs(w, ids);
  const bool cpu = std::any_of(plan.decode.begin(), plan.decode.end(), [](const HyBatch& b) { return b.has_cpu(); });
  const int64_t t0 = now_ns();
  if (!plan.decode.empty() && !cpu) {  // every sequence on the GPU: exactly the GPU-only rank's step
    GoRankStep g;
    g.tokens.resize(1), g.recorded.resize(1);
    FD_CHECK(plan.decode.size() == 1, "hybrid engine: an all-GPU step runs as one batch");
    decode_wave(0, plan.decode[0].rows, g);
    out.tokens = std::move(g.tokens), out.recorded = std::move(g.recorded);
    out.gpu_attn_ms = g.attention_ms, out.decode_ms = g.decode_ms;
    out.s_part_ms = std::max(0.0, g.decode_ms - g.attention_ms);
    for (auto& s : g.spans) out.spans.push_back(std::move(s));
  } else if (!plan.decode.empty()) {
    decode_pipelined(plan, out);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    float ms = 0;
    for (const auto& [b, e] : s_part_spans_) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, timing_[b], timing_[e]));
      out.s_part_ms += ms;
    }
    for (const auto& [b, e] : attn_spans_) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, timing_[b], timing_[e]));
      out.gpu_attn_ms += ms;
    }
    out.decode_ms = double(now_ns() - t0) / 1e6;
    out.spans.push_back({o_.track, "decode step", t0, now_ns() - t0});
  }
  if (plan.has_prefill) {
    for (const auto& [w, ids] : plan.adds) client_->add_seqs(w, ids);
    prefill_hybrid(plan.prefill, out);
  }
  return out;
}

HybridRates HybridRank::calibrate(int64_t max_batch) {
  current();
  const ModelConfig& c = config();
  HybridRates r;
  // The S-Part of one layer (layer 0) at a few batch sizes, device time, the median of 3.
  std::vector<std::pair<double, double>> pts;
  DevActs& a = acts(17);
  std::vector<int32_t> tokens;
  std::vector<int64_t> pos;
  for (int64_t n : {int64_t(1), int64_t(8), int64_t(32), int64_t(128), int64_t(512), int64_t(2048)}) {
    if (n > std::max<int64_t>(max_batch, 1) && !pts.empty()) break;
    tokens.assign(size_t(n), 3), pos.assign(size_t(n), 0);
    model_->ensure(a, n);
    model_->upload(a.tokens.get(), tokens.data(), size_t(n) * 4);
    model_->upload(a.pos.get(), pos.data(), size_t(n) * 8);
    model_->embed(a);
    std::vector<float> t;
    for (int rep = 0; rep < 4; ++rep) {
      CUDA_CHECK(cudaEventRecord(event(0), stream_));
      model_->attention_input(a, 0, CudaModel::kF32 | CudaModel::kF16);
      model_->attention_output_and_mlp(a, 0);  // (the attention writes the o-projection's input itself)
      CUDA_CHECK(cudaEventRecord(event(1), stream_));
      CUDA_CHECK(cudaEventSynchronize(event(1)));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, event(0), event(1)));
      if (rep > 0) t.push_back(ms);  // the first is a warm-up
    }
    std::sort(t.begin(), t.end());
    pts.push_back({double(n), double(t[t.size() / 2]) / 1e3});
  }
  r.s_part = TTable(pts);
  // GPU decode attention: B sequences over slots 0.. at a long and a 1-token context (the cache holds whatever it
  // holds: the time does not depend on the values).
  const int64_t B = std::max<int64_t>(1, std::min<int64_t>(32, slots_)), ctx = std::max<int64_t>(1, std::min<int64_t>(1024, o_.max_ctx));
  DeviceBuffer<int32_t>& x = aux(17);
  const size_t nb = static_cast<size_t>(B);
  std::vector<int32_t> sl(nb), pp(nb, 0), ln(nb, static_cast<int32_t>(ctx));
  for (int64_t i = 0; i < B; ++i) sl[size_t(i)] = int32_t(i);
  x.resize(size_t(3 * B));
  model_->upload(x.get(), sl.data(), size_t(B) * 4);
  model_->upload(x.get() + B, pp.data(), size_t(B) * 4);
  const auto attn_ms = [&](int32_t len) {
    std::fill(ln.begin(), ln.end(), len);
    model_->upload(x.get() + 2 * B, ln.data(), size_t(B) * 4);
    model_->ensure(a, B);
    std::vector<float> t;
    for (int rep = 0; rep < 4; ++rep) {
      CUDA_CHECK(cudaEventRecord(event(0), stream_));
      cuda::decode_attention({.q = a.q.get(), .k_cache = k_cache_[0].get(), .v_cache = v_cache_[0].get(), .slots = x.get(),
                              .lens = x.get() + 2 * B, .B = B, .max_ctx = o_.max_ctx, .Hq = int(c.num_heads),
                              .Hkv = int(c.num_kv_heads), .D = int(c.head_dim), .workspace = workspace_.get(),
                              .out_act = a.a16.get(), .out_dtype = model_->act_dtype()},  // as the step runs it
                             stream_);
      CUDA_CHECK(cudaEventRecord(event(1), stream_));
      CUDA_CHECK(cudaEventSynchronize(event(1)));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, event(0), event(1)));
      if (rep > 0) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return double(t[t.size() / 2]);
  };
  const double short_ms = attn_ms(1), long_ms = attn_ms(int32_t(ctx));
  r.gpu_s_per_seq = short_ms / 1e3 / double(B);
  r.gpu_s_per_token = std::max(1e-15, (long_ms - short_ms) / 1e3 / double(B * std::max<int64_t>(ctx - 1, 1)));
  // Each R-worker: 8 calibration sequences of 256 tokens at layer 0 (APPEND_KV: the shipping rate) and 8 short
  // ones, then ATTENDs of 1 short, 8 short and 8 long sequences, 3 rounds (medians): the worker's own compute
  // per token (long - short), per sequence (8 short - 1 short) and per call (what is left: waking its threads);
  // the wall time of the lone ATTEND beyond its compute is engaging the CPUs.
  const int64_t S = 8, N = 256;
  const size_t kvd = size_t(c.kv_dim()), qd = size_t(c.q_dim());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<uint16_t> kv(static_cast<size_t>(S * N) * kvd), q(static_cast<size_t>(S) * qd), k1(static_cast<size_t>(S) * kvd);
  for (auto& v : kv) v = fp32_to_fp16(u(rng));
  for (auto& v : q) v = fp32_to_fp16(u(rng));
  for (auto& v : k1) v = fp32_to_fp16(u(rng));
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double ship = 0, engage = 0;
  for (size_t w = 0; w < client_->size(); ++w) {
    std::vector<uint64_t> longs, shorts;
    std::map<uint64_t, int64_t> ctx;  // each calibration sequence's tokens
    for (int64_t s = 0; s < S; ++s) {
      longs.push_back((uint64_t(1) << 62) + 1 + uint64_t(s));
      shorts.push_back((uint64_t(1) << 62) + 1 + uint64_t(S + s));
    }
    client_->add_seqs(w, longs);
    client_->add_seqs(w, shorts);
    Header h = header(MsgType::AppendKV, 0, size_t(S));
    h.n_tokens = uint32_t(S * N);
    const std::vector<uint32_t> counts(static_cast<size_t>(S), static_cast<uint32_t>(N));
    const int64_t ta = now_ns();
    // Within the worker's largest message: in pieces when over it (kept until answered: the sends are zero-copy).
    const std::vector<AppendChunk> pieces = chunk_appends(longs, counts, 0, client_->append_bytes(w, SIZE_MAX) / (kvd * 2 * 2));
    std::vector<std::pair<size_t, uint64_t>> sent;
    for (const AppendChunk& a : pieces) {
      Header hc = h;
      hc.n_seq = uint32_t(a.ids.size());
      hc.n_tokens = uint32_t(a.end - a.begin);
      sent.push_back({w, client_->send(w, hc, {{a.ids.data(), a.ids.size() * 8}, {a.counts.data(), a.counts.size() * 4},
                                               {kv.data() + a.begin * kvd, (a.end - a.begin) * kvd * 2},
                                               {kv.data() + a.begin * kvd, (a.end - a.begin) * kvd * 2}})});
    }
    client_->wait(sent);
    ship = std::max(ship, double(now_ns() - ta) / 1e9 / double(S * N));
    for (uint64_t id : longs) ctx[id] = N;
    struct Sample {
      double compute_s, wall_s;
      int64_t tokens;
    };
    const auto attend = [&](const std::vector<uint64_t>& which) {
      const size_t n = which.size();
      const int64_t tw = now_ns();
      const RWorkerReply rep = client_->call(w, header(MsgType::Attend, 0, n), {{which.data(), n * 8}, {q.data(), n * qd * 2},
                                                                                 {k1.data(), n * kvd * 2}, {k1.data(), n * kvd * 2}});
      Sample x{double(rep.h.compute_ns) / 1e9, double(now_ns() - tw) / 1e9, 0};
      for (uint64_t id : which) x.tokens += ++ctx[id];  // the new token is attended too
      return x;
    };
    attend(longs), attend(shorts);  // warm-up
    const std::vector<uint64_t> one = {shorts[0]};
    std::vector<double> lone_c, lone_t, short_c, short_t, long_c, long_t, eng;
    for (int rep = 0; rep < 3; ++rep) {
      const Sample a1 = attend(one), as = attend(shorts), al = attend(longs);
      lone_c.push_back(a1.compute_s), lone_t.push_back(double(a1.tokens));
      short_c.push_back(as.compute_s), short_t.push_back(double(as.tokens));
      long_c.push_back(al.compute_s), long_t.push_back(double(al.tokens));
      eng.push_back(std::max(0.0, a1.wall_s - a1.compute_s));
    }
    const double c1 = median(lone_c), cs = median(short_c), cl = median(long_c);
    const double t1 = median(lone_t), ts = median(short_t), tl = median(long_t);
    WorkerCost wc;
    wc.s_per_token = std::max(1e-15, (cl - cs) / std::max(1.0, tl - ts));
    wc.s_per_seq = std::max(0.0, ((cs - wc.s_per_token * ts) - (c1 - wc.s_per_token * t1)) / double(S - 1));
    wc.s_per_call = std::max(0.0, c1 - wc.s_per_token * t1 - wc.s_per_seq);
    r.workers.push_back(wc);
    engage = std::max(engage, median(eng));
    std::vector<uint64_t> all = longs;
    all.insert(all.end(), shorts.begin(), shorts.end());
    client_->free_seqs(w, all);
  }
  r.engage_s = engage;
  r.move_s_per_token = ship;
  return r;
}

}  // namespace fd
