// The paged-swap engine (CUDA builds). See paged_swap_engine.h; the policy is scheduler.h / block_manager.h.
#include "baselines/paged_swap/paged_swap_engine.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <optional>

#include "baselines/paged_swap/scheduler.h"
#include "fastdecode/core/clock.h"
#include "fastdecode/spart/cuda_model.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/green_context.h"

namespace fd {

namespace {

struct Seq {
  Request req;
  // Prompt, then every token the sequence continued with (its pick, or the forced token): all but the
  // last are in the cache between steps; a recompute prefills all of them again.
  std::vector<int32_t> tokens;
  int64_t generated = 0;
};

// Host memory from cudaHostAlloc (pinned: the swap copies run asynchronously at full link speed).
struct PinnedBuffer {
  __half* p = nullptr;
  explicit PinnedBuffer(size_t n) {
    if (n) CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p), n * sizeof(__half), cudaHostAllocDefault));
  }
  ~PinnedBuffer() {
    if (p) cudaFreeHost(p);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

enum Ev { kSwapOut0, kSwapOut1, kSwapIn0, kSwapIn1, kCompute0, kCompute1, kNumEvents };

class PagedSwapEngine : public Engine {
 public:
  PagedSwapEngine(const PagedSwapConfig& ec, const EngineContext& ctx) : ec_(ec), cfg_(ctx.model), sampling_(ctx.sampling) {
    const auto devs = cuda_devices();
    if (devs.empty()) throw ConfigError("engine.type paged-swap runs on a GPU, and no CUDA device answers (the fastdecode and reference "
                                         "engines run on the CPU)");
    CUDA_CHECK(cudaSetDevice(0));
    device_name_ = devs[0].name;
    streams_ = std::make_unique<cuda::SmLimitedStreams>(int(ctx.hardware.gpu_sm_count), 1);
    stream_ = streams_->stream(0);
    model_ = std::make_unique<CudaModel>(load_model_weights(cfg_, ctx.weights), stream_,
                                         streams_->limited() ? streams_->sm_count() : 0, dtype_from_name(ec.dtype));
    model_->use_gemm_table(load_gemm_table(ctx.hardware.gpu_gemm_table));
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    budget_bytes_ = ctx.hardware.gpu_memory_gb > 0 ? ctx.hardware.gpu_memory_gb * 1e9 : double(total_b);
    const int64_t bs = ec.block_size;
    block_bytes_ = paged_swap_block_bytes(cfg_, bs);
    gpu_blocks_ = ec.num_gpu_blocks > 0 ? ec.num_gpu_blocks : paged_swap_gpu_blocks(cfg_, budget_bytes_, bs);
    if (ec.num_gpu_blocks > 0)
      notes_.push_back("paged-swap: num_gpu_blocks = " + std::to_string(ec.num_gpu_blocks) +
                       " is forced; the GPU memory budget does not size the KV-cache");
    if (gpu_blocks_ < 1)
      FD_THROW("paged-swap engine: " << budget_bytes_ / 1e9 << " GB of GPU memory hold the full-depth weights of "
                                     << cfg_.name << " and 1 GiB of workspaces but not one KV block of " << bs << " tokens");
    // What this (reduced-layer) run allocates must fit the real device: the blocks of the layers run, the
    // activations of a full decode batch and a full prefill step, and 2 GiB kept free.
    block_elems_ = size_t(bs) * size_t(cfg_.kv_dim());
    const double run_block = double(block_elems_) * 2 * 2 * double(cfg_.num_layers);
    const double rows = double(std::max(ec.max_num_seqs, ec.max_num_batched_tokens));
    const double acts = rows * 4 * double(2 * cfg_.hidden_size + 2 * cfg_.q_dim() + 4 * cfg_.kv_dim() + cfg_.intermediate_size * 3) +
                        double(ec.max_num_seqs) * 4 * double(cfg_.vocab_size);
    const int64_t fit = int64_t((double(free_b) - double(2ull << 30) - acts) / run_block);
    if (fit < gpu_blocks_) {
      blocks_device_limited_ = true;
      gpu_blocks_ = std::max<int64_t>(fit, 0);
      if (gpu_blocks_ < 1) FD_THROW("paged-swap engine: the device has no room for one KV block");
      notes_.push_back("paged-swap: the device holds only " + std::to_string(gpu_blocks_) +
                       " blocks of the layers run, fewer than the full-depth accounting gives");
    }
    cpu_blocks_ = int64_t(ec.swap_space_gb * double(1ull << 30) / block_bytes_);
    if (cpu_blocks_ >= (int64_t(1) << 31)) cpu_blocks_ = (int64_t(1) << 31) - 1;
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
      k_cache_.emplace_back(size_t(gpu_blocks_) * block_elems_);
      v_cache_.emplace_back(size_t(gpu_blocks_) * block_elems_);
    }
    // One pinned pool: layer l's K at [2l], V at [2l + 1], each cpu_blocks x block_elems.
    host_ = std::make_unique<PinnedBuffer>(size_t(2 * cfg_.num_layers) * size_t(cpu_blocks_) * block_elems_);
    PagedSchedulerConfig sc;
    sc.max_num_seqs = ec.max_num_seqs;
    sc.max_num_batched_tokens = ec.max_num_batched_tokens;
    sc.preemption = ec.preemption == "recompute" ? Preemption::kRecompute : Preemption::kSwap;
    sched_.emplace(sc, BlockManager(bs, gpu_blocks_, cpu_blocks_, ec.watermark));
    for (int i = 0; i < kNumEvents; ++i) CUDA_CHECK(cudaEventCreate(&events_[size_t(i)]));
  }

  ~PagedSwapEngine() override {
    shutdown();
    for (auto e : events_)
      if (e) cudaEventDestroy(e);
  }

  std::string name() const override { return "paged-swap"; }
  json info() const override {
    return {{"device", device_name_},
            {"s_part", "cuda: " + ec_.dtype + " weights and activations, fused QKV and gate|up GEMMs (cuBLAS GemmEx, "
                       "fp32 accumulation, residual added in the GEMM)"},
            {"attention", "cuda: flash-decoding split-K over a block-paged fp16 KV-cache (block tables); tiled causal "
                          "prefill; prefill and decode in separate steps (vLLM v0.2)"},
            {"sm_count", streams_->sm_count()},
            {"sm_limited", streams_->limited()},
            {"memory_budget_gb", budget_bytes_ / 1e9},
            {"block_size", ec_.block_size},
            {"gpu_blocks", gpu_blocks_},
            {"cpu_swap_blocks", cpu_blocks_},
            {"block_bytes_full_depth", block_bytes_},
            {"block_bytes_allocated", double(block_elems_) * 4 * double(cfg_.num_layers)},
            {"gpu_blocks_from", ec_.num_gpu_blocks > 0 ? "num_gpu_blocks (forced)" : "memory budget"},
            {"blocks_limited_by_device", blocks_device_limited_},
            {"preemption", ec_.preemption},
            {"watermark", ec_.watermark},
            {"max_num_seqs", ec_.max_num_seqs},
            {"max_num_batched_tokens", ec_.max_num_batched_tokens},
            {"cuda_graphs", false},
            {"gemm_table", model_->gemm_table_info()}};
  }

  void add(const std::vector<Request>& requests) override {
    for (const auto& r : requests) {  // every request checked before any is queued
      validate_request(r, cfg_);
      if (seqs_.count(r.id)) FD_THROW("paged-swap: request " << r.id << " is already queued or running");
      sched_->check(r.id, int64_t(r.prompt.size()), max_positions(r));
    }
    for (const auto& r : requests) {
      sched_->add(r.id, int64_t(r.prompt.size()), max_positions(r));
      Seq s;
      s.req = r;
      s.tokens = r.prompt;
      seqs_.emplace(r.id, std::move(s));
    }
  }

  bool done() const override { return sched_->idle(); }

  // Not bounded through the harness: like vLLM, the engine admits by free blocks and preempts when they
  // run out (a KV bound here would make the harness hold requests back so that nothing is ever
  // preempted). A request that cannot fit alone is an error.
  EngineCapacity capacity(int64_t, int64_t max_len) const override {
    EngineCapacity c;
    c.slots = ec_.max_num_seqs;
    const BlockManager& b = sched_->blocks();
    c.note = "paged-swap: " + std::to_string(gpu_blocks_) + " GPU blocks x " + std::to_string(ec_.block_size) + " = " +
             std::to_string(gpu_blocks_ * ec_.block_size) + " KV tokens (" +
             (ec_.num_gpu_blocks > 0 ? std::string("num_gpu_blocks, forced")
                                     : "(memory - full-depth fp16 weights - 1 GiB) / full-depth KV bytes per block") +
             "), " + std::to_string(cpu_blocks_) + " CPU swap blocks; admission by free blocks, preemption " + ec_.preemption;
    if (max_len > 1 && !b.ever_fits(max_len - 1 + ec_.block_size))
      c.error = "a sequence of " + std::to_string(max_len - 1) + " positions needs " + std::to_string(b.blocks_for(max_len - 1)) +
                " KV blocks (+1 to swap in) but paged-swap has " + std::to_string(gpu_blocks_) + " GPU blocks (watermark " +
                std::to_string(b.watermark_blocks()) + "): raise num_gpu_blocks or the GPU memory";
    return c;
  }

  StepResult step() override {
    StepResult out;
    const PagedStepPlan plan = sched_->schedule();
    if (plan.empty() && !sched_->idle())
      FD_THROW("paged-swap: the scheduler planned nothing with " << sched_->waiting() << " waiting, " << sched_->swapped()
                                                                << " swapped sequences");
    double swap_out_ms = 0, swap_in_ms = 0, compute_ms = 0;
    if (!plan.swap_out.empty()) copy_blocks(plan.swap_out, true, out);
    if (!plan.swap_in.empty()) copy_blocks(plan.swap_in, false, out);
    for (const Preempted& p : plan.preempted) {
      ++out.counts[p.how == Preemption::kSwap ? "preempted_swap" : "preempted_recompute"];
      if (p.fallback) ++out.counts["swap_fallback_recompute"];
    }
    CUDA_CHECK(cudaEventRecord(events_[kCompute0], stream_));
    if (!plan.prefill.empty()) {
      prefill(plan.prefill, out);
    } else if (!plan.decode.empty()) {
      decode(plan.decode, out);
    }
    CUDA_CHECK(cudaEventRecord(events_[kCompute1], stream_));
    CUDA_CHECK(cudaEventSynchronize(events_[kCompute1]));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[kCompute0], events_[kCompute1]));
    compute_ms = ms;
    if (!plan.swap_out.empty()) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, events_[kSwapOut0], events_[kSwapOut1]));
      swap_out_ms = ms;
    }
    if (!plan.swap_in.empty()) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, events_[kSwapIn0], events_[kSwapIn1]));
      swap_in_ms = ms;
    }
    for (const auto& t : out.tokens) {
      sched_->on_token(t.request_id);
      if (!t.finished) continue;
      sched_->finish(t.request_id);
      seqs_.erase(t.request_id);
    }
    out.breakdown_ms = {{"swap_out_ms", swap_out_ms},
                        {"swap_in_ms", swap_in_ms},
                        {"prefill", plan.prefill.empty() ? 0.0 : compute_ms},
                        {"decode", plan.prefill.empty() ? compute_ms : 0.0}};
    return out;
  }

  void shutdown() override {
    for (const auto& [id, s] : seqs_) sched_->finish(id);
    seqs_.clear();
  }

 private:
  // The last generated token is never fed back: at most prompt + max_new - 1 cache positions.
  static int64_t max_positions(const Request& r) { return int64_t(r.prompt.size()) + r.max_new_tokens - 1; }

  // Physical cache row of position t of `seq` (its block table on the GPU).
  int32_t row_of(uint64_t seq, int64_t t) const { return row_in(sched_->blocks().table(seq), t); }
  int32_t row_in(const std::vector<int32_t>& table, int64_t t) const {
    return int32_t(int64_t(table[size_t(t / ec_.block_size)]) * ec_.block_size + t % ec_.block_size);
  }

  // Copies blocks between the GPU caches and the pinned pool, K and V of every layer run, one
  // cudaMemcpyAsync per run of consecutive blocks (on both sides) per layer and tensor, timed with events.
  void copy_blocks(const BlockMapping& m, bool out_to_cpu, StepResult& out) {
    CUDA_CHECK(cudaEventRecord(events_[out_to_cpu ? kSwapOut0 : kSwapIn0], stream_));
    const size_t run_bytes = block_elems_ * sizeof(__half);
    for (size_t i = 0; i < m.size();) {
      size_t n = 1;
      while (i + n < m.size() && m[i + n].first == m[i].first + int32_t(n) && m[i + n].second == m[i].second + int32_t(n)) ++n;
      const int32_t gpu = out_to_cpu ? m[i].first : m[i].second, cpu = out_to_cpu ? m[i].second : m[i].first;
      for (int64_t l = 0; l < cfg_.num_layers; ++l)
        for (int kv = 0; kv < 2; ++kv) {
          __half* dev = (kv ? v_cache_ : k_cache_)[size_t(l)].get() + size_t(gpu) * block_elems_;
          __half* host = host_->p + (size_t(2 * l + kv) * size_t(cpu_blocks_) + size_t(cpu)) * block_elems_;
          if (out_to_cpu)
            CUDA_CHECK(cudaMemcpyAsync(host, dev, n * run_bytes, cudaMemcpyDeviceToHost, stream_));
          else
            CUDA_CHECK(cudaMemcpyAsync(dev, host, n * run_bytes, cudaMemcpyHostToDevice, stream_));
        }
      i += n;
    }
    CUDA_CHECK(cudaEventRecord(events_[out_to_cpu ? kSwapOut1 : kSwapIn1], stream_));
    const int64_t bytes = int64_t(m.size() * run_bytes) * 2 * cfg_.num_layers;
    out.counts[out_to_cpu ? "swap_out_bytes" : "swap_in_bytes"] += bytes;
    out.counts[out_to_cpu ? "swap_out_blocks" : "swap_in_blocks"] += int64_t(m.size());
  }

  // Uploads per-row int32 arrays into aux_ back to back, with the step's other inputs (`with`) in the same staged
  // upload; returns each array's device pointer.
  std::vector<const int32_t*> upload_aux(const std::vector<const std::vector<int32_t>*>& arrays,
                                         std::vector<CudaModel::Upload> with) {
    size_t total = 0;
    for (const auto* a : arrays) total += a->size();
    if (aux_.size() < total) {
      CUDA_CHECK(cudaStreamSynchronize(stream_));  // aux_ is reallocated
      aux_.resize(total);
    }
    std::vector<const int32_t*> ptrs;
    size_t at = 0;
    for (const auto* a : arrays) {
      ptrs.push_back(aux_.get() + at);
      with.push_back({aux_.get() + at, a->data(), a->size() * 4});
      at += a->size();
    }
    model_->upload(with);
    return ptrs;
  }

  void append(DevActs& a, int64_t T, const int32_t* rows, const int32_t* zeros, int64_t l) {
    // The cache as [rows, kv_dim]: physical row ids as slots with max_ctx = 1, position 0.
    cuda::append_kv({.k = a.k.get(),
                     .v = a.v.get(),
                     .slots = rows,
                     .pos = zeros,
                     .T = T,
                     .max_ctx = 1,
                     .kv_dim = int(cfg_.kv_dim()),
                     .k_cache = k_cache_[size_t(l)].get(),
                     .v_cache = v_cache_[size_t(l)].get()},
                    stream_);
  }

  void decode(const std::vector<uint64_t>& ids, StepResult& out) {
    const int64_t t0 = now_ns();
    const int64_t B = int64_t(ids.size());
    std::vector<Seq*> seqs;
    std::vector<const std::vector<int32_t>*> block_tables;  // each looked up once
    int64_t max_blocks = 1;
    for (uint64_t id : ids) {
      seqs.push_back(&seqs_.at(id));
      block_tables.push_back(&sched_->blocks().table(id));
      max_blocks = std::max<int64_t>(max_blocks, int64_t(block_tables.back()->size()));
    }
    std::vector<int32_t> tokens, rows, phys, zeros(size_t(B), 0), lens, tables(size_t(B * max_blocks), 0);
    std::vector<int64_t> pos;
    for (int64_t b = 0; b < B; ++b) {
      const Seq& s = *seqs[size_t(b)];
      const int64_t p = int64_t(s.tokens.size()) - 1;  // the new token's position
      tokens.push_back(s.tokens.back()), pos.push_back(p), rows.push_back(int32_t(b));
      const std::vector<int32_t>& t = *block_tables[size_t(b)];
      phys.push_back(row_in(t, p));
      lens.push_back(int32_t(p + 1));
      std::copy(t.begin(), t.end(), tables.begin() + b * max_blocks);
      out.total_context += p + 1;
    }
    model_->ensure(dec_, B);
    const auto d = upload_aux({&phys, &zeros, &lens, &tables}, {{dec_.tokens.get(), tokens.data(), size_t(B) * 4},
                                                                {dec_.pos.get(), pos.data(), size_t(B) * 8},
                                                                {dec_.rows.get(), rows.data(), size_t(B) * 4}});
    const int64_t ctx = max_blocks * ec_.block_size;
    const size_t ws = cuda::decode_attention_workspace_floats(B, int(cfg_.num_heads), int(cfg_.head_dim), ctx);
    if (workspace_.size() < ws) {
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      workspace_.resize(ws);
    }
    model_->embed(dec_);
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
      model_->attention_input(dec_, int(l), CudaModel::kF32);
      append(dec_, B, d[0], d[1], l);
      cuda::decode_attention({.q = dec_.q.get(),
                              .k_cache = k_cache_[size_t(l)].get(),
                              .v_cache = v_cache_[size_t(l)].get(),
                              .slots = nullptr,
                              .lens = d[2],
                              .B = B,
                              .max_ctx = ctx,
                              .Hq = int(cfg_.num_heads),
                              .Hkv = int(cfg_.num_kv_heads),
                              .D = int(cfg_.head_dim),
                              .workspace = ws ? workspace_.get() : nullptr,
                              .block_tables = d[3],
                              .block_size = int(ec_.block_size),
                              .max_blocks = max_blocks,
                              .out_act = dec_.a16.get(),  // the o-projection's 16-bit input, no cast between
                              .out_dtype = model_->act_dtype()},
                             stream_);
      model_->attention_output_and_mlp(dec_, int(l));
    }
    sample(dec_, seqs, out);
    out.decode_tokens = B;
    out.spans.push_back({"gpu stream 0", "decode step", t0, now_ns() - t0});
  }

  // Prefill over every token each sequence has (its prompt; after a recompute preemption, the prompt and
  // the tokens generated so far): causal attention over the packed batch, K/V stored into its blocks.
  void prefill(const std::vector<uint64_t>& ids, StepResult& out) {
    const int64_t t0 = now_ns();
    std::vector<Seq*> seqs;
    std::vector<int32_t> tokens, phys, starts, last;
    std::vector<int64_t> pos;
    int64_t max_len = 0;
    for (uint64_t id : ids) {
      Seq& s = seqs_.at(id);
      seqs.push_back(&s);
      starts.push_back(int32_t(tokens.size()));
      const int64_t n = int64_t(s.tokens.size());
      max_len = std::max(max_len, n);
      for (int64_t t = 0; t < n; ++t) tokens.push_back(s.tokens[size_t(t)]), pos.push_back(t), phys.push_back(row_of(id, t));
      last.push_back(int32_t(tokens.size() - 1));
      out.total_context += n;
    }
    starts.push_back(int32_t(tokens.size()));
    const int64_t T = int64_t(tokens.size());
    std::vector<int32_t> zeros(size_t(T), 0);
    model_->ensure(pre_, T);
    const auto d = upload_aux({&phys, &zeros}, {{pre_.tokens.get(), tokens.data(), size_t(T) * 4},
                                                {pre_.pos.get(), pos.data(), size_t(T) * 8},
                                                {pre_.starts.get(), starts.data(), starts.size() * 4},
                                                {pre_.rows.get(), last.data(), last.size() * 4}});
    model_->prefill_forward(pre_, int64_t(ids.size()), max_len, [&](int l) { append(pre_, T, d[0], d[1], l); });
    sample(pre_, seqs, out);
    out.prefill_tokens = T;
    out.spans.push_back({"gpu stream 0", "prefill", t0, now_ns() - t0});
  }

  // Samples one token per sequence (rows a.rows) and emits it; the sequence continues with it or with
  // its forced token (teacher forcing).
  void sample(DevActs& a, const std::vector<Seq*>& seqs, StepResult& out) {
    RowDraws draws;
    for (const Seq* s : seqs) draws.add(s->req, s->generated, sampling_);
    std::vector<float> recorded(draws.record.size() * size_t(cfg_.vocab_size));
    std::vector<int32_t> tok(seqs.size());
    model_->sample(a, int64_t(seqs.size()), draws.params, draws.ids, draws.steps, tok.data(), draws.record,
                   recorded.data());
    size_t k = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = *seqs[i];
      s.tokens.push_back(s.req.next_input(s.generated, tok[i]));
      ++s.generated;
      const bool eos = s.req.stop_at_eos && tok[i] == cfg_.eos_token_id;
      out.tokens.push_back({s.req.id, tok[i], s.generated >= s.req.max_new_tokens || eos, {}});
      if (s.req.record_logits) {
        const float* row = &recorded[k++ * size_t(cfg_.vocab_size)];
        out.tokens.back().logits.assign(row, row + cfg_.vocab_size);
      }
    }
  }

  PagedSwapConfig ec_;
  ModelConfig cfg_;
  SamplingParams sampling_;
  std::string device_name_;
  std::unique_ptr<cuda::SmLimitedStreams> streams_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaModel> model_;
  double budget_bytes_ = 0, block_bytes_ = 0;
  int64_t gpu_blocks_ = 0, cpu_blocks_ = 0;
  size_t block_elems_ = 0;  // fp16 elements of one block of one layer's K (or V)
  bool blocks_device_limited_ = false;
  std::vector<DeviceBuffer<__half>> k_cache_, v_cache_;  // per layer [gpu_blocks * block_size, kv_dim]
  std::unique_ptr<PinnedBuffer> host_;                  // the CPU swap pool
  std::optional<PagedScheduler> sched_;
  std::map<uint64_t, Seq> seqs_;
  DeviceBuffer<float> workspace_;
  DeviceBuffer<int32_t> aux_;
  DevActs dec_, pre_;
  std::array<cudaEvent_t, kNumEvents> events_{};
};

}  // namespace

std::unique_ptr<Engine> make_paged_swap_engine(const PagedSwapConfig& c, const EngineContext& ctx) {
  return std::make_unique<PagedSwapEngine>(c, ctx);
}

}  // namespace fd
