#include "fastdecode/sworker/fastdecode_engine.h"
#include "fastdecode/sched/placement.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "fastdecode/core/affinity.h"
#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fd_fault_drop_last_token.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)
#include "fd_fault_shift_tokens.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)
#include "fastdecode/model/reference.h"
#include "fastdecode/parallel/comm.h"
#include "fastdecode/wire/curve.h"
#include "fastdecode/wire/rworker_client.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/sworker/srank.h"
#include "fastdecode/spart/spart.h"
#include "kernels/cuda/device_info.h"

namespace fd {

namespace {

using proto::Header;
using proto::MsgType;
using proto::WireDType;

// The config as this engine runs it: backend "auto" decided (cuda when a GPU answers), the wire dtype's
// default filled in, the hardware balance applied to spawned R-workers.
FastDecodeConfig resolve(FastDecodeConfig c, const HardwareBalance& hw) {
  if (c.backend == "auto") c.backend = cuda_devices().empty() ? "cpu" : "cuda";
  if (c.wire_dtype.empty()) c.wire_dtype = c.backend == "cuda" ? "fp16" : "fp32";
  if (hw.rworkers > 0) c.rworkers.spawn = hw.rworkers, c.rworkers.pin = true;
  if (hw.rworker_threads > 0) c.rworkers.threads = hw.rworker_threads;
  return c;
}

// With engine.parallel (G > 1 ranks): one R-worker group per rank, listed per group, of equal sizes.
void check_groups(const FastDecodeConfig& ec, int64_t G) {
  if (!ec.rworkers.endpoints.empty())
    throw ConfigError("fastdecode engine: engine.parallel has one R-worker group per rank: list each group's endpoints "
                      "in engine.rworkers.groups[g].endpoints, not engine.rworkers.endpoints");
  if (!ec.rworkers.groups.empty() && int64_t(ec.rworkers.groups.size()) != G)
    throw ConfigError("fastdecode engine: engine.rworkers.groups has " + std::to_string(ec.rworkers.groups.size()) +
                      " entries for " + std::to_string(G) + " S-ranks");
  for (int64_t g = 1; g < G; ++g) {
    const RWorkersConfig a = ec.rworkers.group(0), b = ec.rworkers.group(size_t(g));
    const size_t na = a.endpoints.empty() ? size_t(a.spawn) : a.endpoints.size();
    const size_t nb = b.endpoints.empty() ? size_t(b.spawn) : b.endpoints.size();
    if (na != nb)
      throw ConfigError("fastdecode engine: R-worker group 0 has " + std::to_string(na) + " workers and group " +
                        std::to_string(g) + " has " + std::to_string(nb) + ": every group needs the same number (a "
                        "sequence sits at the same worker index in every group)");
  }
}

// Per group, the first core of its pinned spawned workers (worker i takes `threads` cores from first + i * threads):
// the group's first_cpu, else the core after those of the pinned groups before it; -1 for a listed or unpinned group.
std::vector<int64_t> pinned_first_cpus(const FastDecodeConfig& ec, int64_t G) {
  std::vector<int64_t> first(size_t(G), -1);
  int64_t next_cpu = 0;
  for (int64_t g = 0; g < G; ++g) {
    const RWorkersConfig r = ec.rworkers.group(size_t(g));
    if (!r.endpoints.empty() || !r.pin) continue;
    const int64_t own_first = ec.rworkers.groups.empty() ? -1 : ec.rworkers.groups[size_t(g)].first_cpu;
    first[size_t(g)] = own_first >= 0 ? own_first : next_cpu;
    next_cpu = std::max(next_cpu, first[size_t(g)] + r.spawn * r.threads);
  }
  return first;
}

// The cores the spawned, pinned workers will take (pinned_first_cpus), checked against the CPUs this process may run
// on: a config error naming the key, before any worker is spawned. Registered workers are pinned by their launcher.
void check_pinned_cpus(const FastDecodeConfig& ec, const std::vector<int64_t>& first_cpus, bool from_hardware) {
  const std::vector<int> allowed = allowed_cpus();  // ascending; empty when it cannot be read
  if (allowed.empty() || !ec.rworkers.register_endpoint.empty()) return;
  const size_t G = first_cpus.size();
  for (size_t g = 0; g < G; ++g) {
    const RWorkersConfig r = ec.rworkers.group(g);
    const int64_t first_cpu = first_cpus[g], last = first_cpu + r.spawn * r.threads - 1;
    for (int64_t c = first_cpu; first_cpu >= 0 && c <= last; ++c) {
      if (c < CPU_SETSIZE && std::binary_search(allowed.begin(), allowed.end(), int(c))) continue;
      const std::string key = from_hardware ? "hardware.rworkers (its workers are pinned: engine.rworkers.pin)"
                              : ec.rworkers.groups.empty() ? "engine.rworkers.pin"
                                                           : "engine.rworkers.groups[" + std::to_string(g) + "] (pin)";
      throw ConfigError(key + ": " + std::to_string(r.spawn) + " R-worker(s) x " + std::to_string(r.threads) +
                        " threads pinned to CPUs " + std::to_string(first_cpu) + "-" + std::to_string(last) +
                        (G > 1 ? " (group " + std::to_string(g) + ")" : "") + ", but CPU " + std::to_string(c) +
                        " is not one this process may run on (" + std::to_string(allowed.size()) + " CPUs, the last " +
                        std::to_string(allowed.back()) + "): fewer workers or threads, or pin: false");
    }
  }
}

// engine.sworker_cpus as CPUs (empty: leave the process as started), checked against the CPUs this process may run on
// before any worker is spawned. "rest": those the pinned spawned workers (pinned_first_cpus) do not take.
std::vector<int> sworker_cpus_for(const FastDecodeConfig& ec, const std::vector<int64_t>& first_cpus) {
  if (ec.sworker_cpus.empty()) return {};
  const std::vector<int> allowed = allowed_cpus();
  std::vector<int> cpus;
  if (ec.sworker_cpus == "rest") {
    std::vector<bool> taken(CPU_SETSIZE, false);
    bool any = false;
    for (size_t g = 0; g < first_cpus.size(); ++g) {
      const RWorkersConfig r = ec.rworkers.group(g);
      for (int64_t c = first_cpus[g]; first_cpus[g] >= 0 && c < first_cpus[g] + r.spawn * r.threads; ++c)
        if (c < CPU_SETSIZE) taken[size_t(c)] = any = true;
    }
    if (!any)
      throw ConfigError("engine.sworker_cpus: \"rest\" is the CPUs the pinned R-workers leave free, and no spawned "
                        "worker is pinned (engine.rworkers.pin): pin them, or name the S-worker's CPUs (e.g. \"12-15\")");
    for (int c : allowed)
      if (!taken[size_t(c)]) cpus.push_back(c);
    if (cpus.empty())
      throw ConfigError("engine.sworker_cpus: the pinned R-workers take every CPU this process may run on (" +
                        cpu_list_string(allowed) + "): none is left for the S-worker; fewer workers or threads");
    return cpus;
  }
  cpus = parse_cpu_list(ec.sworker_cpus, "engine.sworker_cpus");
  for (int c : cpus)
    if (!std::binary_search(allowed.begin(), allowed.end(), c))
      throw ConfigError("engine.sworker_cpus: CPU " + std::to_string(c) + " is not one this process may run on (" +
                        cpu_list_string(allowed) + ")");
  return cpus;
}

// The client settings of every rank's R-worker link: deadline, heartbeats, CURVE keys (read here: a bad key file
// is a config error before any work).
RWorkerClientOptions client_options_for(const RWorkersConfig& r) {
  RWorkerClientOptions o;
  o.timeout_ms = int(r.timeout_ms);
  o.heartbeat_ms = int(r.heartbeat_ms);
  o.heartbeat_timeout_ms = int(r.heartbeat_timeout_ms);
  o.shm_bytes = r.shm ? kEngineShmBytes : 0;
  o.spin_us = int(r.spin_us);
  if (!r.curve_server_public.empty()) {
    if (!curve_available()) throw ConfigError("engine.rworkers.curve: this libzmq has no CURVE support (libsodium)");
    o.curve_server_public = read_curve_public(r.curve_server_public);
    o.curve_client = read_curve_secret(r.curve_client_secret);
  }
  return o;
}

}  // namespace

// vLLM's order: the config resolved and every part of it checked with nothing started, then the R-workers launched,
// then the ranks built on them.
FastDecodeEngine::FastDecodeEngine(const FastDecodeConfig& config, const EngineContext& ctx)
    : ec_(resolve(config, ctx.hardware)), cfg_(ctx.model), sampling_(ctx.sampling),
      wire_(ec_.wire_dtype == "fp16" ? WireDType::F16 : WireDType::F32) {
  Setup s = check_setup(ctx);
  const std::vector<std::vector<std::string>> endpoints = launch_rworkers(s, ctx.hardware.network);
  if (!s.sworker_cpus.empty()) {
    pin_all_threads(s.sworker_cpus);
    notes_.push_back("the S-worker's threads are pinned to CPUs " + cpu_list_string(s.sworker_cpus) +
                     " (engine.sworker_cpus: " + ec_.sworker_cpus + ")");
  }
  build_ranks(s, endpoints, ctx.hardware);
}

FastDecodeEngine::Setup FastDecodeEngine::check_setup(const EngineContext& ctx) {
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
  Setup s;
  s.layout = rank_layout(cfg_, ec.parallel);
  if (s.layout.G > 1) check_groups(ec, s.layout.G);
  // The GPU of each rank: refused here when too few answer. On the cpu backend no rank has one; on the cuda backend
  // one S-rank always runs on GPU 0 (its parallel.devices is not read).
  place_ranks(s.layout, ec.parallel, ec.backend == "cuda" ? RankGpus::kParallel : RankGpus::kNone, -1, "fastdecode engine");
  // The weights: a checkpoint refused (a NaN or Inf weight, a missing tensor) is a config error with nothing started.
  s.weights = load_rank_weights(s.layout, ctx.model, ctx.weights);
  s.first_cpus = pinned_first_cpus(ec, s.layout.G);
  check_pinned_cpus(ec, s.first_cpus, ctx.hardware.rworkers > 0);
  s.sworker_cpus = sworker_cpus_for(ec, s.first_cpus);
  s.client = client_options_for(ec.rworkers);
  return s;
}

void FastDecodeEngine::build_ranks(Setup& s, const std::vector<std::vector<std::string>>& endpoints,
                                   const HardwareBalance& hw) {
  const FastDecodeConfig& ec = ec_;
  const RankLayout& l = s.layout;
  comms_ = RankComms(ec.parallel, ec.backend == "cuda" ? l.devices : std::vector<int>{});
  devices_ = l.devices;
  if (ec.backend == "cuda")
    for (std::string& n : rank_notes(l, comms_)) notes_.push_back(std::move(n));
  for (size_t g = 0; g < size_t(l.G); ++g) {
    const SPartComms comms{comms_.tp(g)};
    std::unique_ptr<SPart> sp =
        ec.backend == "cuda" ? make_cuda_spart(std::move(s.weights[g]), {int(hw.gpu_sm_count), dtype_from_name(ec.dtype),
                                                                         ec.cuda_graphs, l.devices[g], comms, hw.gpu_gemm_table})
                             : make_cpu_spart(std::move(s.weights[g]), comms);
    auto client = std::make_unique<RWorkerClient>(endpoints[g], s.client);
    SRankOptions o;
    o.tp_rank = int(l.tp_rank(g)), o.tp_size = int(l.T), o.pp_rank = int(l.pp_rank(g)), o.pp_size = int(l.P);
    o.layer_begin = l.stages[size_t(l.pp_rank(g))].first;
    o.wire = wire_;
    o.shm_in_place = ec.rworkers.shm_in_place;
    o.append_chunk_bytes = size_t(ec.rworkers.append_chunk_kb) << 10;
    o.prefill_reserve_tokens = ec.prefill_tokens;
    if (l.G > 1) {
      o.track_suffix = " t" + std::to_string(l.tp_rank(g)) + " p" + std::to_string(l.pp_rank(g));
      o.worker_prefix = "rworker g" + std::to_string(g) + ".";
    }
    ranks_.push_back(std::make_unique<SRank>(std::move(sp), std::move(client), comms_.pp(g), o));
  }
  load_.assign(ranks_[0]->client().size(), 0);
  dead_.assign(load_.size(), false);
}

FastDecodeEngine::~FastDecodeEngine() {
  try {
    shutdown();
  } catch (...) {
  }
}

json FastDecodeEngine::info() const {
  const auto workers = [](SRank& r) {
    json w = json::array();
    for (size_t i = 0; i < r.hello().size(); ++i) {
      const ShmLaneStats s = r.client().shm_stats(i);  // whether this worker's tensors go through shared memory, or why not
      json shm = {{"state", s.state}, {"bytes", s.bytes}, {"device_registered", r.region_pinned(i)}, {"requests", s.requests_shm},
                  {"replies", s.replies_shm}, {"requests_ring", s.requests_ring}, {"replies_ring", s.replies_ring}};
      if (!s.reason.empty()) shm["reason"] = s.reason;
      w.push_back({{"endpoint", r.endpoint(i)}, {"hello", r.hello()[i]}, {"shm", shm}});
    }
    return w;
  };
  json j = {{"backend", ec_.backend},       {"s_part", ranks_.empty() ? "" : ranks_[0]->spart().describe()},
            {"mini_batches", ec_.mini_batches}, {"wire_dtype", ec_.wire_dtype},
            {"rworkers_spawned", !spawned_.empty()}, {"waves", ec_.parallel.wave_count()}, {"rworkers", ranks_.empty() ? json::array() : workers(*ranks_[0])}};
  if (ranks_.size() > 1) {
    json r = json::array();
    for (const auto& rk : ranks_) {
      const SRankOptions& o = rk->options();
      const ModelConfig& c = rk->config();
      r.push_back({{"t", o.tp_rank}, {"p", o.pp_rank}, {"layers", {o.layer_begin, o.layer_begin + c.num_layers}},
                   {"device", ec_.backend == "cuda" ? json(devices_[size_t(&rk - &ranks_[0])]) : json(nullptr)},
                   {"heads", c.num_heads}, {"kv_heads", c.num_kv_heads}, {"s_part", rk->spart().describe()},
                   {"rworkers", workers(*rk)}});
    }
    j["parallel"] = {{"tensor", ec_.parallel.tensor}, {"pipeline", ec_.parallel.pipeline}, {"waves", ec_.parallel.wave_count()},
                     {"comm", {{"tensor", comms_.tensor_describe()}, {"pipeline", comms_.pipeline_describe()}}}};
    j["ranks"] = r;
  }
  return j;
}

// The R-workers' KV memory (from their HELLO replies): worker w holds C_w = memory_w / (layers x bytes
// per token per layer) tokens of full blocks; each sequence also holds at most one fp16 partial block
// per layer (slack s_w tokens), and at most W / min(prompt + 1) sequences run at a W load, so
// C'_w = C_w / (1 + s_w / min(prompt + 1)); placement by least projected load keeps a worker within one
// sequence (max_len) of the mean: the capacity is P x (min_w C'_w - max_len). With several ranks a
// sequence sits at the same worker index in every group: the minimum is over every group's workers, each
// with its own layers and heads.
EngineCapacity FastDecodeEngine::capacity(int64_t min_prompt, int64_t max_len) const {
  EngineCapacity cap;
  double min_c = 1e300;
  for (const auto& rk : ranks_)
    for (const json& h : rk->hello()) {
      const double layers = double(rk->config().num_layers);
      const double per_token = layers * h.at("kv_bytes_per_token_per_layer").get<double>();
      const double slack = h.at("kv_tail_block_bytes").get<double>() * layers / per_token;
      const double c = std::floor(h.at("memory_limit_bytes").get<double>() / per_token);
      min_c = std::min(min_c, c / (1.0 + slack / double(min_prompt + 1)));
    }
  const size_t n = load_.size();
  cap.kv_tokens = int64_t(double(n) * (std::floor(min_c) - double(max_len)));
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "schedule.kv_capacity_tokens = %lld, derived from the R-workers' memory (%zu workers%s, at most %.0f "
                "tokens each after partial-block slack; minus one longest sequence each for placement imbalance)",
                (long long)cap.kv_tokens, n, ranks_.size() > 1 ? " per group" : "", std::floor(min_c));
  cap.note = buf;
  if (cap.kv_tokens < max_len) {
    std::snprintf(buf, sizeof buf,
                  "the R-workers' KV memory is too small for one request of %lld tokens: each of the %zu workers holds "
                  "at most %.0f tokens after partial-block slack, and placement keeps room for one longest request on "
                  "each, which leaves %lld tokens in all: raise engine.rworkers.memory_gb (or set "
                  "schedule.kv_capacity_tokens)",
                  (long long)max_len, n, std::floor(min_c), (long long)std::max<int64_t>(cap.kv_tokens, 0));
    cap.error = buf;
  }
  return cap;
}

