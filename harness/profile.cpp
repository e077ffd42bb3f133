#include "harness/profile.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "fastdecode/spart/spart.h"
#include "fastdecode/core/stats.h"
#include "harness/provenance.h"
#include "kernels/cpu/decode_attention.h"

namespace fd {

namespace {

// First whitespace-separated word of a small text file; "" when it cannot be read.
std::string read_word(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string w;
  if (f) f >> w;
  return w;
}

// "32768K" / "32M" / "1G" / "4096" (sysfs cache size) -> bytes; 0 when malformed.
int64_t parse_size(const std::string& s) {
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) return 0;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (...) {
    return 0;
  }
  const std::string unit = s.substr(used);
  if (unit.empty()) return v;
  if (unit == "K") return v << 10;
  if (unit == "M") return v << 20;
  if (unit == "G") return v << 30;
  return 0;
}

std::string mib(int64_t bytes) {
  std::ostringstream o;
  o.precision(4);
  o << double(bytes) / double(1 << 20) << " MiB";
  return o.str();
}

void check_options(const ProfileOptions& o) {
  if (o.backend != "cpu" && o.backend != "cuda")
    throw ConfigError("--backend: '" + o.backend + "' is not an S-Part backend (cpu or cuda)");
  if (o.sm_count < 0) throw ConfigError("--sm-count: must be >= 0 (0: the whole GPU), got " + std::to_string(o.sm_count));
  if (o.sm_count > 0 && o.backend != "cuda")
    throw ConfigError("--sm-count " + std::to_string(o.sm_count) + ": limits the CUDA S-Part's SMs (--backend cuda); "
                      "--backend " + o.backend + " has no SMs to limit");
  if (o.batches.empty()) throw ConfigError("--batches: give at least one batch size");
  for (size_t i = 0; i < o.batches.size(); ++i) {
    if (o.batches[i] < 1) throw ConfigError("--batches: " + std::to_string(o.batches[i]) + " is not >= 1");
    if (i > 0 && o.batches[i] <= o.batches[i - 1])
      throw ConfigError("--batches: must be strictly increasing (" + std::to_string(o.batches[i - 1]) + " then " +
                        std::to_string(o.batches[i]) + ")");
  }
  if (o.kv_dtypes.empty()) throw ConfigError("--kv-dtypes: give at least one KV dtype");
  for (const std::string& n : o.kv_dtypes)
    if (n != "fp16" && n != "int8" && n != "int4")
      throw ConfigError("--kv-dtypes: unknown KV dtype '" + n + "' (expected fp16, int8 or int4)");
  if (o.context < kKVBlockTokens)
    throw ConfigError("--context: " + std::to_string(o.context) + " is shorter than one KV block (" +
                      std::to_string(kKVBlockTokens) + " tokens)");
  if (o.reps < 1) throw ConfigError("--reps: must be >= 1");
  if (o.r_threads < 1) throw ConfigError("--r-threads: must be >= 1");
}

}  // namespace

int64_t read_llc_bytes(const std::string& cache_dir) {
  std::error_code ec;
  int best_level = -1;
  int64_t best = 0;
  for (const auto& e : std::filesystem::directory_iterator(cache_dir, ec)) {
    if (e.path().filename().string().rfind("index", 0) != 0) continue;
    const std::string level = read_word(e.path() / "level");
    const int64_t size = parse_size(read_word(e.path() / "size"));
    if (level.empty() || !std::isdigit(static_cast<unsigned char>(level[0])) || size <= 0) continue;
    const int l = std::atoi(level.c_str());
    if (l > best_level || (l == best_level && size > best)) best_level = l, best = size;
  }
  return best;
}

int64_t read_mem_available_bytes(const std::string& meminfo) {
  std::ifstream f(meminfo);
  std::string key, unit;
  int64_t v = 0;
  while (f >> key >> v) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return unit.find("kB") != std::string::npos ? v * 1024 : v;
  }
  return 0;
}

RWorkingSet r_working_set(int64_t llc_bytes, int r_threads, int64_t mem_available_bytes) {
  RWorkingSet w;
  w.llc_known = llc_bytes > 0;
  w.llc_bytes = w.llc_known ? llc_bytes : kRFallbackLLCBytes;
  w.wanted = std::max({4 * w.llc_bytes, kRMinWorkingSetBytes, int64_t(256e6) * std::max(1, r_threads / 4)});
  w.cap_bytes = mem_available_bytes > 0 ? mem_available_bytes / 4 : int64_t(4) << 30;
  w.bytes = std::min(w.wanted, w.cap_bytes);
  return w;
}

