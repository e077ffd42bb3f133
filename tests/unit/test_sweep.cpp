// fd-bench sweep's pure parts: the spec parse (strict), point expansion (product, zip, "keys" axes), folder
// names ("labels" too) and their collisions, run order (interleaved, grouped), the "quick" variant, and the
// headline numbers of a summary.
#include "harness/sweep.h"
#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using ::testing::HasSubstr;

namespace {

const std::string kFile = "/specs/paper/fig.json";

json spec_json() {
  return json::parse(R"({
    "name": "s",
    "base": "../gpu/base.json",
    "axes": [
      {"key": "model.layers", "values": [1, 2]},
      {"key": "engine.type", "values": ["fastdecode", "gpu-only"], "name": "engine"}
    ]
  })");
}

std::string spec_error(const json& j) {
  return error_message<ConfigError>([&] { parse_sweep_spec(j, kFile); });
}

std::vector<std::string> names(const std::vector<SweepPoint>& p) {
  std::vector<std::string> out;
  for (const auto& x : p) out.push_back(x.name);
  return out;
}

}  // namespace

TEST(Sweep, ParsesDefaultsAndResolvesBase) {
  const SweepSpec s = parse_sweep_spec(spec_json(), kFile);
  EXPECT_EQ(s.name, "s");
  EXPECT_EQ(s.base, "/specs/gpu/base.json");  // relative to the spec file's folder
  EXPECT_FALSE(s.zip);
  EXPECT_EQ(s.repeats, 1);
  EXPECT_TRUE(s.interleaved);
  ASSERT_EQ(s.axes.size(), 2u);
  EXPECT_EQ(s.axes[0].name, "layers");  // the key's last component
  EXPECT_EQ(s.axes[1].name, "engine");
  const json j = s.to_json();
  EXPECT_EQ(j["base"], "/specs/gpu/base.json");
  EXPECT_EQ(j["mode"], "product");
  EXPECT_EQ(j["order"], "interleaved");
  EXPECT_EQ(j["axes"][0]["key"], "model.layers");
}

TEST(Sweep, ProductExpansionLastAxisFastest) {
  json j = spec_json();
  j["set"] = {"workload.requests=8"};
  const auto p = expand_points(parse_sweep_spec(j, kFile), {"engine.threads=2"});
  EXPECT_EQ(names(p), (std::vector<std::string>{"layers-1_engine-fastdecode", "layers-1_engine-gpu-only",
                                                "layers-2_engine-fastdecode", "layers-2_engine-gpu-only"}));
  // The spec's "set", then the axes in order, then the command line's --set.
  EXPECT_EQ(p[2].overrides, (std::vector<std::string>{"workload.requests=8", "model.layers=2",
                                                      "engine.type=\"fastdecode\"", "engine.threads=2"}));
  EXPECT_EQ(p[1].values, (json{{"layers", 1}, {"engine", "gpu-only"}}));
}

TEST(Sweep, ZipExpansionWalksAxesTogether) {
  json j = spec_json();
  j["mode"] = "zip";
  const auto p = expand_points(parse_sweep_spec(j, kFile));
  EXPECT_EQ(names(p), (std::vector<std::string>{"layers-1_engine-fastdecode", "layers-2_engine-gpu-only"}));
  j["axes"][1]["values"].push_back("vanilla");
  EXPECT_THAT(spec_error(j), HasSubstr("axes[1] (engine) has 3 values and axes[0] (layers) has 2"));
}

TEST(Sweep, KeysAxisSetsSeveralKeysTogether) {
  json j = spec_json();
  j["axes"] = json::parse(R"([{"keys": ["schedule.mode", "schedule.interval"],
                                "values": [["all-at-once", 1], ["fixed-interval", 8]], "name": "sched"},
                               {"keys": ["workload.prompt_len", "workload.gen_len"], "values": [[16, 32]]}])");
  const auto p = expand_points(parse_sweep_spec(j, kFile));
  EXPECT_EQ(names(p), (std::vector<std::string>{"sched-all-at-once-1_prompt-len-gen-len-16-32",
                                                "sched-fixed-interval-8_prompt-len-gen-len-16-32"}));
  // Folder names take only [A-Za-z0-9.-]: the default name's '_' became '-' in the folder, not in "values".
  EXPECT_EQ(p[1].overrides, (std::vector<std::string>{"schedule.mode=\"fixed-interval\"", "schedule.interval=8",
                                                      "workload.prompt_len=16", "workload.gen_len=32"}));
  EXPECT_EQ(p[1].values["sched"], json::parse(R"(["fixed-interval", 8])"));
  EXPECT_TRUE(p[0].values.contains("prompt_len-gen_len"));
  // Each value must be an array with one value per key.
  j["axes"][0]["values"].push_back(json::array({"load-control"}));
  EXPECT_THAT(spec_error(j), HasSubstr("axes[0].values: [\"load-control\"] must be a list of 2 values"));
}

