// The CPU S-Part backend: the reference model's stages with OpenBLAS GEMMs (fp32) where OpenBLAS was
// found at configure time, the reference GEMM otherwise.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "fd_fault_tp_skip_reduce.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)
#include "fastdecode/model/reference.h"
#include "fastdecode/parallel/comm.h"
#include "fastdecode/spart/spart.h"

#ifdef FD_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace fd {

void SPart::sample(int slot, const std::vector<int32_t>& rows, const std::vector<SamplingParams>& params,
                   const std::vector<uint64_t>& request_ids, const std::vector<uint64_t>& steps, int32_t* out,
                   const std::vector<int32_t>& record, float* recorded) {
  FD_CHECK(params.size() == rows.size() && request_ids.size() == rows.size() && steps.size() == rows.size(),
           "sample: params, a request id and a step per row");
  FD_CHECK(record.empty() || recorded, "sample: rows to record but nowhere to put them");
  const int64_t V = config().vocab_size;
  std::vector<float> lg(rows.size() * size_t(V));
  logits(slot, rows, lg.data());
  for (size_t i = 0; i < rows.size(); ++i)
    out[i] = sample_token(&lg[i * size_t(V)], V, params[i], request_ids[i], steps[i]);
  for (size_t k = 0; k < record.size(); ++k) {
    FD_CHECK(record[k] >= 0 && size_t(record[k]) < rows.size(), "sample: record index " << record[k] << " out of range");
    std::memcpy(recorded + k * size_t(V), &lg[size_t(record[k]) * size_t(V)], size_t(V) * 4);
  }
}

void SPart::prepare(int, const int64_t*, int64_t) {
  FD_THROW("S-Part " << describe() << ": has no pipeline-parallel stages");
}
SPart::Residual SPart::residual(int) {
  FD_THROW("S-Part " << describe() << ": has no pipeline-parallel stages");
}
void SPart::send_residual(int slot, Communicator& c, int peer) {
  const Residual x = residual(slot);
  c.send(x.data, x.bytes, peer);
}
void SPart::recv_residual(int slot, Communicator& c, int peer) {
  const Residual x = residual(slot);
  c.recv(x.data, x.bytes, peer);
}

#ifdef FD_HAVE_OPENBLAS
// y[T, out] = x[T, in] · W[out, in]^T (+ bias): one SGEMM, W read once for the whole batch.
static void blas_linear(const float* x, int64_t T, int64_t in, const float* W, const float* bias, int64_t out, float* y) {
  if (bias)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) y[t * out + o] = bias[o];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(out), int(in), 1.0f, x, int(in), W, int(in),
              bias ? 1.0f : 0.0f, y, int(out));
}
constexpr LinearFn kLinear = blas_linear;
constexpr const char* kGemm = "OpenBLAS sgemm";
#else
constexpr LinearFn kLinear = ref_linear;
constexpr const char* kGemm = "reference loops (OpenBLAS not found at configure time)";
#endif

