#include "harness/experiment.h"

#include "fastdecode/sworker/fastdecode_engine.h"

#include <algorithm>

#include "fastdecode/core/stats.h"
#include "harness/runner.h"
#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::repo_path;
using ::testing::HasSubstr;

namespace {

json base_config() {
  return json::parse(R"({
    "name": "t",
    "model": {"config": "models/tiny-llama.json", "weights": {"seed": 3, "dtype": "fp16"}},
    "workload": {"requests": 4, "prompt_len": 8, "gen_len": 8},
    "engine": {"type": "reference"}
  })");
}

// Configs are parsed as if they lived in experiments/ so relative model paths resolve.
const std::string kFile = repo_path("experiments/test.json");

std::string config_error(const json& j) {
  return error_message<ConfigError>([&] { parse_experiment(j, kFile); });
}

}  // namespace

TEST(Experiment, ParsesQuickstart) {
  const ExperimentConfig e = load_experiment(repo_path("experiments/quickstart.json"));
  EXPECT_EQ(e.name, "quickstart");
  EXPECT_EQ(e.engine.type, "fastdecode");
  const auto& fd = std::any_cast<const FastDecodeConfig&>(e.engine.config);
  EXPECT_EQ(fd.rworkers.spawn, 2);
  EXPECT_TRUE(fd.rworkers.endpoints.empty());
  // "auto" stays in the config; the engine decides when it is made (where the GPU is asked).
  EXPECT_EQ(fd.backend, "auto");
  EXPECT_EQ(e.model.name, "small-llama");
  EXPECT_GT(e.workload.requests, 0);
  EXPECT_FALSE(e.workload.prompt_len.fixed());
  EXPECT_EQ(e.resolved()["model"]["layers"], e.model.num_layers);
}

TEST(Experiment, DefaultsAndOverrides) {
  json j = base_config();
  j["model"]["layers"] = 1;
  j["sampling"] = {{"temperature", 0.7}, {"top_k", 40}, {"top_p", 0.9}, {"seed", 5}};
  j["hardware"] = {{"gpu", {{"memory_gb", 24}, {"sm_count", 16}}}, {"rworkers", {{"count", 2}, {"threads", 4}}}};
  const ExperimentConfig e = parse_experiment(j, kFile);
  EXPECT_EQ(e.model.num_layers, 1);
  EXPECT_EQ(e.model.full_num_layers, 2);
  EXPECT_DOUBLE_EQ(e.sampling.temperature, 0.7);
  EXPECT_EQ(e.sampling.top_k, 40);
  EXPECT_EQ(e.hardware.gpu_sm_count, 16);
  EXPECT_EQ(e.hardware.rworkers, 2);
  EXPECT_EQ(e.weights.dtype, DType::F16);
  EXPECT_EQ(e.output_dir, "results");
}

TEST(Experiment, BadConfigsNameFileAndKey) {
  const auto with = [](const std::function<void(json&)>& f) {
    json j = base_config();
    f(j);
    return config_error(j);
  };
  EXPECT_THAT(with([](json& j) { j["worklaod"] = 1; }), HasSubstr("test.json: worklaod: unknown key"));
  EXPECT_THAT(with([](json& j) { j["workload"]["prompt_length"] = 1; }),
              HasSubstr("test.json: workload.prompt_length: unknown key"));
  EXPECT_THAT(with([](json& j) { j["workload"]["requests"] = "4"; }),
              HasSubstr("workload.requests: expected an integer"));
  EXPECT_THAT(with([](json& j) { j["workload"]["requests"] = 0; }), HasSubstr("workload.requests: value 0 out of range"));
  EXPECT_THAT(with([](json& j) { j["workload"]["requests"] = 2.5; }), HasSubstr("workload.requests: expected an integer"));
  EXPECT_THAT(with([](json& j) { j["workload"].erase("gen_len"); }), HasSubstr("workload.gen_len: required key is missing"));
  EXPECT_THAT(with([](json& j) { j["workload"]["gen_len"] = 600; }), HasSubstr("workload.gen_len"));
  EXPECT_THAT(with([](json& j) { j["workload"]["prompt_len"] = {{"min", 9}, {"max", 4}}; }),
              HasSubstr("workload.prompt_len: max < min"));
  EXPECT_THAT(with([](json& j) { j["workload"]["prompt_len"] = {{"min", 1}, {"max", 4}, {"mode", 2}}; }),
              HasSubstr("workload.prompt_len.mode: unknown key"));
  EXPECT_THAT(with([](json& j) { j["workload"]["arrival"] = "bursty"; }), HasSubstr("workload.arrival"));
  EXPECT_THAT(with([](json& j) { j["workload"]["arrival"] = "poisson"; }), HasSubstr("workload.rate: required key is missing"));
  EXPECT_THAT(with([](json& j) { j["workload"]["rate"] = 3; }), HasSubstr("workload.rate: only with"));
  EXPECT_THAT(with([](json& j) { j["schedule"] = {{"mode", "sls"}}; }), HasSubstr("schedule.mode: 'sls' is not one of"));
  EXPECT_THAT(with([](json& j) { j["schedule"] = {{"mode", "load-control"}}; }), HasSubstr("schedule.w_lim: required"));
  EXPECT_THAT(with([](json& j) { j["schedule"] = {{"mode", "fixed-interval"}, {"every", 4}}; }),
              HasSubstr("schedule.every: unknown key"));
  EXPECT_THAT(with([](json& j) { j["engine"]["type"] = "vllm"; }), HasSubstr("engine.type: 'vllm' is not one of"));
  EXPECT_THAT(with([](json& j) { j["engine"]["threads"] = -1; }), HasSubstr("engine.threads"));
  EXPECT_THAT(with([](json& j) { j["engine"]["batch"] = 4; }), HasSubstr("engine.batch: unknown key"));
  EXPECT_THAT(with([](json& j) { j["model"]["layers"] = 3; }), HasSubstr("model.layers: value 3 out of range"));
  EXPECT_THAT(with([](json& j) { j["model"]["weights"]["dtype"] = "int8"; }), HasSubstr("model.weights.dtype"));
  EXPECT_THAT(with([](json& j) { j["model"]["weights"]["dir"] = "/tmp"; }), HasSubstr("not both"));
  EXPECT_THAT(with([](json& j) { j["model"]["config"] = "models/nope.json"; }), HasSubstr("nope.json: cannot open"));
  EXPECT_THAT(with([](json& j) { j["sampling"] = {{"top_p", 1.5}}; }), HasSubstr("sampling.top_p"));
  EXPECT_THAT(with([](json& j) { j["sampling"] = {{"temperature", -1}}; }), HasSubstr("sampling.temperature"));
  EXPECT_THAT(with([](json& j) { j["hardware"] = {{"gpu", {{"sm_count", 0}}}}; }), HasSubstr("hardware.gpu.sm_count"));
  EXPECT_THAT(with([](json& j) { j["hardware"] = {{"cpu", 1}}; }), HasSubstr("hardware.cpu: unknown key"));
  EXPECT_THAT(with([](json& j) { j["output"] = {{"dir", ""}}; }), HasSubstr("output.dir"));
  EXPECT_THAT(config_error(json::array()), HasSubstr("must be a JSON object"));
}

