#include "fastdecode/sworker/srank.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "fastdecode/core/clock.h"
#include "fastdecode/parallel/comm.h"

namespace fd {

using proto::Header;
using proto::MsgType;
using proto::WireDType;

// A plan batch in flight through this rank's layers. Its rows are ordered by owning worker, so each worker's
// rows are one contiguous range. The S-Part writes a worker's q/k/v into a block of that worker's shared-memory
// region where it can (ids copied there too: the whole ATTEND lies in the region and goes as it lies), else into the
// worker's range of the q/k/v staging buffers, sent from there without a copy over ZeroMQ (or copied into the
// region). Either place lives until the reply arrives. Activations live in the S-Part's slot.
struct SRank::Batch {
  int slot = 0;
  const PlanBatch* plan = nullptr;
  HostBuffer q, k, v;  // [T, q_dim] / [T, kv_dim] in the wire dtype
  struct Part {
    size_t begin = 0, end = 0;  // rows of this batch owned by the worker
    std::vector<uint64_t> ids;
    uint64_t request = 0;
    const void* ids_at = nullptr;  // where its ids, q, k and v lie (its region block, or ids and the staging ranges)
    uint8_t *q_at = nullptr, *k_at = nullptr, *v_at = nullptr;
    ShmBlock block;  // in the worker's region: kept between steps, taken anew when too small
  };
  std::vector<Part> parts;  // per worker
  std::vector<HostRowsOut> outs;  // attention_input's destinations: the parts with rows, in row order
};

namespace {

void reserve(SPart& sp, HostBuffer& b, size_t bytes) {
  if (b.size() < bytes) b = sp.alloc_host(std::max(bytes, b.size() + b.size() / 2));
}

constexpr size_t align64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

SRank::SRank(std::unique_ptr<SPart> spart, std::unique_ptr<RWorkerClient> client, Communicator* pp, SRankOptions o)
    : spart_(std::move(spart)), client_(std::move(client)), pp_(pp), o_(std::move(o)),
      rec_(*spart_, *client_, pp_, o_.layer_begin, o_.track_suffix, o_.worker_prefix) {
  const ModelConfig& c = spart_->config();
  // Every worker answers HELLO before any work, or the run is refused as a config error (exit 2) naming it.
  for (size_t w = 0; w < client_->size(); ++w) {
    try {
      hello_.push_back(client_->hello(w, int(c.num_layers), int(c.num_heads), int(c.num_kv_heads), int(c.head_dim), o_.wire));
    } catch (const RWorkerLost& e) {
      throw ConfigError(std::string("no R-worker answers HELLO: ") + e.what() +
                        " (is it running, is the endpoint right, do its CURVE keys match?)");
    }
  }
  pin_regions();  // the lanes' offers were answered on the way to the HELLO replies: register them now, not at step 1
  // Pinning GBs of host memory takes ~0.5 s a GB (cudaMallocHost): here, with the load, not in the first prompts' TTFT;
  // at most kPrefillReserveBytes a buffer (a budget far above what ever runs grows at first use, as before).
  if (o_.prefill_reserve_tokens > 0)
    for (HostBuffer* b : {&prefill_k_[0], &prefill_k_[1], &prefill_v_[0], &prefill_v_[1]})
      reserve(*spart_, *b, std::min(kPrefillReserveBytes, size_t(o_.prefill_reserve_tokens) * row_bytes(c.kv_dim())));
}

SRank::~SRank() {
  for (const Pinned& p : pinned_)
    if (p.ok) spart_->unregister_host(p.region->base());
}

// Each worker's region, once its lane is active, registered with the S-Part's device: ATTEND's replies land there,
// and set_attention then copies them up by DMA instead of staging pageable pages (the h2d that took 3.5x d2h's time
// for a third of the bytes). A lane that ended (or changed) is unregistered first; one the device refused is not
// tried again.
void SRank::pin_regions() {
  pinned_.resize(client_->size());
  for (size_t w = 0; w < client_->size(); ++w) {
    std::shared_ptr<const shm::Region> r = client_->shm_region(w);
    Pinned& p = pinned_[w];
    if (r == p.region) continue;
    if (p.ok) spart_->unregister_host(p.region->base());
    p = {std::move(r), false};
    if (p.region) p.ok = spart_->register_host(p.region->base(), p.region->size());
  }
}

DType SRank::host_dtype() const { return o_.wire == WireDType::F16 ? DType::F16 : DType::F32; }
size_t SRank::row_bytes(int64_t width) const { return size_t(width) * proto::wire_dtype_size(o_.wire); }

Header SRank::header(MsgType t, int layer, size_t n_seq) const {
  const ModelConfig& c = spart_->config();
  Header h = proto::make_header(t, int(c.num_heads), int(c.num_kv_heads), int(c.head_dim), o_.wire);
  h.layer = uint32_t(layer);
  h.n_seq = uint32_t(n_seq);
  return h;
}

void SRank::collect_frees() {
  if (pending_frees_.empty()) return;
  std::vector<std::pair<size_t, uint64_t>> reqs;
  for (const auto& f : pending_frees_) reqs.push_back({f.worker, f.request});
  struct Forget {  // after the wait, however it ends (a failed wait fails the run); not before: a FREE_SEQ's ids over
    std::vector<PendingFree>& p;  // ConstBuffer::kCopyBytes are read by libzmq until it has sent them
    ~Forget() { p.clear(); }
  } forget{pending_frees_};
  client_->wait(reqs);
}

void SRank::shutdown(bool spawned, const std::vector<std::string>& tokens) {
  std::exception_ptr failed;
  for (size_t w = 0; w < client_->size(); ++w) {
    if (client_->lost(w)) continue;
    try {
      if (spawned) client_->shutdown(w, tokens.at(w));
      else client_->close_session(w);  // users' workers stay up, clean: every sequence of this run freed
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void SRank::recover(const std::vector<size_t>& dead) {
  for (size_t w : dead) client_->mark_dead(w, "lost");
  client_->drain(10000);  // the survivors' replies, the pending frees' among them, before their ids go
  pending_frees_.clear();
}

RankStep SRank::run(const StepPlan& plan) {
  pin_regions();
  RankStep out;
  rec_.begin(out.timing);
  collect_frees();
  for (const auto& [w, ids] : plan.drop)  // recovery: each id alone, so that one already gone does not stop the rest
    for (uint64_t id : ids) {
      try {
        client_->free_seqs(w, {id});
      } catch (const RWorkerLost&) {
        throw;
      } catch (const Error&) {  // unknown-sequence: it never reached this worker, or was freed already
      }
    }
  for (const auto& t : plan.truncates) client_->truncate(t.worker, t.ids, t.lengths);
  // FREE_SEQ without waiting (a worker handles its requests in order: later ones see the memory freed);
  // the replies are collected at the next step or at shutdown, where an error still fails the run.
  for (const auto& [w, ids] : plan.frees) {
    pending_frees_.push_back({w, 0, ids});
    pending_frees_.back().request = client_->send_free_seqs(w, pending_frees_.back().ids);
  }
  if (!plan.decode.empty()) decode(plan, out);
  if (plan.has_prefill) {
    for (const auto& [w, ids] : plan.adds) client_->add_seqs(w, ids);
    prefill(plan.prefill, out);
  }
  rec_.end();
  return out;
}

// The batch's first-layer input: its tokens' embeddings (first stage) or the residual stream handed on by the
// stage before (sizes the slot, then receives into it); and each worker's range of its rows.
void SRank::setup(Batch& b, const PlanBatch& pb) {
  const ModelConfig& c = spart_->config();
  const int64_t T = int64_t(pb.ids.size());
  b.slot = pb.slot;
  b.plan = &pb;
  reserve(*spart_, b.q, size_t(T) * row_bytes(c.q_dim()));
  reserve(*spart_, b.k, size_t(T) * row_bytes(c.kv_dim()));
  reserve(*spart_, b.v, size_t(T) * row_bytes(c.kv_dim()));
  rec_.s_part("s-part", "", [&] {
    if (o_.pp_rank == 0) {
      spart_->embed(b.slot, pb.tokens.data(), pb.pos.data(), int64_t(pb.tokens.size()));
    } else {
      spart_->prepare(b.slot, pb.pos.data(), int64_t(pb.pos.size()));
      rec_.span("comm", rec_.name(0, b.slot, "residual in"), [&] { spart_->recv_residual(b.slot, *pp_, o_.pp_rank - 1); });
    }
  });
  b.parts.resize(client_->size());  // their blocks kept
  for (auto& p : b.parts) p.begin = p.end = 0, p.ids.clear();
  for (size_t r = 0; r < pb.ids.size(); ++r) {
    auto& p = b.parts[pb.workers[r]];
    if (p.ids.empty()) p.begin = r;
    p.end = r + 1;
    p.ids.push_back(pb.ids[r]);
  }
  // Each worker's place: a block of its region ([ids][q][k][v], 64-byte aligned), or its staging ranges.
  const size_t qb = row_bytes(c.q_dim()), kvb = row_bytes(c.kv_dim());
  b.outs.clear();
  size_t row = 0;
  for (size_t w = 0; w < b.parts.size(); ++w) {
    auto& p = b.parts[w];
    const size_t n = p.end - p.begin;
    if (n == 0) continue;
    FD_CHECK(p.begin == row && p.end - p.begin == p.ids.size(), "plan batch rows are not ordered by worker (worker " << w << ")");
    row = p.end;
    const size_t need = align64(n * 8) + align64(n * qb) + 2 * align64(n * kvb);
    if (o_.shm_in_place && p.block.size() < need) {
      p.block = {};  // given back first: its space may be the room the larger one needs
      p.block = client_->shm_alloc(w, need + need / 4);  // room to grow, unless only the exact size fits
      if (!p.block) p.block = client_->shm_alloc(w, need);
    }
    if (p.block) {
      uint8_t* at = p.block.data();
      std::memcpy(at, p.ids.data(), n * 8);
      p.ids_at = at;
      p.q_at = at + align64(n * 8);
      p.k_at = p.q_at + align64(n * qb);
      p.v_at = p.k_at + align64(n * kvb);
    } else {
      p.ids_at = p.ids.data();
      p.q_at = b.q.data() + p.begin * qb;
      p.k_at = b.k.data() + p.begin * kvb;
      p.v_at = b.v.data() + p.begin * kvb;
    }
    b.outs.push_back({p.q_at, p.k_at, p.v_at, int64_t(n)});
  }
  FD_CHECK(row == pb.ids.size(), "plan batch: " << row << " of its " << pb.ids.size() << " rows have a worker");
}

int64_t SRank::warm_up(int slots, int64_t max_rows) {
  int64_t graphs = 0;
  for (int s = 0; s < slots; ++s) graphs += spart_->warm_up(s, max_rows, host_dtype());
  return graphs;
}

void SRank::hand_on(int slot) { spart_->send_residual(slot, *pp_, o_.pp_rank + 1); }

// S-Part of layer l for a batch, then ATTEND to every worker owning some of its sequences.
void SRank::launch(Batch& b, int l) {
  const ModelConfig& c = spart_->config();
  const size_t qb = row_bytes(c.q_dim()), kvb = row_bytes(c.kv_dim());
  rec_.s_part("s-part", rec_.name(l, b.slot, "attention input"),
              [&] { spart_->attention_input(b.slot, l, host_dtype(), b.outs); });
  rec_.sending([&] {
    for (size_t w = 0; w < b.parts.size(); ++w) {
      auto& p = b.parts[w];
      if (p.begin == p.end) continue;
      const size_t n = p.end - p.begin;
      p.request = client_->send(w, header(MsgType::Attend, l, n),
                                {{p.ids_at, n * 8}, {p.q_at, n * qb}, {p.k_at, n * kvb}, {p.v_at, n * kvb}});
      rec_.sent(b.slot, w);
    }
  });
}

// Waits for layer l's attention of a batch, then the rest of the layer on the S-Part.
void SRank::finish(Batch& b, int l) {
  const ModelConfig& c = spart_->config();
  std::vector<std::pair<size_t, uint64_t>> reqs;
  for (size_t w = 0; w < b.parts.size(); ++w)
    if (b.parts[w].begin != b.parts[w].end) reqs.push_back({w, b.parts[w].request});
  const std::vector<RWorkerReply> replies = rec_.attend_replies(l, b.slot, reqs);
  rec_.s_part("s-part", rec_.name(l, b.slot, "output+MLP"), [&] {
    std::vector<HostRows> rows;  // workers in row order: their ranges are consecutive
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto& p = b.parts[reqs[i].first];
      const RWorkerReply& r = replies[i];
      FD_CHECK(r.frames.at(0).size() == (p.end - p.begin) * row_bytes(c.q_dim()),
               o_.worker_prefix << reqs[i].first << " (" << client_->endpoint(reqs[i].first) << "): attention reply of "
                                << r.frames.at(0).size() << " bytes");
      rows.push_back({r.frames.at(0).data(), int64_t(p.end - p.begin)});
    }
    spart_->set_attention(b.slot, host_dtype(), rows);
    spart_->attention_output_and_mlp(b.slot, l);
  });
}

void SRank::decode(const StepPlan& plan, RankStep& out) {
  rec_.decode_begin();
  const int64_t L = spart_->config().num_layers, V = spart_->config().vocab_size;
  const size_t n_mb = plan.decode.size();
  const bool last_stage = o_.pp_rank + 1 == o_.pp_size;
  while (batches_.size() < n_mb) batches_.push_back(std::make_unique<Batch>());
  out.decode_tokens.resize(last_stage ? n_mb : 0);
  out.decode_recorded.resize(last_stage ? n_mb : 0);
  for (size_t w = 0; w + 1 < plan.waves.size(); ++w) {
    const size_t b0 = plan.waves[w], b1 = plan.waves[w + 1];
    // The pipeline inside a stage: while the R-workers attend for one mini-batch, the S-Part runs the other.
    for (size_t m = b0; m < b1; ++m) {
      setup(*batches_[m], plan.decode[m]);
      launch(*batches_[m], 0);
    }
    for (int l = 0; l < L; ++l)
      for (size_t m = b0; m < b1; ++m) {
        finish(*batches_[m], l);
        if (l + 1 < L) launch(*batches_[m], l + 1);
        else if (!last_stage) hand_on(batches_[m]->slot);
      }
    if (!last_stage) continue;
    rec_.s_part("s-part", "", [&] {  // the last stage samples each wave as it ends
      for (size_t m = b0; m < b1; ++m) {
        const PlanBatch& pb = plan.decode[m];
        out.decode_tokens[m].resize(pb.sample_rows.size());
        out.decode_recorded[m].resize(pb.draws.record.size() * size_t(V));
        spart_->sample(pb.slot, pb.sample_rows, pb.draws.params, pb.draws.ids, pb.draws.steps, out.decode_tokens[m].data(),
                       pb.draws.record, pb.draws.record.empty() ? nullptr : out.decode_recorded[m].data());
      }
    });
  }
  if (!last_stage) pp_->flush_sends();
  rec_.decode_end();
}

// Prompts run through the S-Part with its own causal attention (the prompt is compute-bound: the S-Part's
// device is good at it), the prompt's K/V shipped to the owning worker per layer (APPEND_KV), the first
// token sampled at the last stage.
// pb: one entry of ids / workers per sequence (ordered by worker), tokens and pos per prompt token.
void SRank::prefill(const PlanBatch& pb, RankStep& out) {
  rec_.prefill_begin();
  const ModelConfig& c = spart_->config();
  const int64_t T = int64_t(pb.pos.size());
  const int slot = pb.slot;
  const size_t kvb = row_bytes(c.kv_dim());
  if (o_.pp_rank == 0) {
    spart_->embed(slot, pb.tokens.data(), pb.pos.data(), T);
  } else {
    spart_->prepare(slot, pb.pos.data(), T);
    rec_.span("comm", "prefill residual in", [&] { spart_->recv_residual(slot, *pp_, o_.pp_rank - 1); });
  }
  // APPEND_KV per (layer, worker) from two alternating K/V buffers: before a buffer is refilled, the sends of
  // two layers earlier (its readers, zero-copy) are answered. A worker's share goes in chunks of at most
  // o_.append_chunk_bytes of K and V, and at most half its largest message (HELLO's max_message_bytes): the worker
  // stores one while the next is on its way (one message of hundreds of MB was first carried whole, then stored), and
  // each fits its shared-memory lane. Whole sequences go together; a longer prompt alone is cut into chunk-sized
  // pieces, appended in order (the worker takes a sequence's tokens across messages as it does across steps).
  std::vector<std::pair<size_t, AppendChunk>> per_worker;  // in row order (rows are ordered by worker)
  for (size_t si = 0; si + 1 < pb.starts.size();) {
    const size_t w = pb.workers[si];
    std::vector<uint64_t> ids;
    std::vector<uint32_t> counts;
    const size_t first = size_t(pb.starts[si]);
    for (; si + 1 < pb.starts.size() && pb.workers[si] == w; ++si)
      ids.push_back(pb.ids[si]), counts.push_back(uint32_t(pb.starts[si + 1] - pb.starts[si]));
    for (AppendChunk& a : chunk_appends(ids, counts, first, client_->append_bytes(w, o_.append_chunk_bytes) / (2 * kvb)))
      per_worker.push_back({w, std::move(a)});
  }
  std::vector<std::pair<size_t, uint64_t>> pending[2];
  // Host spans of each layer's stages (a CUDA S-Part's launches return early: a stage's device time shows in the
  // next call that waits, attention_input's copy of k/v down); prefill's S-Part time is its whole (prefill_end).
  const auto timed = [&](int l, const char* track, const char* what, auto&& f) { rec_.span(track, rec_.name(l, slot, what), f); };
  for (int l = 0; l < c.num_layers; ++l) {
    const int b = l % 2;
    if (!pending[b].empty()) {
      rec_.wait("s-worker", rec_.name(l, slot, "prefill append wait"), [&] { client_->wait(pending[b]); });
      pending[b].clear();
    }
    reserve(*spart_, prefill_k_[b], size_t(T) * kvb);
    reserve(*spart_, prefill_v_[b], size_t(T) * kvb);
    timed(l, "s-part", "prefill k/v", [&] {
      spart_->attention_input(slot, l, host_dtype(), nullptr, prefill_k_[b].data(), prefill_v_[b].data());
    });
    timed(l, "s-part", "prefill attention", [&] { spart_->prefill_attention(slot, pb.starts); });
    timed(l, "s-part", "prefill output+MLP", [&] { spart_->attention_output_and_mlp(slot, l); });
    timed(l, "s-worker", "prefill append send", [&] {
      for (const auto& [w, a] : per_worker) {
        Header h = header(MsgType::AppendKV, l, a.ids.size());
        h.n_tokens = uint32_t(a.end - a.begin);
        const size_t n = a.end - a.begin;
        pending[b].push_back({w, client_->send(w, h, {{a.ids.data(), a.ids.size() * 8}, {a.counts.data(), a.counts.size() * 4},
                                                      {prefill_k_[b].data() + a.begin * kvb, n * kvb},
                                                      {prefill_v_[b].data() + a.begin * kvb, n * kvb}})});
      }
    });
    rec_.appends(int64_t(per_worker.size()));
  }
  if (o_.pp_rank + 1 < o_.pp_size) {
    hand_on(slot);
  } else {
    const size_t V = size_t(c.vocab_size);
    out.prefill_tokens.resize(pb.sample_rows.size());
    out.prefill_recorded.resize(pb.draws.record.size() * V);
    spart_->sample(slot, pb.sample_rows, pb.draws.params, pb.draws.ids, pb.draws.steps, out.prefill_tokens.data(),
                   pb.draws.record, pb.draws.record.empty() ? nullptr : out.prefill_recorded.data());
  }
  rec_.prefill_end([&] {
    for (auto& p : pending) client_->wait(p);
    if (pp_ && o_.pp_rank + 1 < o_.pp_size) pp_->flush_sends();
  });
}

}  // namespace fd
