// The vanilla engine on LibTorch (vanilla_engine.h): the model as HuggingFace's eager modeling code runs it
// (modeling_llama / modeling_opt, eager attention), driven as generate() drives it. The math mirrors
// fastdecode/model/reference.cpp stage by stage; RoPE uses the project's rope_inv_freq /
// rope_attention_scaling, sampling the project's sample_token on fp32 host logits.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <set>

#include "baselines/vanilla/vanilla_engine.h"
#include "baselines/gpu_only/gpu_only_engine.h"  // gpu_only_slots: the memory rule of a static batch
#include "kernels/cuda/device_info.h"
#include "fastdecode/core/clock.h"

namespace fd {

VanillaBuild vanilla_build() {
  VanillaBuild b;
  b.libtorch = true;
  b.torch_version = TORCH_VERSION;
  b.cuda = torch::cuda::is_available();
  return b;
}

namespace {

using torch::Tensor;
namespace F = torch::nn::functional;

struct TorchLayer {
  Tensor attn_norm_w, attn_norm_b, wq, wk, wv, wo, bq, bk, bv, bo;
  Tensor mlp_norm_w, mlp_norm_b, w_gate, b_gate, w_up, b_up, w_down, b_down;
};

// One static batch: rows in request order, each row's state; per layer the K and V caches
// [B, kv_heads, T, D], grown by torch::cat every step; `valid` [B, T] marks real (not left-pad) positions.
struct Batch {
  struct Row {
    Request req;
    int64_t length = 0;     // unmasked tokens in the cache: prompt + one per decode step (finished rows too)
    int64_t generated = 0;  // tokens emitted
    int32_t next = 0;       // the token fed at the next step
    bool finished = false;
  };
  std::vector<Row> rows;
  std::vector<Tensor> k, v;
  Tensor valid;  // bool, on the host
};

class VanillaEngine : public Engine {
 public:
  VanillaEngine(const VanillaConfig& c, const EngineContext& ctx, torch::Device device, torch::ScalarType dtype)
      : cfg_(c), model_(ctx.model), sampling_(ctx.sampling), device_(device), dtype_(dtype) {
    const ModelWeights w = load_model_weights(ctx.model, ctx.weights);
    auto t = [&](const std::vector<float>& v, std::vector<int64_t> shape) -> Tensor {
      if (v.empty()) return {};  // an absent bias
      const Tensor host = torch::from_blob(const_cast<float*>(v.data()), shape, torch::kFloat32);
      return host.to(device_, dtype_, /*non_blocking=*/false, /*copy=*/true);
    };
    const int64_t H = model_.hidden_size, I = model_.intermediate_size, qd = model_.q_dim(), kvd = model_.kv_dim(),
                  P = model_.embed_dim(), V = model_.vocab_size;
    embed_ = t(w.embed, {V, P});
    lm_head_ = w.lm_head.empty() ? embed_ : t(w.lm_head, {V, P});  // tied head: the same tensor
    if (model_.arch == Arch::OPT) pos_embed_ = t(w.pos_embed, {int64_t(w.pos_embed.size()) / H, H});
    if (model_.has_projections()) project_in_ = t(w.project_in, {H, P}), project_out_ = t(w.project_out, {P, H});
    if (model_.has_final_norm()) final_norm_w_ = t(w.final_norm_w, {H}), final_norm_b_ = t(w.final_norm_b, {H});
    for (const LayerWeights& L : w.layers) {
      TorchLayer T;
      T.attn_norm_w = t(L.attn_norm_w, {H}), T.attn_norm_b = t(L.attn_norm_b, {H});
      T.wq = t(L.wq, {qd, H}), T.wk = t(L.wk, {kvd, H}), T.wv = t(L.wv, {kvd, H}), T.wo = t(L.wo, {H, qd});
      T.bq = t(L.bq, {qd}), T.bk = t(L.bk, {kvd}), T.bv = t(L.bv, {kvd}), T.bo = t(L.bo, {H});
      T.mlp_norm_w = t(L.mlp_norm_w, {H}), T.mlp_norm_b = t(L.mlp_norm_b, {H});
      T.w_gate = t(L.w_gate, {I, H}), T.b_gate = t(L.b_gate, {I});
      T.w_up = t(L.w_up, {I, H}), T.b_up = t(L.b_up, {I});
      T.w_down = t(L.w_down, {H, I}), T.b_down = t(L.b_down, {H});
      layers_.push_back(std::move(T));
    }
    if (model_.arch == Arch::Llama) {
      const std::vector<float> inv = rope_inv_freq(model_);
      inv_freq_ = torch::from_blob(const_cast<float*>(inv.data()), {int64_t(inv.size())}, torch::kFloat32)
                      .to(device_, torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);  // `inv` goes away
      rope_scaling_ = rope_attention_scaling(model_);
    }
    // The pad token: HF pads with pad_token_id (Llama checkpoints usually set it to eos). Its value never
    // reaches a real row (masked keys, dropped outputs), so any in-vocabulary id does.
    pad_token_ = model_.eos_token_id >= 0 && model_.eos_token_id < V ? int32_t(model_.eos_token_id) : 0;
  }

