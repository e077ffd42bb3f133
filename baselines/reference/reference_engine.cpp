#include "baselines/reference/reference_engine.h"

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "kernels/cpu/kv_codec.h"

namespace fd {

ReferenceEngineConfig ReferenceEngineConfig::parse(StrictObject& o) {
  ReferenceEngineConfig c;
  const bool dtype_given = o.has("kv_dtype");
  c.kv_dtype = dtype_from_name(o.get_enum("kv_dtype", {"fp32", "fp16", "bf16"}, std::string("fp32")));
  if (o.has("kv_format")) {
    const auto names = kv_codec_names();
    c.kv_format = o.get_enum("kv_format", std::set<std::string>(names.begin(), names.end()));
    if (dtype_given && c.kv_dtype != DType::F16)
      FD_THROW_BAD_INPUT("engine.kv_format " << c.kv_format << " quantizes fp16 blocks: engine.kv_dtype must be fp16 "
                                             "(or left out), not " << dtype_name(c.kv_dtype));
    c.kv_dtype = DType::F16;
  }
  return c;
}

json ReferenceEngineConfig::to_json() const {
  json j = {{"kv_dtype", std::string(dtype_name(kv_dtype))}};
  if (!kv_format.empty()) j["kv_format"] = kv_format;
  return j;
}

std::unique_ptr<Engine> make_reference_engine(const ReferenceEngineConfig& c, const EngineContext& ctx) {
  auto e = std::make_unique<ReferenceEngine>(ctx.model, ctx.weights, ctx.sampling, c.kv_dtype, c.kv_format);
  if (ctx.hardware.gpu_memory_gb > 0 || ctx.hardware.gpu_sm_count > 0)
    e->add_note("hardware.gpu is not applied: the reference engine runs nothing on a GPU here");
  return e;
}

ReferenceEngine::ReferenceEngine(const ModelConfig& model, TensorSource& weights, const SamplingParams& sampling,
                                 DType kv_dtype, const std::string& kv_format)
    : model_(load_model_weights(model, weights)), sampling_(sampling) {
  model_.set_kv_dtype(kv_dtype);
  if (kv_format.empty()) return;
  // The R-worker's view of a block: [H][32][D] fp16 K then V (the tail layout), through the format, back to the
  // reference's [32][kv_dim] rows.
  const KVCodec& codec = kv_codec(kv_format);
  const int H = int(model.num_kv_heads), D = int(model.head_dim);
  codec.check_shape(H, D);
  model_.set_kv_block_codec(kKVBlockTokens, [&codec, H, D](float* k, float* v, int64_t n, int64_t kvd) {
    std::vector<uint16_t> blk(kv_fp16_block_bytes(H, D) / 2);
    std::vector<float> back(blk.size());
    const size_t half = blk.size() / 2;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < kvd; ++j) {
        const size_t at = size_t(((j / D) * n + t) * D + j % D);
        blk[at] = fp32_to_fp16(k[t * kvd + j]);
        blk[half + at] = fp32_to_fp16(v[t * kvd + j]);
      }
    kv_codec_round_trip(codec, blk.data(), back.data(), H, D);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < kvd; ++j) {
        const size_t at = size_t(((j / D) * n + t) * D + j % D);
        k[t * kvd + j] = back[at];
        v[t * kvd + j] = back[half + at];
      }
  });
  add_note("KV format " + kv_format + ": " + std::string(codec.describe()));
}

void ReferenceEngine::add(const std::vector<Request>& requests) {
  for (const auto& r : requests) {
    validate_request(r, model_.config());
    if (running_.count(r.id)) FD_THROW("request " << r.id << " is already running");
  }
  queued_.insert(queued_.end(), requests.begin(), requests.end());
}

void ReferenceEngine::emit(Running& r, const float* logits, StepResult& out) {
  const int64_t V = model_.config().vocab_size;
  const int32_t tok = sample_token(logits, V, r.req.sampling_or(sampling_), r.req.id, uint64_t(r.generated));
  // Teacher forcing: the pick is emitted, the forced token is what the sequence continues with.
  r.last_token = r.req.next_input(r.generated, tok);
  ++r.generated;
  const bool eos = r.req.stop_at_eos && tok == model_.config().eos_token_id;
  const bool finished = r.generated >= r.req.max_new_tokens || eos;
  out.tokens.push_back({r.req.id, tok, finished, {}});
  if (r.req.record_logits) out.tokens.back().logits.assign(logits, logits + V);
}

StepResult ReferenceEngine::step() {
  StepResult out;
  const int64_t V = model_.config().vocab_size;

  // Decode: every running sequence feeds its last token (batched in one forward).
  if (!running_.empty()) {
    const int64_t t0 = now_ns();
    std::vector<RefToken> batch;
    for (auto& [id, r] : running_) batch.push_back({r.seq, r.last_token, true});
    const std::vector<float> logits = model_.forward(batch);
    size_t row = 0;
    for (auto& [id, r] : running_) {
      emit(r, &logits[row++ * size_t(V)], out);
      out.total_context += model_.sequence_length(r.seq);
    }
    out.decode_tokens = int64_t(batch.size());
    out.spans.push_back({"reference", "decode", t0, now_ns() - t0});
  }

  // Prefill: every queued request's prompt in one forward; logits only at each prompt's last token.
  std::vector<Running> fresh;
  if (!queued_.empty()) {
    const int64_t t0 = now_ns();
    std::vector<RefToken> batch;
    while (!queued_.empty()) {
      Running r;
      r.req = std::move(queued_.front());
      queued_.pop_front();
      r.seq = model_.add_sequence();
      for (size_t i = 0; i < r.req.prompt.size(); ++i)
        batch.push_back({r.seq, r.req.prompt[i], i + 1 == r.req.prompt.size()});
      fresh.push_back(std::move(r));
    }
    const std::vector<float> logits = model_.forward(batch);
    for (size_t i = 0; i < fresh.size(); ++i) {
      emit(fresh[i], &logits[i * size_t(V)], out);
      out.total_context += model_.sequence_length(fresh[i].seq);
    }
    out.prefill_tokens = int64_t(batch.size());
    out.spans.push_back({"reference", "prefill", t0, now_ns() - t0});
  }
  for (auto& r : fresh) running_.emplace(r.req.id, std::move(r));

  // Finished sequences free their KV-cache at once.
  for (const auto& t : out.tokens) {
    if (!t.finished) continue;
    model_.free_sequence(running_.at(t.request_id).seq);
    running_.erase(t.request_id);
  }
  return out;
}

void ReferenceEngine::shutdown() {
  for (auto& [id, r] : running_) model_.free_sequence(r.seq);
  running_.clear();
  queued_.clear();
}

}  // namespace fd
