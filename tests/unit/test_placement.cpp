// place_sequence (fastdecode/sched/placement.h): where the FastDecode engine puts a new sequence. Expectations
// computed by hand from the definition (docs/SCHEDULING.md, "Placement").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fastdecode/sched/placement.h"
#include "tests/unit/test_helpers.h"

using namespace fd;
using ::testing::HasSubstr;

TEST(Placement, OverlapIsTheSumOverTheCommonSteps) {
  // (3 + t)(5 + t) for t = 0, 1, 2: 15 + 24 + 35.
  EXPECT_DOUBLE_EQ(placement_overlap(3, 5, 3), 74);
  EXPECT_DOUBLE_EQ(placement_overlap(3, 5, 1), 15);
  EXPECT_DOUBLE_EQ(placement_overlap(3, 5, 0), 0);
  EXPECT_DOUBLE_EQ(placement_overlap(3, 5, -2), 0);
}

TEST(Placement, GoesWhereTheFutureLoadsItSharesAreSmallest) {
  // Worker 0: an old sequence (103 tokens, 5 steps left; projected 108). Worker 1: a young one (8 tokens, 20 left;
  // projected 28). A new one of 8 tokens and 20 steps: against worker 0 it overlaps 5 steps, sum (103 + t)(8 + t) =
  // 5260; against worker 1 all 20, sum (8 + t)^2 = 6790. Worker 0, though its projected load is the larger.
  const std::vector<PlacedLoad> running = {{0, 103, 5}, {1, 8, 20}};
  EXPECT_DOUBLE_EQ(placement_overlap(103, 8, 5), 5260);
  EXPECT_DOUBLE_EQ(placement_overlap(8, 8, 20), 6790);
  EXPECT_EQ(place_sequence({108, 28}, {false, false}, running, 8, 20, 28, 108), 0u);
  // Worker 0 dead: worker 1, whatever the cost.
  EXPECT_EQ(place_sequence({108, 28}, {true, false}, running, 8, 20, 28, 108), 1u);
  // The memory bound: with the longest sequence 28 (as if the old one were not), the mean after is (108 + 28 + 28) / 2
  // = 82 and worker 0 would reach 136 > 82 + 28: only worker 1 qualifies.
  EXPECT_EQ(place_sequence({108, 28}, {false, false}, running, 8, 20, 28, 28), 1u);
}

TEST(Placement, EmptyWorkersTieToTheSmallerLoadThenTheLowerIndex) {
  // Nothing running: every cost is 0; the smaller projected load wins, then the lower index.
  EXPECT_EQ(place_sequence({50, 20, 20}, {false, false, false}, {}, 8, 20, 28, 28), 1u);
  EXPECT_EQ(place_sequence({0, 0, 0}, {false, false, false}, {}, 8, 20, 28, 28), 0u);
  // A micro-batch of equal sequences admitted together spreads: after one lands on worker 0 it costs the next more.
  std::vector<PlacedLoad> r = {{0, 8, 20}};
  EXPECT_EQ(place_sequence({28, 0, 0}, {false, false, false}, r, 8, 20, 28, 28), 1u);
  r.push_back({1, 8, 20});
  EXPECT_EQ(place_sequence({28, 28, 0}, {false, false, false}, r, 8, 20, 28, 28), 2u);
}

TEST(Placement, NoLiveWorkerIsAnError) {
  EXPECT_THAT(fd::test::error_message([] { place_sequence({0, 0}, {true, true}, {}, 8, 20, 28, 28); }),
              HasSubstr("no R-worker left"));
}

TEST(Placement, UnequalWorkersWeighTheirSecondsPerToken) {
  // Worker 0 holds a sequence of 100 tokens with 20 steps left; worker 1 nothing. A new one of 8 tokens and 20 steps:
  // overlap with worker 0 = sum_{t<20} (100 + t)(8 + t) = 38 990; with itself sum (8 + t)^2 = 6 790.
  const std::vector<PlacedLoad> running = {{0, 100, 20}};
  EXPECT_DOUBLE_EQ(placement_overlap(100, 8, 20), 38990);
  // Equal workers: the empty one.
  EXPECT_EQ(place_sequence({120, 0}, {false, false}, running, 8, 20, 28, 120), 1u);
  // Worker 1 three times slower: 1 x (2 x 38 990 + 6 790) = 84 770 against 9 x 6 790 = 61 110: still worker 1.
  EXPECT_EQ(place_sequence({120, 0}, {false, false}, running, 8, 20, 28, 120, {1.0, 3.0}), 1u);
  // Four times slower: 16 x 6 790 = 108 640 > 84 770: worker 0.
  EXPECT_EQ(place_sequence({120, 0}, {false, false}, running, 8, 20, 28, 120, {1.0, 4.0}), 0u);
  EXPECT_THAT(fd::test::error_message([&] { place_sequence({0, 0}, {false, false}, {}, 8, 20, 28, 28, {1.0}); }),
              HasSubstr("1 speeds for 2 workers"));
}