  std::string name() const override { return "vanilla"; }
  void add_note(std::string n) { notes_.push_back(std::move(n)); }

  json info() const override {
    return {{"device", device_.is_cuda() ? "cuda" : "cpu"},
            {"dtype", dtype_ == torch::kFloat16 ? "fp16" : "fp32"},
            {"torch_version", TORCH_VERSION},
            {"torch_threads", int64_t(at::get_num_threads())},
            {"batch_size", cfg_.batch_size},
            {"memory_budget_gb", budget_bytes_ / 1e9},
            {"memory_bound", budget_bytes_ > 0 ? "a static batch holds at most the sequences the GPU-only rule fits "
                                                 "(full-depth weights and KV) at its longest prompt + generation"
                                               : "none (cpu)"},
            {"batching", "static: left-padded prompts prefilled together, decoded until every row finished"}};
  }

  // The batch GPU memory allows for sequences of `len` positions: the GPU-only engine's rule (full-depth fp16
  // weights, 1 GiB of workspaces, full-depth KV of every position of every row and one decode row's
  // activations), which a static batch meets at its longest prompt + longest generation (left padding makes
  // every row that long). No bound on the CPU.
  int64_t memory_rows(int64_t len) const {
    return budget_bytes_ > 0 ? gpu_only_slots(model_, budget_bytes_, len) : std::numeric_limits<int64_t>::max();
  }
  void set_memory_budget(double bytes) { budget_bytes_ = bytes; }

  EngineCapacity capacity(int64_t, int64_t max_len) const override {
    EngineCapacity c;
    c.slots = std::min(cfg_.batch_size, memory_rows(max_len));
    c.note = "vanilla: static batches of up to " + std::to_string(cfg_.batch_size) + " requests" +
             (budget_bytes_ > 0 ? ", and of at most " + std::to_string(memory_rows(max_len)) + " sequences of " +
                                      std::to_string(max_len) + " positions in " + std::to_string(budget_bytes_ / 1e9) +
                                      " GB at full depth"
                                : "; KV memory not bounded on the cpu");
    if (c.slots < 1)
      c.error = "vanilla: " + std::to_string(budget_bytes_ / 1e9) + " GB of GPU memory hold the full-depth weights but not one sequence of " +
                std::to_string(max_len) + " positions";
    return c;
  }

  void add(const std::vector<Request>& requests) override {
    std::set<uint64_t> ids;
    for (const Request& r : queued_) ids.insert(r.id);
    for (const Batch::Row& r : batch_.rows) ids.insert(r.req.id);
    for (const Request& r : requests) {
      validate_request(r, model_);
      if (!ids.insert(r.id).second) FD_THROW("request " << r.id << " is already queued or running");
    }
    queued_.insert(queued_.end(), requests.begin(), requests.end());
  }

  bool done() const override { return queued_.empty() && batch_.rows.empty(); }

  void shutdown() override {
    queued_.clear();
    batch_ = Batch{};
  }

  StepResult step() override {
    c10::InferenceMode guard;
    StepResult out;
    const int64_t t0 = now_ns();
    if (batch_.rows.empty()) {
      if (queued_.empty()) return out;
      prefill(out);
      out.spans.push_back({"vanilla", "prefill", t0, now_ns() - t0});
    } else {
      decode(out);
      out.spans.push_back({"vanilla", "decode", t0, now_ns() - t0});
    }
    // The batch ends when every row has finished (generate()'s stopping rule for a batch).
    if (std::all_of(batch_.rows.begin(), batch_.rows.end(), [](const Batch::Row& r) { return r.finished; }))
      batch_ = Batch{};
    return out;
  }

