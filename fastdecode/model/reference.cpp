#include "fastdecode/model/reference.h"

#include <algorithm>
#include <cmath>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"

namespace fd {

// y[t, o] = sum_i x[t, i] * W[o, i] + bias[o]. Parallel over output rows so each row of W is read once
// per call whatever T is (decode batches are weight-bandwidth bound).
void ref_linear(const float* x, int64_t T, int64_t in, const float* W, const float* bias, int64_t out, float* y) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const float* wr = W + o * in;
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = x + t * in;
      // Eight partial sums: lets the compiler vectorise without reordering a single sum (-ffast-math).
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= in; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += xr[i + j] * wr[i + j];
      float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      for (; i < in; ++i) s += xr[i] * wr[i];
      y[t * out + o] = s + (bias ? bias[o] : 0.0f);
    }
  }
}

void ref_rmsnorm(const float* x, int64_t T, int64_t n, const float* w, double eps, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float r = float(1.0 / std::sqrt(ss / double(n) + eps));
    for (int64_t i = 0; i < n; ++i) out[t * n + i] = w[i] * (xr[i] * r);
  }
}

void ref_layernorm(const float* x, int64_t T, int64_t n, const float* w, const float* b, double eps, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * n;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += xr[i];
    mean /= double(n);
    for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(n);  // biased variance, as torch.nn.LayerNorm
    const double r = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < n; ++i) out[t * n + i] = float((xr[i] - mean) * r) * w[i] + b[i];
  }
}

void ref_rope(float* vec, int64_t d, int64_t pos, const float* inv_freq, float scaling) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    // HF: angle = pos * inv_freq in fp32; cos and sin times the attention scaling (yarn), in fp32.
    const float angle = float(pos) * inv_freq[i];
    const float c = std::cos(angle) * scaling, s = std::sin(angle) * scaling;
    const float a = vec[i], b = vec[i + half];
    vec[i] = a * c - b * s;
    vec[i + half] = b * c + a * s;
  }
}

void ref_rope(float* vec, int64_t d, int64_t pos, double theta) {
  ModelConfig c;
  c.head_dim = d;
  c.rope.theta = theta;
  ref_rope(vec, d, pos, rope_inv_freq(c).data(), 1.0f);
}

ReferenceModel::ReferenceModel(ModelWeights weights) : w_(std::move(weights)) {}

int64_t ReferenceModel::add_sequence() {
  Sequence s;
  s.live = true;
  s.k.resize(size_t(w_.cfg.num_layers));
  s.v.resize(size_t(w_.cfg.num_layers));
  s.coded.assign(size_t(w_.cfg.num_layers), 0);
  seqs_.push_back(std::move(s));
  return int64_t(seqs_.size()) - 1;
}

void ReferenceModel::set_kv_block_codec(int64_t block_tokens, KVBlockCodec codec) {
  FD_CHECK(!codec || block_tokens > 0, "KV block codec needs a block size > 0, got " << block_tokens);
  FD_CHECK(total_context() == 0, "set the KV block codec before any sequence holds tokens");
  codec_block_ = codec ? block_tokens : 0;
  codec_ = std::move(codec);
}

void ReferenceModel::code_full_blocks(Sequence& s, int64_t layer) {
  if (!codec_) return;
  const int64_t kvd = w_.cfg.kv_dim(), len = int64_t(s.k[size_t(layer)].size()) / kvd;
  int64_t& done = s.coded[size_t(layer)];
  for (; done + codec_block_ <= len; done += codec_block_)
    codec_(s.k[size_t(layer)].data() + done * kvd, s.v[size_t(layer)].data() + done * kvd, codec_block_, kvd);
}

ReferenceModel::Sequence& ReferenceModel::seq_at(int64_t seq) {
  FD_CHECK(seq >= 0 && seq < int64_t(seqs_.size()) && seqs_[size_t(seq)].live, "no live sequence " << seq);
  return seqs_[size_t(seq)];
}
const ReferenceModel::Sequence& ReferenceModel::seq_at(int64_t seq) const {
  FD_CHECK(seq >= 0 && seq < int64_t(seqs_.size()) && seqs_[size_t(seq)].live, "no live sequence " << seq);
  return seqs_[size_t(seq)];
}

