#include "harness/profile.h"

#include <algorithm>
#include <random>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/sworker/spart.h"
#include "harness/provenance.h"
#include "kernels/cpu/decode_attention.h"

namespace fd {

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

json measure_profile(const ModelConfig& model, const std::vector<int64_t>& batches, const std::vector<std::string>& kv_dtypes,
                     int64_t context, int reps, const std::string& command_line) {
  // T(B) on one layer of the model (random weights: the time does not depend on the values).
  const ModelConfig one = with_layers(model, 1);
  auto src = make_random_source(1, DType::F16);
  std::unique_ptr<SPart> sp = make_cpu_spart(load_model_weights(one, *src));
  json t_b = json::array();
  for (int64_t B : batches) {
    std::vector<float> x(size_t(B * one.hidden_size), 0.5f), q(size_t(B * one.q_dim())), k(size_t(B * one.kv_dim())),
        v(k.size()), att(q.size(), 0.01f);
    std::vector<int64_t> pos(size_t(B), 7);
    std::vector<double> ts;
    for (int r = 0; r < reps + 1; ++r) {
      const int64_t t0 = now_ns();
      sp->attention_input(0, x.data(), pos.data(), B, q.data(), k.data(), v.data());
      sp->attention_output_and_mlp(0, att.data(), B, x.data());
      if (r > 0) ts.push_back(double(now_ns() - t0) / 1e9);
    }
    t_b.push_back({B, median(ts)});
  }
  // R: one thread over n_seq sequences of `context` tokens, enough to exceed the caches (>= 256 MB).
  const int H = int(model.num_kv_heads), D = int(model.head_dim);
  json r_map = json::object();
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const std::string& name : kv_dtypes) {
    const KVDType dt = kv_dtype_from_name(name);
    const int n_full = int(context / kKVBlockTokens);
    const size_t blk = kv_block_bytes(dt, H, D);
    const int n_seq = int(std::max<int64_t>(1, int64_t(256e6 / double(std::max<size_t>(1, size_t(n_full) * blk)))));
    std::vector<uint16_t> f16(kv_fp16_block_bytes(H, D) / 2);
    for (auto& e : f16) e = fp32_to_fp16(nd(rng));
    std::vector<uint8_t> one_block(blk);
    kv_quantize_block(dt, f16.data(), one_block.data(), H, D);
    std::vector<std::vector<uint8_t>> store(size_t(n_seq) * size_t(n_full), one_block);
    std::vector<const void*> ptrs;
    for (auto& b : store) ptrs.push_back(b.data());
    std::vector<SeqKVView> views(static_cast<size_t>(n_seq));
    for (int s = 0; s < n_seq; ++s) views[size_t(s)] = {&ptrs[size_t(s) * n_full], n_full, nullptr, 0};
    std::vector<float> qv(size_t(n_seq) * model.num_heads * D, 0.1f), o(qv.size());
    DecodeAttentionParams p;
    p.dtype = dt, p.n_seq = n_seq, p.n_heads = int(model.num_heads), p.n_kv_heads = H, p.head_dim = D;
    p.scale = 1.0f / std::sqrt(float(D)), p.seqs = views.data(), p.q = qv.data(), p.o = o.data();
    DecodeAttentionWorkspace ws;
    std::vector<double> ts;
    for (int r = 0; r < reps + 1; ++r) {
      const int64_t t0 = now_ns();
      decode_attention(p, best_isa(), 1, ws);
      if (r > 0) ts.push_back(double(now_ns() - t0) / 1e9);
    }
    r_map[name] = median(ts) / (double(n_seq) * double(n_full) * kKVBlockTokens);
  }
  return {{"t_b", t_b},
          {"r_s_per_token_layer", r_map},
          {"layers", model.full_num_layers},
          {"method",
           {{"t_b", "CPU S-Part backend, one layer (attention input + output and MLP) for B decode tokens, median"},
            {"r", "decode attention on 1 thread (" + std::string(isa_name(best_isa())) + "), contexts of " +
                      std::to_string(context) + " tokens, >= 256 MB of KV, median time / tokens"}}},
          {"provenance", collect_provenance(command_line)}};
}

}  // namespace fd
