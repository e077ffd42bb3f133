// fp16 <-> fp32 conversion of the R-worker's request and reply tensors (the query in, the attention output out): with
// F16C where the CPU has it (Isa::AVX2 and up imply it), spread over up to n_threads OpenMP threads when there is
// enough to share, else fd::convert_to_f32 / convert_from_f32. IEEE round to nearest even either way: the same bits as
// those for every value but NaN (a NaN stays a NaN; its payload bits may differ).
// Scalar software conversion cost the worker 0.26-0.80 ms a visit at B = 16-64 (Llama-2-7b shapes, 2 workers x 1
// thread, the 2-core development box): up to a fifth of its compute (issue 43).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/decode_attention.h"

namespace fd {

// src (fp16) and dst (fp16) need no alignment: they may lie in a message's frames.
void convert_f16_to_f32(const void* src, float* dst, size_t n, Isa isa, int n_threads);
void convert_f32_to_f16(const float* src, void* dst, size_t n, Isa isa, int n_threads);

namespace detail {
// The F16C loops (convert_f16c.cpp, compiled with -mf16c -mavx2; only called where the CPU has them), and the scalar
// ones, element by element through memcpy (unaligned 16-bit values).
void f16_to_f32_f16c(const uint8_t* src, float* dst, size_t n);
void f32_to_f16_f16c(const float* src, uint8_t* dst, size_t n);
void f16_to_f32_scalar(const uint8_t* src, float* dst, size_t n);
void f32_to_f16_scalar(const float* src, uint8_t* dst, size_t n);
}  // namespace detail

}  // namespace fd