void ReferenceModel::free_sequence(int64_t seq) { seq_at(seq) = Sequence{}; }
int64_t ReferenceModel::sequence_length(int64_t seq) const { return seq_at(seq).length; }

int64_t ReferenceModel::num_sequences() const {
  return std::count_if(seqs_.begin(), seqs_.end(), [](const Sequence& s) { return s.live; });
}

int64_t ReferenceModel::total_context() const {
  int64_t n = 0;
  for (const auto& s : seqs_) n += s.live ? s.length : 0;
  return n;
}

// ---- Stages of a decoder layer, named after the model (shared with the FastDecode S-Part) ----

void ref_embed(const ModelWeights& w, const int32_t* tokens, const int64_t* pos, int64_t T, float* x) {
  const int64_t H = w.cfg.hidden_size, P = w.cfg.embed_dim();
  for (int64_t t = 0; t < T; ++t) {
    const float* e = w.embed.data() + int64_t(tokens[t]) * P;
    if (w.cfg.has_projections()) {  // OPT: x = project_in(embed) [H] from the [P] embedding
      ref_linear(e, 1, P, w.project_in.data(), nullptr, H, x + t * H);
    } else {
      for (int64_t i = 0; i < H; ++i) x[t * H + i] = e[i];
    }
    if (w.cfg.arch == Arch::OPT) {  // learned positions, offset 2 as in HF's OPTLearnedPositionalEmbedding
      const float* p = w.pos_embed.data() + (pos[t] + 2) * H;
      for (int64_t i = 0; i < H; ++i) x[t * H + i] += p[i];
    }
  }
}

static void layer_norm_of(const ModelConfig& c, const std::vector<float>& wt, const std::vector<float>& b,
                          const float* in, int64_t T, float* out) {
  if (c.arch == Arch::Llama) ref_rmsnorm(in, T, c.hidden_size, wt.data(), c.norm_eps, out);
  else ref_layernorm(in, T, c.hidden_size, wt.data(), b.data(), c.norm_eps, out);
}

static const float* bias_of(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

void ref_attention_input(const ModelConfig& c, const LayerWeights& L, const float* x, const int64_t* pos, int64_t T,
                         float* q, float* k, float* v, LinearFn linear) {
  const int64_t H = c.hidden_size, D = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim();
  std::vector<float> h;
  const float* in = x;  // post-LayerNorm OPT: the stream is already normalized
  if (c.pre_norm()) {
    h.resize(size_t(T * H));
    layer_norm_of(c, L.attn_norm_w, L.attn_norm_b, x, T, h.data());
    in = h.data();
  }
  linear(in, T, H, L.wq.data(), bias_of(L.bq), qd, q);
  linear(in, T, H, L.wk.data(), bias_of(L.bk), kvd, k);
  linear(in, T, H, L.wv.data(), bias_of(L.bv), kvd, v);
  if (c.arch != Arch::Llama) return;
  const std::vector<float> inv_freq = rope_inv_freq(c);
  const float scaling = rope_attention_scaling(c);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t hh = 0; hh < c.num_heads; ++hh) ref_rope(q + t * qd + hh * D, D, pos[t], inv_freq.data(), scaling);
    for (int64_t hh = 0; hh < c.num_kv_heads; ++hh)
      ref_rope(k + t * kvd + hh * D, D, pos[t], inv_freq.data(), scaling);
  }
}

