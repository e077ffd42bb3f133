// Faults survived, nothing lost, no one let in (issue 16; docs/RELIABILITY.md, docs/SECURITY.md), with real
// fd-rworker processes on TCP loopback:
//   * recovery: an R-worker killed (SIGKILL) or stopped (SIGSTOP) mid-run, fp16 and int8 KV: the run completes with
//     the tokens of a fault-free run (every request whole), the recovering step counted; with no survivor, or
//     on_failure fail, the step fails naming the worker within about one heartbeat timeout;
//   * sessions over the wire: two engines sharing user-started workers both finish with the reference tokens; a
//     client that vanishes without a word (a killed run) has its sequences freed by the worker;
//   * CURVE: a client without the workers' key, or with a key the worker does not admit, is refused; with the keys
//     the run is the same run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "baselines/reference/reference_engine.h"
#include "fastdecode/sworker/fastdecode_engine.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/wire/curve.h"
#include "fastdecode/wire/rworker_client.h"
#include "tests/unit/test_helpers.h"
#include "tests/unit/token_compare.h"

using namespace fd;
using fd::test::first_divergence;
using fd::test::repo_path;

namespace {

ModelConfig tiny() { return load_model_config(repo_path("experiments/models/tiny-llama.json")); }

std::vector<Request> requests(const ModelConfig& c, int n = 6) {
  std::vector<Request> r;
  for (int i = 0; i < n; ++i) {
    Request q;
    q.id = uint64_t(20 + i);
    for (int t = 0; t < 5 + 7 * i; ++t) q.prompt.push_back(int32_t(3 + (i * 41 + t * 13) % (c.vocab_size - 3)));
    q.max_new_tokens = 40 + 4 * i;  // contexts cross the 32-token block boundary while decoding
    r.push_back(q);
  }
  return r;
}

struct Worker : SpawnedRWorker {
  explicit Worker(const std::string& name, const std::string& kv = "fp16", std::vector<std::string> extra = {})
      : SpawnedRWorker(std::string(FD_BIN_DIR) + "/fd-rworker", args(name, kv, std::move(extra))) {}
  static std::vector<std::string> args(const std::string& name, const std::string& kv, std::vector<std::string> extra) {
    std::vector<std::string> a = {"--threads", "1", "--memory-gb", "0.1", "--kv-dtype", kv, "--name", name};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

FastDecodeConfig listed(const std::vector<const Worker*>& ws) {
  FastDecodeConfig ec;
  ec.prefill_tokens = 40;  // prompts start over several steps
  ec.rworkers.timeout_ms = 20000;
  ec.rworkers.heartbeat_ms = 200;
  ec.rworkers.heartbeat_timeout_ms = 1000;
  for (const Worker* w : ws) ec.rworkers.endpoints.push_back(w->endpoint());
  return ec;
}

// Runs `reqs` to the end, calling fault(step) before each step; returns the tokens and the summed counts.
struct Outcome {
  fd::test::Tokens tokens;
  std::map<std::string, int64_t> counts;
  int64_t steps = 0;
};
Outcome run(Engine& e, const std::vector<Request>& reqs, const std::function<void(int64_t)>& fault = nullptr) {
  Outcome o;
  e.add(reqs);
  while (!e.done()) {
    if (fault) fault(o.steps);
    const StepResult r = e.step();
    ++o.steps;
    for (const auto& t : r.tokens) o.tokens[t.request_id].push_back(t.token);
    for (const auto& [k, v] : r.counts) o.counts[k] += v;
  }
  return o;
}

fd::test::Tokens fault_free(const std::string& kv) {
  const ModelConfig c = tiny();
  Worker a("ff0", kv), b("ff1", kv), d("ff2", kv);
  auto w = make_random_source(3, DType::F16);
  auto e = make_fastdecode_engine(listed({&a, &b, &d}), {c, *w, SamplingParams{}});
  return run(*e, requests(c)).tokens;
}

}  // namespace

// SIGKILL and SIGSTOP of one of three workers mid-run, fp16 and int8 KV: the same tokens as the fault-free run, every
// request whole, the lost worker's sequences rebuilt on the other two.
TEST(Recovery, KilledOrStoppedWorkerTheRunCompletesWithTheSameTokens) {
  const ModelConfig c = tiny();
  for (const std::string kv : {"fp16", "int8"}) {
    const fd::test::Tokens expect = fault_free(kv);
    for (int sig : {SIGKILL, SIGSTOP}) {
      SCOPED_TRACE(kv + (sig == SIGKILL ? ", SIGKILL" : ", SIGSTOP"));
      Worker a("r0", kv), b("r1", kv), d("r2", kv);
      auto w = make_random_source(3, DType::F16);
      auto e = make_fastdecode_engine(listed({&a, &b, &d}), {c, *w, SamplingParams{}});
      const Outcome o = run(*e, requests(c), [&](int64_t step) {
        if (step == 9) kill(b.pid(), sig);  // mid-decode, some prompts still to start
      });
      if (sig == SIGSTOP) kill(b.pid(), SIGCONT);
      EXPECT_EQ(o.tokens, expect) << "first divergence from the fault-free run: " << first_divergence(o.tokens, expect);
      EXPECT_EQ(o.counts.at("rworkers_lost"), 1);
      EXPECT_GT(o.counts.at("sequences_rebuilt"), 0);
      std::printf("%s, %s: %lld steps, %lld sequences rebuilt, the same %zu requests' tokens as the fault-free run\n",
                  kv.c_str(), sig == SIGKILL ? "SIGKILL" : "SIGSTOP", (long long)o.steps,
                  (long long)o.counts.at("sequences_rebuilt"), o.tokens.size());
    }
  }
}

// No survivor: the step fails naming the worker, within about one heartbeat timeout (not a reply deadline).
TEST(Recovery, NoSurvivorOrFailModeFailsNamingTheWorker) {
  const ModelConfig c = tiny();
  for (const std::string mode : {"recover", "fail"}) {
    SCOPED_TRACE(mode);
    Worker a("only0"), b("only1");
    FastDecodeConfig ec = listed(mode == "recover" ? std::vector<const Worker*>{&a} : std::vector<const Worker*>{&a, &b});
    ec.rworkers.on_failure = mode;
    auto w = make_random_source(3, DType::F16);
    auto e = make_fastdecode_engine(ec, {c, *w, SamplingParams{}});
    e->add(requests(c, 2));
    e->step();
    e->step();
    kill(a.pid(), SIGSTOP);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = fd::test::error_message([&] { e->step(); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    kill(a.pid(), SIGKILL);
    EXPECT_THAT(msg, ::testing::HasSubstr("R-worker 0 (" + a.endpoint() + ") is lost"));
    EXPECT_THAT(msg, ::testing::HasSubstr(mode == "recover" ? "no R-worker is left" : "on_failure is fail"));
    std::printf("%s: failed after %.2f s (heartbeat timeout 1 s, reply deadline 20 s): %s\n", mode.c_str(), s, msg.c_str());
  }
}

// Two runs sharing user-started workers at once: each its own session, both finish with the fp16-KV reference's
// tokens, and the workers hold nothing afterwards.
TEST(Sessions, TwoRunsShareUserStartedWorkers) {
  const ModelConfig c = tiny();
  Worker a("shared0"), b("shared1");
  auto w0 = make_random_source(3, DType::F16);
  ReferenceEngine ref(c, *w0, SamplingParams{}, DType::F16);
  const auto expect = fd::test::run_tokens(ref, requests(c));
  fd::test::Tokens got[2];
  std::string error[2];  // an exception in a run's thread is reported here (escaping the thread it would abort the test)
  std::thread th[2];
  for (int i = 0; i < 2; ++i)
    th[i] = std::thread([&, i] {
      try {
        auto w = make_random_source(3, DType::F16);
        auto e = make_fastdecode_engine(listed({&a, &b}), {c, *w, SamplingParams{}});
        got[i] = run(*e, requests(c)).tokens;  // the same request ids in both runs
      } catch (const std::exception& x) {
        error[i] = x.what();
      }
    });
  for (auto& t : th) t.join();
  for (int i = 0; i < 2; ++i) ASSERT_EQ(error[i], "") << "run " << i << " threw";
  for (int i = 0; i < 2; ++i) EXPECT_EQ(got[i], expect) << "run " << i << ": " << first_divergence(got[i], expect);
  RWorkerClient probe({a.endpoint(), b.endpoint()}, 10000);
  for (size_t k = 0; k < 2; ++k) {
    const json st = probe.stats(k);
    EXPECT_EQ(st.at("sequences"), 0) << st.dump();
    EXPECT_GE(st.at("sessions_opened").get<int64_t>(), 2);
  }
}

// A client that vanishes without CLOSE (a killed run): the worker sees its connection end and frees its sequences;
// the next run with the same ids is not refused as a duplicate.
TEST(Sessions, AVanishedClientsSequencesAreFreed) {
  Worker a("vanish");
  {
    RWorkerClient gone({a.endpoint()}, 10000);
    gone.hello(0, 2, 4, 4, 64, proto::WireDType::F32);
    gone.add_seqs(0, {1, 2, 3});
  }  // closed without a word
  RWorkerClient probe({a.endpoint()}, 10000);
  int64_t left = -1;
  for (int i = 0; i < 100 && left != 0; ++i) {
    left = probe.stats(0).at("sequences").get<int64_t>();
    if (left) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(left, 0);
  probe.hello(0, 2, 4, 4, 64, proto::WireDType::F32);
  EXPECT_NO_THROW(probe.add_seqs(0, {1, 2, 3}));
}

// CURVE: workers that admit one client key. That client runs (the same tokens as without CURVE); a client with no
// CURVE, or with a key the workers do not admit, is refused before any work (a config error naming the worker).
TEST(Curve, OnlyAdmittedClientsRun) {
  if (!curve_available()) {
    if (std::getenv("FD_REQUIRE_BINARIES")) FAIL() << "this libzmq has no CURVE (libsodium) and FD_REQUIRE_BINARIES is set";
    GTEST_SKIP() << "this libzmq has no CURVE support";
  }
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fd-curve-" + std::to_string(getpid()));
  fs::remove_all(dir);
  write_curve_keys((dir / "server").string(), "rworker", curve_generate());
  write_curve_keys((dir / "clients").string(), "sworker", curve_generate());
  write_curve_keys((dir / "other").string(), "intruder", curve_generate());
  const std::vector<std::string> curve = {"--curve-secret", (dir / "server" / "rworker.secret").string(), "--curve-clients",
                                          (dir / "clients").string()};
  const ModelConfig c = tiny();
  Worker a("c0", "fp16", curve), b("c1", "fp16", curve);
  const auto reqs = requests(c, 3);
  FastDecodeConfig ec = listed({&a, &b});
  ec.rworkers.timeout_ms = 2000;
  auto w = make_random_source(3, DType::F16);
  // No CURVE at all: the handshake fails.
  EXPECT_THAT(fd::test::error_message<ConfigError>([&] { make_fastdecode_engine(ec, {c, *w, SamplingParams{}}); }),
              ::testing::HasSubstr("no R-worker answers HELLO"));
  // A key the workers do not admit.
  ec.rworkers.curve_server_public = (dir / "server" / "rworker.public").string();
  ec.rworkers.curve_client_secret = (dir / "other" / "intruder.secret").string();
  EXPECT_THAT(fd::test::error_message<ConfigError>([&] { make_fastdecode_engine(ec, {c, *w, SamplingParams{}}); }),
              ::testing::HasSubstr("no R-worker answers HELLO"));
  // The admitted key: the run.
  ec.rworkers.curve_client_secret = (dir / "clients" / "sworker.secret").string();
  ec.rworkers.timeout_ms = 20000;
  auto e = make_fastdecode_engine(ec, {c, *w, SamplingParams{}});
  const auto got = run(*e, reqs).tokens;
  e.reset();
  Worker p0("plain0"), p1("plain1");
  auto w2 = make_random_source(3, DType::F16);
  auto plain = make_fastdecode_engine(listed({&p0, &p1}), {c, *w2, SamplingParams{}});
  EXPECT_EQ(got, run(*plain, reqs).tokens);
  fs::remove_all(dir);
}