json measure_profile(const ModelConfig& model, const ProfileOptions& o) {
  check_options(o);
  if (o.service) check_service_options(o.svc);  // before anything is measured
  // T(B) on one layer of the model (random weights: the time does not depend on the values), as the
  // FastDecode engine drives it: q/k/v out and the attention output in through the backend's host
  // buffers in the wire dtype (fp16 on the GPU, fp32 on the CPU backend).
  const ModelConfig one = with_layers(model, 1);
  auto src = make_random_source(1, DType::F16);
  CudaSPartOptions cuda_opt;
  cuda_opt.sm_count = o.sm_count;
  std::unique_ptr<SPart> sp = o.backend == "cuda" ? make_cuda_spart(load_model_weights(one, *src), cuda_opt)
                                                  : make_cpu_spart(load_model_weights(one, *src));
  const DType wire = o.backend == "cuda" ? DType::F16 : DType::F32;
  const size_t es = dtype_size(wire);
  json t_b = json::array(), head_b = json::array();
  for (int64_t B : o.batches) {
    HostBuffer q = sp->alloc_host(size_t(B * one.q_dim()) * es), k = sp->alloc_host(size_t(B * one.kv_dim()) * es),
               v = sp->alloc_host(size_t(B * one.kv_dim()) * es), att = sp->alloc_host(size_t(B * one.q_dim()) * es);
    std::memset(att.data(), 0, att.size());
    std::vector<int32_t> tokens(size_t(B), 5);
    std::vector<int64_t> pos(size_t(B), 7);
    sp->embed(0, tokens.data(), pos.data(), B);
    std::vector<double> ts;
    for (int r = 0; r < o.reps + 1; ++r) {
      const int64_t t0 = now_ns();
      sp->attention_input(0, 0, wire, q.data(), k.data(), v.data());
      sp->set_attention(0, wire, {{att.data(), B}});
      sp->attention_output_and_mlp(0, 0);
      if (r > 0) ts.push_back(double(now_ns() - t0) / 1e9);
    }
    t_b.push_back({B, median(ts)});
    // The step's own GPU work besides its layers: the final norm, the LM head and greedy sampling of B rows, the
    // tokens copied down (SPart::sample), as every decode step runs it once.
    std::vector<int32_t> rows(static_cast<size_t>(B)), picked(static_cast<size_t>(B));
    std::vector<uint64_t> rids(static_cast<size_t>(B)), steps(static_cast<size_t>(B), 0);
    for (int64_t i = 0; i < B; ++i) rows[size_t(i)] = int32_t(i), rids[size_t(i)] = uint64_t(i);
    std::vector<double> hs;
    for (int r = 0; r < o.reps + 1; ++r) {
      const int64_t t0 = now_ns();
      sp->sample(0, rows, SamplingParams{}, rids, steps, picked.data());
      if (r > 0) hs.push_back(double(now_ns() - t0) / 1e9);
    }
    head_b.push_back({B, median(hs)});
  }
  // R: r_threads threads over n_seq sequences of `context` tokens, enough KV to stream from DRAM
  // (r_working_set: >= 4 x the last-level cache and >= 1 GiB, capped by free memory).
  const RWorkingSet ws_size = r_working_set(read_llc_bytes(), o.r_threads, read_mem_available_bytes());
  const int H = int(model.num_kv_heads), D = int(model.head_dim);
  json r_map = json::object(), bytes_read = json::object();
  std::string bytes_text;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const std::string& name : o.kv_dtypes) {
    const KVDType dt = kv_dtype_from_name(name);
    const int n_full = int(o.context / kKVBlockTokens);
    const size_t blk = kv_block_bytes(dt, H, D);
    const double seq_bytes = double(n_full) * double(blk);
    const int n_seq = int(std::max<int64_t>(4 * int64_t(o.r_threads), int64_t(std::ceil(double(ws_size.bytes) / seq_bytes))));
    std::vector<uint16_t> f16(kv_fp16_block_bytes(H, D) / 2);
    for (auto& e : f16) e = fp32_to_fp16(nd(rng));
    std::vector<uint8_t> one_block(blk);
    kv_quantize_block(dt, f16.data(), one_block.data(), H, D);
    std::vector<std::vector<uint8_t>> store(size_t(n_seq) * size_t(n_full), one_block);
    std::vector<const void*> ptrs;
    for (auto& b : store) ptrs.push_back(b.data());
    std::vector<SeqKVView> views(static_cast<size_t>(n_seq));
    for (int s = 0; s < n_seq; ++s) views[size_t(s)] = {&ptrs[size_t(s) * n_full], n_full, nullptr, 0};
    std::vector<float> qv(size_t(n_seq) * model.num_heads * D, 0.1f), out(qv.size());
    DecodeAttentionParams p;
    p.dtype = dt, p.n_seq = n_seq, p.n_heads = int(model.num_heads), p.n_kv_heads = H, p.head_dim = D;
    p.scale = 1.0f / std::sqrt(float(D)), p.seqs = views.data(), p.q = qv.data(), p.o = out.data();
    DecodeAttentionWorkspace ws;
    std::vector<double> ts;
    for (int r = 0; r < o.reps + 1; ++r) {
      const int64_t t0 = now_ns();
      decode_attention(p, best_isa(), o.r_threads, ws);
      if (r > 0) ts.push_back(double(now_ns() - t0) / 1e9);
    }
    // Seconds per token per layer for ONE CPU: r_threads CPUs share the work (and the memory bus).
    r_map[name] = median(ts) * double(o.r_threads) / (double(n_seq) * double(n_full) * kKVBlockTokens);
    const int64_t read = int64_t(n_seq) * n_full * int64_t(blk);
    bytes_read[name] = read;
    bytes_text += (bytes_text.empty() ? "" : ", ") + name + " " + mib(read);
  }
  const std::string llc_text = ws_size.llc_known ? "last-level cache " + mib(ws_size.llc_bytes) + " (sysfs)"
                                                 : "last-level cache unreadable, " + mib(ws_size.llc_bytes) + " assumed";
  json method = {
      {"t_b", sp->describe() + "; one layer (attention input with q/k/v to the host, attention output from the host, "
                               "output projection and MLP) for B decode tokens, median; head_b: the final norm, LM head and "
                               "greedy sampling of B rows with the token ids copied down (once a step), median" +
                  (o.sm_count > 0 ? "; --sm-count " + std::to_string(o.sm_count) + " (green context)" : std::string())},
      {"r", "decode attention on " + std::to_string(o.r_threads) + " thread(s) together (" +
                std::string(isa_name(best_isa())) + "), R = time x threads / tokens, contexts of " +
                std::to_string(o.context) + " tokens, KV read per repetition: " + bytes_text + "; " + llc_text +
                "; working set max(4 x LLC, 1 GiB, 256 MB x max(1, threads/4))" +
                (ws_size.capped() ? ", CAPPED at a quarter of MemAvailable (" + mib(ws_size.cap_bytes) +
                                        "): partly from cache"
                                  : std::string()) +
                ", median time / tokens"},
      {"r_bytes_read", bytes_read},
      {"llc_bytes", ws_size.llc_known ? json(ws_size.llc_bytes) : json(nullptr)},
      {"r_working_set_capped", ws_size.capped()}};
  json j = {{"t_b", t_b},
            {"head_b", head_b},
            {"r_s_per_token_layer", r_map},
            {"layers", model.full_num_layers},
            {"backend", o.backend},
            {"r_threads", o.r_threads},
            {"method", method},
            {"provenance", collect_provenance(o.command_line)}};
  if (o.backend == "cuda") j["sm_count"] = o.sm_count;  // 0: the whole GPU
  if (o.service) {
    j["r_service"] = measure_service_profile(model, o.svc);
    // The model's view of the same rows: R of the kernel measured above (per CPU, at --context) x the busiest worker's
    // tokens / its threads, beside the replay's kernel alone on the rows' own bytes (kernel_alone_s_per_layer).
    for (json& row : j["r_service"]["rows"]) {
      const std::string dt = row["kv_dtype"].get<std::string>();
      if (!r_map.contains(dt) || !row.contains("busiest_worker_tokens")) continue;
      row["r_kernel_s_per_layer"] = r_map[dt].get<double>() / double(o.svc.threads) * row["busiest_worker_tokens"].get<double>();
    }
  }
  return j;
}

}  // namespace fd
