// Helpers of the CUDA kernel tests (CUDA builds): an owning device buffer (errors: CUDA_CHECK).
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace fd::test {

// A device buffer of n elements of T, freed on destruction; uploads from and downloads to host vectors of
// a same-sized type H (e.g. uint16_t for __half).
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) { CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T))); }
  template <typename H>
  explicit Dev(const std::vector<H>& h) : Dev(h.size()) {
    static_assert(sizeof(H) == sizeof(T));
    CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p_); }
  T* get() const { return p_; }
  template <typename H = T>
  std::vector<H> download() const {
    static_assert(sizeof(H) == sizeof(T));
    std::vector<H> h(n_);
    CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void fill_bytes(int byte) { CUDA_CHECK(cudaMemset(p_, byte, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

}  // namespace fd::test
