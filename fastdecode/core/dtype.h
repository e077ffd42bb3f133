// Element types of stored tensors and exact fp16/bf16 <-> fp32 conversion (round to nearest even).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fd {

enum class DType { F32, F16, BF16 };

size_t dtype_size(DType t);
// Names as used on the command line and in configs: "fp32", "fp16", "bf16".
std::string_view dtype_name(DType t);
// Parses "fp32"/"float32", "fp16"/"float16", "bf16"/"bfloat16"; throws fd::Error otherwise.
DType dtype_from_name(std::string_view name);
// safetensors header names: "F32", "F16", "BF16".
std::string_view dtype_safetensors_name(DType t);
// Returns false for any other safetensors dtype string.
bool dtype_from_safetensors_name(std::string_view name, DType* out);

// IEEE binary16 and bfloat16 conversions, written out bit by bit so every machine gives the same
// bits (no dependence on F16C or compiler builtins). NaN stays NaN; overflow goes to infinity.
uint16_t fp32_to_fp16(float f);
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);
float bf16_to_fp32(uint16_t h);

// Converts n elements of type `t` at `src` to fp32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);
// Converts n fp32 values to type `t` at `dst` (round to nearest even).
void convert_from_f32(DType t, const float* src, void* dst, size_t n);

}  // namespace fd
