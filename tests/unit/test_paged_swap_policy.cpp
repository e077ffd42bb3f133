// The paged-swap baseline's policy (vLLM v0.2's block manager and scheduler, pure C++) and its config
// section: block accounting, watermark admission, FCFS, youngest-first preemption by swap and by
// recompute, swap round trips, and the "engine" section parsed from an experiment config.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "baselines/paged_swap/block_manager.h"
#include "baselines/paged_swap/paged_swap_engine.h"
#include "baselines/paged_swap/scheduler.h"
#include "harness/experiment.h"
#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::repo_path;
using ::testing::HasSubstr;

namespace {

// Drives a scheduler as the engine does: every planned sequence gets one token per step; a sequence
// finishes once it has `gen` generated tokens. Checks the block tables against the tokens each step.
struct Driver {
  PagedScheduler s;
  std::map<uint64_t, int64_t> prompt, gen, made;
  std::map<uint64_t, int64_t> last_prefill_tokens;  // tokens a sequence's latest prefill ran over
  std::vector<PagedStepPlan> plans;
  Driver(PagedSchedulerConfig c, BlockManager b) : s(c, std::move(b)) {}
  void add(uint64_t id, int64_t p, int64_t g) {
    s.add(id, p, p + g - 1);
    prompt[id] = p, gen[id] = g, made[id] = 0;
  }
  // One step; returns its plan.
  PagedStepPlan step() {
    PagedStepPlan plan = s.schedule();
    EXPECT_TRUE(plan.prefill.empty() || plan.decode.empty()) << "prefill and decode in one step";
    for (uint64_t id : plan.prefill.empty() ? plan.decode : plan.prefill) {
      // The table covers every token the step computes over: all of them (prefill) or up to the new one.
      EXPECT_TRUE(s.blocks().on_gpu(id));
      EXPECT_EQ(s.blocks().tokens(id), s.num_tokens(id)) << "sequence " << id;
      EXPECT_EQ(int64_t(s.blocks().table(id).size()), s.blocks().blocks_for(s.num_tokens(id)));
    }
    for (uint64_t id : plan.prefill) last_prefill_tokens[id] = s.num_tokens(id);
    for (uint64_t id : plan.prefill.empty() ? plan.decode : plan.prefill) {
      s.on_token(id);
      if (++made[id] == gen[id]) s.finish(id);
    }
    plans.push_back(plan);
    return plan;
  }
  int64_t run(int64_t max_steps = 10000) {
    int64_t n = 0;
    while (!s.idle() && n < max_steps) {
      const PagedStepPlan p = step();
      EXPECT_FALSE(p.empty()) << "step " << n << " planned nothing";
      if (p.empty()) break;
      ++n;
    }
    return n;
  }
};

PagedSchedulerConfig sched_config(Preemption p, int64_t max_seqs = 256, int64_t max_tokens = 4096) {
  PagedSchedulerConfig c;
  c.preemption = p;
  c.max_num_seqs = max_seqs;
  c.max_num_batched_tokens = max_tokens;
  return c;
}

}  // namespace

TEST(PagedBlockManager, AllocateAppendFreeKeepsAccounting) {
  BlockManager b(16, 10, 4, 0.0);
  b.allocate(1, 17);  // 2 blocks
  EXPECT_EQ(b.table(1).size(), 2u);
  EXPECT_EQ(b.free_gpu_blocks(), 8);
  for (int i = 0; i < 15; ++i) b.append_slot(1);  // 32 tokens: still 2 blocks
  EXPECT_EQ(b.table(1).size(), 2u);
  b.append_slot(1);  // 33: a third block
  EXPECT_EQ(b.table(1).size(), 3u);
  EXPECT_EQ(b.tokens(1), 33);
  b.allocate(2, 16 * 7);  // the rest
  EXPECT_EQ(b.free_gpu_blocks(), 0);
  EXPECT_FALSE(b.can_append_slot(2));  // full last block, nothing free
  EXPECT_THROW(b.append_slot(2), Error);
  EXPECT_EQ(b.tokens(2), 16 * 7);  // a refused append changes nothing
  b.free(1);
  b.free(2);
  EXPECT_EQ(b.free_gpu_blocks(), 10);
  EXPECT_FALSE(b.has(1));
  EXPECT_THROW(b.free(1), Error);
}

