#include "harness/profile.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/spart/spart.h"
#include "fastdecode/core/stats.h"
#include "harness/provenance.h"
#include "kernels/cpu/decode_attention.h"

namespace fd {

json measure_profile(const ModelConfig& model, const std::vector<int64_t>& batches, const std::vector<std::string>& kv_dtypes,
                     int64_t context, int reps, const std::string& backend, int r_threads, const std::string& command_line) {
  // T(B) on one layer of the model (random weights: the time does not depend on the values), as the
  // FastDecode engine drives it: q/k/v out and the attention output in through the backend's host
  // buffers in the wire dtype (fp16 on the GPU, fp32 on the CPU backend).
  const ModelConfig one = with_layers(model, 1);
  auto src = make_random_source(1, DType::F16);
  std::unique_ptr<SPart> sp = backend == "cuda" ? make_cuda_spart(load_model_weights(one, *src))
                                                : make_cpu_spart(load_model_weights(one, *src));
  const DType wire = backend == "cuda" ? DType::F16 : DType::F32;
  const size_t es = dtype_size(wire);
  json t_b = json::array();
  for (int64_t B : batches) {
    HostBuffer q = sp->alloc_host(size_t(B * one.q_dim()) * es), k = sp->alloc_host(size_t(B * one.kv_dim()) * es),
               v = sp->alloc_host(size_t(B * one.kv_dim()) * es), att = sp->alloc_host(size_t(B * one.q_dim()) * es);
    std::memset(att.data(), 0, att.size());
    std::vector<int32_t> tokens(size_t(B), 5);
    std::vector<int64_t> pos(size_t(B), 7);
    sp->embed(0, tokens.data(), pos.data(), B);
    std::vector<double> ts;
    for (int r = 0; r < reps + 1; ++r) {
      const int64_t t0 = now_ns();
      sp->attention_input(0, 0, wire, q.data(), k.data(), v.data());
      sp->set_attention(0, wire, {{att.data(), B}});
      sp->attention_output_and_mlp(0, 0);
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
    const int n_seq = int(std::max<int64_t>(std::max(1, 4 * r_threads), int64_t(256e6 * std::max(1, r_threads / 4) / double(std::max<size_t>(1, size_t(n_full) * blk)))));
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
      decode_attention(p, best_isa(), r_threads, ws);
      if (r > 0) ts.push_back(double(now_ns() - t0) / 1e9);
    }
    // Seconds per token per layer for ONE CPU: r_threads CPUs share the work (and the memory bus).
    r_map[name] = median(ts) * double(r_threads) / (double(n_seq) * double(n_full) * kKVBlockTokens);
  }
  return {{"t_b", t_b},
          {"r_s_per_token_layer", r_map},
          {"layers", model.full_num_layers},
          {"backend", backend},
          {"r_threads", r_threads},
          {"method",
           {{"t_b", sp->describe() + "; one layer (attention input with q/k/v to the host, attention output from the host, "
                     "output projection and MLP) for B decode tokens, median"},
            {"r", "decode attention on " + std::to_string(r_threads) + " thread(s) together (" +
                      std::string(isa_name(best_isa())) + "), R = time x threads / tokens, contexts of " +
                      std::to_string(context) + " tokens, >= 256 MB of KV, median time / tokens"}}},
          {"provenance", collect_provenance(command_line)}};
}

}  // namespace fd
