// fd-bench sweep: a base experiment config run at every point of a grid of --set overrides, each point
// `repeats` times, into one folder per run with an index of headline numbers (docs/EXPERIMENTS.md,
// "Sweeps"). The spec parse, point expansion, naming and run order are pure functions (no file is read
// but the spec, nothing is run); run_sweep is the runner loop over them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"

namespace fd {

// One axis: one key ("key") or several varied together ("keys"; each value an array of that length).
struct SweepAxis {
  std::string name;                 // "name", else the last component of each key joined by '-'
  std::vector<std::string> keys;    // dotted config keys, as --set takes them
  std::vector<json> values;         // the values, in order ("keys": each an array, one value per key)
  bool multi = false;               // given as "keys"
  std::vector<std::string> labels;  // "labels": each value's folder label (empty: made from the value)
};

struct SweepSpec {
  std::string file;  // the spec file it came from ("" for a spec parsed from memory)
  std::string name;
  std::string description;
  std::string base;              // the experiment config, resolved against the spec file's folder
  std::vector<std::string> set;  // "set": overrides applied to every point first
  std::vector<SweepAxis> axes;
  bool zip = false;  // "mode": "zip" (axes walked together) or "product" (every combination)
  int64_t repeats = 1;
  bool interleaved = true;  // "order": "interleaved" (rep 1 of every point, then rep 2 ...) or "grouped"
  // "quick": {"set": [...], "values": {axis name: [values or labels kept]}}, the spec's short variant
  // (fd-bench sweep --quick): its "set" goes after the spec's, and each named axis keeps only those values.
  bool has_quick = false;
  std::vector<std::string> quick_set;
  std::vector<std::pair<std::string, std::vector<json>>> quick_values;
  bool quick_applied = false;  // with_quick() made this spec
  std::vector<std::string> only;  // with_only()'s "AXIS=VALUE[,VALUE...]" filters, if it made this spec
  json to_json() const;        // the spec as parsed, defaults filled in and base resolved (for index.json)
};

// One point of the grid: its folder name, the --set strings that make it, and its value on each axis.
struct SweepPoint {
  std::string name;
  std::vector<std::string> overrides;  // spec "set", then one per axis key, then the command line's
  json values = json::object();        // {axis name: value}
};

// One run: a point (index into the points) and a repeat (1-based).
struct SweepRun {
  size_t point = 0;
  int64_t rep = 1;
};

// Parses a spec strictly (unknown keys, types, empty axes, zip length mismatch, repeats < 1, a missing
// base are ConfigErrors naming the file and key). `path` names the file in messages and is the folder
// "base" resolves against.
SweepSpec parse_sweep_spec(const json& j, const std::string& path);
SweepSpec load_sweep_spec(const std::string& path);

// The spec's "quick" variant: quick "set" after the spec's, axes cut to the values "quick" names (an entry
// matches a value equal to it or whose label is it; zip keeps a point only if every named axis keeps it).
// ConfigError if the spec has no "quick" or an entry matches nothing.
SweepSpec with_quick(const SweepSpec& s);

// The spec cut to the command line's --only filters, each "AXIS=VALUE[,VALUE...]" (a value's label, or
// the value as its label is written): every named axis keeps only those values, as "quick" does. An
// unknown axis, a value no axis has, or a malformed filter is a ConfigError naming the axes or values.
SweepSpec with_only(const SweepSpec& s, const std::vector<std::string>& only);

// The points in naming order (product: the last axis varies fastest; zip: the i-th value of every axis).
// `extra_sets` (the command line's --set) go after each point's own. Two points with the same folder
// name are a ConfigError naming both.
std::vector<SweepPoint> expand_points(const SweepSpec& s, const std::vector<std::string>& extra_sets = {});

// Every run of the sweep in the order it is run (interleaved or grouped).
std::vector<SweepRun> run_order(const SweepSpec& s, size_t num_points);

// The filesystem-safe label of an axis value in a folder name: strings as they are, numbers as JSON
// writes them, arrays' elements joined by '-', objects' "key-value"s joined by '-'; every character
// outside [A-Za-z0-9.-] becomes '-'; a label longer than 40 characters becomes its first 24 and a hash
// of the value's JSON.
std::string sweep_value_label(const json& v);

// The --set string for a key and a value: "key=<value as JSON>".
std::string sweep_override(const std::string& key, const json& value);

// The headline numbers of a run from its summary.json (each only when the summary has it).
json sweep_headline(const json& summary);

struct SweepOptions {
  std::string out_dir;            // DIR: DIR/<point>/rep<k>/ and DIR/index.json
  std::vector<std::string> sets;  // the command line's --set, after every point's own
  std::string command_line;       // for provenance and index.json
  bool dry_run = false;           // print the points and the run count; run and write nothing
  bool quick = false;             // run the spec's "quick" variant (with_quick)
  std::vector<std::string> only;  // --only AXIS=VALUE[,VALUE...]: run only those values (with_only)
  int64_t repeats = 0;            // --repeats N: N repeats of each point instead of the spec's (0: the spec's)
  bool quiet = false;             // no progress on stderr
  bool fail_fast = false;         // stop at the first failed run
};

// Validates every point's config (load_experiment; a ConfigError names the point) before running the
// first, then runs (or skips, when its folder has a summary.json) every run in order, rewriting
// DIR/index.json after each. Returns 1 if a run failed, else 0. Throws ConfigError for a bad spec or point.
int run_sweep(const SweepSpec& s, const SweepOptions& opt);

}  // namespace fd
