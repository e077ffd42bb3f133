// attention_input into parts (fastdecode/spart/spart.h, HostRowsOut) on the CPU S-Part, and resolve_rows's checks.
// The CUDA S-Part's parts: tests/gpu/test_cuda_spart.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fastdecode/spart/spart.h"
#include "spart_parts_check.h"
#include "test_helpers.h"

using namespace fd;

TEST(SPartParts, CpuAttentionInputIntoPartsIsTheWholeSplit) {
  const ModelConfig c = load_model_config(fd::test::repo_path("experiments/models/tiny-llama-gqa.json"));
  auto src = make_random_source(5, DType::F16);
  const ModelWeights w = load_model_weights(c, *src);
  auto sp = make_cpu_spart(w);
  for (const DType dt : {DType::F32, DType::F16})
    for (const bool with_q : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (with_q ? " with q" : " without q"));
      fd::test::check_attention_input_parts(*sp, dt, with_q);
    }
}

TEST(SPartParts, ResolveRowsChecksTheParts) {
  float buf[4];
  const HostRowsOut all{buf, buf, buf};
  const std::vector<HostRowsOut> one = resolve_rows({all}, 7);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].rows, 7);
  EXPECT_EQ(resolve_rows({{buf, buf, buf, 3}, {nullptr, nullptr, nullptr, 0}, {buf, buf, buf, 4}}, 7).size(), 2u)
      << "the empty part dropped";
  const std::vector<HostRowsOut> kv = resolve_rows({{nullptr, nullptr, nullptr, 0}, {nullptr, buf, buf, 7}}, 7);
  ASSERT_EQ(kv.size(), 1u);
  EXPECT_EQ(kv[0].q, nullptr) << "out[0] says q is not wanted";
  EXPECT_EQ(resolve_rows({all}, 0).size(), 1u) << "an empty slot keeps one empty part";
  const auto msg = [](const std::vector<HostRowsOut>& p, int64_t T) { return fd::test::error_message([&] { resolve_rows(p, T); }); };
  EXPECT_THAT(msg({{buf, buf, buf, 3}, {buf, buf, buf, 3}}, 7), ::testing::HasSubstr("6 rows in the parts for a slot of 7"));
  EXPECT_THAT(msg({all, {buf, buf, buf, 3}}, 7), ::testing::HasSubstr("kAllRows only as the single part"));
  EXPECT_THAT(msg({{buf, buf, buf, -2}}, 7), ::testing::HasSubstr("a part of -2 rows"));
  EXPECT_THAT(msg({{buf, nullptr, buf, 7}}, 7), ::testing::HasSubstr("no place for k or v"));
  EXPECT_THAT(msg({{buf, buf, buf, 3}, {nullptr, buf, buf, 4}}, 7), ::testing::HasSubstr("q in some parts and not in others"));
  EXPECT_THAT(msg({}, 7), ::testing::HasSubstr("no destination"));
}
