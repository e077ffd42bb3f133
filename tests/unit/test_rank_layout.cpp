// The S-rank layout every engine with tensor/pipeline ranks shares (fastdecode/spart/rank_layout.h): T, P, G and
// the stages, the GPU of each rank under each engine's rule (RankGpus), each rank's weights, the ranks' notes.
#include "fastdecode/spart/rank_layout.h"

#include <cstring>

#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::repo_path;
using ::testing::HasSubstr;

namespace {

ModelConfig tiny_gqa() { return load_model_config(repo_path("experiments/models/tiny-llama-gqa.json")); }  // 4 heads, 2 KV

ParallelConfig parallel(int64_t T, int64_t P, std::vector<int64_t> devices = {}) {
  ParallelConfig pc;
  pc.tensor = T, pc.pipeline = P, pc.devices = std::move(devices);
  return pc;
}

}  // namespace

TEST(RankLayout, OneRankIsOneStageOfEveryLayerWithNothingChecked) {
  const ModelConfig c = tiny_gqa();
  const RankLayout l = rank_layout(c, parallel(1, 1));
  EXPECT_EQ(l.T, 1);
  EXPECT_EQ(l.P, 1);
  EXPECT_EQ(l.G, 1);
  EXPECT_EQ(l.stages, (std::vector<std::pair<int64_t, int64_t>>{{0, c.num_layers}}));
  EXPECT_TRUE(l.devices.empty());
}

TEST(RankLayout, StagesAndRanksOfTensorTimesPipeline) {
  const ModelConfig c = tiny_gqa();
  ParallelConfig pc = parallel(2, 2);
  pc.layers = {1, c.num_layers - 1};
  const RankLayout l = rank_layout(c, pc);
  EXPECT_EQ(l.G, 4);
  EXPECT_EQ(l.stages, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, c.num_layers}}));
  EXPECT_EQ(l.tp_rank(3), 1);
  EXPECT_EQ(l.pp_rank(3), 1);
  EXPECT_EQ(l.tp_rank(2), 0);
  EXPECT_EQ(l.pp_rank(1), 0);
}

TEST(RankLayout, RefusalsNameTheKey) {
  const ModelConfig c = tiny_gqa();
  EXPECT_THAT(error_message<ConfigError>([&] { rank_layout(c, parallel(4, 1)); }), HasSubstr("engine.parallel.tensor"));
  EXPECT_THAT(error_message<ConfigError>([&] { rank_layout(c, parallel(1, c.num_layers + 1)); }),
              HasSubstr("engine.parallel.pipeline"));
}

// The engines' rules for the GPU of each rank: FastDecode's cpu backend none (kNone), its cuda backend one per rank
// when G > 1 (kParallel), the GPU-only baseline also a listed GPU for its one rank (kParallelOrListed).
TEST(RankLayout, GpusOfEachEngineRule) {
  const ModelConfig c = tiny_gqa();
  const auto place = [&](const ParallelConfig& pc, RankGpus which, int64_t n) {
    RankLayout l = rank_layout(c, pc);
    place_ranks(l, pc, which, n, "test engine");
    return l.devices;
  };
  EXPECT_EQ(place(parallel(2, 2), RankGpus::kNone, 0), (std::vector<int>{0, 0, 0, 0}));  // no GPU asked, none needed
  EXPECT_EQ(place(parallel(2, 2), RankGpus::kParallel, 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(place(parallel(1, 2), RankGpus::kParallel, 1), (std::vector<int>{0, 0}));  // stages share GPU 0
  EXPECT_EQ(place(parallel(1, 1, {1}), RankGpus::kParallel, 2), (std::vector<int>{0}));
  EXPECT_EQ(place(parallel(1, 1, {1}), RankGpus::kParallelOrListed, 2), (std::vector<int>{1}));
  EXPECT_EQ(place(parallel(1, 1), RankGpus::kParallelOrListed, 2), (std::vector<int>{0}));
  EXPECT_EQ(place(parallel(2, 1, {0, 0}), RankGpus::kParallel, 1), (std::vector<int>{0, 0}));
  const std::string few = error_message<ConfigError>([&] { place(parallel(2, 1), RankGpus::kParallel, 1); });
  EXPECT_THAT(few, HasSubstr("test engine"));
  EXPECT_THAT(few, HasSubstr("needs 2 GPUs, one per rank"));
  EXPECT_THAT(error_message<ConfigError>([&] { place(parallel(1, 1, {1}), RankGpus::kParallelOrListed, 1); }),
              HasSubstr("engine.parallel.devices"));
}

TEST(RankLayout, WeightsOfEachRank) {
  const ModelConfig c = tiny_gqa();
  auto src = make_random_source(5, DType::F16);
  const ModelWeights whole = load_model_weights(c, *src);
  const std::vector<ModelWeights> one = load_rank_weights(rank_layout(c, parallel(1, 1)), c, *src);
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(one[0].embed.size(), whole.embed.size());
  EXPECT_EQ(std::memcmp(one[0].embed.data(), whole.embed.data(), whole.embed.size() * sizeof(float)), 0);
  const RankLayout l = rank_layout(c, parallel(2, 2));
  const std::vector<ModelWeights> parts = load_rank_weights(l, c, *src);
  ASSERT_EQ(parts.size(), 4u);
  for (size_t g = 0; g < parts.size(); ++g) {
    const auto [begin, end] = l.stages[size_t(l.pp_rank(g))];
    EXPECT_EQ(parts[g].cfg.num_layers, end - begin) << "rank " << g;
    EXPECT_EQ(parts[g].cfg.num_heads, c.num_heads / 2) << "rank " << g;
  }
}

TEST(RankLayout, NotesOfRanksOnGpus) {
  const ModelConfig c = tiny_gqa();
  RankLayout one = rank_layout(c, parallel(1, 1));
  one.devices = {0};
  EXPECT_TRUE(rank_notes(one, RankComms{}).empty());
  RankLayout two = rank_layout(c, parallel(1, 2));
  two.devices = {0, 0};
  const std::vector<std::string> n = rank_notes(two, RankComms{});
  ASSERT_EQ(n.size(), 2u);
  EXPECT_THAT(n[0], HasSubstr("S-ranks share a GPU (devices [0,0])"));
  EXPECT_THAT(n[1], HasSubstr("pipeline hand-offs go through pinned host memory"));
}