 private:
  // Takes up to batch_size queued requests and runs their left-padded prompts at once.
  void prefill(StepResult& out) {
    batch_ = Batch{};
    int64_t longest_prompt = 0, longest_gen = 0;
    while (!queued_.empty() && int64_t(batch_.rows.size()) < cfg_.batch_size) {
      const Request& next = queued_.front();
      const int64_t p = std::max(longest_prompt, int64_t(next.prompt.size())), g = std::max(longest_gen, next.max_new_tokens);
      if (int64_t(batch_.rows.size()) + 1 > memory_rows(p + g)) {
        if (batch_.rows.empty())
          FD_THROW("vanilla: request " << next.id << " (" << p + g << " positions) does not fit the GPU memory budget of "
                                       << budget_bytes_ / 1e9 << " GB at full depth");
        break;  // the batch is as large as memory allows
      }
      longest_prompt = p, longest_gen = g;
      batch_.rows.push_back({std::move(queued_.front())});
      queued_.pop_front();
    }
    const int64_t B = int64_t(batch_.rows.size());
    int64_t S = 0;
    for (const auto& r : batch_.rows) S = std::max(S, int64_t(r.req.prompt.size()));
    // HF's left padding: pads first; position ids = cumsum(mask) - 1, pads at position 1.
    std::vector<int64_t> tok(size_t(B * S), pad_token_), pos(size_t(B * S), 1);
    batch_.valid = torch::zeros({B, S}, torch::kBool);
    auto valid = batch_.valid.accessor<bool, 2>();
    for (int64_t b = 0; b < B; ++b) {
      Batch::Row& r = batch_.rows[size_t(b)];
      const int64_t n = int64_t(r.req.prompt.size()), pad = S - n;
      for (int64_t i = 0; i < n; ++i) {
        tok[size_t(b * S + pad + i)] = r.req.prompt[size_t(i)];
        pos[size_t(b * S + pad + i)] = i;
        valid[b][pad + i] = true;
      }
      r.length = n;
      out.prefill_tokens += n;
      out.total_context += n;
    }
    // Query i may see key j when j <= i (causal) and j is a real token.
    const Tensor causal = torch::ones({S, S}, torch::kBool).tril();
    const Tensor allowed = causal.unsqueeze(0) & batch_.valid.unsqueeze(1);  // [B, S, S]
    batch_.k.assign(layers_.size(), Tensor());
    batch_.v.assign(layers_.size(), Tensor());
    const Tensor logits = forward(host_long(tok, B, S), host_long(pos, B, S), allowed.logical_not().unsqueeze(1));
    emit(logits, out);
  }

  // One token for every row of the batch; finished rows feed the pad token and their tokens are dropped.
  void decode(StepResult& out) {
    const int64_t B = int64_t(batch_.rows.size());
    std::vector<int64_t> tok(static_cast<size_t>(B)), pos(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      Batch::Row& r = batch_.rows[size_t(b)];
      tok[size_t(b)] = r.finished ? pad_token_ : r.next;
      // A finished row may run past the model's positions while the longest row goes on (its output is
      // dropped): clamp it so OPT's learned table is never indexed beyond its end.
      pos[size_t(b)] = std::min(r.length, model_.position_limit() - 1);
      ++r.length;
      out.total_context += r.length;
    }
    out.decode_tokens = B;  // every row computes, finished ones too
    // generate() extends the attention mask with a 1 for every row, finished or not.
    batch_.valid = torch::cat({batch_.valid, torch::ones({B, 1}, torch::kBool)}, 1);
    const Tensor mask = batch_.valid.logical_not().view({B, 1, 1, -1});
    emit(forward(host_long(tok, B, 1), host_long(pos, B, 1), mask), out);
  }

  Tensor host_long(const std::vector<int64_t>& v, int64_t B, int64_t S) const {
    return torch::from_blob(const_cast<int64_t*>(v.data()), {B, S}, torch::kInt64).to(device_, /*non_blocking=*/false,
                                                                                        /*copy=*/true);
  }

