// vLLM v0.2's block manager (vllm/core/block_manager.py), as the paged-swap baseline runs it: the
// KV-cache is cut into blocks of `block_size` tokens; a GPU pool and a CPU (swap) pool of block ids; each
// sequence has a block table (logical block i -> physical block id) in one of the two pools. Pure C++:
// it only hands out ids (the engine owns the memory they index), so it is unit-tested everywhere.
// Every operation checks its precondition first and throws fd::Error, leaving the state unchanged.
#pragma once
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace fd {

// (source block, destination block) of one block copy: GPU -> CPU for a swap-out, CPU -> GPU for a swap-in.
using BlockMapping = std::vector<std::pair<int32_t, int32_t>>;

class BlockManager {
 public:
  // watermark: admit a prompt only while the free GPU blocks left after its allocation stay at least
  // int(watermark x num_gpu_blocks) (vLLM: keeps room for running sequences to grow, avoiding churn).
  BlockManager(int64_t block_size, int64_t num_gpu_blocks, int64_t num_cpu_blocks, double watermark);

  int64_t block_size() const { return block_size_; }
  int64_t num_gpu_blocks() const { return num_gpu_; }
  int64_t num_cpu_blocks() const { return num_cpu_; }
  int64_t watermark_blocks() const { return watermark_blocks_; }
  int64_t free_gpu_blocks() const { return int64_t(free_gpu_.size()); }
  int64_t free_cpu_blocks() const { return int64_t(free_cpu_.size()); }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Could a sequence of `tokens` tokens ever be allocated (all GPU blocks free)? vLLM's AllocStatus.NEVER.
  bool ever_fits(int64_t tokens) const { return num_gpu_ - blocks_for(tokens) >= watermark_blocks_; }
  // Room for a new sequence of `tokens` tokens now, keeping the watermark (vLLM's can_allocate).
  bool can_allocate(int64_t tokens) const { return free_gpu_blocks() - blocks_for(tokens) >= watermark_blocks_; }
  // A new GPU block table for `seq` covering `tokens` positions (tokens >= 1).
  void allocate(uint64_t seq, int64_t tokens);
  // True when `seq` (on the GPU) can grow by one position: its last block has room or a block is free.
  bool can_append_slot(uint64_t seq) const;
  // Grows `seq` by one position, taking a new GPU block when its last block is full.
  void append_slot(uint64_t seq);
  // Frees every block of `seq` (GPU or CPU) and forgets it.
  void free(uint64_t seq);

  // Room in the CPU pool for all of `seq`'s GPU blocks.
  bool can_swap_out(uint64_t seq) const;
  // Moves `seq` to the CPU pool: returns (gpu block, cpu block) per logical block, in table order.
  BlockMapping swap_out(uint64_t seq);
  // Room in the GPU pool for `seq`'s blocks and one more (the slot its next decode appends), keeping
  // the watermark (vLLM's can_swap_in).
  bool can_swap_in(uint64_t seq) const;
  // Moves `seq` back to the GPU pool: returns (cpu block, gpu block) per logical block, in table order.
  BlockMapping swap_in(uint64_t seq);

  bool has(uint64_t seq) const { return seqs_.count(seq) != 0; }
  bool on_gpu(uint64_t seq) const;
  int64_t tokens(uint64_t seq) const;               // positions the table covers
  const std::vector<int32_t>& table(uint64_t seq) const;

 private:
  struct Table {
    std::vector<int32_t> blocks;
    int64_t tokens = 0;
    bool gpu = true;
  };
  const Table& get(uint64_t seq) const;
  static int32_t take(std::vector<int32_t>& pool);

  int64_t block_size_, num_gpu_, num_cpu_, watermark_blocks_;
  std::vector<int32_t> free_gpu_, free_cpu_;  // stacks: the lowest id is handed out first
  std::map<uint64_t, Table> seqs_;
};

}  // namespace fd