namespace {

// Writes n fp32 values to host memory in dt (F32 or F16).
void store(const float* src, size_t n, DType dt, void* dst) {
  if (n == 0) return;
  if (dt == DType::F32) std::memcpy(dst, src, n * 4);
  else convert_from_f32(dt, src, dst, n);
}

// Tensor rank t's embedding rows: x = embed[tok] (OPT: project_in of it) when t holds the token's row, else
// 0; OPT's learned position on rank 0 only. Summed over the ranks this is ref_embed's x, exactly (one
// non-zero term besides the position, and fp32 addition of two terms commutes).
void embed_shard(const ModelWeights& w, const int32_t* tokens, const int64_t* pos, int64_t T, float* x) {
  const int64_t H = w.cfg.hidden_size, P = w.cfg.embed_dim(), v0 = w.shard.vocab_begin, v1 = w.shard.vocab_end;
  for (int64_t t = 0; t < T; ++t) {
    float* xt = x + t * H;
    if (tokens[t] >= v0 && tokens[t] < v1) {
      const float* e = w.embed.data() + (int64_t(tokens[t]) - v0) * P;
      if (w.cfg.has_projections()) ref_linear(e, 1, P, w.project_in.data(), nullptr, H, xt);
      else std::memcpy(xt, e, size_t(H) * 4);
    } else {
      std::memset(xt, 0, size_t(H) * 4);
    }
    if (w.cfg.arch == Arch::OPT && w.shard.tp_rank == 0) {
      const float* p = w.pos_embed.data() + (pos[t] + 2) * H;
      for (int64_t i = 0; i < H; ++i) xt[i] += p[i];
    }
  }
}

class CpuSPart : public SPart {
 public:
  CpuSPart(ModelWeights w, SPartComms comms) : w_(std::move(w)), tp_(comms.tp && comms.tp->size() > 1 ? comms.tp : nullptr) {
    const int64_t T = tp_ ? tp_->size() : 1;
    FD_CHECK(w_.shard.tp_size == T, "cpu S-Part: weights of tensor part " << w_.shard.tp_rank << " of " << w_.shard.tp_size
                                                                          << " with a tensor group of " << T);
    FD_CHECK(!tp_ || w_.shard.tp_rank == tp_->rank(),
             "cpu S-Part: weights of tensor rank " << w_.shard.tp_rank << " on group rank " << tp_->rank());
    if (tp_) {
      add_ = [this](float* x, const float* y, int64_t n) {  // rank 0 keeps x, the others contribute only y
#ifdef FD_FAULT_TP_SKIP_REDUCE  // planted fault: the MLP branch (every second call) is not summed over the ranks
        if (++fault_calls_ % 2 == 0) {
          for (int64_t i = 0; i < n; ++i) x[i] += y[i];
          return;
        }
#endif
        if (tp_->rank() == 0)
          for (int64_t i = 0; i < n; ++i) x[i] += y[i];
        else
          std::memcpy(x, y, size_t(n) * 4);
        tp_->all_reduce_sum(x, size_t(n), CommType::F32);
      };
    }
  }
  const ModelConfig& config() const override { return w_.cfg; }
  std::string describe() const override {
    std::string d = std::string("cpu fp32, GEMM: ") + kGemm;
    if (tp_) d += ", tensor rank " + std::to_string(tp_->rank()) + " of " + std::to_string(tp_->size()) + " (" + tp_->describe() + ")";
    return d;
  }

  HostBuffer alloc_host(size_t bytes) override {
    return HostBuffer(std::malloc(std::max<size_t>(bytes, 1)), bytes, [](void* p) { std::free(p); });
  }

  void prepare(int slot, const int64_t* pos, int64_t T) override {
    Slot& s = at(slot);
    const ModelConfig& c = w_.cfg;
    s.T = T;
    s.pos.assign(pos, pos + T);
    s.x.resize(size_t(T * c.hidden_size));
    s.q.resize(size_t(T * c.q_dim()));
    s.att.resize(s.q.size());
    s.k.resize(size_t(T * c.kv_dim()));
    s.v.resize(s.k.size());
  }

  Residual residual(int slot) override {
    Slot& s = at(slot);
    return {s.x.data(), s.x.size() * 4};
  }

  void embed(int slot, const int32_t* tokens, const int64_t* pos, int64_t T) override {
    prepare(slot, pos, T);
    Slot& s = at(slot);
    if (!tp_) {
      ref_embed(w_, tokens, pos, T, s.x.data());
      return;
    }
    embed_shard(w_, tokens, pos, T, s.x.data());
    tp_->all_reduce_sum(s.x.data(), s.x.size(), CommType::F32);
  }

  using SPart::attention_input;
  void attention_input(int slot, int layer, DType dt, const std::vector<HostRowsOut>& parts) override {
    Slot& s = at(slot);
    const std::vector<HostRowsOut> out = resolve_rows(parts, s.T);
    ref_attention_input(w_.cfg, w_.layers[size_t(layer)], s.x.data(), s.pos.data(), s.T, s.q.data(), s.k.data(),
                        s.v.data(), kLinear);
    const size_t qd = size_t(w_.cfg.q_dim()), kvd = size_t(w_.cfg.kv_dim());
    size_t row = 0;
    for (const HostRowsOut& p : out) {
      const size_t n = size_t(p.rows);
      if (p.q) store(&s.q[row * qd], n * qd, dt, p.q);
      if (n) store(&s.k[row * kvd], n * kvd, dt, p.k), store(&s.v[row * kvd], n * kvd, dt, p.v);
      row += n;
    }
  }