TEST(PagedBlockManager, WatermarkAdmission) {
  BlockManager b(16, 100, 0, 0.05);  // 5 blocks kept back
  EXPECT_EQ(b.watermark_blocks(), 5);
  EXPECT_TRUE(b.can_allocate(16 * 95));   // leaves exactly 5
  EXPECT_FALSE(b.can_allocate(16 * 95 + 1));  // would leave 4
  EXPECT_TRUE(b.ever_fits(16 * 95));
  EXPECT_FALSE(b.ever_fits(16 * 96));
  b.allocate(1, 16 * 90);
  EXPECT_TRUE(b.can_allocate(16 * 5));
  EXPECT_FALSE(b.can_allocate(16 * 5 + 1));
  // The default 0.01 of 1000 blocks: 10 kept back.
  EXPECT_EQ(BlockManager(16, 1000, 0, 0.01).watermark_blocks(), 10);
}

TEST(PagedBlockManager, SwapRoundTripKeepsTables) {
  BlockManager b(4, 8, 8, 0.0);
  b.allocate(1, 9);  // 3 blocks
  b.allocate(2, 4);  // 1 block
  const std::vector<int32_t> before = b.table(1);
  const BlockMapping out = b.swap_out(1);
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].first, before[i]) << "gpu block of logical block " << i;
  EXPECT_FALSE(b.on_gpu(1));
  EXPECT_EQ(b.free_gpu_blocks(), 7);
  EXPECT_EQ(b.free_cpu_blocks(), 5);
  EXPECT_FALSE(b.can_append_slot(1));  // swapped out: no decode
  EXPECT_THROW(b.swap_out(1), Error);
  ASSERT_TRUE(b.can_swap_in(1));
  const BlockMapping in = b.swap_in(1);
  ASSERT_EQ(in.size(), 3u);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(in[i].first, out[i].second) << "logical block " << i << " comes back from where it went";
    EXPECT_EQ(in[i].second, b.table(1)[i]);
  }
  EXPECT_EQ(b.table(1).size(), before.size());
  EXPECT_EQ(b.tokens(1), 9);
  EXPECT_EQ(b.free_cpu_blocks(), 8);
  b.free(1);
  b.free(2);
  EXPECT_EQ(b.free_gpu_blocks(), 8);
  // The CPU pool cannot take a sequence larger than its free blocks.
  BlockManager small(4, 8, 2, 0.0);
  small.allocate(1, 12);
  EXPECT_FALSE(small.can_swap_out(1));
  EXPECT_THROW(small.swap_out(1), Error);
  EXPECT_TRUE(small.on_gpu(1));
}

TEST(PagedScheduler, FcfsAdmissionAndBudgets) {
  // max_num_seqs 2, 20 prompt tokens a step: 1 and 2 go first (3 would make 24 tokens and 3 running).
  Driver d(sched_config(Preemption::kSwap, 2, 20), BlockManager(4, 100, 0, 0.0));
  d.add(1, 8, 3), d.add(2, 8, 3), d.add(3, 8, 3), d.add(4, 30, 2);
  PagedStepPlan p = d.step();
  EXPECT_EQ(p.prefill, (std::vector<uint64_t>{1, 2}));
  p = d.step();  // nothing fits (2 running): decode
  EXPECT_EQ(p.decode, (std::vector<uint64_t>{1, 2}));
  d.step();  // 1 and 2 finish
  p = d.step();
  // 3 (8 tokens) then 4 (30): 38 > 20, so 3 alone; the first prompt goes whatever its length.
  EXPECT_EQ(p.prefill, (std::vector<uint64_t>{3}));
  d.run();
  bool four_alone = false;
  for (const PagedStepPlan& q : d.plans) four_alone |= q.prefill == std::vector<uint64_t>{4};
  EXPECT_TRUE(four_alone) << "a prompt over max_num_batched_tokens still runs, alone";
  EXPECT_EQ(d.s.blocks().free_gpu_blocks(), 100);
}

