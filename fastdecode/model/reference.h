// The fp32 CPU reference model: the golden implementation every engine is tested against.
// Plain loops in the spirit of llm.c's CPU reference; correctness and readability over speed.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "fastdecode/model/weights.h"

namespace fd {

// One token to run: it belongs to sequence `seq` and goes at the next position of that sequence.
struct RefToken {
  int64_t seq = 0;
  int32_t token = 0;
  bool want_logits = false;  // compute the LM head for this token
};

class ReferenceModel {
 public:
  explicit ReferenceModel(ModelWeights weights);

  const ModelConfig& config() const { return w_.cfg; }
  const ModelWeights& weights() const { return w_; }
  // Rounds K/V through this dtype as they enter the cache (fp32 = exact, the default). With fp16 the
  // reference sees the same K/V values as an engine storing an fp16 KV-cache.
  void set_kv_dtype(DType t) { kv_dtype_ = t; }
  // A block-quantized KV-cache (an R-worker's int8 / int4 store): each time `block_tokens` more tokens of
  // a sequence's cache at a layer are complete, `codec` replaces that block's K and V ([block_tokens,
  // kv_dim] each, already rounded through the KV dtype) in place by the values the store holds for it.
  // When, as in FastDecode: a decoding token (its sequence's only token in a forward, after the prompt)
  // sees the block it completes replaced before it attends (the worker quantizes on append, then
  // attends); a prompt attends over the unreplaced values (the S-Part computes prefill attention over
  // the fp16 K/V it then ships) and its full blocks are replaced after. An empty codec turns this off.
  using KVBlockCodec = std::function<void(float* k, float* v, int64_t block_tokens, int64_t kv_dim)>;
  void set_kv_block_codec(int64_t block_tokens, KVBlockCodec codec);

  // Creates an empty sequence (KV-cache) and returns its id; ids are never reused.
  int64_t add_sequence();
  void free_sequence(int64_t seq);
  // Number of tokens in the sequence's KV-cache.
  int64_t sequence_length(int64_t seq) const;
  int64_t num_sequences() const;
  // Sum of cached tokens over all live sequences.
  int64_t total_context() const;

  // Runs a batch: each token's K/V is appended to its sequence's cache at the next position and the
  // token attends causally to its sequence's cache. A sequence may appear several times (a prompt);
  // its tokens are taken in order. Prefill and decode are the same call.
  // Returns logits [n_wanted, vocab] for the tokens with want_logits, in batch order.
  std::vector<float> forward(const std::vector<RefToken>& batch);

 private:
  struct Sequence {
    bool live = false;
    int64_t length = 0;
    std::vector<std::vector<float>> k, v;  // per layer: [length, kv_dim]
    std::vector<int64_t> coded;            // per layer: tokens replaced by the block codec
  };
  void code_full_blocks(Sequence& s, int64_t layer);
  Sequence& seq_at(int64_t seq);
  const Sequence& seq_at(int64_t seq) const;

  ModelWeights w_;
  DType kv_dtype_ = DType::F32;
  int64_t codec_block_ = 0;
  KVBlockCodec codec_;
  std::vector<Sequence> seqs_;
};

// y[T, out] = x[T, in] · W[out, in]^T + bias[out] (bias may be null). The stages below take the GEMM to
// use, so the FastDecode CPU S-Part runs them with OpenBLAS and the reference with ref_linear.
using LinearFn = void (*)(const float* x, int64_t T, int64_t in, const float* W, const float* bias, int64_t out,
                          float* y);
void ref_linear(const float* x, int64_t T, int64_t in, const float* W, const float* bias, int64_t out, float* y);

// The stages of the forward pass, named after the model; the FastDecode S-Part runs the same stages
// with attention done elsewhere (on R-workers). x: residual stream [T, H]; pos: [T] positions.
void ref_embed(const ModelWeights& w, const int32_t* tokens, const int64_t* pos, int64_t T, float* x);
// norm -> q, k, v projections (+ biases) -> RoPE (Llama: cfg.rope). q: [T, q_dim], k, v: [T, kv_dim].
void ref_attention_input(const ModelConfig& c, const LayerWeights& L, const float* x, const int64_t* pos, int64_t T,
                         float* q, float* k, float* v, LinearFn linear = ref_linear);
// How a residual branch's output y [n] (the o projection's, the MLP's down projection's) joins the residual
// stream x [n]. The default (null) is x += y. A tensor-parallel rank holds only its heads' / its intermediate
// slice's share of y, so its hook sums the shares over the ranks (rank 0: x += y, the others: x = y, then an
// all-reduce of x), after which every rank holds the same x.
using ResidualAdd = std::function<void(float* x, const float* y, int64_t n)>;
// x += att W_o^T (+ b); x += MLP(norm(x)). att: [T, q_dim]. `add`: see ResidualAdd.
void ref_attention_output_and_mlp(const ModelConfig& c, const LayerWeights& L, const float* att, int64_t T, float* x,
                                  LinearFn linear = ref_linear, const ResidualAdd* add = nullptr);
// The LM head's input: final norm (Llama; pre-LN OPT), then OPT's project_out. hn: [n, embed_dim].
void ref_final_hidden(const ModelWeights& w, const float* x, int64_t n, float* hn, LinearFn linear = ref_linear);
// final norm -> LM head: logits [n, V] over the rows the weights hold (the whole vocabulary; a
// tensor-parallel shard: its vocabulary slice).
void ref_lm_head(const ModelWeights& w, const float* x, int64_t n, float* logits, LinearFn linear = ref_linear);
// One query token over n cached tokens (k, v: [n, kv_dim]); out: [q_dim]. GQA by head groups.
void ref_decode_attention(const float* q, const float* k, const float* v, int64_t n, const ModelConfig& c, float* out);

// Building blocks, exposed for tests. x, out: [T, n].
void ref_rmsnorm(const float* x, int64_t T, int64_t n, const float* w, double eps, float* out);
void ref_layernorm(const float* x, int64_t T, int64_t n, const float* w, const float* b, double eps, float* out);
// HF "rotate_half" RoPE on one head vector of size d at position pos: pairs (i, i + d/2) rotated by
// pos * inv_freq[i] (rope_inv_freq), cos and sin multiplied by `scaling` (rope_attention_scaling).
void ref_rope(float* vec, int64_t d, int64_t pos, const float* inv_freq, float scaling);
// Default RoPE with base theta.
void ref_rope(float* vec, int64_t d, int64_t pos, double theta);

}  // namespace fd
