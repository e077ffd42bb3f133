// fp16 <-> fp32 for the R-worker's tensors (see convert.h).
#include "kernels/cpu/convert.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "fastdecode/core/dtype.h"

namespace fd {

namespace {

// Below this many elements a conversion stays on the calling thread (waking a team costs more than it saves).
constexpr size_t kPerThread = size_t(1) << 15;

template <class F>
void split(size_t n, int n_threads, F&& f) {
  const int t = int(std::min<size_t>(size_t(std::max(1, n_threads)), std::max<size_t>(1, n / kPerThread)));
  if (t <= 1) {
    f(size_t(0), n);
    return;
  }
  const size_t chunk = ((n + size_t(t) - 1) / size_t(t) + 7) & ~size_t(7);
#pragma omp parallel for num_threads(t) schedule(static, 1)
  for (int k = 0; k < t; ++k) {
    const size_t b = std::min(n, size_t(k) * chunk), e = std::min(n, b + chunk);
    if (b < e) f(b, e);
  }
}

bool f16c(Isa isa) {
#if defined(FD_SCALAR_KERNELS_ONLY)
  (void)isa;
  return false;
#else
  return isa != Isa::Scalar && isa_supported(Isa::AVX2);
#endif
}

}  // namespace

namespace detail {

void f16_to_f32_scalar(const uint8_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = fp16_to_fp32(h);
  }
}

void f32_to_f16_scalar(const float* src, uint8_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = fp32_to_fp16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

}  // namespace detail

void convert_f16_to_f32(const void* src, float* dst, size_t n, Isa isa, int n_threads) {
  const auto* s = static_cast<const uint8_t*>(src);
  const bool hw = f16c(isa);
  split(n, n_threads, [&](size_t b, size_t e) {
#if !defined(FD_SCALAR_KERNELS_ONLY)
    if (hw) return detail::f16_to_f32_f16c(s + 2 * b, dst + b, e - b);
#endif
    detail::f16_to_f32_scalar(s + 2 * b, dst + b, e - b);
  });
  (void)hw;
}

void convert_f32_to_f16(const float* src, void* dst, size_t n, Isa isa, int n_threads) {
  auto* d = static_cast<uint8_t*>(dst);
  const bool hw = f16c(isa);
  split(n, n_threads, [&](size_t b, size_t e) {
#if !defined(FD_SCALAR_KERNELS_ONLY)
    if (hw) return detail::f32_to_f16_f16c(src + b, d + 2 * b, e - b);
#endif
    detail::f32_to_f16_scalar(src + b, d + 2 * b, e - b);
  });
  (void)hw;
}

}  // namespace fd
