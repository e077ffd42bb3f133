// fd-spart-bench (CUDA builds): the S-Part of one layer on the GPU for B decode tokens next to its
// ceiling, the same layer's cuBLAS GEMMs alone ([q|k|v], o, [gate|up], down: the same calls on the same
// shapes), in the same run. Both are timed with CUDA events over --reps back-to-back repetitions after a
// warm-up; the S-Part time is device time of the stages (norms, GEMMs, bias/RoPE, activation, residuals,
// the q/k/v split into the fp16 tensors FastDecode sends), without the host transfers of the engine (fd-bench profile --backend cuda measures
// those). Writes JSON rows: B, spart_ms, gemm_ms, ratio, the GEMMs' TFLOP/s and weight-read GB/s, and
// each elementwise kernel of the layer timed alone (elementwise_ms, elementwise_sum_ms).
// --tensor T: the layer of one tensor rank of T (heads, KV heads and MLP columns / T: fastdecode/model/shard.h),
// measured on one GPU: PREDICTED per-rank compute at T GPUs, without the two all-reduces of B x hidden fp32
// per layer that T ranks add. Those are measured (NCCL, one thread per GPU, CUDA events) only where T GPUs
// answer and the build has NCCL; otherwise allreduce_ms is null and the output says why.
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>

#include <thread>

#include "fastdecode/core/cli_main.h"
#include "fastdecode/model/shard.h"
#include "fastdecode/parallel/comm.h"
#include "fastdecode/spart/cuda_model.h"
#include "harness/bench/cuda_timing.h"
#include "harness/provenance.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/green_context.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/qkv.h"

int main(int argc, char** argv) {
  CLI::App app{"S-Part layer time on the GPU vs its cuBLAS GEMMs alone (same shapes, same run)"};
  app.name("fd-spart-bench");
  std::string model_path, out;
  std::vector<int64_t> batches = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  int64_t reps = 20, sm_count = 0, tensor = 1;
  std::string dtype = "fp16";
  app.add_option("--model", model_path, "Model config (HF config.json)")->required();
  app.add_option("--batches", batches, "Decode batch sizes B")->capture_default_str();
  app.add_option("--reps", reps, "Timed repetitions per B (after one warm-up)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--sm-count", sm_count, "Run on this many SMs (green context); 0 = all")->capture_default_str();
  app.add_option("--dtype", dtype, "16-bit weight and activation type")->check(CLI::IsMember({"fp16", "bf16"}))->capture_default_str();
  app.add_option("--tensor", tensor, "Time one tensor rank's layer of T (per-rank shapes, one GPU); T GPUs and NCCL: "
                 "also the all-reduces")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--out", out, "JSON file to write");
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
      CUDA_CHECK(cudaMemsetAsync(a.a16.get(), 0, size_t(B) * size_t(qd) * 2, s));
      CUDA_CHECK(cudaMemsetAsync(a.i16.get(), 0, size_t(B) * size_t(I) * 2, s));
      auto time = [&](const std::function<void()>& body) { return fd::cuda_ms_per_call(s, reps, body); };
      const double spart = time([&] {
        m.attention_input(a, 0, fd::CudaModel::kF16);  // as FastDecode runs it (fp16 q/k/v for the wire)
        m.attention_output_and_mlp(a, 0);
      });
      const double gemm = time([&] { m.layer_gemms_only(a, 0); });
      // The same stages replayed from one CUDA graph (as the engines run batches of up to
      // GraphCache::kMaxRows rows with cuda_graphs): what the layer costs without launch gaps.
      double graph = 0;
      if (B <= fd::GraphCache::kMaxRows) {
        fd::GraphCache g(s);
        graph = time([&] {
          g.run(0, [&] {
            m.attention_input(a, 0, fd::CudaModel::kF16);
            m.attention_output_and_mlp(a, 0);
          });
        });
      }
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
      const double tflops = 2.0 * layer_params * double(B) / (gemm * 1e-3) / 1e12;
      const double wgbs = layer_params * 2 / (gemm * 1e-3) / 1e9;
      std::printf("%6lld %10.4f %10.4f %7.3f %9.1f %9.0f %12.4f %10.4f\n", (long long)B, spart, gemm, spart / gemm,
                  tflops, wgbs, stage_sum, graph);
      fd::json ar = nullptr;
      if (!nccl.empty()) ar = 2 * allreduce_ms(B);  // two per layer (after o and after down)
      rows.push_back({{"B", B}, {"spart_ms", spart}, {"gemm_ms", gemm}, {"ratio", spart / gemm},
                      {"allreduce_ms", ar},
                      {"spart_graph_ms", graph > 0 ? fd::json(graph) : fd::json(nullptr)},
                      {"graph_ratio", graph > 0 ? fd::json(graph / gemm) : fd::json(nullptr)},
                      {"gemm_tflops", tflops}, {"gemm_weight_gbs", wgbs}, {"elementwise_ms", stages},
                      {"elementwise_sum_ms", stage_sum}});
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
                             {"dtype", dtype},
                             {"method", "CUDA events over reps back-to-back; S-Part = one layer's device stages "
                                        "(no host transfers); ceiling = the same layer's 4 cuBLAS GemmEx calls "
                                        "(16-bit in and out, fp32 accumulation) alone"},
                             {"rows", rows},
                             {"provenance", fd::collect_provenance(fd::join_args(argc, argv))}};
    if (!out.empty()) fd::write_json_file(out, result);
    return 0;
  });
}
