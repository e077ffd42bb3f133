// Tensor- and pipeline-parallel cuts of a model at load time (docs/plans/issue14-parallel.md §1, §2).
// T tensor ranks split every layer by heads and by MLP columns (Megatron-LM's cut); P pipeline stages
// split the layer stack into contiguous runs. Rank g = p*T + t holds tensor part t of stage p's layers,
// with its ModelWeights::cfg the shard config (shard_config) and its ModelWeights::shard saying which part
// (WeightShard, weights.h). No communication happens here: the cut only decides who holds which bytes.
//
// Rank t's part, HF layout [out, in] (Megatron's "columns" are HF rows):
//   wq, bq / wk, bk, wv, bv           rows [t*Hq/T*D, ...) / [t*Hkv/T*D, ...): whole heads, GQA groups kept
//   w_gate, b_gate, w_up, b_up (fc1)  rows [t*I/T, (t+1)*I/T)
//   wo / w_down (fc2)                 columns [t*Hq/T*D, ...) / [t*I/T, ...): row-parallel, summed by the reduce
//   bo / b_down                       tp_rank 0 only; EMPTY on the other ranks, so a rank's partial sum
//                                     adds the bias exactly once (every S-Part adds a bias only if present)
//   layer norms                       replicated on every rank of the stage
//   embed                             first stage: vocabulary rows [vocab_begin, vocab_end)
//   pos_embed, project_in             first stage, whole (OPT)
//   lm_head (or tied embed)           last stage: the same vocabulary rows, stored in lm_head except when
//                                     the stage is also the first and the embedding is tied (then embed
//                                     holds them, lm_head stays empty: lm_head_matrix() is right either way)
//   final_norm, project_out           last stage, whole
// Vocabulary rows: Vp = ceil(V/T), rank t holds [t*Vp, min((t+1)*Vp, V)); every rank must hold >= 1 row.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "fastdecode/model/model_config.h"
#include "fastdecode/model/weights.h"

namespace fd {

// fd::ConfigError naming the model and `engine.parallel.tensor` unless T >= 1 divides num_heads,
// num_kv_heads (GQA KV heads are not replicated across ranks: that would store a head's KV twice) and
// intermediate_size (OPT: ffn_dim), and every rank gets at least one vocabulary row.
void check_tensor_parallel(const ModelConfig& c, int64_t T);

// The global layers [begin, end) of each of P stages over L layers. Empty `counts`: floor(L/P) each,
// the first L % P stages one more. Else `counts` (engine.parallel.layers) must have P entries, each
// >= 1, summing to L. fd::ConfigError naming engine.parallel.pipeline / engine.parallel.layers for
// P < 1, L < P, or bad counts.
std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t L, int64_t P, const std::vector<int64_t>& counts);

// The config one rank runs: num_heads/T, num_kv_heads/T, intermediate_size/T, num_layers = n_layers.
// Everything else is the full model's: vocab_size (the logits are gathered to [n, V]), hidden_size,
// head_dim (so q_dim() = num_heads/T * head_dim), full_num_layers, name, hf. Calls check_tensor_parallel.
// A shard config describes one rank's arithmetic; do not pass it to model_tensor_specs or
// load_model_weights (its layer names would be local, its num_params() and kv_bytes_per_token() count
// only its heads with the whole vocabulary and the full depth).
ModelConfig shard_config(const ModelConfig& c, int64_t T, int64_t n_layers);

// Loads every rank's part in one walk over model_tensor_specs(c): each source tensor is read once and
// sliced into every rank that holds part of it. Returns T * stages.size() ModelWeights, rank g = p*T + t.
// `stages` must be contiguous [begin, end) runs covering [0, c.num_layers) (as stage_layers returns).
// check_tensor_source(c, src) runs first, so a bad checkpoint fails before any read. T = 1 with one
// stage gives load_model_weights' cfg and tensors exactly (shard: [0, L) layers, [0, V) vocabulary).
std::vector<ModelWeights> load_model_shards(const ModelConfig& c, TensorSource& src, int64_t T,
                                            const std::vector<std::pair<int64_t, int64_t>>& stages);

// Rank g's part alone (for a rank that loads for itself): the same bytes as load_model_shards(...)[g],
// and tensors no part of rank g needs (other stages' layers, the embedding on a middle stage) are never
// read from the source.
ModelWeights load_model_shard(const ModelConfig& c, TensorSource& src, int64_t T,
                              const std::vector<std::pair<int64_t, int64_t>>& stages, int64_t rank);

}  // namespace fd
