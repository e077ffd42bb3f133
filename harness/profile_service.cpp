#include "harness/profile_service.h"

#include <omp.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "fastdecode/core/affinity.h"
#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "fastdecode/core/stats.h"
#include "fastdecode/rworker/server.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/wire/rworker_client.h"
#include "kernels/cpu/decode_attention.h"

namespace fd {

void check_service_options(const ServiceProfileOptions& o) {
  if (o.workers < 1) throw ConfigError("--rworkers: at least 1 R-worker");
  if (o.threads < 1) throw ConfigError("--rworker-threads: at least 1 thread a worker");
  if (o.layers < 1) throw ConfigError("--service-layers: at least 1 layer");
  if (o.reps < 1) throw ConfigError("--reps: must be >= 1");
  if (o.batches.empty() || o.contexts.empty()) throw ConfigError("--batches and --contexts: give at least one value each");
  for (int64_t b : o.batches)
    if (b < o.workers)
      throw ConfigError("--batches: " + std::to_string(b) + " sequences leave some of the " + std::to_string(o.workers) +
                        " R-workers (--rworkers) without any");
  for (int64_t s : o.contexts)
    if (s < 1) throw ConfigError("--contexts: " + std::to_string(s) + " is not >= 1");
  for (const std::string& n : o.kv_dtypes)
    if (n != "fp16" && n != "int8" && n != "int4")
      throw ConfigError("--kv-dtypes: unknown KV dtype '" + n + "' (expected fp16, int8 or int4)");
  if (o.pin) {
    const std::vector<int> allowed = allowed_cpus();  // ascending; empty when it cannot be read
    if (!allowed.empty())
      for (int c = o.first_cpu; c < o.first_cpu + o.workers * o.threads; ++c)
        if (!std::binary_search(allowed.begin(), allowed.end(), c))
          throw ConfigError("--rworkers " + std::to_string(o.workers) + " x --rworker-threads " + std::to_string(o.threads) +
                            " pinned from CPU " + std::to_string(o.first_cpu) + ": CPU " + std::to_string(c) +
                            " is not one this process may run on (fewer workers or threads, or --no-pin)");
  }
}

namespace {

std::vector<uint16_t> random_f16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = fp32_to_fp16(d(rng));
  return v;
}

}  // namespace