  // Samples every unfinished row from its last-position logits (fp32 on the host), with its request's
  // sampling and (id, step): the draws the reference engine makes.
  void emit(const Tensor& logits, StepResult& out) {
    const Tensor host = logits.to(torch::kCPU, torch::kFloat32).contiguous();
    const int64_t V = model_.vocab_size;
    const float* base = host.data_ptr<float>();
    RowDraws draws;
    std::vector<Batch::Row*> live;
    std::vector<int64_t> row_of;
    for (size_t b = 0; b < batch_.rows.size(); ++b) {
      Batch::Row& r = batch_.rows[b];
      if (r.finished) continue;
      draws.add(r.req, r.generated, sampling_);
      live.push_back(&r);
      row_of.push_back(int64_t(b));
    }
    size_t next_record = 0;
    for (size_t i = 0; i < live.size(); ++i) {
      Batch::Row& r = *live[i];
      const float* row = base + row_of[i] * V;
      const int32_t tok = sample_token(row, V, draws.params[i], draws.ids[i], draws.steps[i]);
      r.next = r.req.next_input(r.generated, tok);  // teacher forcing: the forced token is fed
      ++r.generated;
      const bool eos = r.req.stop_at_eos && tok == model_.eos_token_id;
      r.finished = r.generated >= r.req.max_new_tokens || eos;
      out.tokens.push_back({r.req.id, tok, r.finished, {}});
      if (next_record < draws.record.size() && draws.record[next_record] == int32_t(i)) {
        out.tokens.back().logits.assign(row, row + V);
        ++next_record;
      }
    }
  }

  Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) const {
    return b.defined() ? F::linear(x, w, b) : F::linear(x, w);
  }

  // RMSNorm as HF's LlamaRMSNorm (statistics in fp32, weight applied in the compute dtype) or LayerNorm.
  Tensor norm(const Tensor& x, const Tensor& w, const Tensor& b) const {
    if (model_.arch == Arch::Llama) {
      const Tensor x32 = x.to(torch::kFloat32);
      const Tensor r = torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + model_.norm_eps);
      return w * (x32 * r).to(dtype_);
    }
    return torch::layer_norm(x, {model_.hidden_size}, w, b, model_.norm_eps);
  }

