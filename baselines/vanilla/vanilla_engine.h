// The "Vanilla PyTorch" baseline of the paper: the model in LibTorch eager ops, run as HuggingFace
// transformers' generate() runs it. Static batching: up to `batch_size` queued requests form a batch, their
// prompts left-padded with an attention mask and position ids, prefilled together, then decoded one token
// per step until EVERY member has finished (finished rows keep computing on a pad token, their tokens are
// dropped); only then does the next batch start. Per layer the KV-cache grows by torch::cat every step.
// This header names no Torch type: the rest of the project does not depend on Torch's headers.
#pragma once
#include <memory>
#include <string>

#include "fastdecode/engine/engine.h"

namespace fd {

// The "engine" section with type "vanilla".
struct VanillaConfig {
  int64_t batch_size = 16;      // requests per static batch (the engine's slots)
  std::string device = "auto";  // auto (cuda when LibTorch sees one, else cpu) | cpu | cuda
  // auto: fp16 on cuda, fp32 on cpu; fp16 needs cuda (the CPU path computes in fp32).
  std::string dtype = "auto";
  static VanillaConfig parse(StrictObject& o);  // the section's own keys (not type / threads)
  json to_json() const;
};

// What this build of the vanilla engine has: LibTorch at all, its version, and whether it sees a CUDA
// device (false without LibTorch or with a CPU-only LibTorch).
struct VanillaBuild {
  bool libtorch = false;
  std::string torch_version;
  bool cuda = false;
};
VanillaBuild vanilla_build();

std::unique_ptr<Engine> make_vanilla_engine(const VanillaConfig& c, const EngineContext& ctx);

}  // namespace fd