TEST(PagedScheduler, PromptTooLargeIsRefusedNamingIt) {
  PagedScheduler s(sched_config(Preemption::kSwap), BlockManager(16, 10, 0, 0.0));
  const std::string msg = error_message<Error>([&] { s.add(42, 200, 200); });
  EXPECT_THAT(msg, HasSubstr("request 42"));
  EXPECT_THAT(msg, HasSubstr("10 GPU blocks"));
  EXPECT_TRUE(s.idle());  // nothing queued
  s.add(43, 16, 16 * 9);  // 9 blocks + 1 to swap in: fits exactly
  EXPECT_EQ(s.waiting(), 1u);
}

// Four sequences grow until the GPU blocks run out: the youngest running sequence is preempted first,
// swapped out then back in; every sequence finishes and every block comes back.
TEST(PagedScheduler, SwapPreemptsYoungestAndRoundTrips) {
  Driver d(sched_config(Preemption::kSwap), BlockManager(4, 12, 32, 0.0));
  for (uint64_t id = 1; id <= 4; ++id) d.add(id, 4, 12);  // 1 block each at first, up to 4 (15 positions)
  d.run();
  std::vector<uint64_t> victims;
  size_t swap_ins = 0;
  for (const PagedStepPlan& p : d.plans) {
    for (const Preempted& q : p.preempted) {
      victims.push_back(q.seq);
      EXPECT_EQ(q.how, Preemption::kSwap);
      EXPECT_FALSE(q.fallback);
    }
    swap_ins += p.swap_in.size();
    EXPECT_TRUE(p.swap_in.empty() || p.preempted.empty()) << "swap-in only in steps without preemption";
  }
  ASSERT_FALSE(victims.empty()) << "12 blocks for 4 x 4: someone must be preempted";
  EXPECT_EQ(victims.front(), 4u) << "the youngest (latest arrival) goes first";
  EXPECT_GT(swap_ins, 0u);
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(d.made[id], 12) << "sequence " << id;
  EXPECT_EQ(d.s.blocks().free_gpu_blocks(), 12);
  EXPECT_EQ(d.s.blocks().free_cpu_blocks(), 32);
}

TEST(PagedScheduler, RecomputeRequeuesAtTheFront) {
  Driver d(sched_config(Preemption::kRecompute), BlockManager(4, 12, 0, 0.0));
  for (uint64_t id = 1; id <= 4; ++id) d.add(id, 4, 12);
  d.add(5, 40, 1);  // waits behind them (10 blocks: not while they run)
  bool seen = false, reprefilled = false;
  while (!d.s.idle()) {
    const std::map<uint64_t, int64_t> made_before = d.made;
    const PagedStepPlan p = d.step();
    // A recomputed sequence is prefilled over its prompt and every token generated so far (Driver::step
    // checked that its table covered exactly its tokens).
    for (uint64_t id : p.prefill)
      if (made_before.at(id) > 0) {
        reprefilled = true;
        EXPECT_EQ(d.last_prefill_tokens.at(id), d.prompt[id] + made_before.at(id)) << "sequence " << id;
      }
    if (!p.preempted.empty() && !seen) {
      seen = true;
      EXPECT_EQ(p.preempted.front().seq, 4u);
      EXPECT_EQ(p.preempted.front().how, Preemption::kRecompute);
      EXPECT_TRUE(p.swap_out.empty());
      ASSERT_FALSE(d.s.waiting_queue().empty());
      EXPECT_EQ(d.s.waiting_queue().front(), p.preempted.back().seq) << "re-queued at the front, before 5";
      EXPECT_EQ(d.s.waiting_queue().back(), 5u);
      EXPECT_FALSE(d.s.blocks().has(4u)) << "its blocks are freed";
    }
    ASSERT_LT(d.plans.size(), 1000u);
  }
  EXPECT_TRUE(seen);
  EXPECT_TRUE(reprefilled);
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(d.made[id], 12);
  EXPECT_EQ(d.s.blocks().free_gpu_blocks(), 12);
}

