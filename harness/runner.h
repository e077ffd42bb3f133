// Runs an experiment: drives an engine step by step, records steps.jsonl, trace.json, summary.json
// and requests.jsonl (and logits.jsonl, logits/*.npy, score.jsonl), and shows progress. The recorders that
// write those files are in harness/run_recorders.h.
#pragma once
#include <string>

#include "harness/experiment.h"

namespace fd {

struct RunOptions {
  std::string out_dir;       // the run folder (created; must not already hold a summary.json)
  std::string command_line;  // for provenance
  bool progress = true;      // progress line on stderr when it is a terminal
};

// Returns summary.json's content. Throws fd::Error on failure (the run folder keeps what was written).
json run_experiment(const ExperimentConfig& e, const RunOptions& opt);

// Percentile with linear interpolation between order statistics (numpy's default); 0 for empty input.
// {mean, p1, p50, p90, p99, max, count} of the values.
json distribution(const std::vector<double>& v);

// Writes fp32 [rows, cols] (C order) as an NPY v1.0 file (numpy.load reads it).
void write_npy_f32(const std::string& path, const float* data, int64_t rows, int64_t cols);

}  // namespace fd