TEST(Sweep, OrderInterleavedOrGrouped) {
  json j = spec_json();
  j["repeats"] = 2;
  const SweepSpec inter = parse_sweep_spec(j, kFile);
  const auto a = run_order(inter, 3);
  ASSERT_EQ(a.size(), 6u);
  const std::vector<std::pair<size_t, int64_t>> want_inter = {{0, 1}, {1, 1}, {2, 1}, {0, 2}, {1, 2}, {2, 2}};
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(std::make_pair(a[i].point, a[i].rep), want_inter[i]) << i;
  j["order"] = "grouped";
  const auto g = run_order(parse_sweep_spec(j, kFile), 3);
  const std::vector<std::pair<size_t, int64_t>> want_grouped = {{0, 1}, {0, 2}, {1, 1}, {1, 2}, {2, 1}, {2, 2}};
  ASSERT_EQ(g.size(), 6u);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(std::make_pair(g[i].point, g[i].rep), want_grouped[i]) << i;
}

TEST(Sweep, ValueLabelsAndCollisions) {
  EXPECT_EQ(sweep_value_label(json(0.5)), "0.5");
  EXPECT_EQ(sweep_value_label(json("int8")), "int8");
  EXPECT_EQ(sweep_value_label(json("a b/c_d")), "a-b-c-d");
  EXPECT_EQ(sweep_value_label(json(true)), "true");
  EXPECT_EQ(sweep_value_label(json::parse(R"({"memory_gb": 24, "sm_count": 8})")), "memory-gb-24-sm-count-8");
  // Long values: a prefix and a hash of the JSON, so two long values that share the prefix still differ.
  const json long1 = json::parse(R"({"type": "fastdecode", "rworkers": {"spawn": 4, "threads": 8}})");
  const json long2 = json::parse(R"({"type": "fastdecode", "rworkers": {"spawn": 4, "threads": 16}})");
  const std::string l1 = sweep_value_label(long1), l2 = sweep_value_label(long2);
  EXPECT_LE(l1.size(), 40u);
  EXPECT_NE(l1, l2);
  EXPECT_EQ(l1.substr(0, 24), l2.substr(0, 24));
  EXPECT_EQ(l1, sweep_value_label(long1));  // deterministic
  // Two values that make the same folder name are refused, naming both.
  json j = spec_json();
  j["axes"][1]["values"] = {"a b", "a_b"};
  EXPECT_THAT(error_message<ConfigError>([&] { expand_points(parse_sweep_spec(j, kFile)); }),
              HasSubstr("have the same folder name 'layers-1_engine-a-b'"));
}

TEST(Sweep, StrictParseErrors) {
  json j = spec_json();
  j["repeat"] = 2;
  EXPECT_THAT(spec_error(j), HasSubstr("fig.json: repeat: unknown key"));
  j = spec_json();
  j["axes"][0]["vals"] = {1};
  EXPECT_THAT(spec_error(j), HasSubstr("axes[0].vals: unknown key"));
  j = spec_json();
  j["repeats"] = 0;
  EXPECT_THAT(spec_error(j), HasSubstr("repeats: value 0 out of range"));
  j = spec_json();
  j["axes"] = json::array();
  EXPECT_THAT(spec_error(j), HasSubstr("axes: expected a non-empty list of axes"));
  j = spec_json();
  j.erase("axes");
  EXPECT_THAT(spec_error(j), HasSubstr("axes: required key is missing"));
  j = spec_json();
  j.erase("base");
  EXPECT_THAT(spec_error(j), HasSubstr("base: required key is missing"));
  j = spec_json();
  j["axes"][0]["values"] = json::array();
  EXPECT_THAT(spec_error(j), HasSubstr("axes[0].values: expected a non-empty list of values"));
  j = spec_json();
  j["axes"][0]["keys"] = {"model.layers"};
  EXPECT_THAT(spec_error(j), HasSubstr("give one of \"key\""));
  j = spec_json();
  j["axes"][1]["key"] = "model.layers";
  EXPECT_THAT(spec_error(j), HasSubstr("'model.layers' is already varied by axes[0]"));
  j = spec_json();
  j["axes"][1]["name"] = "layers";
  EXPECT_THAT(spec_error(j), HasSubstr("'layers' is already the name of axes[0]"));
  j = spec_json();
  j["mode"] = "cartesian";
  EXPECT_THAT(spec_error(j), HasSubstr("mode: 'cartesian' is not one of"));
  j = spec_json();
  j["order"] = "random";
  EXPECT_THAT(spec_error(j), HasSubstr("order: 'random' is not one of"));
  j = spec_json();
  j["set"] = {"workload.requests"};
  EXPECT_THAT(spec_error(j), HasSubstr("set: \"workload.requests\" is not a \"KEY.PATH=VALUE\" string"));
  j = spec_json();
  j["axes"][0]["key"] = "model..layers";
  EXPECT_THAT(spec_error(j), HasSubstr("is not a dotted config key"));
}