void FastDecodeEngine::add(const std::vector<Request>& requests) {
  for (const auto& r : requests) {
    validate_request(r, cfg_);
    if (running_.count(r.id)) FD_THROW("request " << r.id << " is already running");
  }
  queued_.insert(queued_.end(), requests.begin(), requests.end());
}

size_t FastDecodeEngine::place(const Sequence& s) const {
  std::vector<PlacedLoad> running;
  running.reserve(running_.size());
  for (const auto& [id, r] : running_)
    if (&r != &s && r.worker < load_.size())  // worker load_.size(): not placed yet (recovery)
      running.push_back({r.worker, double(r.len > 0 ? r.len : int64_t(r.req.prompt.size())),
                         double(r.req.max_new_tokens - r.generated)});
  return place_sequence(load_, dead_, running, double(s.len > 0 ? s.len : int64_t(s.req.prompt.size())),
                        double(s.req.max_new_tokens), int64_t(s.req.prompt.size()) + s.req.max_new_tokens, longest_);
}

StepResult FastDecodeEngine::step() {
  StepResult out;
  StepPlan plan;
  std::vector<std::vector<Sequence*>> mb_seqs;
  std::vector<Sequence*> fresh;
  std::vector<RankStep> res;
  // A step that loses an R-worker is undone on the survivors, its sequences rebuilt elsewhere (recover), and run
  // again from a fresh plan.
  for (;;) {
    plan = StepPlan{};
    plan.frees = frees_;
    mb_seqs.clear(), fresh.clear(), admitted_.clear();
    if (!running_.empty()) plan_decode(plan, mb_seqs);
    if (!queued_.empty()) plan_prefill(plan, fresh);
    std::vector<size_t> lost;
    try {
      res = run_ranks(plan, &lost);
      break;
    } catch (const Error& e) {
      if (lost.empty()) throw;
      recover(lost, plan, admitted_, e.what(), out);
    }
  }
  frees_.clear();
  // The tokens: the last stage's tensor rank 0 (its tensor peers picked the same ones).
  const RankStep& last = res[size_t((ec_.parallel.pipeline - 1) * ec_.parallel.tensor)];
  for (size_t m = 0; m < mb_seqs.size(); ++m) {
    for (Sequence* s : mb_seqs[m]) s->fed.push_back(s->last), s->len += 1;
    emit(mb_seqs[m], last.decode_tokens.at(m), last.decode_recorded.at(m), out);
    for (Sequence* s : mb_seqs[m]) out.total_context += s->len;
  }
  out.decode_tokens = int64_t(running_.size()) - int64_t(fresh.size());
  if (!mb_seqs.empty()) {  // the busiest worker's KV tokens this decode attended over the live workers' mean
    std::vector<int64_t> kv(load_.size(), 0);
    int64_t sum = 0, live = 0;
    for (const auto& mb : mb_seqs)
      for (const Sequence* s : mb) kv[s->worker] += s->len, sum += s->len;
    for (size_t w = 0; w < kv.size(); ++w) live += !dead_[w];
    if (sum > 0 && live > 0) out.worker_kv_imbalance = double(*std::max_element(kv.begin(), kv.end())) * double(live) / double(sum);
  }
  if (plan.has_prefill) {
    for (Sequence* s : fresh) s->len = int64_t(s->req.prompt.size());
    emit(fresh, last.prefill_tokens, last.prefill_recorded, out);
    for (Sequence* s : fresh) out.total_context += s->len;
    out.prefill_tokens = int64_t(plan.prefill.pos.size());
  }
  std::vector<RankTiming> timing;
  for (RankStep& r : res) timing.push_back(std::move(r.timing));
  add_rank_timing(timing, !plan.decode.empty(), out);
  release_finished(out);
  return out;
}

