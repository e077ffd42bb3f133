// fd-spart-bench (CUDA builds): the S-Part of one layer on the GPU for B decode tokens next to its
// ceiling, the same layer's cuBLAS GEMMs alone ([q|k|v], o, [gate|up], down: the same calls on the same
// shapes), in the same run. Both are timed with CUDA events over --reps back-to-back repetitions after a
// warm-up, in --rounds interleaved rounds (times: medians; a ratio: the median of the rounds' ratios). Every GEMM
// reads a non-zero input, as in the engines (the attention's output, which the R-Part would send, is a uniform
// random stand-in): a GEMM on zeros draws less power and runs faster (kernels/cuda/ceilings.h). The S-Part time is
// device time of the stages (norms, GEMMs, bias/RoPE, activation, residuals,
// the q/k/v split into the fp16 tensors FastDecode sends), without the host transfers of the engine (fd-bench profile --backend cuda measures
// those). Writes JSON rows: B, spart_ms, gemm_ms, ratio, the GEMMs' TFLOP/s and weight-read GB/s, and
// each elementwise kernel of the layer timed alone (elementwise_ms, elementwise_sum_ms, and the DRAM rate each
// reaches, elementwise_gbs).
// --tensor T: the layer of one tensor rank of T (heads, KV heads and MLP columns / T: fastdecode/model/shard.h),
// measured on one GPU: PREDICTED per-rank compute at T GPUs, without the two all-reduces of B x hidden fp32
// per layer that T ranks add. Those are measured (NCCL, one thread per GPU, CUDA events) only where T GPUs
// answer and the build has NCCL; otherwise allreduce_ms is null and the output says why.
// The GEMMs run the GEMM table's algorithms, as the engines do (--gemm-table: "auto", the default, is the device's
// table in configs/gemm/; "none" is cuBLAS's default). --tune-gemm FILE instead times, for each of the model's
// weight GEMMs ([q|k|v], o, [gate|up], down as one layer calls them, the LM head) at each --tune-rows, cuBLAS's default
// and every algorithm cuBLASLt's heuristic offers (on four copies of the weight in turn, so that none is read from
// L2), and writes the fastest into FILE (fastdecode/spart/gemm_table.h) where it beats the default by more than
// --tune-margin; entries of FILE for other problems are kept.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>

#include <thread>

#include "fastdecode/core/cli_main.h"
#include "fastdecode/core/stats.h"
#include "fastdecode/model/shard.h"
#include "fastdecode/parallel/comm.h"
#include "fastdecode/spart/cuda_model.h"
#include "harness/engines.h"
#include "harness/bench/cuda_timing.h"
#include "harness/provenance.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/green_context.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/qkv.h"

