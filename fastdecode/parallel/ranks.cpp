#include "fastdecode/parallel/ranks.h"

#include <atomic>
#include <exception>
#include <thread>

namespace fd {

ParallelConfig ParallelConfig::parse(StrictObject& p, bool cuda_possible, int64_t max_waves) {
  ParallelConfig pc;
  pc.tensor = p.get_int("tensor", 1, 64, 1);
  pc.pipeline = p.get_int("pipeline", 1, 64, 1);
  pc.waves = p.get_int("waves", 1, max_waves, 0);
  const json& ls = p.get_raw("layers");
  if (!ls.is_null()) {
    if (!ls.is_array() || int64_t(ls.size()) != pc.pipeline)
      p.fail("layers", "expected a list of " + std::to_string(pc.pipeline) + " layer counts, one per pipeline stage");
    for (const auto& n : ls) {
      if (!n.is_number_integer() || n.get<int64_t>() < 1) p.fail("layers", "every stage needs at least 1 layer");
      pc.layers.push_back(n.get<int64_t>());
    }
  }
  pc.timeout_ms = p.get_int("timeout_ms", 100, 3600000, 60000);
  pc.comm = p.get_enum("comm", {"auto", "gloo", "nccl"}, std::string("auto"));
  const json& ds = p.get_raw("devices");
  if (!ds.is_null()) {
    if (!cuda_possible) p.fail("devices", "applies to the cuda backend (the GPU of each rank)");
    if (!ds.is_array() || int64_t(ds.size()) != pc.ranks())
      p.fail("devices", "expected a list of " + std::to_string(pc.ranks()) + " GPU indices, one per rank (rank p*T + t)");
    for (const auto& d : ds) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) p.fail("devices", "every entry must be a GPU index >= 0");
      pc.devices.push_back(d.get<int64_t>());
    }
  }
  if (pc.comm == "nccl" && !cuda_possible) p.fail("comm", "nccl moves GPU buffers; the cpu backend uses gloo");
  p.finish();
  return pc;
}

json ParallelConfig::to_json() const {
  return {{"tensor", tensor}, {"pipeline", pipeline}, {"waves", wave_count()}, {"layers", layers},
          {"timeout_ms", timeout_ms}, {"comm", comm},       {"devices", devices}};
}

std::vector<int> rank_devices(const ParallelConfig& pc, int64_t n, const std::string& engine) {
  const int64_t T = pc.tensor, P = pc.pipeline, G = T * P;
  std::vector<int> d(size_t(G), 0);
  if (n == 0) throw ConfigError(engine + ": engine.parallel on the cuda backend: no CUDA device answers");
  if (!pc.devices.empty()) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t v = pc.devices[size_t(g)];
      if (v >= n)
        throw ConfigError("engine.parallel.devices: rank " + std::to_string(g) + " on GPU " + std::to_string(v) + ", but " +
                          std::to_string(n) + " GPU(s) answer");
      d[size_t(g)] = int(v);
    }
    return d;
  }
  if (G == 1) return d;
  if (n >= G) {
    for (int64_t g = 0; g < G; ++g) d[size_t(g)] = int(g);
    return d;
  }
  if (T == 1) return d;  // every stage on GPU 0 (the engines note it)
  std::string zeros;
  for (int64_t g = 0; g < G; ++g) zeros += g ? ", 0" : "0";
  throw ConfigError(engine + ": engine.parallel: tensor " + std::to_string(T) + " x pipeline " + std::to_string(P) +
                    " on the cuda backend needs " + std::to_string(G) + " GPUs, one per rank, and " + std::to_string(n) +
                    " answer(s). To run the ranks on fewer GPUs anyway (a correctness run: ranks sharing a GPU measure "
                    "nothing about T GPUs), list engine.parallel.devices (e.g. [" + zeros + "]) with comm gloo");
}