KernelAlone replay_kernel_alone(const ModelConfig& model, const ServiceProfileOptions& o, const std::string& dtype,
                                int64_t batch, int64_t context) {
  FD_CHECK(batch >= o.workers && context >= 1, "replay_kernel_alone: B " << batch << " on " << o.workers << " workers");
  const KVDType dt = kv_dtype_from_name(dtype);
  const int H = int(model.num_heads), K = int(model.num_kv_heads), D = int(model.head_dim), L = o.layers, V = 2 * L;
  const int n_full = int(context / kKVBlockTokens), n_tail = int(context % kKVBlockTokens);
  const size_t blk = kv_block_bytes(dt, K, D), tail_bytes = kv_fp16_block_bytes(K, D);
  // One block's bytes (random fp16 quantized to the dtype) and an fp16 tail, copied everywhere: the kernel's time does
  // not depend on the values, only on where they lie.
  std::vector<uint16_t> f16(tail_bytes / 2);
  {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& e : f16) e = fp32_to_fp16(nd(rng));
  }
  std::vector<uint8_t> one(blk);
  kv_quantize_block(dt, f16.data(), one.data(), K, D);
  std::vector<double> busy(size_t(o.workers), 0.0);
  std::vector<int64_t> held(size_t(o.workers), 0);  // tokens each worker's replay holds at one layer (its views')
  std::barrier sync(o.workers);
  std::exception_ptr failed;
  std::mutex failed_mu;
  const auto worker = [&](int w) {
    try {
      if (o.pin) {
        std::vector<int> cpus;
        for (int c = 0; c < o.threads; ++c) cpus.push_back(o.first_cpu + w * o.threads + c);
        pin_openmp_threads(cpus, o.threads);
      }
      // This worker's sequences (i mod P == w) by mini-batch ((i / P) mod 2), as the service places them.
      int n_mb[2] = {0, 0};
      for (int64_t i = w; i < batch; i += o.workers) ++n_mb[(i / o.workers) % 2];
      const int n_seq = n_mb[0] + n_mb[1];
      const size_t seq_bytes = size_t(n_full) * blk + (n_tail ? tail_bytes : 0);
      const size_t total = size_t(L) * size_t(n_seq) * seq_bytes;
      std::unique_ptr<uint8_t[]> mem(new uint8_t[std::max<size_t>(total, 1)]);
      // First touch by this worker's own threads (as a worker's store is written by its own appends).
#pragma omp parallel for num_threads(o.threads) schedule(static)
      for (int64_t u = 0; u < int64_t(L) * n_seq; ++u) {
        uint8_t* at = mem.get() + size_t(u) * seq_bytes;
        for (int b = 0; b < n_full; ++b) std::memcpy(at + size_t(b) * blk, one.data(), blk);
        if (n_tail) std::memcpy(at + size_t(n_full) * blk, f16.data(), tail_bytes);
      }
      std::vector<const void*> ptrs(size_t(L) * size_t(n_seq) * size_t(std::max(n_full, 1)));
      std::vector<SeqKVView> views(size_t(L) * size_t(n_seq));
      for (int64_t u = 0; u < int64_t(L) * n_seq; ++u) {
        uint8_t* at = mem.get() + size_t(u) * seq_bytes;
        const void** pp = &ptrs[size_t(u) * size_t(std::max(n_full, 1))];
        for (int b = 0; b < n_full; ++b) pp[b] = at + size_t(b) * blk;
        views[size_t(u)] = {pp, n_full, n_tail ? reinterpret_cast<const uint16_t*>(at + size_t(n_full) * blk) : nullptr,
                            n_tail};
      }
      for (int64_t u = 0; u < n_seq; ++u) held[size_t(w)] += views[size_t(u)].n_tokens();
      std::vector<float> q(size_t(std::max(n_mb[0], n_mb[1])) * size_t(H) * size_t(D), 0.1f), out(q.size());
      DecodeAttentionWorkspace ws;
      double mine = 0;
      for (int step = 0; step < o.reps + 1; ++step)
        for (int visit = 0; visit < V; ++visit) {
          sync.arrive_and_wait();  // the visit's requests reach every worker together
          const int l = visit % L;
          for (int mb = 0, first = 0; mb < 2; first += n_mb[mb], ++mb) {
            if (n_mb[mb] == 0) continue;
            DecodeAttentionParams p;
            p.dtype = dt, p.n_seq = n_mb[mb], p.n_heads = H, p.n_kv_heads = K, p.head_dim = D;
            p.scale = 1.0f / std::sqrt(float(D));
            p.seqs = &views[size_t(l) * size_t(n_seq) + size_t(first)];
            p.q = q.data(), p.o = out.data();
            const int64_t t0 = now_ns();
            decode_attention(p, best_isa(), o.threads, ws);
            if (step > 0) mine += double(now_ns() - t0) / 1e9;
          }
        }
      busy[size_t(w)] = mine / double(o.reps * V);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failed_mu);
      if (!failed) failed = std::current_exception();
      sync.arrive_and_drop();
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < o.workers; ++w) threads.emplace_back(worker, w);
  for (auto& t : threads) t.join();
  if (failed) std::rethrow_exception(failed);
  KernelAlone r;
  r.busiest_s_per_layer = *std::max_element(busy.begin(), busy.end());
  r.busiest_tokens = *std::max_element(held.begin(), held.end());
  for (double b : busy) r.mean_s_per_layer += b / double(busy.size());
  return r;
}