TEST(Sweep, MissingBaseFileIsRefused) {
  fd::test::TempDir d("sweep");
  json j = spec_json();
  j["base"] = "nowhere.json";
  write_json_file(d.file("spec.json"), j);
  EXPECT_THAT(error_message<ConfigError>([&] { load_sweep_spec(d.file("spec.json")); }),
              HasSubstr("base: " + d.file("nowhere.json") + " is not a file"));
}

TEST(Sweep, HeadlineTakesOnlyWhatTheSummaryHas) {
  const json summary = json::parse(R"({"results": {
      "output_throughput": 100.5, "step_ms": {"p50": 1, "p99": 9}, "ttft_ms": {"p50": 3},
      "decode_only": {"tokens_per_s": 120, "step_ms": {"p99": 7}},
      "steady": {"tokens_per_s": 130, "mean_batch": 32.5}}})");
  EXPECT_EQ(sweep_headline(summary),
            json::parse(R"({"output_throughput": 100.5, "decode_only.tokens_per_s": 120, "steady.tokens_per_s": 130,
                            "decode_only.step_ms.p99": 7, "step_ms.p99": 9, "ttft_ms.p50": 3, "steady.mean_batch": 32.5})"));
  // A summary from before decode_only / steady existed: the fields it has, no others.
  const json old = json::parse(R"({"results": {"output_throughput": 5, "step_ms": {"p99": 2}}})");
  EXPECT_EQ(sweep_headline(old), json::parse(R"({"output_throughput": 5, "step_ms.p99": 2})"));
}

TEST(Sweep, LabelsNameTheFolders) {
  json j = spec_json();
  j["axes"][1]["labels"] = {"fd", "gpu only"};
  const auto p = expand_points(parse_sweep_spec(j, kFile));
  EXPECT_EQ(names(p), (std::vector<std::string>{"layers-1_engine-fd", "layers-1_engine-gpu-only", "layers-2_engine-fd",
                                                "layers-2_engine-gpu-only"}));
  EXPECT_EQ(p[0].values["engine"], "fastdecode");  // the value, not the label
  EXPECT_EQ(parse_sweep_spec(j, kFile).to_json()["axes"][1]["labels"], j["axes"][1]["labels"]);
  j["axes"][1]["labels"] = {"fd"};
  EXPECT_THAT(spec_error(j), HasSubstr("axes[1].labels: expected a list of 2 strings, one per value"));
  j["axes"][1]["labels"] = {"fd", "fd"};
  EXPECT_THAT(spec_error(j), HasSubstr("axes[1].labels: 'fd' is given twice"));
}

