#include "harness/experiment.h"

#include "fastdecode/sworker/fastdecode_config.h"

#include <algorithm>
#include <cstring>
#include <fstream>

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

// hardware.gpu as summary.json's resolved config writes it when unset (0: the device's own memory and SMs) is
// accepted and means the same as leaving the keys out (a sweep axis can name "the whole device" so).
TEST(Experiment, GpuZerosMeanTheDevice) {
  const ExperimentConfig unset = parse_experiment(base_config(), kFile);
  EXPECT_EQ(unset.resolved()["hardware"]["gpu"], (json{{"memory_gb", 0.0}, {"sm_count", 0}, {"gemm_table", "auto"}}));
  json j = base_config();
  j["hardware"] = {{"gpu", {{"memory_gb", 0}, {"sm_count", 0}}}};
  const ExperimentConfig zeros = parse_experiment(j, kFile);
  EXPECT_EQ(zeros.hardware.gpu_memory_gb, 0.0);
  EXPECT_EQ(zeros.hardware.gpu_sm_count, 0);
  EXPECT_EQ(zeros.resolved()["hardware"], unset.resolved()["hardware"]);
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
  EXPECT_THAT(with([](json& j) { j["hardware"] = {{"gpu", {{"sm_count", -1}}}}; }), HasSubstr("hardware.gpu.sm_count"));
  EXPECT_THAT(with([](json& j) { j["hardware"] = {{"gpu", {{"memory_gb", -0.5}}}}; }), HasSubstr("hardware.gpu.memory_gb"));
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

// ---------------------------------------------------------------------------------------------------
// Workload files (workload.prompts / score / trace), output.logits, --set overrides (issue 11).

namespace {

using fd::test::TempDir;

// A config in `d` (so relative paths resolve there) with the tiny model (vocab 256, 512 positions).
json file_config(const std::string& key, const std::string& file) {
  json j = base_config();
  j["model"]["config"] = repo_path("experiments/models/tiny-llama.json");
  j["workload"] = {{key, file}};
  return j;
}

std::string write(const TempDir& d, const std::string& name, const std::string& text) {
  std::ofstream(d.file(name)) << text;
  return d.file(name);
}

}  // namespace

TEST(ExperimentFiles, PromptsFileGivesRequests) {
  TempDir d("prompts");
  write(d, "p.jsonl",
        "{\"prompt\": [5, 6, 7], \"gen_len\": 4}\n\n"
        "{\"prompt\": [9], \"gen_len\": 2, \"max_gen_len\": 6, \"temperature\": 0.8, \"seed\": 11}\n"
        "{\"prompt\": [10, 11], \"gen_len\": 3, \"top_k\": 5, \"top_p\": 0.5}\n");
  json j = file_config("prompts", "p.jsonl");
  j["sampling"] = {{"temperature", 0.3}, {"top_k", 7}, {"seed", 2}};
  const ExperimentConfig e = parse_experiment(j, d.file("exp.json"));
  EXPECT_EQ(e.workload.source, "prompts");
  EXPECT_EQ(e.workload.prompts_file, d.file("p.jsonl"));
  EXPECT_EQ(e.workload.requests, 3);  // defaults to the file's requests (blank lines skipped)
  EXPECT_EQ(e.workload.file_requests[1].where, d.file("p.jsonl") + ":3");
  EXPECT_EQ(e.workload.gen_len.max, 6);  // the scheduler's projection: max_gen_len
  EXPECT_EQ(e.schedule.seq, 6);
  const auto r = make_requests(e.workload, e.model, e.sampling);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r[0].max_new_tokens, 4);
  EXPECT_FALSE(r[0].sampling.has_value());  // no override: the run's sampling
  EXPECT_EQ(r[1].prompt, std::vector<int32_t>{9});
  EXPECT_EQ(r[1].max_new_tokens, 2);
  ASSERT_TRUE(r[1].sampling.has_value());  // merged over the run's: temperature and seed overridden
  EXPECT_DOUBLE_EQ(r[1].sampling->temperature, 0.8);
  EXPECT_EQ(r[1].sampling->seed, 11u);
  EXPECT_EQ(r[1].sampling->top_k, 7);
  ASSERT_TRUE(r[2].sampling.has_value());
  EXPECT_DOUBLE_EQ(r[2].sampling->temperature, 0.3);
  EXPECT_EQ(r[2].sampling->top_k, 5);
  EXPECT_DOUBLE_EQ(r[2].sampling->top_p, 0.5);
  EXPECT_TRUE(r[2].forced.empty());
  EXPECT_FALSE(r[2].record_logits);
  EXPECT_EQ(arrival_times(e.workload), std::vector<double>(3, 0.0));
  EXPECT_EQ(e.resolved()["workload"]["prompts"], d.file("p.jsonl"));
  // requests = the first N lines; more than the file holds is an error.
  j["workload"]["requests"] = 2;
  const ExperimentConfig two = parse_experiment(j, d.file("exp.json"));
  EXPECT_EQ(two.workload.requests, 2);
  EXPECT_EQ(make_requests(two.workload, two.model).size(), 2u);
  j["workload"]["requests"] = 4;
  EXPECT_THAT(error_message<ConfigError>([&] { parse_experiment(j, d.file("exp.json")); }),
              HasSubstr("workload.requests: 4 but " + d.file("p.jsonl") + " holds 3 requests"));
  // Arrivals from the lines with "arrival": "trace".
  write(d, "a.jsonl", "{\"prompt\": [5], \"gen_len\": 1, \"arrival_s\": 0.5}\n{\"prompt\": [5], \"gen_len\": 1, \"arrival_s\": 2}\n");
  json a = file_config("prompts", "a.jsonl");
  a["workload"]["arrival"] = "trace";
  EXPECT_EQ(arrival_times(parse_experiment(a, d.file("exp.json")).workload), (std::vector<double>{0.5, 2.0}));
  write(d, "a.jsonl", "{\"prompt\": [5], \"gen_len\": 1, \"arrival_s\": 0.5}\n{\"prompt\": [5], \"gen_len\": 1}\n");
  EXPECT_THAT(error_message<ConfigError>([&] { parse_experiment(a, d.file("exp.json")); }),
              HasSubstr(d.file("a.jsonl") + ":2: missing key 'arrival_s'"));
  write(d, "a.jsonl", "{\"prompt\": [5], \"gen_len\": 1, \"arrival_s\": 0.5}\n{\"prompt\": [5], \"gen_len\": 1, \"arrival_s\": 0.2}\n");
  EXPECT_THAT(error_message<ConfigError>([&] { parse_experiment(a, d.file("exp.json")); }),
              HasSubstr(d.file("a.jsonl") + ":2: 'arrival_s' decreases"));
}