// The running sequences in waves x mini_batches mini-batches: each worker's sequences alternate between them,
// so every worker has work in each (it attends for one while the S-Part runs another); each is ordered by
// owning worker. Wave w is mini-batches [w * mini_batches, (w + 1) * mini_batches).
void FastDecodeEngine::plan_decode(StepPlan& plan, std::vector<std::vector<Sequence*>>& mbs) {
  const int64_t per_wave = ec_.mini_batches, M = per_wave * ec_.parallel.wave_count();
  mbs.assign(size_t(std::min<int64_t>(M, int64_t(running_.size()))), {});
  const size_t n_slots = mbs.size();
  std::vector<size_t> turn(load_.size(), 0);
  for (auto& [id, s] : running_) mbs[turn[s.worker]++ % n_slots].push_back(&s);
  // Every worker holding fewer sequences than there are mini-batches can leave one empty: it goes.
  mbs.erase(std::remove_if(mbs.begin(), mbs.end(), [](const auto& mb) { return mb.empty(); }), mbs.end());
  const size_t n_mb = mbs.size();
  for (size_t m = 0; m < n_mb; ++m) {
    std::stable_sort(mbs[m].begin(), mbs[m].end(), [](const Sequence* a, const Sequence* b) { return a->worker < b->worker; });
    PlanBatch pb;
    pb.slot = int(m);
    for (Sequence* s : mbs[m]) {
      pb.sample_rows.push_back(int32_t(pb.ids.size()));
      pb.ids.push_back(s->req.id), pb.workers.push_back(s->worker), pb.tokens.push_back(s->last), pb.pos.push_back(s->len);
      pb.draws.add(s->req, s->generated, sampling_);
    }
    plan.decode.push_back(std::move(pb));
  }
  for (size_t m = 0; m < n_mb; m += size_t(per_wave)) plan.waves.push_back(m);
  plan.waves.push_back(n_mb);
}

