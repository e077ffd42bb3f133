// The one way CUDA errors become fd::Error: CUDA_CHECK / CUBLAS_CHECK around a runtime or cuBLAS call
// (file:line, the statement, the error), check_launch after a kernel launch, check_act_dtype for the
// 16-bit activation types. Host code; included by the kernels, the S-Part, the benches and the tests.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"

// A failed call throws; its (non-sticky) error is cleared first so the next call starts clean.
#define CUDA_CHECK(stmt)                                                                                       \
  do {                                                                                                         \
    const cudaError_t fd_cuda_e_ = (stmt);                                                                     \
    if (fd_cuda_e_ != cudaSuccess) {                                                                           \
      cudaGetLastError();                                                                                      \
      FD_THROW(__FILE__ << ":" << __LINE__ << ": " #stmt ": " << cudaGetErrorString(fd_cuda_e_));              \
    }                                                                                                          \
  } while (0)
#define CUBLAS_CHECK(stmt)                                                                                     \
  do {                                                                                                         \
    const cublasStatus_t fd_cublas_e_ = (stmt);                                                                \
    if (fd_cublas_e_ != CUBLAS_STATUS_SUCCESS)                                                                 \
      FD_THROW(__FILE__ << ":" << __LINE__ << ": " #stmt ": cuBLAS status " << int(fd_cublas_e_));             \
  } while (0)

namespace fd::cuda {

// Throws fd::Error naming `what` when the last kernel launch failed (cudaGetLastError).
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) FD_THROW(what << ": CUDA launch failed: " << cudaGetErrorString(e));
}

// Throws unless t is F16 or BF16 (the 16-bit activation and weight types).
inline void check_act_dtype(DType t, const char* what) {
  if (t != DType::F16 && t != DType::BF16) FD_THROW(what << ": 16-bit activations are fp16 or bf16, not " << dtype_name(t));
}

}  // namespace fd::cuda