namespace {

// --tune-gemm: the model's weight GEMM problems at each of `rows`, each algorithm timed against cuBLAS's default.
int tune(const fd::CudaModel& m, const fd::ModelConfig& c, fd::DType act, const std::vector<int64_t>& rows, int64_t reps,
         double margin, const std::string& file, const std::string& command) {
  if (c.arch != fd::Arch::Llama && c.arch != fd::Arch::OPT) FD_THROW("--tune-gemm: unknown architecture");
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  fd::GemmTable t;
  if (std::filesystem::exists(file)) {
    t = fd::GemmTable::load(file);  // merged: its other problems are kept
    if (t.device != prop.name || t.cublaslt_version != int64_t(cublasLtGetVersion()))
      FD_THROW_BAD_INPUT(file << " holds a table for " << t.device << " with cuBLASLt " << t.cublaslt_version
                              << "; this is " << prop.name << " with " << cublasLtGetVersion()
                              << ": write another file");
  }
  t.device = prop.name;
  t.cublaslt_version = int64_t(cublasLtGetVersion());
  fd::json made = t.notes.is_object() && t.notes.contains("made_by") ? t.notes["made_by"] : fd::json::array();
  if (!made.is_array()) made = fd::json::array({made});
  made.push_back(command);  // every tuning run that wrote into this file
  t.notes = {{"made_by", made}, {"rule", "the fastest of cuBLAS's default and cuBLASLt's heuristic algorithms (at most "
                                            "16), each timed over four weight copies; an entry only where it beats the "
                                            "default by more than the margin"},
             {"margin", margin}, {"provenance", fd::collect_provenance(command)}};
  const int64_t H = c.hidden_size, I = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const bool llama = c.arch == fd::Arch::Llama;
  struct Shape {
    const char* name;
    int64_t out, in;
    bool y_fp32;
    float beta;
  };
  // As CudaModel calls them (one GPU: the o and down projections add into the fp32 residual).
  const std::vector<Shape> shapes = {{"qkv", qd + 2 * kvd, H, false, 0.0f}, {"o", H, qd, true, 1.0f},
                                     {"gate_up", llama ? 2 * I : I, H, false, 0.0f}, {"down", H, I, true, 1.0f},
                                     {"lm_head", c.vocab_size, H, true, 0.0f}};
  const cudaStream_t s = m.stream();
  int changed = 0;
  std::printf("%-8s %6s %5s %11s %9s %6s\n", "gemm", "rows", "algos", "default_us", "best_us", "algo");
  for (const Shape& g : shapes) {
    constexpr int kCopies = 4;
    std::vector<fd::DeviceBuffer<uint16_t>> W;
    for (int k = 0; k < kCopies; ++k) {
      W.emplace_back(size_t(g.out * g.in));
      fd::cuda::fill_uniform16(W.back().get(), W.back().size(), 0.05f, uint64_t(k + 1), act == fd::DType::BF16, s);
    }
    const int64_t rmax = *std::max_element(rows.begin(), rows.end());
    fd::DeviceBuffer<uint16_t> x(size_t(rmax * g.in));
    fd::DeviceBuffer<float> y(size_t(rmax * g.out));
    // Random operands, not zeros: a tensor-core GEMM's time depends on its operands' bits (ceilings.h).
    fd::cuda::fill_uniform16(x.get(), x.size(), 1.0f, 7, act == fd::DType::BF16, s);
    CUDA_CHECK(cudaMemsetAsync(y.get(), 0, y.size() * 4, s));
    for (const int64_t T : rows) {
      const fd::GemmProblem p{g.out, g.in, T, act, g.y_fp32, g.beta != 0.0f};
      int turn = 0;
      const auto time = [&](int algo) {
        return fd::cuda_ms_per_call(s, reps, [&] {
          m.gemm_with(algo, x.get(), T, g.in, W[size_t(turn++ % kCopies)].get(), g.out, y.get(), g.y_fp32, g.beta);
        });
      };
      const double def = time(-1);
      const int n = m.gemm_algos(p);
      int best = -1;
      double best_ms = def;
      for (int a = 0; a < n; ++a) {
        const double ms = time(a);
        if (ms < best_ms) best = a, best_ms = ms;
      }
      std::printf("%-8s %6lld %5d %11.1f %9.1f %6d\n", g.name, (long long)T, n, def * 1e3, best_ms * 1e3, best);
      if (best >= 0 && best_ms < def * (1.0 - margin)) {
        t.set(p, best, {{"us", best_ms * 1e3}, {"default_us", def * 1e3}});
        ++changed;
      } else {
        t.erase(p);  // tuned before, perhaps: the default is as fast now
      }
    }
  }
  fd::write_json_file(file, t.to_json());
  std::printf("%s: %zu problems with an algorithm of their own (%d from this run)\n", file.c_str(), t.size(), changed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"S-Part layer time on the GPU vs its cuBLAS GEMMs alone (same shapes, same run)"};
  app.name("fd-spart-bench");
  std::string model_path, out;
  std::vector<int64_t> batches = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  int64_t reps = 20, rounds = 5, sm_count = 0, tensor = 1;
  std::string dtype = "fp16", gemm_table = "auto", tune_out;
  std::vector<int64_t> tune_rows;
  // The graphs' buckets up to 128 rows: tuned at 192-1024 too, the S-Part ran slower in place at 1024 rows
  // (artifacts/stages/gemm-table-7062fd9/README.md), so the default tunes where it was seen to pay.
  for (int64_t r = 1; r <= fd::GraphCache::kPow2Rows; r *= 2) tune_rows.push_back(r);
  double tune_margin = 0.02;
  app.add_option("--model", model_path, "Model config (HF config.json)")->required();
  app.add_option("--batches", batches, "Decode batch sizes B")->capture_default_str();
  app.add_option("--reps", reps, "Timed repetitions per B (after one warm-up)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "Rounds per B, each timing the S-Part and its GEMMs in turn (medians reported)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--sm-count", sm_count, "Run on this many SMs (green context); 0 = all")->capture_default_str();
  app.add_option("--dtype", dtype, "16-bit weight and activation type")->check(CLI::IsMember({"fp16", "bf16"}))->capture_default_str();
  app.add_option("--tensor", tensor, "Time one tensor rank's layer of T (per-rank shapes, one GPU); T GPUs and NCCL: "
                 "also the all-reduces")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--out", out, "JSON file to write");
  app.add_option("--gemm-table", gemm_table, "GEMM table: auto (configs/gemm/<device>.json when there is one), none, "
                 "or a file")->capture_default_str();
  app.add_option("--tune-gemm", tune_out, "Tune: time every cuBLASLt algorithm of each weight GEMM and write the "
                 "fastest into this GEMM table file (merged with what it holds), instead of the layer benchmark");
  app.add_option("--tune-rows", tune_rows, "Rows (B) to tune at (default: the CUDA graphs' batch buckets 1-128)")
      ->check(CLI::PositiveNumber);
  app.add_option("--tune-margin", tune_margin, "An algorithm replaces cuBLAS's default only when faster by more than "
                 "this fraction")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  return fd::guarded_main(app, argc, argv, [&]() {
    const auto devs = fd::cuda_devices();
    if (devs.empty()) FD_THROW("no CUDA device answers");
    const fd::ModelConfig full = fd::with_layers(fd::load_model_config(model_path), 1);
    const fd::ModelConfig c = tensor > 1 ? fd::shard_config(full, tensor, 1) : full;  // checks T divides the heads
    // The all-reduce of B x hidden fp32 over T GPUs (in place, the engine's call), per B: null where it cannot be
    // measured here.
    std::string allreduce_why;
    fd::CommGroup nccl;
    if (tensor > 1) {
      if (!fd::have_nccl()) allreduce_why = "this build has no NCCL communicator";
      else if (int64_t(devs.size()) < tensor)
        allreduce_why = "needs " + std::to_string(tensor) + " GPUs, " + std::to_string(devs.size()) + " answer(s)";
      else {
        std::vector<int> d;
        for (int i = 0; i < int(tensor); ++i) d.push_back(i);
        nccl = fd::make_nccl_group(d);
      }
    }
    const auto allreduce_ms = [&](int64_t B) -> double {
      std::vector<double> ms(size_t(tensor), 0.0);
      std::vector<std::thread> th;
      for (int r = 0; r < int(tensor); ++r)
        th.emplace_back([&, r] {
          CUDA_CHECK(cudaSetDevice(r));
          fd::DeviceBuffer<float> buf(size_t(B * full.hidden_size));
          cudaStream_t rs = nullptr;
          CUDA_CHECK(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
          ms[size_t(r)] = fd::cuda_ms_per_call(rs, reps, [&] {
            nccl[size_t(r)]->all_reduce_sum(buf.get(), buf.size(), fd::CommType::F32, rs);
          });
          CUDA_CHECK(cudaStreamDestroy(rs));
        });
      for (auto& t : th) t.join();
      double worst = 0;
      for (double m : ms) worst = std::max(worst, m);
      return worst;
    };
    const fd::DType act = fd::dtype_from_name(dtype);
    auto src = fd::make_random_source(1, act);
    if (tensor > 1)
      std::printf("tensor rank 0 of %lld: %lld heads, %lld KV heads, %lld MLP columns (PREDICTED per-rank compute; "
                  "allreduce: %s)\n", (long long)tensor, (long long)c.num_heads, (long long)c.num_kv_heads,
                  (long long)c.intermediate_size, allreduce_why.empty() ? "measured, NCCL" : allreduce_why.c_str());
    fd::cuda::SmLimitedStreams streams(int(sm_count), 1);
    cudaStream_t s = streams.stream(0);
    fd::CudaModel m(fd::load_model_weights(c, *src), s, streams.limited() ? streams.sm_count() : 0, act);
    if (!tune_out.empty()) {
      // A table holds for the whole device and one GPU's shapes (CudaModel ignores it on a green context).
      if (sm_count > 0 || tensor > 1) FD_THROW_BAD_INPUT("--tune-gemm tunes at all SMs and the whole model's shapes: "
                                                         "drop --sm-count and --tensor");
      return tune(m, c, act, tune_rows, reps, tune_margin, tune_out, fd::join_args(argc, argv));
    }
    m.use_gemm_table(fd::load_gemm_table(fd::resolve_gemm_table(gemm_table)));
    std::printf("%s\n", m.gemm_table_describe().c_str());
    const double H = double(c.hidden_size), I = double(c.intermediate_size), qd = double(c.q_dim()),
                 kvd = double(c.kv_dim());
    const double layer_params = H * (qd + 2 * kvd) + qd * H + (c.arch == fd::Arch::Llama ? 3 : 2) * H * I;
    fd::json rows = fd::json::array();
    std::printf("%6s %10s %10s %7s %9s %9s %12s %10s\n", "B", "spart_ms", "gemm_ms", "ratio", "TFLOP/s", "wGB/s",
                "elemwise_ms", "graph_ms");
    for (int64_t B : batches) {
      fd::DevActs a;
      m.ensure(a, B);
      std::vector<int32_t> tok(static_cast<size_t>(B), 5);
      std::vector<int64_t> pos(static_cast<size_t>(B), 100);
      m.upload(a.tokens.get(), tok.data(), tok.size() * 4);
      m.upload(a.pos.get(), pos.data(), pos.size() * 8);
      m.embed(a);
      // The attention's output (the R-Part's, here a stand-in) and the MLP's input: random values, not zeros,
      // for the S-Part and its ceiling alike: a GEMM on zeros runs faster than on real activations (ceilings.h).
      fd::cuda::fill_uniform16(a.a16.get(), size_t(B) * size_t(qd), 1.0f, 11, act == fd::DType::BF16, s);
      fd::cuda::fill_uniform16(a.i16.get(), size_t(B) * size_t(I), 1.0f, 13, act == fd::DType::BF16, s);
      auto time = [&](const std::function<void()>& body) { return fd::cuda_ms_per_call(s, reps, body); };
      // --rounds rounds, each timing the S-Part (eagerly and from one CUDA graph, as the engines run batches of up
      // to GraphCache::kMaxRows rows) and its GEMMs in turn; the medians are reported. Timed one after the other
      // once, the last of them ran on a warmer GPU: at B = 1024 a GEMM-bound layer runs at its power limit, and the
      // graph's ratio swung 1.11-1.21 between two such runs (artifacts/stages/gemm-inputs/).
      fd::GraphCache g(s);
      // The ratios are the medians of each round's ratio (the S-Part and its GEMMs of the same round, seconds apart),
      // not a ratio of medians taken from different rounds.
      std::vector<double> spart_r, gemm_r, ratio_r, graph_r, gratio_r;
      for (int64_t round = 0; round < rounds; ++round) {
        spart_r.push_back(time([&] {
          m.attention_input(a, 0, fd::CudaModel::kF16);  // as FastDecode runs it (fp16 q/k/v for the wire)
          m.attention_output_and_mlp(a, 0);
        }));
        gemm_r.push_back(time([&] { m.layer_gemms_only(a, 0); }));
        ratio_r.push_back(spart_r.back() / gemm_r.back());
        if (B <= fd::GraphCache::kMaxRows) {
          graph_r.push_back(time([&] {
            g.run(0, [&] {
              m.attention_input(a, 0, fd::CudaModel::kF16);
              m.attention_output_and_mlp(a, 0);
            });
          }));
          gratio_r.push_back(graph_r.back() / gemm_r.back());
        }
      }
      const double spart = fd::median(spart_r), gemm = fd::median(gemm_r), graph = graph_r.empty() ? 0 : fd::median(graph_r);
      const double ratio = fd::median(ratio_r), graph_ratio = gratio_r.empty() ? 0 : fd::median(gratio_r);
      // Each elementwise kernel of the layer alone (same shapes; weights stand-ins: the values do not
      // change the time), to see where the S-Part's time beyond the GEMMs goes.
      const int64_t Hn = c.hidden_size, In = c.intermediate_size;
      fd::DeviceBuffer<float> wn(size_t(Hn) * 2), bias(size_t(c.q_dim() + 2 * c.kv_dim()));
      fd::DeviceBuffer<float> inv(size_t(c.head_dim / 2));
      CUDA_CHECK(cudaMemsetAsync(wn.get(), 0, wn.size() * 4, s));
      CUDA_CHECK(cudaMemsetAsync(inv.get(), 0, inv.size() * 4, s));
      const bool llama = c.arch == fd::Arch::Llama;
      auto norm = [&] {
        if (llama) fd::cuda::rmsnorm(a.x.get(), nullptr, wn.get(), 1e-5f, B, Hn, a.h16.get(), act, s);
        else fd::cuda::layernorm(a.x.get(), nullptr, wn.get(), wn.get() + Hn, 1e-5f, B, Hn, a.h16.get(), act, s);
      };
      // The layer's elementwise kernels: two norms (attention, MLP), bias+RoPE+split, the activation. The
      // residual adds are inside the o- and down-projection GEMMs (fp32 C, beta = 1), whose extra cost
      // over the 16-bit-output GEMMs of the ceiling is in spart_ms but in no row here.
      fd::json stages = {{"norm_x2", 2 * time(norm)},
                         {"qkv_post", time([&] {
                            fd::cuda::qkv_post({.qkv = a.qkv16.get(),
                                                .dtype = act,
                                                .bias = llama ? nullptr : bias.get(),
                                                .pos = a.pos.get(),
                                                .inv_freq = llama ? inv.get() : nullptr,
                                                .T = B,
                                                .Hq = c.num_heads,
                                                .Hkv = c.num_kv_heads,
                                                .D = c.head_dim,
                                                .q = nullptr,
                                                .k = nullptr,
                                                .v = nullptr,
                                                .q16 = a.q16.get(),
                                                .k16 = a.k16.get(),
                                                .v16 = a.v16.get()},
                                               s);
                          })},
                         {"activation", time([&] {
                            if (llama)
                              fd::cuda::silu_mul(a.gu16.get(), act, B, In, a.i16.get(), s);
                            else
                              fd::cuda::relu_bias(a.gu16.get(), act, wn.get(), B, In, a.i16.get(), s);
                          })}};
      double stage_sum = 0;
      for (auto& [k, v] : stages.items()) stage_sum += v.get<double>();
      // Each one's DRAM traffic over its time (GB/s; eager launches, so launch-bound at small B): the norms read
      // the fp32 residual and write 16 bits, bias+RoPE+split reads and writes the 16-bit [q|k|v], the activation
      // reads two 16-bit halves and writes one.
      const double qkv_cols = double(qd + 2 * c.kv_dim()), bytes_per_row_norm = double(Hn) * (4 + 2);
      const double act_cols = llama ? 3.0 * double(In) : 2.0 * double(In);
      const fd::json stage_gbs = {
          {"norm_x2", 2 * double(B) * bytes_per_row_norm / (stages["norm_x2"].get<double>() * 1e-3) / 1e9},
          {"qkv_post", double(B) * qkv_cols * 4 / (stages["qkv_post"].get<double>() * 1e-3) / 1e9},
          {"activation", double(B) * act_cols * 2 / (stages["activation"].get<double>() * 1e-3) / 1e9}};
      const double tflops = 2.0 * layer_params * double(B) / (gemm * 1e-3) / 1e12;
      const double wgbs = layer_params * 2 / (gemm * 1e-3) / 1e9;
      std::printf("%6lld %10.4f %10.4f %7.3f %9.1f %9.0f %12.4f %10.4f\n", (long long)B, spart, gemm, ratio,
                  tflops, wgbs, stage_sum, graph);
      fd::json ar = nullptr;
      if (!nccl.empty()) ar = 2 * allreduce_ms(B);  // two per layer (after o and after down)
      rows.push_back({{"B", B}, {"spart_ms", spart}, {"gemm_ms", gemm}, {"ratio", ratio},
                      {"allreduce_ms", ar},
                      {"spart_graph_ms", graph > 0 ? fd::json(graph) : fd::json(nullptr)},
                      {"graph_ratio", graph > 0 ? fd::json(graph_ratio) : fd::json(nullptr)},
                      {"graph_ratio_rounds", gratio_r},  // each round's graph / GEMMs (same round)
                      {"gemm_ms_rounds", gemm_r},
                      {"gemm_tflops", tflops}, {"gemm_weight_gbs", wgbs}, {"elementwise_ms", stages},
                      {"elementwise_sum_ms", stage_sum}, {"elementwise_gbs", stage_gbs}});
    }
    fd::json tp = nullptr;
    if (tensor > 1)
      tp = {{"tensor", tensor},
            {"rank_shapes", {{"heads", c.num_heads}, {"kv_heads", c.num_kv_heads}, {"intermediate", c.intermediate_size}}},
            {"spart_ms_is", "PREDICTED per-rank compute at T GPUs: one GPU's measurement of one rank's shapes"},
            {"allreduce_ms_is", allreduce_why.empty() ? "MEASURED: 2 NCCL all-reduces of B x hidden fp32 per layer, the "
                                                        "slowest rank, CUDA events"
                                                      : "not measured: " + allreduce_why}};
    const fd::json result = {{"model", c.name},
                             {"tensor_parallel", tp},
                             {"device", devs[0].name},
                             {"sm_count", streams.sm_count()},
                             {"reps", reps},
                             {"rounds", rounds},
                             {"dtype", dtype},
                             {"gemm_table", m.gemm_table_info()},
                             {"method", "CUDA events over reps back-to-back, in rounds (S-Part eager, GEMMs, "
                                        "S-Part graph in turn): times are medians over rounds, ratios the medians of "
                                        "each round's ratio; S-Part = one layer's device stages (no host transfers); "
                                        "ceiling = the same layer's 4 cuBLAS GemmEx calls "
                                        "(16-bit in and out, fp32 accumulation) alone, each on the input the layer "
                                        "gives it; the attention's output (the R-Part's) a uniform random stand-in"},
                             {"rows", rows},
                             {"provenance", fd::collect_provenance(fd::join_args(argc, argv))}};
    if (!out.empty()) fd::write_json_file(out, result);
    return 0;
  });
}
