// The S-Part: every stage of the model that touches weights, batched over all running sequences.
// Attention over the KV-cache is not here: the R-workers do it. Stages are named after the model.
//
// Activations live in the backend, in numbered slots (one per mini-batch in flight, one for prefill):
// on the GPU the residual stream of a slot stays in device memory for the whole step, and only what
// must cross to the R-workers crosses: q, k, v out and the attention output in, in the wire dtype,
// through host buffers the backend allocates (pinned on CUDA). Rows keep the order given to embed().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/sampling.h"
#include "fastdecode/model/weights.h"

namespace fd {

// Host memory from a backend (page-locked on CUDA), freed on destruction.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(void* p, size_t n, std::function<void(void*)> free) : p_(p), n_(n), free_(std::move(free)) {}
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& o) noexcept { swap(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~HostBuffer() {
    if (p_ && free_) free_(p_);
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }
  size_t size() const { return n_; }

 private:
  void swap(HostBuffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(free_, o.free_);
  }
  void* p_ = nullptr;
  size_t n_ = 0;
  std::function<void(void*)> free_;
};

// A run of attention-output rows in host memory (one R-worker's reply), `rows` rows in the wire dtype.
struct HostRows {
  const void* data = nullptr;
  int64_t rows = 0;
};

// Where attention_input writes a run of consecutive rows: q [rows, q_dim], k and v [rows, kv_dim] (one R-worker's
// share, e.g. straight into its shared-memory region). q may be null (prefill needs only k and v on the host);
// rows = kAllRows: every row of the slot (a single part).
struct HostRowsOut {
  static constexpr int64_t kAllRows = -1;
  void* q = nullptr;
  void* k = nullptr;
  void* v = nullptr;
  int64_t rows = kAllRows;
};
// The parts with kAllRows resolved against a slot of T rows and empty parts dropped (at least one part is left, so
// out[0].q says whether q is wanted); throws unless their rows add up to T (kAllRows only alone), each part has k and
// v, and q is in every part or in none.
std::vector<HostRowsOut> resolve_rows(const std::vector<HostRowsOut>& parts, int64_t T);

class Communicator;  // fastdecode/parallel/comm.h

class SPart {
 public:
  virtual ~SPart() = default;
  virtual const ModelConfig& config() const = 0;
  virtual std::string describe() const = 0;  // backend and GEMM, for summary.json
  // Host memory for q/k/v and attention tensors exchanged with R-workers (grown, never shrunk).
  virtual HostBuffer alloc_host(size_t bytes) = 0;
  // Slot `slot` holds the T tokens at positions pos: x = their embeddings.
  virtual void embed(int slot, const int32_t* tokens, const int64_t* pos, int64_t T) = 0;
  // q [T, q_dim], k, v [T, kv_dim] = projections of norm(x) (+ RoPE), written to host memory in dtype
  // (F32 or F16), the slot's rows split over `parts` in order (resolve_rows); q may be null (prefill needs only k
  // and v on the host).
  virtual void attention_input(int slot, int layer, DType dt, const std::vector<HostRowsOut>& parts) = 0;
  // All of them to one place each.
  void attention_input(int slot, int layer, DType dt, void* q, void* k, void* v) {
    attention_input(slot, layer, dt, std::vector<HostRowsOut>{{q, k, v, HostRowsOut::kAllRows}});
  }
  // The slot's attention output = the given host rows, concatenated in order (T rows in all).
  virtual void set_attention(int slot, DType dt, const std::vector<HostRows>& parts) = 0;
  // Device time of the R-Part's copies so far (cumulative, ns): q/k/v down in attention_input (d2h) and the
  // attention rows up in set_attention (h2d). Zero for a backend whose activations are host memory (CPU).
  struct CopyTimes {
    int64_t d2h_ns = 0, h2d_ns = 0;
  };
  virtual CopyTimes copy_times() const { return {}; }
  // The device's own timeline for trace.json: each span one stage of a slot's work on the CUDA stream it ran on
  // (layer -1: not a layer's, e.g. embed or sample), placed on the fd::now_ns() clock by CUDA events. Recorded only
  // after trace_device(true) (the events cost host time at every stage); device_spans() returns those recorded since
  // the last call and waits for the slots' work first, so call it between steps. A backend whose stages run on the
  // host (CPU) has none.
  struct DeviceSpan {
    int stream = 0, slot = 0, layer = -1;
    std::string what;
    int64_t start_ns = 0, dur_ns = 0;
  };
  virtual void trace_device(bool /*on*/) {}
  virtual std::vector<DeviceSpan> device_spans() { return {}; }
  // Host memory the backend's copies read often that alloc_host did not make (the R-workers' shared-memory regions,
  // where their replies land): registered with the device (CUDA: cudaHostRegister), so that set_attention copies it up
  // by DMA as from alloc_host's pinned memory, not staged from pageable pages. Returns whether it was (false: a
  // backend without a device, or the device refused; the copies then work as before). unregister_host(p) before the
  // memory goes; the backend's destructor unregisters what is left.
  virtual bool register_host(void* /*p*/, size_t /*bytes*/) { return false; }
  virtual void unregister_host(void* /*p*/) {}
  // Before a run: sets up now what the first decode steps of up to max_rows rows on `slot` would (CUDA: the slot's
  // buffers for that many rows and the graphs of every layer's two decode stages at each padded size up to it, for
  // q/k/v going down in `wire`), so that a run's first steps cost what later ones do. Results are unchanged. Returns
  // how many graphs it captured (0 for a backend without them).
  virtual int64_t warm_up(int /*slot*/, int64_t /*max_rows*/, DType /*wire*/) { return 0; }
  // The slot's attention output = causal attention of the last attention_input over packed prompts:
  // rows starts[i]..starts[i+1]-1 are sequence i at positions 0..; K and V rounded to fp16 first (as
  // the R-workers will store them).
  virtual void prefill_attention(int slot, const std::vector<int64_t>& starts) = 0;
  // x += o-projection of the slot's attention output; x += MLP(norm(x)).
  virtual void attention_output_and_mlp(int slot, int layer) = 0;
  // logits [rows.size(), vocab] of final-norm(x[rows]).
  virtual void logits(int slot, const std::vector<int32_t>& rows, float* out) = 0;
  // Next tokens for x[rows]: out[i] = fd::sample_token of row i's logits with params[i] and (request_ids[i],
  // steps[i]) — identical to sampling the logits() rows; on the backend's device where it can (only token ids
  // come down). record: indices i (ascending) whose fp32 logits rows — the ones the picks are made from — are
  // copied to recorded[k * vocab] for the k-th of them; only those rows are copied (recorded may be null when
  // record is empty).
  virtual void sample(int slot, const std::vector<int32_t>& rows, const std::vector<SamplingParams>& params,
                      const std::vector<uint64_t>& request_ids, const std::vector<uint64_t>& steps, int32_t* out,
                      const std::vector<int32_t>& record, float* recorded);
  // The same sampling for every row, nothing recorded.
  void sample(int slot, const std::vector<int32_t>& rows, const SamplingParams& sp,
              const std::vector<uint64_t>& request_ids, const std::vector<uint64_t>& steps, int32_t* out) {
    sample(slot, rows, std::vector<SamplingParams>(rows.size(), sp), request_ids, steps, out, {}, nullptr);
  }

  // Pipeline parallelism: a later stage's slot takes its residual stream from the stage before instead of
  // embedding tokens. prepare() sizes slot `slot` for T tokens at positions pos without embedding (x is
  // then written by recv_residual()). send_residual() hands the slot's x [T, hidden] (fp32, bytes unchanged)
  // to rank `peer` of `c`; recv_residual() receives it into the prepared slot. The defaults move residual()'s
  // host memory; a backend that keeps x elsewhere overrides them (CUDA: device buffers with a communicator
  // that takes them, else a pinned host copy). residual() is the slot's x where the backend keeps it in host
  // memory. The defaults of prepare() and residual() (a backend without pipeline support) throw fd::Error.
  struct Residual {
    float* data = nullptr;
    size_t bytes = 0;
  };
  virtual void prepare(int slot, const int64_t* pos, int64_t T);
  virtual Residual residual(int slot);
  virtual void send_residual(int slot, Communicator& c, int peer);
  virtual void recv_residual(int slot, Communicator& c, int peer);
};

// The S-Part's peers in a parallel engine. tp: the tensor-parallel group of this rank (null or size 1: none).
struct SPartComms {
  Communicator* tp = nullptr;
};

// fp32 on the CPU: the reference model's stages (fastdecode/model/reference.h). The embedded default
// when no GPU answers. With comms.tp of size T > 1, `weights` is tensor rank tp->rank()'s shard
// (fastdecode/model/shard.h: its heads, its MLP columns, its vocabulary rows) and the S-Part takes part in
// the group's collectives: embed() all-reduces the masked embedding (exact: one rank's row plus zeros), each
// residual branch all-reduces the ranks' shares (attention_output_and_mlp: the only arithmetic that changes
// with T, by the order of the fp32 sums), and logits() all-gathers the vocabulary slices into [n, V]. Every
// rank of the group must make the same calls in the same order; each rank's x stays bit-identical.
std::unique_ptr<SPart> make_cpu_spart(ModelWeights weights, SPartComms comms = {});
struct CudaSPartOptions {
  int sm_count = 0;         // > 0: run on that many SMs (a CUDA green context: hardware-balance emulation)
  DType act = DType::F16;   // 16-bit weights and activations: fp16 or bf16
  bool cuda_graphs = false; // decode stages of at most 1024 rows replayed from CUDA graphs (batch padded)
  int device = 0;           // the CUDA device (every call sets it current on the calling thread)
  SPartComms comms;         // tp of size T > 1: `weights` is tensor rank tp->rank()'s shard, as for the cpu S-Part
  std::string gemm_table;   // a GEMM table file (fastdecode/spart/gemm_table.h), "" for none
};
// 16-bit weights on a CUDA device, cuBLAS GEMMs with fp32 accumulation, activations resident in device
// memory, each slot's work on a CUDA stream of its own (kStreams streams, slot s on stream s % kStreams; one stream
// under tensor parallelism). Throws fd::Error when no device answers or the build has no CUDA. Under tensor parallelism the
// collectives are those of make_cpu_spart (masked embedding, each residual branch all-reduced with its bias
// added on rank 0 before the sum, logits all-gathered), on device buffers in the S-Part's stream when the
// communicator takes them (nccl), else through pinned host copies (gloo: ranks may then share one GPU —
// correct, but no measure of T GPUs' speed). CUDA graphs are off under T > 1.
std::unique_ptr<SPart> make_cuda_spart(ModelWeights weights, const CudaSPartOptions& options = {});

}  // namespace fd
