// EXPERIMENT (branch exp/stream-append, not on main; issue 43): one decode token's rows of Llama-2-7b (32 heads x 128,
// K and V, 64 rows of 256 B, 8 KiB apart) copied into N cold tails with memcpy, streaming stores, or prefetchw + memcpy;
// argv[2] = 1 carves the tails from one arena advised MADV_HUGEPAGE. Not built by CMake:
//   g++ -O2 -march=x86-64-v2 -o /tmp/ab harness/bench/append_store_variants.cpp && /tmp/ab 256 0 && /tmp/ab 256 1
// GPU machine's Xeon (H100 VM, 2026-12-07): 4 KiB pages memcpy 4.8-5.0 us a sequence, stream 2.0-2.2, prefetchw 3.8-4.1;
// huge pages memcpy 6.2-6.5, stream 1.9, prefetchw 3.4-3.6 (N = 256 and 1024).
#include <immintrin.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
constexpr int H = 32, D = 128, T = 32;  // heads, head dim, block tokens (llama-2-7b)
static void copy_nt(uint16_t* dst, const uint8_t* src, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(reinterpret_cast<uint8_t*>(dst) + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
}
int main(int argc, char** argv) {
  const int N = argc > 1 ? atoi(argv[1]) : 256;
  const size_t blk = size_t(2) * H * T * D;  // uint16 elements: K and V
  const bool huge = argc > 2 && atoi(argv[2]) == 1;
  std::vector<uint16_t*> tails(N);
  if (huge) {  // one arena on transparent huge pages, tails carved from it
    size_t bytes = blk * 2 * size_t(N), align = size_t(2) << 20;
    char* arena = (char*)aligned_alloc(align, (bytes + align - 1) / align * align);
    madvise(arena, (bytes + align - 1) / align * align, MADV_HUGEPAGE);
    memset(arena, 0, bytes);
    for (int s = 0; s < N; ++s) tails[s] = (uint16_t*)(arena + size_t(s) * blk * 2);
  } else {
    for (auto& t : tails) { t = (uint16_t*)aligned_alloc(64, blk * 2); memset(t, 0, blk * 2); }
  }
  std::vector<uint8_t> k(H * D * 2 * N, 1), v(H * D * 2 * N, 2);
  std::vector<char> flush(size_t(512) << 20, 1);
  std::vector<double> a, b, p;
  int pos = 0;
  volatile long sink = 0;
  for (int rep = 0; rep < 40; ++rep) {
    for (int mode = 0; mode < 3; ++mode) {
      for (size_t i = 0; i < flush.size(); i += 64) sink += flush[i];  // cold caches
      auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < N; ++s) {
        uint16_t* tail = tails[s];
        const uint8_t* ks = k.data() + size_t(s) * H * D * 2; const uint8_t* vs = v.data() + size_t(s) * H * D * 2;
        if (mode == 2) for (int h = 0; h < H; ++h) { char* kd = (char*)(tail + (h * T + pos) * D); _mm_prefetch(kd, _MM_HINT_ET0); _mm_prefetch(kd+64, _MM_HINT_ET0); _mm_prefetch(kd+128, _MM_HINT_ET0); _mm_prefetch(kd+192, _MM_HINT_ET0); char* vd = kd + size_t(H) * T * D * 2; _mm_prefetch(vd, _MM_HINT_ET0); _mm_prefetch(vd+64, _MM_HINT_ET0); _mm_prefetch(vd+128, _MM_HINT_ET0); _mm_prefetch(vd+192, _MM_HINT_ET0);}
        for (int h = 0; h < H; ++h) {
          uint16_t* kd = tail + (h * T + pos) * D;
          uint16_t* vd = kd + H * T * D;
          if (mode == 1) { copy_nt(kd, ks + h * D * 2, D * 2); copy_nt(vd, vs + h * D * 2, D * 2); }
          else { memcpy(kd, ks + h * D * 2, D * 2); memcpy(vd, vs + h * D * 2, D * 2); }
        }
      }
      if (mode == 1) _mm_sfence();
      auto t1 = std::chrono::steady_clock::now();
      double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
      (mode == 0 ? a : mode == 1 ? b : p).push_back(us / N);
      pos = (pos + 1) % T;
    }
  }
  auto med = [](std::vector<double> x) { std::sort(x.begin(), x.end()); return x[x.size() / 2]; };
  printf("%s N=%d per-sequence append (16 KiB), median us: memcpy %.2f  stream %.2f  prefetchw+memcpy %.2f\n", huge ? "thp " : "4k  ", N, med(a), med(b), med(p));
}