// New requests: placed on the least-loaded worker index (the same in every group); at most prefill_tokens
// prompt tokens per step (whole prompts, at least one): bounds the S-Part's activation memory; the rest
// start on the following steps.
void FastDecodeEngine::plan_prefill(StepPlan& plan, std::vector<Sequence*>& fresh) {
  int64_t budget = ec_.prefill_tokens;
  std::map<size_t, std::vector<uint64_t>> adds;
  while (!queued_.empty() && (fresh.empty() || int64_t(queued_.front().prompt.size()) <= budget)) {
    budget -= int64_t(queued_.front().prompt.size());
    Sequence s;
    s.req = std::move(queued_.front());
    queued_.pop_front();
    s.worker = place(s);
    load_[s.worker] += int64_t(s.req.prompt.size()) + s.req.max_new_tokens;
    longest_ = std::max(longest_, int64_t(s.req.prompt.size()) + s.req.max_new_tokens);
    adds[s.worker].push_back(s.req.id);
    const uint64_t id = s.req.id;
    admitted_.push_back(id);
    fresh.push_back(&running_.emplace(id, std::move(s)).first->second);
  }
  plan.adds.assign(adds.begin(), adds.end());
  // Ordered by worker: each worker's prompt rows are one contiguous range of the K/V buffers.
  std::stable_sort(fresh.begin(), fresh.end(), [](const Sequence* a, const Sequence* b) { return a->worker < b->worker; });
  PlanBatch& pb = plan.prefill;
  plan.has_prefill = true;
  pb.slot = int(ec_.mini_batches * ec_.parallel.wave_count());  // after the decode mini-batches' slots
  for (Sequence* s : fresh) {
    pb.starts.push_back(int64_t(pb.tokens.size()));
    pb.ids.push_back(s->req.id), pb.workers.push_back(s->worker);
    for (size_t t = 0; t < s->req.prompt.size(); ++t) pb.tokens.push_back(s->req.prompt[t]), pb.pos.push_back(int64_t(t));
    pb.sample_rows.push_back(int32_t(pb.tokens.size()) - 1);
    pb.draws.add(s->req, s->generated, sampling_);
  }
  pb.starts.push_back(int64_t(pb.tokens.size()));
}