ServiceFit fit_service(const std::vector<double>& x1, const std::vector<double>& x2, const std::vector<double>& y) {
  const size_t n = y.size();
  FD_CHECK(n == x1.size() && n == x2.size() && n >= 3, "fit_service: need 3 or more points of (x1, x2, y)");
  // Relative least squares: minimises the sum of ((fit - y) / y)², so a 1 ms point counts as much as a 100 ms one
  // (the runs it predicts span that range). Normal equations of the weighted rows [1 x1 x2] / y · (a c b) = 1, solved
  // by Gaussian elimination with partial pivoting.
  double m[3][4] = {};
  for (size_t i = 0; i < n; ++i) {
    FD_CHECK(y[i] > 0, "fit_service: a round of " << y[i] << " s");
    const double r[3] = {1.0 / y[i], x1[i] / y[i], x2[i] / y[i]};
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 3; ++k) m[j][k] += r[j] * r[k];
      m[j][3] += r[j];
    }
  }
  for (int col = 0; col < 3; ++col) {
    int piv = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::fabs(m[r][col]) > std::fabs(m[piv][col])) piv = r;
    FD_CHECK(std::fabs(m[piv][col]) > 0, "fit_service: the points do not determine the fit (too few distinct B or B·S)");
    for (int k = 0; k < 4; ++k) std::swap(m[col][k], m[piv][k]);
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (int k = col; k < 4; ++k) m[r][k] -= f * m[col][k];
    }
  }
  ServiceFit f;
  f.a = m[0][3] / m[0][0], f.c = m[1][3] / m[1][1], f.b = m[2][3] / m[2][2];
  double mean = 0, ss_tot = 0, ss_res = 0;
  for (double v : y) mean += v / double(n);
  for (size_t i = 0; i < n; ++i) {
    const double p = f.a + f.c * x1[i] + f.b * x2[i];
    ss_tot += (y[i] - mean) * (y[i] - mean);
    ss_res += (y[i] - p) * (y[i] - p);
    f.max_rel_err = std::max(f.max_rel_err, std::fabs(p / y[i] - 1));
  }
  f.r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 1;
  return f;
}