TEST(ExperimentFiles, ScoreFileForcesContinuations) {
  TempDir d("score");
  write(d, "s.jsonl", "{\"prompt\": [5, 6], \"continuation\": [7, 8, 9]}\n{\"prompt\": [3], \"continuation\": [4]}\n");
  json j = file_config("score", "s.jsonl");
  const ExperimentConfig e = parse_experiment(j, d.file("exp.json"));
  EXPECT_EQ(e.workload.source, "score");
  EXPECT_EQ(e.workload.requests, 2);
  // Every request records its logits (for the score), nothing is written without output.logits.
  EXPECT_EQ(e.logits.requests, (std::vector<uint64_t>{0, 1}));
  EXPECT_FALSE(e.logits.write);
  const auto r = make_requests(e.workload, e.model, e.sampling);
  EXPECT_EQ(r[0].forced, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(r[0].max_new_tokens, 3);
  EXPECT_FALSE(r[0].stop_at_eos);
  EXPECT_EQ(r[1].forced, std::vector<int32_t>{4});
  validate_request(r[0], e.model);
  // output.logits narrows the recorded (and scored) requests.
  j["output"] = {{"logits", {{"requests", {1}}, {"top_k", 3}, {"full", false}}}};
  const ExperimentConfig n = parse_experiment(j, d.file("exp.json"));
  EXPECT_EQ(n.logits.requests, std::vector<uint64_t>{1});
  EXPECT_TRUE(n.logits.write);
  EXPECT_EQ(n.logits.top_k, 3);
  EXPECT_FALSE(n.logits.full);
  EXPECT_EQ(n.resolved()["output"]["logits"]["requests"], json::array({1}));
  // full = N: every request still recorded (and scored), the full rows of the first N only.
  j["output"] = {{"logits", {{"full", 1}}}};
  const ExperimentConfig f = parse_experiment(j, d.file("exp.json"));
  EXPECT_EQ(f.logits.requests, (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(f.logits.full);
  EXPECT_EQ(f.logits.full_requests, 1);
  EXPECT_EQ(f.resolved()["output"]["logits"]["full"], 1);
  j["output"] = {{"logits", {{"full", 3}}}};
  EXPECT_THROW(parse_experiment(j, d.file("exp.json")), ConfigError) << "more full rows than recorded requests";
}

TEST(ExperimentFiles, TraceLinesTakePromptsAndOverrides) {
  TempDir d("trace");
  write(d, "t.jsonl",
        "{\"arrival_s\": 0, \"prompt_len\": 4, \"gen_len\": 3}\n"
        "{\"arrival_s\": 0.25, \"prompt\": [8, 9], \"gen_len\": 2, \"max_gen_len\": 5, \"temperature\": 1.5}\n");
  json j = file_config("trace", "t.jsonl");
  j["workload"]["arrival"] = "trace";
  const ExperimentConfig e = parse_experiment(j, d.file("exp.json"));
  const auto r = make_requests(e.workload, e.model);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].prompt.size(), 4u);  // seeded tokens of prompt_len
  EXPECT_GT(r[0].prompt[0], e.model.eos_token_id);
  EXPECT_EQ(r[1].prompt, (std::vector<int32_t>{8, 9}));
  ASSERT_TRUE(r[1].sampling.has_value());
  EXPECT_DOUBLE_EQ(r[1].sampling->temperature, 1.5);
  EXPECT_EQ(e.workload.file_requests[1].max_gen_len, 5);
  EXPECT_EQ(arrival_times(e.workload), (std::vector<double>{0.0, 0.25}));
}

TEST(ExperimentFiles, BadLinesNameFileAndLine) {
  TempDir d("bad");
  const auto err = [&](const std::string& key, const std::string& line, const std::function<void(json&)>& f = {}) {
    // Line 1 is a good line of the file's kind: the error must name line 2.
    const std::string good = key == "score"   ? "{\"prompt\": [5, 6], \"continuation\": [2]}\n"
                             : key == "trace" ? "{\"arrival_s\": 0, \"prompt_len\": 2, \"gen_len\": 2}\n"
                                              : "{\"prompt\": [5, 6], \"gen_len\": 2}\n";
    const std::string file = write(d, "bad.jsonl", good + line + "\n");
    json j = file_config(key, "bad.jsonl");
    if (f) f(j);
    const std::string msg = error_message<ConfigError>([&] { parse_experiment(j, d.file("exp.json")); });
    EXPECT_THAT(msg, HasSubstr(file + ":2: ")) << line;
    return msg;
  };
  EXPECT_THAT(err("prompts", "{\"prompt\": [5], \"gen_len\": "), HasSubstr("not JSON"));
  EXPECT_THAT(err("prompts", "[1, 2]"), HasSubstr("expected a JSON object"));
  EXPECT_THAT(err("prompts", "{\"gen_len\": 2}"), HasSubstr("missing key 'prompt'"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [], \"gen_len\": 2}"), HasSubstr("'prompt' is empty"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5, \"a\"], \"gen_len\": 2}"), HasSubstr("\"a\" is not a token id"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5, -1], \"gen_len\": 2}"), HasSubstr("-1 is not a token id"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5, 256], \"gen_len\": 2}"), HasSubstr("token id 256 outside the vocabulary [0, 256)"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5]}"), HasSubstr("missing key 'gen_len'"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5], \"gen_len\": -3}"), HasSubstr("'gen_len' = -3 must be >= 1"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5], \"gen_len\": 2, \"max_gen_len\": 1}"), HasSubstr("'max_gen_len' < 'gen_len'"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5], \"gen_len\": 513}"), HasSubstr("needs 513 positions"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5], \"gen_len\": 2, \"temprature\": 1}"), HasSubstr("unknown key 'temprature'"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5], \"gen_len\": 2, \"top_p\": 0}"), HasSubstr("'top_p' must be in (0, 1]"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5], \"gen_len\": 2, \"temperature\": -1}"), HasSubstr("'temperature' must be >= 0"));
  EXPECT_THAT(err("prompts", "{\"prompt\": [5], \"gen_len\": 2, \"arrival_s\": 1}"), HasSubstr("'arrival_s' only with"));
  EXPECT_THAT(err("score", "{\"prompt\": [5], \"continuation\": []}"), HasSubstr("'continuation' is empty"));
  EXPECT_THAT(err("score", "{\"prompt\": [5]}"), HasSubstr("missing key 'continuation'"));
  EXPECT_THAT(err("score", "{\"prompt\": [5], \"continuation\": [300]}"), HasSubstr("forced token id 300 outside the vocabulary"));
  EXPECT_THAT(err("score", "{\"prompt\": [5], \"continuation\": [6], \"gen_len\": 1}"), HasSubstr("unknown key 'gen_len'"));
  EXPECT_THAT(err("trace", "{\"arrival_s\": 0, \"prompt_len\": 2, \"prompt\": [5], \"gen_len\": 1}",
                  [](json& j) { j["workload"]["arrival"] = "trace"; }),
              HasSubstr("not both"));
}