// One rank: inline. Several: one thread each; a rank that fails aborts its communicators, which wakes its
// peers blocked in a collective or a hand-off, and the first failure is what the step throws.
std::vector<RankStep> FastDecodeEngine::run_ranks(const StepPlan& plan, std::vector<size_t>* lost) {
  std::vector<RankStep> res(ranks_.size());
  std::mutex m;
  run_on_ranks(
      ranks_.size(), size_t(ec_.parallel.tensor), "fastdecode engine",
      [&](size_t g) {
        try {
          res[g] = ranks_[g]->run(plan);
        } catch (const RWorkerLost& e) {
          if (lost) {
            std::lock_guard<std::mutex> lock(m);
            for (size_t w : e.workers())
              if (std::find(lost->begin(), lost->end(), w) == lost->end()) lost->push_back(w);
          }
          throw;
        }
      },
      [&](size_t g) { comms_.abort(g); }, [](size_t g) { return "R-worker group " + std::to_string(g); });
  return res;
}

// Emits each sequence's picked token (a forced sequence continues with its forced token, not the pick) and
// the logits rows of those that record them (`recorded`: their rows in order).
void FastDecodeEngine::emit(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& tok,
                            const std::vector<float>& recorded, StepResult& out) {
  FD_CHECK(tok.size() == seqs.size(), "fastdecode engine: " << tok.size() << " tokens for " << seqs.size() << " sequences");
  const size_t V = size_t(cfg_.vocab_size);
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
      const float* row = &recorded.at(next_record++ * V);
      out.tokens.back().logits.assign(row, row + V);
    }
  }
}

// Finished sequences free their R-worker memory at the start of the next step (every rank's group frees
// its copy); their placement load is released now.
void FastDecodeEngine::release_finished(const StepResult& out) {
  std::map<size_t, std::vector<uint64_t>> frees;
  for (const auto& t : out.tokens) {
    if (!t.finished) continue;
    Sequence& s = running_.at(t.request_id);
    frees[s.worker].push_back(t.request_id);
    load_[s.worker] -= int64_t(s.req.prompt.size()) + s.req.max_new_tokens;
    running_.erase(t.request_id);
  }
  frees_.assign(frees.begin(), frees.end());
}

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
