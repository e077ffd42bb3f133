// The host-offload engine's config section (parse, defaults, refused keys, to_json) and its memory
// arithmetic (host slots at full depth, GPU staging rows), worked by hand. CPU-only: no device is touched.
#include "baselines/host_offload/host_offload_engine.h"

#include <algorithm>

#include "harness/engines.h"
#include "test_helpers.h"

using namespace fd;

namespace {

ModelConfig cfg(const char* name) {
  return load_model_config(fd::test::repo_path(std::string("experiments/models/") + name + ".json"));
}

EngineSpec parse(json j) { return parse_engine_spec(StrictObject(j, "x.json", "engine")); }
HostOffloadConfig host_offload(json j) { return std::any_cast<HostOffloadConfig>(parse(std::move(j)).config); }

}  // namespace

TEST(HostOffloadConfig, Defaults) {
  const auto types = engine_types();
  EXPECT_NE(std::find(types.begin(), types.end(), "host-offload"), types.end());
  const HostOffloadConfig c = host_offload({{"type", "host-offload"}});
  EXPECT_EQ(c.host_kv_gb, 32);
  EXPECT_EQ(c.max_context, 0);
  EXPECT_EQ(c.prefill_tokens, 16384);
  EXPECT_EQ(c.dtype, "fp16");
  EXPECT_EQ(c.max_batch, 0);
  EXPECT_EQ(c.copy, "batched");
}

TEST(HostOffloadConfig, ParsesEveryKeyAndRoundTrips) {
  const json j = {{"type", "host-offload"}, {"host_kv_gb", 1.5}, {"max_context", 4096}, {"prefill_tokens", 2048},
                  {"dtype", "bf16"},        {"max_batch", 96},   {"copy", "per_sequence"}};
  const EngineSpec spec = parse(j);
  const HostOffloadConfig c = std::any_cast<HostOffloadConfig>(spec.config);
  EXPECT_EQ(c.host_kv_gb, 1.5);
  EXPECT_EQ(c.max_context, 4096);
  EXPECT_EQ(c.prefill_tokens, 2048);
  EXPECT_EQ(c.dtype, "bf16");
  EXPECT_EQ(c.max_batch, 96);
  EXPECT_EQ(c.copy, "per_sequence");
  // The echo in summary.json parses back to the same section, every key.
  const json echo = engine_spec_to_json(spec);
  EXPECT_EQ(echo.at("type"), "host-offload");
  const HostOffloadConfig back = host_offload(echo);
  EXPECT_EQ(back.host_kv_gb, c.host_kv_gb);
  EXPECT_EQ(back.max_context, c.max_context);
  EXPECT_EQ(back.prefill_tokens, c.prefill_tokens);
  EXPECT_EQ(back.dtype, c.dtype);
  EXPECT_EQ(back.max_batch, c.max_batch);
  EXPECT_EQ(back.copy, c.copy);
  EXPECT_EQ(engine_spec_to_json(parse(echo)), echo);
  // 0 = the defaults' meaning (the model's position limit; the slots), accepted when written.
  EXPECT_EQ(host_offload({{"type", "host-offload"}, {"max_context", 0}, {"max_batch", 0}}).max_batch, 0);
}

TEST(HostOffloadConfig, RefusesBadKeysAndValues) {
  // Keys of other engines, and typos, are refused; so are values out of range.
  for (const json& bad : {json{{"type", "host-offload"}, {"rworkers", json::object()}},
                          json{{"type", "host-offload"}, {"cuda_graphs", true}},
                          json{{"type", "host-offload"}, {"host_kv_GB", 4}},
                          json{{"type", "host-offload"}, {"dtype", "fp32"}},
                          json{{"type", "host-offload"}, {"copy", "2d"}},
                          json{{"type", "host-offload"}, {"host_kv_gb", 0}},
                          json{{"type", "host-offload"}, {"host_kv_gb", -1}},
                          json{{"type", "host-offload"}, {"max_batch", 65536}},
                          json{{"type", "host-offload"}, {"max_context", -1}},
                          json{{"type", "host-offload"}, {"prefill_tokens", 0}}})
    EXPECT_THROW(parse(bad), ConfigError) << bad.dump();
  const std::string msg = fd::test::error_message<ConfigError>([] { parse({{"type", "host-offload"}, {"host_kv_GB", 4}}); });
  EXPECT_NE(msg.find("host_kv_GB"), std::string::npos) << msg;
}

// Host slots by hand. Llama-2-7b: fp16 KV 2 (K,V) x 32 layers x 4096 x 2 bytes = 524 288 bytes per token;
// 1024 positions = 536 870 912 bytes per slot: 32e9 / that = 59.6 -> 59; 4096 positions: 14.9 -> 14;
// 0.5 GB: 0.93 -> 0. Reduced to 2 layers, the accounting stays at full depth: 59.
// Llama-3-8B (GQA 32/8): 2 x 32 x 1024 x 2 = 131 072 bytes per token; 8192 positions: 32e9 / 1 073 741 824
// = 29.8 -> 29.
TEST(HostOffloadSlots, FullDepthHostBudget) {
  const ModelConfig c = cfg("llama-2-7b");
  EXPECT_EQ(c.kv_bytes_per_token(2, true), 524288);
  EXPECT_EQ(host_offload_slots(c, 32e9, 1024), 59);
  EXPECT_EQ(host_offload_slots(with_layers(c, 2), 32e9, 1024), 59);
  EXPECT_EQ(host_offload_slots(c, 32e9, 4096), 14);
  EXPECT_EQ(host_offload_slots(c, 0.5e9, 1024), 0);
  EXPECT_EQ(host_offload_slots(c, 32e9, 0), 0);
  EXPECT_EQ(host_offload_slots(cfg("llama-3-8b"), 32e9, 8192), 29);
}

// GPU rows by hand, Llama-2-7b at 24 GB and 1024 positions: 24e9 - 13 476 831 232 (fp16 weights, full
// depth) - 1 073 741 824 (reserve) = 9 449 426 944 bytes; per row: two staging buffers of one layer's K and
// V, 2 x 2 x 1024 x 4096 x 2 = 33 554 432 bytes, + 366 080 bytes of activations and logits
// (gpu_only_row_bytes: 4 x (3 x 8192 + 32000) + 2 x (3 x 8192 + 12288 + 3 x 11008)) = 33 920 512:
// 278.6 -> 278. Independent of the layers run; 14 GB do not hold the weights and the reserve: 0.
TEST(HostOffloadSlots, GpuStagingRows) {
  const ModelConfig c = cfg("llama-2-7b");
  EXPECT_EQ(host_offload_gpu_rows(c, 24e9, 1024), 278);
  EXPECT_EQ(host_offload_gpu_rows(with_layers(c, 2), 24e9, 1024), 278);
  EXPECT_EQ(host_offload_gpu_rows(c, 14e9, 1024), 0);
}
