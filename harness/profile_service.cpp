#include "harness/profile_service.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "fastdecode/core/stats.h"
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
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
      for (int c = o.first_cpu; c < o.first_cpu + o.workers * o.threads; ++c)
        if (c >= CPU_SETSIZE || !CPU_ISSET(c, &allowed))
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
                    {"busiest_parts_s_per_layer", parts}};
        rows.push_back(row);
        fx1.push_back(per_worker), fx2.push_back(per_worker * double(S)), fy.push_back(median(round_s));
        const auto ms = [&](const char* k) { return 1e3 * parts.value(k, 0.0); };
        std::fprintf(stderr,
                     "fd-bench profile --service: %s B %lld context %lld: %.3f ms a layer (busiest worker %.3f ms: kernel %.3f, "
                     "append %.3f, query %.3f, prepare %.3f, output %.3f; its loop: handle %.3f, receive %.3f, send %.3f, "
                     "idle %.3f)\n",
                     dtype.c_str(), (long long)B, (long long)S, 1e3 * median(round_s), 1e3 * median(busiest_s), ms("kernel"),
                     ms("append"), ms("query"), ms("prepare"), ms("output"), ms("loop_handle"), ms("loop_receive"),
                     ms("loop_send"), ms("loop_wait"));
      }
    }
    for (int w = 0; w < o.workers; ++w) {
      try {
        client.shutdown(size_t(w), workers[size_t(w)]->token());
      } catch (const Error&) {
      }
      workers[size_t(w)]->wait_exit(5000);
    }
    if (fy.size() >= 3) {
      const ServiceFit f = fit_service(fx1, fx2, fy);
      fits[dtype] = {{"a_s", f.a},
                     {"per_seq_s", f.c},
                     {"per_token_s", f.b},
                     {"r_s_per_token_layer_cpu", f.b * o.threads},
                     {"r2", f.r2},
                     {"max_rel_err", f.max_rel_err}};
    }
  }
  return {{"workers", o.workers},
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
                         "context over the measured steps; fit: "
                         "round = a + per_seq * B/P + per_token * B*S/P (relative least squares); r_s_per_token_layer_cpu = per_token x "
                         "threads"}};
}

}  // namespace fd