namespace {

// The tensor group's communicator: nccl for GPU ranks on distinct devices when built (auto), gloo otherwise.
std::string tensor_comm(const ParallelConfig& pc, bool cuda, const std::vector<int>& devices) {
  bool distinct = true;
  for (size_t i = 0; i < devices.size(); ++i)
    for (size_t j = 0; j < i; ++j) distinct = distinct && devices[i] != devices[j];
  const std::string& want = pc.comm;
  if (!cuda || want == "gloo") {
    if (!have_gloo())
      throw ConfigError("engine.parallel.tensor > 1 with comm gloo needs the Gloo communicator, and this build has none "
                        "(scripts/setup.sh installs libgloo-dev; docs/PARALLEL.md)");
    return "gloo";
  }
  if (want == "nccl" || (distinct && have_nccl())) {
    if (!have_nccl())
      throw ConfigError("engine.parallel.comm nccl: this build has no NCCL communicator (CMake found no nccl.h / "
                        "libnccl.so.2; set FD_NCCL_ROOT, docs/PARALLEL.md)");
    if (!distinct)
      throw ConfigError("engine.parallel.comm nccl: a tensor group's ranks share a GPU, and NCCL holds one rank per GPU "
                        "(use comm gloo to run them on one GPU)");
    return "nccl";
  }
  if (!have_gloo())
    throw ConfigError("engine.parallel.tensor > 1 on the cuda backend needs NCCL (distinct GPUs) or Gloo, and this build "
                      "has neither (docs/PARALLEL.md)");
  return "gloo";
}

}  // namespace

RankComms::RankComms(const ParallelConfig& pc, const std::vector<int>& devices) : T_(size_t(pc.tensor)) {
  const int64_t T = pc.tensor, P = pc.pipeline;
  const int timeout = int(pc.timeout_ms);
  const bool cuda = !devices.empty();
  if (T > 1)
    for (int64_t p = 0; p < P; ++p) {
      std::vector<int> group;
      if (cuda) group.assign(devices.begin() + p * T, devices.begin() + (p + 1) * T);
      tp_.push_back(tensor_comm(pc, cuda, group) == "nccl" ? make_nccl_group(group) : make_gloo_group(int(T), timeout));
    }
  if (P > 1)  // the stage hand-off: ranks are threads of this process, so an in-process mailbox
    for (int64_t t = 0; t < T; ++t) pp_.push_back(make_local_group(int(P), timeout));
}

Communicator* RankComms::tp(size_t g) const { return tp_.empty() ? nullptr : tp_[g / T_][g % T_].get(); }
Communicator* RankComms::pp(size_t g) const { return pp_.empty() ? nullptr : pp_[g % T_][g / T_].get(); }

void RankComms::abort(size_t g) {
  if (Communicator* c = tp(g)) c->abort();
  if (Communicator* c = pp(g)) c->abort();
}

std::string RankComms::tensor_describe() const { return tp_.empty() ? "none" : tp_[0][0]->describe(); }
std::string RankComms::pipeline_describe() const { return pp_.empty() ? "none" : pp_[0][0]->describe(); }
bool RankComms::tensor_device_buffers() const { return !tp_.empty() && tp_[0][0]->device_buffers(); }

void run_on_ranks(size_t G, size_t T, const std::string& engine, const std::function<void(size_t)>& work,
                  const std::function<void(size_t)>& on_fail, const std::function<std::string(size_t)>& what) {
  if (G == 1) return work(0);
  std::vector<std::string> err(G);
  std::atomic<int> order{0};
  std::vector<int> when(G, -1);
  std::vector<std::thread> th;
  for (size_t g = 0; g < G; ++g)
    th.emplace_back([&, g] {
      try {
        work(g);
      } catch (const std::exception& e) {
        when[g] = order++;
        err[g] = e.what();
        on_fail(g);
      }
    });
  for (auto& t : th) t.join();
  int first = -1;
  for (size_t g = 0; g < G; ++g)
    if (when[g] >= 0 && (first < 0 || when[g] < when[size_t(first)])) first = int(g);
  if (first < 0) return;
  const size_t f = size_t(first);
  const std::string extra = what ? " (" + what(f) + ")" : "";
  FD_THROW(engine << ": rank t" << f % T << " p" << f / T << extra << ": " << err[f]);
}

std::vector<size_t> wave_bounds(size_t n, int64_t W) {
  const size_t w = std::max<size_t>(1, std::min<size_t>(size_t(std::max<int64_t>(W, 1)), n));
  std::vector<size_t> b = {0};
  for (size_t i = 0; i < w; ++i) b.push_back(b.back() + n / w + (i < n % w ? 1 : 0));
  return b;
}

}  // namespace fd
