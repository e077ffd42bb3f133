// F16C conversion loops (see convert.h). Compiled with -mavx2 -mf16c; called only where isa_supported(Isa::AVX2).
#include <immintrin.h>

#include <cstring>

#include "fastdecode/core/dtype.h"
#include "kernels/cpu/convert.h"

namespace fd::detail {

void f16_to_f32_f16c(const uint8_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
  f16_to_f32_scalar(src + 2 * i, dst + i, n - i);
}

void f32_to_f16_f16c(const float* src, uint8_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  f32_to_f16_scalar(src + i, dst + 2 * i, n - i);
}

}  // namespace fd::detail