TEST(ExperimentFiles, BadWorkloadAndLogitsKeys) {
  TempDir d("keys");
  write(d, "p.jsonl", "{\"prompt\": [5, 6], \"gen_len\": 2}\n{\"prompt\": [7], \"gen_len\": 3}\n");
  const auto err = [&](const std::function<void(json&)>& f) {
    json j = file_config("prompts", "p.jsonl");
    f(j);
    return error_message<ConfigError>([&] { parse_experiment(j, d.file("exp.json")); });
  };
  EXPECT_THAT(err([](json& j) { j["workload"]["prompt_len"] = 4; }),
              HasSubstr("workload.prompt_len: not allowed with workload.prompts"));
  EXPECT_THAT(err([](json& j) { j["workload"]["gen_len"] = 4; }), HasSubstr("workload.gen_len: not allowed with workload.prompts"));
  EXPECT_THAT(err([](json& j) { j["workload"]["score"] = "p.jsonl"; }), HasSubstr("not prompts and score"));
  EXPECT_THAT(err([](json& j) { j["workload"]["prompts"] = "none.jsonl"; }), HasSubstr("none.jsonl: cannot open prompts file"));
  write(d, "s.jsonl", "{\"prompt\": [5, 6], \"continuation\": [2]}\n");
  EXPECT_THAT(err([](json& j) {
                j["workload"].erase("prompts");
                j["workload"]["score"] = "s.jsonl";
                j["workload"]["stop_at_eos"] = true;
              }),
              HasSubstr("workload.stop_at_eos: not with workload.score"));
  EXPECT_THAT(err([](json& j) { j["output"] = {{"logits", {{"requests", 3}}}}; }),
              HasSubstr("output.logits.requests: the first 3 requests, but the workload has 2"));
  EXPECT_THAT(err([](json& j) { j["output"] = {{"logits", {{"requests", {0, 2}}}}}; }),
              HasSubstr("output.logits.requests: request 2 is not in the workload"));
  EXPECT_THAT(err([](json& j) { j["output"] = {{"logits", {{"requests", {1, 1}}}}}; }), HasSubstr("listed twice"));
  EXPECT_THAT(err([](json& j) { j["output"] = {{"logits", {{"requests", 1}, {"top_k", 257}}}}; }),
              HasSubstr("output.logits.top_k: value 257 out of range"));
  EXPECT_THAT(err([](json& j) { j["output"] = {{"logits", {{"requests", 1}, {"all", true}}}}; }),
              HasSubstr("output.logits.all: unknown key"));
  // A seeded workload takes output.logits too.
  json j = base_config();
  j["output"] = {{"logits", {{"requests", 2}, {"top_k", 4}}}};
  const ExperimentConfig e = parse_experiment(j, kFile);
  EXPECT_EQ(e.logits.requests, (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(e.logits.full);
  EXPECT_FALSE(parse_experiment(base_config(), kFile).logits.write);
  j["output"]["logits"] = {{"top_k", 1}};  // requests left out: all of them
  EXPECT_EQ(parse_experiment(j, kFile).logits.requests, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(parse_experiment(j, kFile).resolved()["output"]["logits"]["requests"], 4);
  EXPECT_TRUE(parse_experiment(base_config(), kFile).logits.requests.empty());
}

TEST(ExperimentOverrides, SetDottedKeys) {
  json j = base_config();
  apply_override(j, "workload.requests=64");
  apply_override(j, "engine.rworkers.kv_dtype=int8");  // not JSON: a string; missing objects created
  apply_override(j, "sampling.top_p=0.5");
  apply_override(j, "name=\"quoted\"");
  apply_override(j, "output.logits={\"requests\": [1], \"top_k\": 2}");
  EXPECT_EQ(j["workload"]["requests"], 64);
  EXPECT_EQ(j["engine"]["rworkers"]["kv_dtype"], "int8");
  EXPECT_EQ(j["sampling"]["top_p"], 0.5);
  EXPECT_EQ(j["name"], "quoted");
  EXPECT_EQ(j["output"]["logits"]["top_k"], 2);
  EXPECT_THAT(error_message<ConfigError>([&] { apply_override(j, "workload.requests.x=1"); }),
              HasSubstr("--set workload.requests.x=1: workload.requests is not an object (it is 64)"));
  EXPECT_THAT(error_message<ConfigError>([&] { apply_override(j, "workload.requests"); }), HasSubstr("expected KEY=VALUE"));
  EXPECT_THAT(error_message<ConfigError>([&] { apply_override(j, "workload..x=1"); }), HasSubstr("empty key"));
  EXPECT_THAT(error_message<ConfigError>([&] { apply_override(j, "=1"); }), HasSubstr("empty key"));
  // Through load_experiment: applied before validation, echoed, and a bad value names the key.
  TempDir d("set");
  json f = base_config();
  f["model"]["config"] = repo_path("experiments/models/tiny-llama.json");
  std::ofstream(d.file("exp.json")) << f.dump();
  const ExperimentConfig e = load_experiment(d.file("exp.json"), {"workload.requests=9", "workload.seed=3"});
  EXPECT_EQ(e.workload.requests, 9);
  EXPECT_EQ(e.workload.seed, 3u);
  EXPECT_EQ(e.resolved()["workload"]["requests"], 9);
  EXPECT_EQ(e.overrides, (std::vector<std::string>{"workload.requests=9", "workload.seed=3"}));
  EXPECT_THAT(error_message<ConfigError>([&] { load_experiment(d.file("exp.json"), {"workload.requests=zero"}); }),
              HasSubstr("workload.requests: expected an integer"));
}

TEST(RunnerNpy, WritesNumpyV1Layout) {
  TempDir d("npy");
  const std::vector<float> v = {1.0f, -2.5f, 3.0f, 4.0f, 5.0f, 6.0f};
  write_npy_f32(d.file("a.npy"), v.data(), 2, 3);
  std::ifstream in(d.file("a.npy"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t hlen = size_t(uint8_t(bytes[8])) | (size_t(uint8_t(bytes[9])) << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  const std::string header = bytes.substr(10, hlen);
  EXPECT_THAT(header, HasSubstr("'descr': '<f4'"));
  EXPECT_THAT(header, HasSubstr("'fortran_order': False"));
  EXPECT_THAT(header, HasSubstr("'shape': (2, 3)"));
  EXPECT_EQ(header.back(), '\n');
  ASSERT_EQ(bytes.size(), 10 + hlen + v.size() * 4);
  std::vector<float> back(v.size());
  std::memcpy(back.data(), bytes.data() + 10 + hlen, v.size() * 4);
  EXPECT_EQ(back, v);
}
