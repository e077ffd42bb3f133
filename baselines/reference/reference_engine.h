// The reference engine: the fp32 CPU reference model behind the Engine interface. All queued
// requests start at the next step; each step prefills new prompts and decodes every running sequence.
#pragma once
#include <deque>
#include <map>

#include "fastdecode/engine/engine.h"
#include "fastdecode/model/reference.h"

namespace fd {

// The "engine" section with type "reference".
struct ReferenceEngineConfig {
  DType kv_dtype = DType::F32;  // K/V rounded through it as they are cached (fp16: what an fp16 cache holds)
  // A KV format (kernels/cpu/kv_codec.h, any listed one, served or study): every full block of 32 tokens is
  // replaced by the values that format stores for it, when an R-worker would quantize it. Empty: none. Needs fp16.
  std::string kv_format;
  static ReferenceEngineConfig parse(StrictObject& o);  // the section's own keys (not type / threads)
  json to_json() const;
};
std::unique_ptr<Engine> make_reference_engine(const ReferenceEngineConfig& c, const EngineContext& ctx);

class ReferenceEngine : public Engine {
 public:
  // kv_dtype: K/V are rounded through it as they enter the cache (fp32: exact). fp16 gives the
  // reference the KV values an fp16 KV-cache holds, so engines with one can be compared token by token.
  ReferenceEngine(const ModelConfig& model, TensorSource& weights, const SamplingParams& sampling,
                  DType kv_dtype = DType::F32, const std::string& kv_format = "");
  std::string name() const override { return "reference"; }
  void add(const std::vector<Request>& requests) override;
  StepResult step() override;
  bool done() const override { return queued_.empty() && running_.empty(); }
  void shutdown() override;
  void add_note(std::string n) { notes_.push_back(std::move(n)); }

 private:
  struct Running {
    Request req;
    int64_t seq = -1;
    int64_t generated = 0;
    int32_t last_token = 0;
  };
  void emit(Running& r, const float* logits, StepResult& out);

  ReferenceModel model_;
  SamplingParams sampling_;
  std::deque<Request> queued_;
  std::map<uint64_t, Running> running_;  // by request id: deterministic order
};

}  // namespace fd
