// AVX512-VNNI level of the CPU decode attention (Isa::AVX512VNNI): the integer-dot kernel
// (decode_attention_qdot.h) with VPDPBUSD for int8/int4 blocks on an int8-quantized query; everything
// else (fp16 blocks, or a float query) is the AVX-512 path. Compiled with the AVX-512 flags plus
// -mavx512vnni; only called after isa_supported(Isa::AVX512VNNI).
#include <immintrin.h>

#define FD_ATTN_SIMD_TEMPLATE
#include "kernels/cpu/decode_attention_impl.h"
#include "kernels/cpu/decode_attention_qdot.h"
#include "kernels/cpu/decode_attention_v512.h"

namespace fd::attn {

void run_chunk_avx512vnni(const CallCtx& c, const Chunk& ch, const float* q, float* m, float* l, float* acc,
                          float* scratch) {
  if (c.q8 && c.dtype != KVDType::F16) return simd::run_qchunk<V512, I512<true>>(c, ch, q, m, l, acc, scratch);
  run_chunk_avx512(c, ch, q, m, l, acc, scratch);
}

}  // namespace fd::attn