TEST(Experiment, ScheduleAndArrivals) {
  json j = base_config();
  const ExperimentConfig d = parse_experiment(j, kFile);
  EXPECT_EQ(d.schedule.mode, AdmitMode::AllAtOnce);  // default: every request in one batch
  EXPECT_EQ(d.schedule.batch, 4);
  EXPECT_EQ(arrival_times(d.workload), std::vector<double>(4, 0.0));
  j["schedule"] = {{"mode", "fixed-interval"}, {"batch", 4}, {"interval", 2}};
  j["workload"]["arrival"] = "poisson";
  j["workload"]["rate"] = 50.0;
  const ExperimentConfig e = parse_experiment(j, kFile);
  EXPECT_EQ(e.schedule.mode, AdmitMode::FixedInterval);
  EXPECT_EQ(e.schedule.seq, 8);  // defaults to the generation length
  const auto t = arrival_times(e.workload);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_GT(t[0], 0.0);
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  EXPECT_EQ(e.resolved()["schedule"]["mode"], "fixed-interval");
}

TEST(Experiment, RequestsAreSeededAndInRange) {
  ExperimentConfig e = parse_experiment(base_config(), kFile);
  e.workload.prompt_len = {3, 20};
  e.workload.gen_len = {1, 9};
  const auto a = make_requests(e.workload, e.model);
  const auto b = make_requests(e.workload, e.model);
  ASSERT_EQ(a.size(), 4u);
  bool lengths_differ = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_GE(a[i].prompt.size(), 3u);
    EXPECT_LE(a[i].prompt.size(), 20u);
    EXPECT_GE(a[i].max_new_tokens, 1);
    EXPECT_LE(a[i].max_new_tokens, 9);
    lengths_differ |= a[i].prompt.size() != a[0].prompt.size();
    for (int32_t t : a[i].prompt) {
      EXPECT_GT(t, e.model.eos_token_id);
      EXPECT_LT(t, e.model.vocab_size);
    }
  }
  EXPECT_TRUE(lengths_differ);
  // More requests leave the first ones unchanged; another seed changes them.
  e.workload.requests = 9;
  EXPECT_EQ(make_requests(e.workload, e.model)[2].prompt, a[2].prompt);
  e.workload.seed = 1;
  EXPECT_NE(make_requests(e.workload, e.model)[2].prompt, a[2].prompt);
}

TEST(Experiment, PercentileMatchesNumpyLinear) {
  // numpy.percentile([1, 2, 3, 4, 10], q) for q = 0, 50, 90, 99, 100 (linear interpolation)
  const std::vector<double> v = {4, 1, 10, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 3.0);
  EXPECT_NEAR(percentile(v, 90), 7.6, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 9.76, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
  // The one median: percentile 50, the mean of the two middle values for an even count.
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({5, 1, 3}), 3.0);
  const json d = distribution(v);
  EXPECT_DOUBLE_EQ(d["mean"].get<double>(), 4.0);
  EXPECT_EQ(d["count"], 5);
}