TEST(Sweep, QuickVariantCutsAxesAndAddsItsSet) {
  json j = spec_json();
  j["set"] = {"workload.requests=8"};
  j["axes"].push_back(
      json::parse(R"({"keys": ["a.x", "a.y"], "values": [[1, 2], [3, 4], [5, 6]], "labels": ["p", "q", "r"],
                                      "name": "xy"})"));
  j["quick"] = json::parse(R"({"set": ["workload.gen_len=4"], "values": {"layers": [2], "xy": ["p", [5, 6]]}})");
  const SweepSpec full = parse_sweep_spec(j, kFile);
  EXPECT_EQ(expand_points(full).size(), 12u);  // without --quick, "quick" changes nothing
  const SweepSpec q = with_quick(full);
  const auto p = expand_points(q);
  // layers by value, xy by label and by value; engine untouched.
  EXPECT_EQ(names(p), (std::vector<std::string>{"layers-2_engine-fastdecode_xy-p", "layers-2_engine-fastdecode_xy-r",
                                                "layers-2_engine-gpu-only_xy-p", "layers-2_engine-gpu-only_xy-r"}));
  EXPECT_EQ(p[1].overrides, (std::vector<std::string>{"workload.requests=8", "workload.gen_len=4", "model.layers=2",
                                                      "engine.type=\"fastdecode\"", "a.x=5", "a.y=6"}));
  EXPECT_EQ(q.to_json()["variant"], "quick");
  EXPECT_EQ(full.to_json()["variant"], "full");
  // Zip: a point is kept only if every named axis keeps its index.
  json z = spec_json();
  z["mode"] = "zip";
  z["quick"] = json::parse(R"({"values": {"engine": ["gpu-only"]}})");
  EXPECT_EQ(names(expand_points(with_quick(parse_sweep_spec(z, kFile)))),
            (std::vector<std::string>{"layers-2_engine-gpu-only"}));
  // Errors: no "quick", an entry that names nothing, an axis that does not exist, an unknown key.
  EXPECT_THAT(error_message<ConfigError>([&] { with_quick(parse_sweep_spec(spec_json(), kFile)); }),
              HasSubstr("--quick: the spec has no \"quick\" variant"));
  j["quick"]["values"]["xy"] = {"s"};
  EXPECT_THAT(spec_error(j), HasSubstr("quick.values.xy: \"s\" is neither a value nor a label of axis xy"));
  j["quick"]["values"] = {{"depth", {1}}};
  EXPECT_THAT(spec_error(j), HasSubstr("quick.values.depth: no axis has this name"));
  j["quick"] = {{"repeats", 1}};
  EXPECT_THAT(spec_error(j), HasSubstr("quick.repeats: unknown key"));
}

TEST(Sweep, OnlyCutsAxesByLabelOrValue) {
  json j = spec_json();
  j["axes"].push_back(json::parse(R"({"keys": ["a.x", "a.y"], "values": [[1, 2], [3, 4], [5, 6]],
                                      "labels": ["p", "q", "r"], "name": "xy"})"));
  const SweepSpec full = parse_sweep_spec(j, kFile);
  const SweepSpec o = with_only(full, {"layers=2", "xy=q,r"});
  EXPECT_EQ(names(expand_points(o)),
            (std::vector<std::string>{"layers-2_engine-fastdecode_xy-q", "layers-2_engine-fastdecode_xy-r",
                                      "layers-2_engine-gpu-only_xy-q", "layers-2_engine-gpu-only_xy-r"}));
  EXPECT_EQ(o.to_json()["only"], json({"layers=2", "xy=q,r"}));
  EXPECT_FALSE(full.to_json().contains("only"));
  // Zip: a point is kept only if every named axis keeps its index.
  json z = spec_json();
  z["mode"] = "zip";
  EXPECT_EQ(names(expand_points(with_only(parse_sweep_spec(z, kFile), {"engine=gpu-only"}))),
            (std::vector<std::string>{"layers-2_engine-gpu-only"}));
  EXPECT_THAT(error_message<ConfigError>([&] { with_only(parse_sweep_spec(z, kFile), {"engine=gpu-only", "layers=1"}); }),
              HasSubstr("--only: keeps no point of the zipped axes"));
  // Errors name what exists.
  EXPECT_THAT(error_message<ConfigError>([&] { with_only(full, {"depth=1"}); }),
              HasSubstr("--only: no axis is named \"depth\" (axes: layers, engine, xy)"));
  EXPECT_THAT(error_message<ConfigError>([&] { with_only(full, {"xy=s"}); }),
              HasSubstr("--only: \"s\" is no value of axis \"xy\" (p, q, r)"));
  EXPECT_THAT(error_message<ConfigError>([&] { with_only(full, {"xy"}); }), HasSubstr("expected AXIS=VALUE"));
  EXPECT_THAT(error_message<ConfigError>([&] { with_only(full, {"xy=p,"}); }), HasSubstr("an empty value"));
}