  // HF's rotate_half RoPE on x [B, heads, S, D] with cos, sin [B, 1, S, D].
  static Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
    const int64_t half = x.size(-1) / 2;
    const Tensor rot = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
    return x * cos + rot * sin;
  }

  // Runs tokens [B, S] at positions [B, S] through the model, appending their K/V to the batch's caches;
  // masked [B, 1, S, T] is true where a query may not see a key. Returns the last position's logits [B, V].
  Tensor forward(const Tensor& tokens, const Tensor& pos, const Tensor& masked_host) {
    const ModelConfig& c = model_;
    const int64_t B = tokens.size(0), S = tokens.size(1), D = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
    const Tensor masked = masked_host.to(device_);
    Tensor x = torch::embedding(embed_, tokens);
    if (c.has_projections()) x = F::linear(x, project_in_);  // OPT: project_in [H, P]
    Tensor cos, sin;
    if (c.arch == Arch::OPT) {
      x = x + torch::embedding(pos_embed_, pos + 2);  // OPTLearnedPositionalEmbedding's offset 2
    } else {
      // HF: freqs = pos (fp32) x inv_freq in fp32; cos and sin times the attention scaling, then to dtype.
      const Tensor freqs = pos.to(torch::kFloat32).unsqueeze(-1) * inv_freq_.view({1, 1, -1});
      const Tensor emb = torch::cat({freqs, freqs}, -1);
      cos = (emb.cos() * rope_scaling_).to(dtype_).unsqueeze(1);
      sin = (emb.sin() * rope_scaling_).to(dtype_).unsqueeze(1);
    }
    const double scale = 1.0 / std::sqrt(double(D));
    const bool pre = c.pre_norm();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const TorchLayer& L = layers_[l];
      const Tensor h = pre ? norm(x, L.attn_norm_w, L.attn_norm_b) : x;
      Tensor q = linear(h, L.wq, L.bq).view({B, S, nh, D}).transpose(1, 2);
      Tensor k = linear(h, L.wk, L.bk).view({B, S, nkv, D}).transpose(1, 2);
      Tensor v = linear(h, L.wv, L.bv).view({B, S, nkv, D}).transpose(1, 2);
      if (c.arch == Arch::Llama) q = rope(q, cos, sin), k = rope(k, cos, sin);
      batch_.k[l] = batch_.k[l].defined() ? torch::cat({batch_.k[l], k}, 2) : k;
      batch_.v[l] = batch_.v[l].defined() ? torch::cat({batch_.v[l], v}, 2) : v;
      // GQA: each KV head serves nh / nkv query heads (HF's repeat_kv).
      const Tensor kk = nh == nkv ? batch_.k[l] : batch_.k[l].repeat_interleave(nh / nkv, 1);
      const Tensor vv = nh == nkv ? batch_.v[l] : batch_.v[l].repeat_interleave(nh / nkv, 1);
      // Eager attention: scores in the compute dtype, softmax in fp32. A masked score gets the lowest
      // finite fp32 (HF: the dtype's min), so a left-pad query row that sees nothing stays finite.
      const Tensor scores = (torch::matmul(q, kk.transpose(2, 3)) * scale).to(torch::kFloat32);
      const Tensor p = scores.masked_fill(masked, std::numeric_limits<float>::lowest()).softmax(-1).to(dtype_);
      const Tensor att = torch::matmul(p, vv).transpose(1, 2).reshape({B, S, nh * D});
      x = x + linear(att, L.wo, L.bo);
      if (!pre) x = norm(x, L.attn_norm_w, L.attn_norm_b);  // post-LN OPT: LN after the residual add
      const Tensor m = pre ? norm(x, L.mlp_norm_w, L.mlp_norm_b) : x;
      Tensor inner;
      if (c.arch == Arch::Llama) inner = torch::silu(linear(m, L.w_gate, L.b_gate)) * linear(m, L.w_up, L.b_up);
      else inner = torch::relu(linear(m, L.w_up, L.b_up));
      x = x + linear(inner, L.w_down, L.b_down);
      if (!pre) x = norm(x, L.mlp_norm_w, L.mlp_norm_b);
    }
    Tensor last = x.select(1, S - 1);  // [B, H]: every row's last position is a real token (left padding)
    if (c.has_final_norm()) last = norm(last, final_norm_w_, final_norm_b_);
    if (c.has_projections()) last = F::linear(last, project_out_);
    return F::linear(last, lm_head_);
  }

  VanillaConfig cfg_;
  ModelConfig model_;
  SamplingParams sampling_;
  torch::Device device_;
  torch::ScalarType dtype_;
  Tensor embed_, lm_head_, pos_embed_, project_in_, project_out_, final_norm_w_, final_norm_b_, inv_freq_;
  float rope_scaling_ = 1.0f;
  std::vector<TorchLayer> layers_;
  int32_t pad_token_ = 0;
  double budget_bytes_ = 0;  // GPU memory budget (bytes) bounding a static batch; 0 = none (cpu)
  std::deque<Request> queued_;
  Batch batch_;
};

}  // namespace

std::unique_ptr<Engine> make_vanilla_engine(const VanillaConfig& c, const EngineContext& ctx) {
  const bool cuda = torch::cuda::is_available();
  if (c.device == "cuda" && !cuda)
    FD_THROW_BAD_INPUT("engine.device cuda: LibTorch " << TORCH_VERSION << " sees no CUDA device"
                                                       << " (a CPU-only LibTorch, or no GPU here); use device cpu or auto");
  const bool on_cuda = c.device == "cuda" || (c.device == "auto" && cuda);
  if (!on_cuda && c.dtype == "fp16")
    FD_THROW_BAD_INPUT("engine.dtype fp16 needs CUDA, and the vanilla engine runs on the cpu here (fp32 only)");
  const torch::ScalarType dtype = (on_cuda && c.dtype != "fp32") ? torch::kFloat16 : torch::kFloat32;
  auto e = std::make_unique<VanillaEngine>(c, ctx, on_cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU),
                                           dtype);
  if (on_cuda) {
    const auto devs = cuda_devices();
    e->set_memory_budget(ctx.hardware.gpu_memory_gb > 0 ? ctx.hardware.gpu_memory_gb * 1e9
                                                        : (devs.empty() ? 0.0 : double(devs[0].memory_bytes)));
  }
  if (ctx.hardware.gpu_sm_count > 0)
    e->add_note("hardware.gpu.sm_count is not applied: the vanilla engine's LibTorch kernels run on all SMs "
                "(its batch is bounded by hardware.gpu.memory_gb at full depth, as the GPU-only engine's is)");
  if (!on_cuda && ctx.hardware.gpu_memory_gb > 0)
    e->add_note("hardware.gpu.memory_gb is not applied: the vanilla engine runs on the cpu");
  return e;
}

}  // namespace fd