void ref_attention_output_and_mlp(const ModelConfig& c, const LayerWeights& L, const float* att, int64_t T, float* x,
                                  LinearFn linear, const ResidualAdd* add) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  std::vector<float> proj(size_t(T * H)), h(size_t(T * H)), up(size_t(T * I)), gate;
  const auto residual_add = [&](const float* y) {
    if (add) (*add)(x, y, T * H);
    else
      for (int64_t i = 0; i < T * H; ++i) x[i] += y[i];
  };
  // x += o W_o^T
  linear(att, T, c.q_dim(), L.wo.data(), bias_of(L.bo), H, proj.data());
  residual_add(proj.data());
  const bool pre = c.pre_norm();  // false: post-LayerNorm OPT (LN after each residual add)
  if (!pre) {
    layer_norm_of(c, L.attn_norm_w, L.attn_norm_b, x, T, h.data());
    std::copy(h.begin(), h.end(), x);
  }
  // Llama: x += down(silu(gate(h)) * up(h)); OPT: x += fc2(relu(fc1(h)))
  if (pre) layer_norm_of(c, L.mlp_norm_w, L.mlp_norm_b, x, T, h.data());
  else std::copy(x, x + T * H, h.begin());
  linear(h.data(), T, H, L.w_up.data(), bias_of(L.b_up), I, up.data());
  if (c.arch == Arch::Llama) {
    gate.resize(size_t(T * I));
    linear(h.data(), T, H, L.w_gate.data(), bias_of(L.b_gate), I, gate.data());
    for (int64_t i = 0; i < T * I; ++i) {
      const float g = gate[size_t(i)];
      up[size_t(i)] *= g / (1.0f + std::exp(-g));
    }
  } else {
    for (auto& u : up) u = std::max(u, 0.0f);
  }
  linear(up.data(), T, I, L.w_down.data(), bias_of(L.b_down), H, proj.data());
  residual_add(proj.data());
  if (!pre) {
    layer_norm_of(c, L.mlp_norm_w, L.mlp_norm_b, x, T, h.data());
    std::copy(h.begin(), h.end(), x);
  }
}

void ref_final_hidden(const ModelWeights& w, const float* x, int64_t n, float* hn, LinearFn linear) {
  const ModelConfig& c = w.cfg;
  std::vector<float> h(size_t(n * c.hidden_size));
  if (c.arch == Arch::Llama) ref_rmsnorm(x, n, c.hidden_size, w.final_norm_w.data(), c.norm_eps, h.data());
  else if (c.has_final_norm())
    ref_layernorm(x, n, c.hidden_size, w.final_norm_w.data(), w.final_norm_b.data(), c.norm_eps, h.data());
  else std::copy(x, x + n * c.hidden_size, h.begin());  // post-LayerNorm OPT: no final LayerNorm
  if (c.has_projections())  // OPT: project_out [P, H], then the head over width P
    linear(h.data(), n, c.hidden_size, w.project_out.data(), nullptr, c.embed_dim(), hn);
  else
    std::copy(h.begin(), h.end(), hn);
}

void ref_lm_head(const ModelWeights& w, const float* x, int64_t n, float* logits, LinearFn linear) {
  const ModelConfig& c = w.cfg;
  std::vector<float> hn(size_t(n * c.embed_dim()));
  ref_final_hidden(w, x, n, hn.data(), linear);
  const int64_t rows = int64_t(w.lm_head_matrix().size()) / c.embed_dim();  // vocab_size, or a shard's slice
  linear(hn.data(), n, c.embed_dim(), w.lm_head_matrix().data(), nullptr, rows, logits);
}

void ref_decode_attention(const float* q, const float* kc, const float* vc, int64_t n, const ModelConfig& c, float* out) {
  const int64_t D = c.head_dim, kvd = c.kv_dim(), group = c.num_heads / c.num_kv_heads;
  const float scale = float(1.0 / std::sqrt(double(D)));
  std::vector<float> score(static_cast<size_t>(n));
  for (int64_t hh = 0; hh < c.num_heads; ++hh) {
    const int64_t kvh = hh / group;
    const float* qh = q + hh * D;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = kc + j * kvd + kvh * D;
      float dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += qh[d] * kj[d];
      score[size_t(j)] = dot * scale;
      mx = std::max(mx, score[size_t(j)]);
    }
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += (score[size_t(j)] = std::exp(score[size_t(j)] - mx));
    float* o = out + hh * D;
    std::fill(o, o + D, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const float p = float(score[size_t(j)] / sum);
      const float* vj = vc + j * kvd + kvh * D;
      for (int64_t d = 0; d < D; ++d) o[d] += p * vj[d];
    }
  }
}

