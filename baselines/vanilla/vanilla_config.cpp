// The vanilla engine's config section; compiled with or without LibTorch.
#include "baselines/vanilla/vanilla_engine.h"

namespace fd {

VanillaConfig VanillaConfig::parse(StrictObject& o) {
  VanillaConfig c;
  c.batch_size = o.get_int("batch_size", 1, 1 << 16, 16);
  c.device = o.get_enum("device", {"auto", "cpu", "cuda"}, std::string("auto"));
  c.dtype = o.get_enum("dtype", {"auto", "fp16", "fp32"}, std::string("auto"));
  // The CPU path computes in fp32 (as HF on a CPU); with device auto this is checked when the engine is made.
  if (c.device == "cpu" && c.dtype == "fp16")
    o.fail("dtype", "fp16 needs device cuda (or auto on a machine with CUDA); the cpu device computes in fp32");
  return c;
}

json VanillaConfig::to_json() const { return {{"batch_size", batch_size}, {"device", device}, {"dtype", dtype}}; }

}  // namespace fd
