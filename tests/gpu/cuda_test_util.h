// Helpers of the CUDA kernel tests (CUDA builds): a checked call and an owning device buffer.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace fd::test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device buffer of n elements of T, freed on destruction; uploads from and downloads to host vectors of
// a same-sized type H (e.g. uint16_t for __half).
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) { cuda_ok(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  template <typename H>
  explicit Dev(const std::vector<H>& h) : Dev(h.size()) {
    static_assert(sizeof(H) == sizeof(T));
    cuda_ok(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p_); }
  T* get() const { return p_; }
  template <typename H = T>
  std::vector<H> download() const {
    static_assert(sizeof(H) == sizeof(T));
    std::vector<H> h(n_);
    cuda_ok(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
  void fill_bytes(int byte) { cuda_ok(cudaMemset(p_, byte, n_ * sizeof(T)), "cudaMemset"); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

}  // namespace fd::test