std::vector<float> ReferenceModel::forward(const std::vector<RefToken>& batch) {
  const ModelConfig& c = w_.cfg;
  const int64_t T = int64_t(batch.size()), H = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();

  // Positions: each token goes at its sequence's next free slot. All checks before any change.
  std::vector<int64_t> pos(static_cast<size_t>(T));
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  {
    std::vector<int64_t> next(seqs_.size(), 0);
    for (size_t s = 0; s < seqs_.size(); ++s) next[s] = seqs_[s].live ? seqs_[s].length : 0;
    for (int64_t t = 0; t < T; ++t) {
      const RefToken& tok = batch[size_t(t)];
      seq_at(tok.seq);
      FD_CHECK(tok.token >= 0 && tok.token < c.vocab_size, "token id " << tok.token << " outside vocab of " << c.vocab_size);
      pos[size_t(t)] = next[size_t(tok.seq)]++;
      tokens[size_t(t)] = tok.token;
      FD_CHECK(pos[size_t(t)] < c.position_limit(),
               "position " << pos[size_t(t)] << " exceeds the model's " << c.position_limit() << " positions ("
                           << (c.position_limit_why.empty() ? "max_position_embeddings" : c.position_limit_why)
                           << ")");
    }
  }

  // With a block codec: which sequences decode (one token here, after their prompt); see set_kv_block_codec.
  std::vector<char> decoding(seqs_.size(), 0);
  if (codec_) {
    std::vector<int64_t> count(seqs_.size(), 0);
    for (const RefToken& tok : batch) ++count[size_t(tok.seq)];
    for (size_t s = 0; s < seqs_.size(); ++s) decoding[s] = count[s] == 1 && seqs_[s].live && seqs_[s].length > 0;
  }

  std::vector<float> x(size_t(T * H));  // the residual stream [T, H]
  ref_embed(w_, tokens.data(), pos.data(), T, x.data());
  std::vector<float> q(size_t(T * qd)), k(size_t(T * kvd)), v(size_t(T * kvd)), att(size_t(T * qd));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w_.layers[size_t(l)];
    ref_attention_input(c, L, x.data(), pos.data(), T, q.data(), k.data(), v.data());
    // Append each token's k, v (optionally rounded to the KV storage dtype), then attend causally.
    if (kv_dtype_ != DType::F32) {
      for (auto* buf : {&k, &v})
        for (auto& e : *buf) {
          uint16_t b;
          convert_from_f32(kv_dtype_, &e, &b, 1);
          convert_to_f32(kv_dtype_, &b, &e, 1);
        }
    }
    for (int64_t t = 0; t < T; ++t) {
      Sequence& s = seqs_[size_t(batch[size_t(t)].seq)];
      s.k[size_t(l)].insert(s.k[size_t(l)].end(), k.begin() + t * kvd, k.begin() + (t + 1) * kvd);
      s.v[size_t(l)].insert(s.v[size_t(l)].end(), v.begin() + t * kvd, v.begin() + (t + 1) * kvd);
      if (decoding[size_t(batch[size_t(t)].seq)]) code_full_blocks(s, l);
    }
#pragma omp parallel for schedule(dynamic)
    for (int64_t t = 0; t < T; ++t) {
      const Sequence& s = seqs_[size_t(batch[size_t(t)].seq)];
      ref_decode_attention(&q[size_t(t * qd)], s.k[size_t(l)].data(), s.v[size_t(l)].data(), pos[size_t(t)] + 1, c,
                           &att[size_t(t * qd)]);
    }
    if (codec_)
      for (const RefToken& tok : batch) code_full_blocks(seqs_[size_t(tok.seq)], l);  // prompts: after attending
    ref_attention_output_and_mlp(c, L, att.data(), T, x.data());
  }
  for (int64_t t = 0; t < T; ++t) seqs_[size_t(batch[size_t(t)].seq)].length = pos[size_t(t)] + 1;

  // Final norm and LM head for the tokens that want logits.
  std::vector<float> sel;
  for (int64_t t = 0; t < T; ++t)
    if (batch[size_t(t)].want_logits) sel.insert(sel.end(), x.begin() + t * H, x.begin() + (t + 1) * H);
  const int64_t n_out = int64_t(sel.size()) / H;
  std::vector<float> logits(size_t(n_out * c.vocab_size));
  if (n_out > 0) ref_lm_head(w_, sel.data(), n_out, logits.data());
  return logits;
}

}  // namespace fd
