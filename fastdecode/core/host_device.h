// FD_HOST_DEVICE marks small inline functions that CUDA kernels share with host code (one definition, so the
// host and the GPU compute the same thing); it is empty when a plain C++ compiler reads the header.
#pragma once

#ifdef __CUDACC__
#define FD_HOST_DEVICE __host__ __device__
#else
#define FD_HOST_DEVICE
#endif