  void set_attention(int slot, DType dt, const std::vector<HostRows>& parts) override {
    Slot& s = at(slot);
    const size_t qd = size_t(w_.cfg.q_dim());
    size_t row = 0;
    for (const HostRows& p : parts) {
      FD_CHECK(row + size_t(p.rows) <= size_t(s.T), "set_attention: more rows than the slot holds");
      if (dt == DType::F32) std::memcpy(&s.att[row * qd], p.data, size_t(p.rows) * qd * 4);
      else convert_to_f32(dt, p.data, &s.att[row * qd], size_t(p.rows) * qd);
      row += size_t(p.rows);
    }
    FD_CHECK(row == size_t(s.T), "set_attention: " << row << " rows for a slot of " << s.T);
  }

  void prefill_attention(int slot, const std::vector<int64_t>& starts) override {
    Slot& s = at(slot);
    const ModelConfig& c = w_.cfg;
    const int64_t qd = c.q_dim(), kvd = c.kv_dim();
    for (auto* buf : {&s.k, &s.v})  // attention sees the KV as the R-worker will store it (fp16)
      for (auto& e : *buf) e = fp16_to_fp32(fp32_to_fp16(e));
    for (size_t i = 0; i + 1 < starts.size(); ++i)
      for (int64_t t = starts[i]; t < starts[i + 1]; ++t)
        ref_decode_attention(&s.q[size_t(t * qd)], &s.k[size_t(starts[i] * kvd)], &s.v[size_t(starts[i] * kvd)],
                             t - starts[i] + 1, c, &s.att[size_t(t * qd)]);
  }

  void attention_output_and_mlp(int slot, int layer) override {
    Slot& s = at(slot);
    ref_attention_output_and_mlp(w_.cfg, w_.layers[size_t(layer)], s.att.data(), s.T, s.x.data(), kLinear,
                                 tp_ ? &add_ : nullptr);
  }

  void logits(int slot, const std::vector<int32_t>& rows, float* out) override {
    Slot& s = at(slot);
    const size_t H = size_t(w_.cfg.hidden_size);
    std::vector<float> sel(rows.size() * H);
    for (size_t i = 0; i < rows.size(); ++i) std::memcpy(&sel[i * H], &s.x[size_t(rows[i]) * H], H * 4);
    const int64_t n = int64_t(rows.size());
    if (!tp_) {
      ref_lm_head(w_, sel.data(), n, out, kLinear);
      return;
    }
    // This rank's vocabulary slice [v0, v1), padded to Vp columns, gathered rank-major: [T][n][Vp].
    const int64_t V = w_.cfg.vocab_size, v0 = w_.shard.vocab_begin, vr = w_.shard.vocab_end - v0;
    const int64_t Vp = w_.shard.vocab_padded > 0 ? w_.shard.vocab_padded : vr, T = tp_->size();
    std::vector<float> local(size_t(n * vr)), padded(size_t(n * Vp), 0.0f), all(size_t(T * n * Vp));
    ref_lm_head(w_, sel.data(), n, local.data(), kLinear);
    for (int64_t i = 0; i < n; ++i) std::memcpy(&padded[size_t(i * Vp)], &local[size_t(i * vr)], size_t(vr) * 4);
    tp_->all_gather(padded.data(), all.data(), padded.size(), CommType::F32);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t cols = std::min(Vp, V - t * Vp);  // the last slice may be shorter
      for (int64_t i = 0; i < n && cols > 0; ++i)
        std::memcpy(out + i * V + t * Vp, &all[size_t((t * n + i) * Vp)], size_t(cols) * 4);
    }
  }

 private:
  struct Slot {
    int64_t T = 0;
    std::vector<int64_t> pos;
    std::vector<float> x, q, k, v, att;
  };
  Slot& at(int slot) {
    FD_CHECK(slot >= 0 && slot < 16, "S-Part slot " << slot << " out of range");
    if (size_t(slot) >= slots_.size()) slots_.resize(size_t(slot) + 1);
    return slots_[size_t(slot)];
  }
  ModelWeights w_;
  Communicator* tp_ = nullptr;
  ResidualAdd add_;
  [[maybe_unused]] int64_t fault_calls_ = 0;  // the planted fault tp_skip_reduce only
  std::vector<Slot> slots_;
};

}  // namespace

std::unique_ptr<SPart> make_cpu_spart(ModelWeights weights, SPartComms comms) {
  return std::make_unique<CpuSPart>(std::move(weights), comms);
}

}  // namespace fd