json measure_service_profile(const ModelConfig& model, const ServiceProfileOptions& o) {
  check_service_options(o);
  using proto::Header;
  using proto::MsgType;
  const int H = int(model.num_heads), K = int(model.num_kv_heads), D = int(model.head_dim);
  const size_t kvb = size_t(K) * size_t(D) * 2;  // one token's K (or V), fp16 on the wire
  const int64_t b_max = *std::max_element(o.batches.begin(), o.batches.end());
  const int64_t s_max = *std::max_element(o.contexts.begin(), o.contexts.end());
  const int64_t per_worker_max = (b_max + o.workers - 1) / o.workers;
  // Each worker's memory: its largest share at the longest context (+ the steps), fp16 blocks (the largest), + slack.
  const double worker_gb =
      double(per_worker_max) * double(s_max + o.reps + 64) * double(o.layers) * double(2 * kvb) * 1.15 / 1e9 + 0.5;
  const std::string bin = o.binary.empty() ? default_rworker_binary() : o.binary;
  // Request buffers, the largest a worker's mini-batch needs: random fp16 q, k, v.
  const size_t rows_max = size_t((per_worker_max + 1) / 2 + 1);
  const std::vector<uint16_t> q = random_f16(rows_max * size_t(H) * size_t(D), 1), k = random_f16(rows_max * kvb / 2, 2),
                              v = random_f16(rows_max * kvb / 2, 3);
  json rows = json::array(), fits = json::object();
  for (const std::string& dtype : o.kv_dtypes) {
    std::vector<std::unique_ptr<SpawnedRWorker>> workers;
    std::vector<std::string> endpoints;
    for (int w = 0; w < o.workers; ++w) {
      std::vector<std::string> args = {"--threads", std::to_string(o.threads), "--kv-dtype", dtype, "--memory-gb",
                                       std::to_string(worker_gb), "--name", "svc" + std::to_string(w)};
      if (o.pin) {
        const int first = o.first_cpu + w * o.threads;
        args.insert(args.end(), {"--cpus", std::to_string(first) + "-" + std::to_string(first + o.threads - 1)});
      }
      workers.push_back(std::make_unique<SpawnedRWorker>(bin, args, 20000));
      endpoints.push_back(workers.back()->endpoint());
    }
    RWorkerClientOptions co;
    co.timeout_ms = 600000;
    co.shm_bytes = o.shm ? kEngineShmBytes : 0;
    RWorkerClient client(endpoints, co);
    for (int w = 0; w < o.workers; ++w) client.hello(size_t(w), o.layers, H, K, D, proto::WireDType::F16);
    uint64_t next_id = 1;
    std::vector<double> fx1, fx2, fy;
    for (int64_t S : o.contexts) {
      for (int64_t B : o.batches) {
        // Placement: sequence i on worker i mod P, in mini-batch (i / P) mod 2.
        std::vector<std::vector<uint64_t>> ids(static_cast<size_t>(o.workers)), mb_ids[2];
        mb_ids[0].resize(size_t(o.workers)), mb_ids[1].resize(size_t(o.workers));
        for (int64_t i = 0; i < B; ++i) {
          const size_t w = size_t(i % o.workers);
          ids[w].push_back(next_id);
          mb_ids[(i / o.workers) % 2][w].push_back(next_id);
          ++next_id;
        }
        const int64_t t_append = now_ns();
        for (int w = 0; w < o.workers; ++w) client.add_seqs(size_t(w), ids[size_t(w)]);
        // The prompts' KV at every layer, in the messages an S-rank would send (chunk_appends).
        std::vector<std::vector<AppendChunk>> chunks(static_cast<size_t>(o.workers));
        size_t chunk_rows = 1;
        for (int w = 0; w < o.workers; ++w) {
          const std::vector<uint32_t> counts(ids[size_t(w)].size(), uint32_t(S));
          chunks[size_t(w)] = chunk_appends(ids[size_t(w)], counts, 0, client.append_bytes(size_t(w), size_t(8) << 20) / (2 * kvb));
          for (const AppendChunk& c : chunks[size_t(w)]) chunk_rows = std::max(chunk_rows, c.end - c.begin);
        }
        const std::vector<uint16_t> kv = random_f16(chunk_rows * kvb / 2, uint32_t(7 + S));
        for (int l = 0; l < o.layers; ++l) {
          std::vector<std::pair<size_t, uint64_t>> sent;
          for (int w = 0; w < o.workers; ++w)
            for (const AppendChunk& c : chunks[size_t(w)]) {
              Header h = proto::make_header(MsgType::AppendKV, H, K, D, proto::WireDType::F16, uint32_t(c.ids.size()));
              h.layer = uint32_t(l);
              h.n_tokens = uint32_t(c.end - c.begin);
              const size_t n = c.end - c.begin;
              sent.push_back({size_t(w), client.send(size_t(w), h, {{c.ids.data(), c.ids.size() * 8},
                                                                    {c.counts.data(), c.counts.size() * 4},
                                                                    {kv.data(), n * kvb}, {kv.data(), n * kvb}})});
            }
          client.wait(sent);
        }
        const double append_s = double(now_ns() - t_append) / 1e9;
        // Decode steps as the engine pipelines them: two requests in flight a worker (a layer's two mini-batches), and
        // the replies of (visit v, mini-batch m) let (v + 1, m) go, as that mini-batch's S-Part would once it had
        // them. The visits cycle the layers, 2 L a step; a layer's time is the steady rate after the first visit
        // (whose own latency, the pipeline's fill, is kept apart).
        const int V = 2 * o.layers;
        const auto send_visit = [&](int visit, int mb) {
          std::vector<std::pair<size_t, uint64_t>> sent;
          for (int w = 0; w < o.workers; ++w) {
            const std::vector<uint64_t>& s = mb_ids[mb][size_t(w)];
            if (s.empty()) continue;
            Header h = proto::make_header(MsgType::Attend, H, K, D, proto::WireDType::F16, uint32_t(s.size()));
            h.layer = uint32_t(visit % o.layers);
            sent.push_back({size_t(w), client.send(size_t(w), h, {{s.data(), s.size() * 8},
                                                                  {q.data(), s.size() * size_t(H) * size_t(D) * 2},
                                                                  {k.data(), s.size() * kvb}, {v.data(), s.size() * kvb}})});
          }
          return sent;
        };
        std::vector<double> round_s, busiest_s, mean_s, first_s;
        // Each worker's ATTEND time by part (STATS attend_parts_s) over the measured steps: snapshots after the warm-up
        // step and at the end.
        const auto parts_now = [&]() {
          std::vector<json> v;
          for (int w = 0; w < o.workers; ++w) {
            const json st = client.stats(size_t(w));
            json p = st.value("attend_parts_s", json::object());
            p["compute"] = st.value("attend_compute_s", 0.0);
            // The socket loop around them: idle before each ATTEND came, its receipt, its handling, the reply's send.
            for (const char* k : {"wait", "receive", "handle", "send"})
              if (st.contains("attend_loop_s")) p[std::string("loop_") + k] = st["attend_loop_s"].value(k, 0.0);
            v.push_back(p);
          }
          return v;
        };
        std::vector<json> parts0;
        for (int step = 0; step < o.reps + 1; ++step) {
          double busy = 0, mean = 0;
          const int64_t t0 = now_ns();
          std::vector<std::pair<size_t, uint64_t>> inflight[2] = {send_visit(0, 0), send_visit(0, 1)};
          int64_t t_first = 0;
          for (int visit = 0; visit < V; ++visit) {
            for (int mb = 0; mb < 2; ++mb) {
              const std::vector<RWorkerReply> replies = client.wait(inflight[mb]);
              double mx = 0, sum = 0;
              for (const RWorkerReply& r : replies) mx = std::max(mx, double(r.h.compute_ns) / 1e9), sum += double(r.h.compute_ns) / 1e9;
              busy += mx, mean += replies.empty() ? 0 : sum / double(replies.size());
              inflight[mb] = visit + 1 < V ? send_visit(visit + 1, mb) : std::vector<std::pair<size_t, uint64_t>>{};
            }
            if (visit == 0) t_first = now_ns();
          }
          const int64_t t_end = now_ns();
          if (step == 0) {  // warm-up
            parts0 = parts_now();
            continue;
          }
          round_s.push_back(double(t_end - t_first) / 1e9 / double(V - 1));
          first_s.push_back(double(t_first - t0) / 1e9);
          busiest_s.push_back(busy / V), mean_s.push_back(mean / V);
        }
        // The busiest worker's (most compute over the measured steps) parts, a layer's visit's worth (per layer, as
        // busiest_compute_s_per_layer).
        const std::vector<json> parts1 = parts_now();
        size_t busiest_w = 0;
        for (size_t w = 0; w < parts1.size(); ++w)
          if (parts1[w]["compute"].get<double>() - parts0[w]["compute"].get<double>() >
              parts1[busiest_w]["compute"].get<double>() - parts0[busiest_w]["compute"].get<double>())
            busiest_w = w;
        json parts = json::object();
        for (auto it = parts1[busiest_w].begin(); it != parts1[busiest_w].end(); ++it)
          parts[it.key()] = (it.value().get<double>() - parts0[busiest_w].value(it.key(), 0.0)) / double(o.reps * V);
        for (int w = 0; w < o.workers; ++w) client.free_seqs(size_t(w), ids[size_t(w)]);
        // The kernel alone on the same bytes and cores (the workers idle meanwhile): contexts of S + the tokens the
        // measured steps appended, on average (2 a step and layer: a layer is visited twice a step).
        const KernelAlone alone = replay_kernel_alone(model, o, dtype, B, S + 2 + o.reps);
        const double per_worker = double(B) / double(o.workers);
        json row = {{"kv_dtype", dtype},
                    {"batch", B},
                    {"context", S},
                    {"round_s_per_layer", median(round_s)},
                    {"busiest_compute_s_per_layer", median(busiest_s)},
                    {"mean_compute_s_per_layer", median(mean_s)},
                    {"first_layer_s", median(first_s)},
                    {"append_s", append_s},
                    {"busiest_worker_tokens", double((B + o.workers - 1) / o.workers) * double(S + o.reps + 1)},
                    {"busiest_parts_s_per_layer", parts},
                    {"kernel_alone_s_per_layer", alone.busiest_s_per_layer},
                    {"kernel_alone_mean_s_per_layer", alone.mean_s_per_layer},
                    {"kernel_alone_busiest_tokens", alone.busiest_tokens}};
        if (alone.busiest_s_per_layer > 0) {
          row["kernel_in_service_over_alone"] = parts.value("kernel", 0.0) / alone.busiest_s_per_layer;
          row["compute_over_kernel_alone"] = parts.value("compute", 0.0) / alone.busiest_s_per_layer;
          row["round_over_kernel_alone"] = median(round_s) / alone.busiest_s_per_layer;
        }
        rows.push_back(row);
        fx1.push_back(per_worker), fx2.push_back(per_worker * double(S)), fy.push_back(median(round_s));
        const auto ms = [&](const char* k) { return 1e3 * parts.value(k, 0.0); };
        std::fprintf(stderr,
                     "fd-bench profile --service: %s B %lld context %lld: %.3f ms a layer (busiest worker %.3f ms: kernel %.3f, "
                     "append %.3f, query %.3f, prepare %.3f, output %.3f; its loop: handle %.3f, receive %.3f, send %.3f, "
                     "idle %.3f); the kernel alone on the same bytes and cores %.3f ms (busiest), %.3f (mean)\n",
                     dtype.c_str(), (long long)B, (long long)S, 1e3 * median(round_s), 1e3 * median(busiest_s), ms("kernel"),
                     ms("append"), ms("query"), ms("prepare"), ms("output"), ms("loop_handle"), ms("loop_receive"),
                     ms("loop_send"), ms("loop_wait"), 1e3 * alone.busiest_s_per_layer, 1e3 * alone.mean_s_per_layer);
      }
    }
    for (int w = 0; w < o.workers; ++w) {
      try {
        client.shutdown(size_t(w), workers[size_t(w)]->token());
      } catch (const Error&) {
      }
      workers[size_t(w)]->wait_exit(5000);
    }
    // The fit needs points that determine it: three or more, with B·S not proportional to B (two contexts or more).
    // Otherwise the rows stand alone and the fit says why it is missing (the rows are what was measured).
    std::string no_fit;
    ServiceFit f;
    try {
      if (fy.size() < 3) no_fit = "fewer than 3 grid points";
      else f = fit_service(fx1, fx2, fy);
    } catch (const Error& e) {
      no_fit = e.what();
    }
    if (!no_fit.empty()) {
      fits[dtype] = {{"error", no_fit}};
    } else {
      fits[dtype] = {{"a_s", f.a},
                     {"per_seq_s", f.c},
                     {"per_token_s", f.b},
                     {"r_s_per_token_layer_cpu", f.b * o.threads},
                     {"r2", f.r2},
                     {"max_rel_err", f.max_rel_err}};
    }
  }
  return {{"workers", o.workers},
          {"rworker_binary", bin},
          {"threads", o.threads},
          {"pinned", o.pin},
          {"layers", o.layers},
          {"shm", o.shm},
          {"rows", rows},
          {"fit", fits},
          {"method", "spawned fd-rworker processes (" + std::to_string(o.workers) + " x " + std::to_string(o.threads) + " threads" +
                         (o.pin ? ", pinned" : "") + (o.shm ? ", shared-memory lane" : ", ZeroMQ only") +
                         "), sequence i on worker i mod P in mini-batch (i / P) mod 2, each holding `context` prompt tokens at " +
                         std::to_string(o.layers) + " layer(s); per decode step 2 x layers visits of the layers, each one ATTEND "
                         "to every worker per mini-batch (its share's q, k, v: the append included), pipelined as the engine "
                         "issues them (two in flight a worker; a mini-batch's replies let its next visit go); round_s_per_layer: "
                         "the steady time a layer after the first visit, first_layer_s: the first visit's latency (the fill), "
                         "medians of " + std::to_string(o.reps) + " steps after one warm-up; busiest_parts_s_per_layer: the busiest worker's "
                         "ATTEND time by part (its STATS attend_parts_s: prepare = ids, memory check and views; append = "
                         "this step's k / v; query = q to fp32; kernel = decode attention; output = o to the wire; compute = "
                         "their sum; and its socket loop's attend_loop_s: loop_wait = idle before each ATTEND came, "
                         "loop_receive, loop_handle = the handler with the shared-memory lane's work, loop_send) over the "
                         "measured steps, per layer; busiest_worker_tokens: its sequences x their mean "
                         "context over the measured steps; kernel_alone_s_per_layer: the kernel alone on the same bytes and "
                         "cores (this process, a thread per worker whose OpenMP team is pinned as that worker's threads, "
                         "holding its share's KV at every layer in the worker's dtype, contexts of context + 2 + reps tokens, "
                         "running decode_attention on each visit's two mini-batches as the worker does, the workers' "
                         "threads meeting at a barrier before each visit), the busiest's seconds a visit over the measured "
                         "steps (kernel_alone_mean_s_per_layer: the mean worker's); fit: "
                         "round = a + per_seq * B/P + per_token * B*S/P (relative least squares); r_s_per_token_layer_cpu = per_token x "
                         "threads"}};
}

}  // namespace fd