// Swap with a CPU pool too small for the victim: vLLM's fallback to recompute, marked as such.
TEST(PagedScheduler, SwapFallsBackToRecomputeWhenCpuPoolIsFull) {
  Driver d(sched_config(Preemption::kSwap), BlockManager(4, 12, 1, 0.0));
  for (uint64_t id = 1; id <= 4; ++id) d.add(id, 4, 12);
  d.run();
  size_t fallbacks = 0;
  for (const PagedStepPlan& p : d.plans)
    for (const Preempted& q : p.preempted) fallbacks += q.fallback && q.how == Preemption::kRecompute;
  EXPECT_GT(fallbacks, 0u);
  EXPECT_EQ(d.s.blocks().free_gpu_blocks(), 12);
  EXPECT_EQ(d.s.blocks().free_cpu_blocks(), 1);
}

TEST(PagedSwapConfig, ParsesFromAnExperimentAndRefusesBadKeys) {
  auto experiment = [](json engine) {
    json j = json::parse(R"({"name": "t", "model": {"config": "models/tiny-llama.json", "weights": {"seed": 3}},
                             "workload": {"requests": 2, "prompt_len": 8, "gen_len": 8}})");
    j["engine"] = engine;
    return parse_experiment(j, repo_path("experiments/test.json"));
  };
  const ExperimentConfig e = experiment({{"type", "paged-swap"}, {"num_gpu_blocks", 64}, {"preemption", "recompute"}});
  const auto& c = std::any_cast<const PagedSwapConfig&>(e.engine.config);
  EXPECT_EQ(c.num_gpu_blocks, 64);
  EXPECT_EQ(c.preemption, "recompute");
  EXPECT_EQ(c.block_size, 16);
  EXPECT_DOUBLE_EQ(c.watermark, 0.01);
  EXPECT_EQ(c.max_num_seqs, 256);
  EXPECT_EQ(c.max_num_batched_tokens, 4096);
  EXPECT_DOUBLE_EQ(c.swap_space_gb, 4);
  EXPECT_EQ(c.dtype, "fp16");
  EXPECT_EQ(e.resolved()["engine"]["num_gpu_blocks"], 64);
  auto err = [&](json engine) { return error_message<ConfigError>([&] { experiment(engine); }); };
  EXPECT_THAT(err({{"type", "paged-swap"}, {"block_sise", 16}}), HasSubstr("block_sise"));
  EXPECT_THAT(err({{"type", "paged-swap"}, {"preemption", "drop"}}), HasSubstr("preemption"));
  EXPECT_THAT(err({{"type", "paged-swap"}, {"block_size", 0}}), HasSubstr("block_size"));
  EXPECT_THAT(err({{"type", "paged-swap"}, {"watermark", 0.9}}), HasSubstr("watermark"));
  EXPECT_THAT(err({{"type", "paged-swap"}, {"swap_space_gb", -1}}), HasSubstr("swap_space_gb"));
  EXPECT_THAT(err({{"type", "paged-swap"}, {"dtype", "fp8"}}), HasSubstr("dtype"));
  EXPECT_THAT(err({{"type", "paged-swap"}, {"cuda_graphs", true}}), HasSubstr("cuda_graphs"));
  EXPECT_THAT(err({{"type", "paged-swap"}, {"max_num_seqs", 0}}), HasSubstr("max_num_seqs"));
}

TEST(PagedSwapConfig, GpuBlocksFromTheMemoryBudget) {
  const ModelConfig c = load_model_config(repo_path("experiments/models/llama-2-7b.json"));
  // Llama-2-7b: 6.74e9 params (13.5 GB fp16), 0.5 MiB of KV per token, 8 MiB per 16-token block.
  EXPECT_DOUBLE_EQ(paged_swap_block_bytes(c, 16), 16.0 * 32 * 2 * 4096 * 2);
  const double weights = double(c.num_params()) * 2, reserve = double(1ull << 30);
  EXPECT_EQ(paged_swap_gpu_blocks(c, 80e9, 16), int64_t((80e9 - weights - reserve) / (16.0 * 524288)));
  EXPECT_EQ(paged_swap_gpu_blocks(with_layers(c, 2), 80e9, 16), paged_swap_gpu_blocks(c, 80e9, 16))
      << "block counts from full-depth accounting";
  EXPECT_EQ(paged_swap_gpu_blocks(c, 14e9, 16), 0);
}
