#include "extensions/hybrid/hybrid_engine.h"

namespace fd {

HybridConfig HybridConfig::parse(StrictObject& o) {
  HybridConfig c;
  c.max_context = o.get_int("max_context", 1, 1 << 24, 0);
  c.prefill_tokens = o.get_int("prefill_tokens", 1, 1 << 24, 16384);
  c.cuda_graphs = o.get_bool("cuda_graphs", true);
  c.dtype = o.get_enum("dtype", {"fp16", "bf16"}, std::string("fp16"));
  c.mini_batches = o.get_int("mini_batches", 1, 2, 2);
  if (o.has("rworkers")) {
    StrictObject r = o.get_object("rworkers");
    // Keys of the fastdecode engine's R-workers that the hybrid engine has no mechanism for: refused, never ignored.
    if (r.has("on_failure") && r.get_raw("on_failure") != "fail")
      r.fail("on_failure", "recovery is not built for the hybrid engine: a worker found gone ends the run (\"fail\")");
    if (r.has("shm_in_place"))
      r.fail("shm_in_place", "not built for the hybrid engine (its q/k/v go from pinned host buffers into the region)");
    if (r.has("append_chunk_kb"))
      r.fail("append_chunk_kb", "not built for the hybrid engine (its prefill appends go in the worker's largest messages)");
    c.rworkers = RWorkersConfig::parse(r, 1);
  } else {
    o.get_raw("rworkers");
  }
  if (!c.rworkers.register_endpoint.empty())
    o.fail("rworkers", "register is not built for the hybrid engine: spawn or list its R-workers");
  if (o.has("controller")) {
    StrictObject k = o.get_object("controller");
    const bool moves = k.has("max_moves_per_step");
    c.controller = HybridControllerConfig::parse(k);
    if (moves && c.controller.max_moves_per_step > 0)
      k.fail("max_moves_per_step", "migration between the GPU and the R-workers is not built in the hybrid engine (0 only)");
    k.finish();
  } else {
    o.get_raw("controller");
  }
  c.controller.max_moves_per_step = 0;  // a sequence stays on the side it was placed on
  c.rworkers.on_failure = "fail";
  return c;
}

json HybridConfig::to_json() const {
  json rw = rworkers.to_json();
  rw.erase("shm_in_place"), rw.erase("append_chunk_kb");  // the fastdecode engine's only (refused above)
  return {{"max_context", max_context}, {"prefill_tokens", prefill_tokens}, {"cuda_graphs", cuda_graphs},
          {"dtype", dtype},             {"mini_batches", mini_batches},     {"rworkers", rw},
          {"controller", controller.to_json()}};
}

}  // namespace fd
