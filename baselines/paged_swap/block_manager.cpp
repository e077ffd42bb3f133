#include "baselines/paged_swap/block_manager.h"

#include "fastdecode/core/error.h"
#include "fd_fault_swap_in_drops_partial_block.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)

namespace fd {

BlockManager::BlockManager(int64_t block_size, int64_t num_gpu_blocks, int64_t num_cpu_blocks, double watermark)
    : block_size_(block_size), num_gpu_(num_gpu_blocks), num_cpu_(num_cpu_blocks) {
  FD_CHECK(block_size >= 1, "block manager: block_size " << block_size << " must be positive");
  FD_CHECK(num_gpu_blocks >= 1 && num_gpu_blocks < (int64_t(1) << 31),
           "block manager: " << num_gpu_blocks << " GPU blocks (1 to 2^31-1)");
  FD_CHECK(num_cpu_blocks >= 0 && num_cpu_blocks < (int64_t(1) << 31),
           "block manager: " << num_cpu_blocks << " CPU blocks (0 to 2^31-1)");
  FD_CHECK(watermark >= 0 && watermark < 1, "block manager: watermark " << watermark << " must be in [0, 1)");
  watermark_blocks_ = int64_t(watermark * double(num_gpu_blocks));  // vLLM: int(watermark * num_gpu_blocks)
  for (int64_t b = num_gpu_ - 1; b >= 0; --b) free_gpu_.push_back(int32_t(b));
  for (int64_t b = num_cpu_ - 1; b >= 0; --b) free_cpu_.push_back(int32_t(b));
}

int32_t BlockManager::take(std::vector<int32_t>& pool) {
  const int32_t b = pool.back();
  pool.pop_back();
  return b;
}

const BlockManager::Table& BlockManager::get(uint64_t seq) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) FD_THROW("block manager: sequence " << seq << " has no block table");
  return it->second;
}

bool BlockManager::on_gpu(uint64_t seq) const { return get(seq).gpu; }
int64_t BlockManager::tokens(uint64_t seq) const { return get(seq).tokens; }
const std::vector<int32_t>& BlockManager::table(uint64_t seq) const { return get(seq).blocks; }

void BlockManager::allocate(uint64_t seq, int64_t tokens) {
  if (seqs_.count(seq)) FD_THROW("block manager: sequence " << seq << " already has a block table");
  if (tokens < 1) FD_THROW("block manager: sequence " << seq << " allocated for " << tokens << " tokens");
  const int64_t need = blocks_for(tokens);
  if (need > free_gpu_blocks())
    FD_THROW("block manager: sequence " << seq << " needs " << need << " GPU blocks, " << free_gpu_blocks() << " free");
  Table t;
  t.tokens = tokens;
  for (int64_t i = 0; i < need; ++i) t.blocks.push_back(take(free_gpu_));
  seqs_.emplace(seq, std::move(t));
}

bool BlockManager::can_append_slot(uint64_t seq) const {
  const Table& t = get(seq);
  return t.gpu && (t.tokens < int64_t(t.blocks.size()) * block_size_ || !free_gpu_.empty());
}

void BlockManager::append_slot(uint64_t seq) {
  if (!can_append_slot(seq))
    FD_THROW("block manager: sequence " << seq << (on_gpu(seq) ? " needs a new GPU block and none is free" : " is swapped out"));
  Table& t = seqs_.at(seq);
  if (t.tokens == int64_t(t.blocks.size()) * block_size_) t.blocks.push_back(take(free_gpu_));
  ++t.tokens;
}

void BlockManager::free(uint64_t seq) {
  const Table& t = get(seq);
  std::vector<int32_t>& pool = t.gpu ? free_gpu_ : free_cpu_;
  // Returned in reverse so the sequence's first block is handed out first again.
  for (auto it = t.blocks.rbegin(); it != t.blocks.rend(); ++it) pool.push_back(*it);
  seqs_.erase(seq);
}

bool BlockManager::can_swap_out(uint64_t seq) const {
  const Table& t = get(seq);
  return t.gpu && int64_t(t.blocks.size()) <= free_cpu_blocks();
}

BlockMapping BlockManager::swap_out(uint64_t seq) {
  if (!can_swap_out(seq))
    FD_THROW("block manager: sequence " << seq
                                        << (on_gpu(seq) ? " has more GPU blocks than the CPU pool has free" : " is already swapped out"));
  Table& t = seqs_.at(seq);
  BlockMapping m;
  for (int32_t& b : t.blocks) {
    const int32_t c = take(free_cpu_);
    m.emplace_back(b, c);
    free_gpu_.push_back(b);
    b = c;
  }
  t.gpu = false;
  return m;
}

bool BlockManager::can_swap_in(uint64_t seq) const {
  const Table& t = get(seq);
  return !t.gpu && free_gpu_blocks() - (int64_t(t.blocks.size()) + 1) >= watermark_blocks_;
}

BlockMapping BlockManager::swap_in(uint64_t seq) {
  if (!can_swap_in(seq))
    FD_THROW("block manager: sequence " << seq << (on_gpu(seq) ? " is not swapped out" : ": too few free GPU blocks to swap in"));
  Table& t = seqs_.at(seq);
  BlockMapping m;
  for (int32_t& b : t.blocks) {
    const int32_t g = take(free_gpu_);
#ifdef FD_FAULT_SWAP_IN_DROPS_PARTIAL_BLOCK  // planted fault: a partly filled last block gets its GPU block but is not
    if (&b != &t.blocks.back() || t.tokens % block_size_ == 0)  // copied back: its tokens' K/V are lost
#endif
    m.emplace_back(b, g);
    free_cpu_.push_back(b);
    b = g;
  }
  t.gpu = true;
  return m;
}

}  // namespace fd
