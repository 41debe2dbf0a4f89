// SIMD layer of the cpu attention kernel: the vector type of the instruction set this
// file is compiled for, widening loads, horizontal reductions and exp. The only code that
// depends on the instruction set (#if __AVX512F__ / __AVX2__) lives here.
//
// These headers are parts of one translation unit (attention.cpp) and keep its anonymous
// namespace: internal linkage leaves GCC free to inline and specialise exactly as it did
// when they were one file.
#pragma once

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

namespace {

#if defined(__AVX512F__) && defined(__AVX512BF16__)
constexpr int W = 16;
constexpr const char* kIsa = "avx512, bf16 dot";
#elif defined(__AVX512F__)
constexpr int W = 16;
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__)
constexpr int W = 8;
constexpr const char* kIsa = "avx2";
#else
constexpr int W = 4;
constexpr const char* kIsa = "generic";
#endif

typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef uint32_t vu __attribute__((vector_size(W * 4)));
typedef uint16_t vh __attribute__((vector_size(W * 2)));
typedef _Float16 vf16 __attribute__((vector_size(W * 2)));

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <std::size_t... I>
inline vf broadcast(float x, std::index_sequence<I...>) { return vf{((void)I, x)...}; }
// x in every lane (not vf{} + x: that costs an add, since 0 + x is not x for x = -0).
inline vf splat(float x) { return broadcast(x, std::make_index_sequence<W>{}); }

// --- widening loads: W cache elements -> W fp32 lanes ---------------------------------
inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline vf load(const c10::BFloat16* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<vf>(_mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16)));
#elif defined(__AVX2__)
  // One zero-extend and one shift (the generic form below compiles to a slower shuffle chain).
  return reinterpret_cast<vf>(_mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16)));
#else
  vh h; std::memcpy(&h, p, sizeof h);
  vu u = __builtin_convertvector(h, vu) << 16;  // bf16 is the high half of an fp32
  vf v; std::memcpy(&v, &u, sizeof v); return v;
#endif
}
inline vf load(const c10::Half* p) {
  vf16 h; std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vf);
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// --- native bf16 dot products (vdpbf16ps) -------------------------------------------------
// Lane i of dot_pairs(acc, a, b) = acc[i] + a[2i] * b[2i] + a[2i + 1] * b[2i + 1]: 2W bf16
// elements, products exact in fp32, no widening (which costs the other path as many
// instructions as its FMAs). load_pairs(p, tail_mask(n)) reads only the first n < 2W
// elements and zeroes the rest, so a loop tail needs no scalar code.
#if defined(__AVX512BF16__)
constexpr bool kNativeBf16Dot = true;
typedef __m512bh vpairs;
typedef __mmask32 PairMask;
inline PairMask tail_mask(int64_t n) { return static_cast<PairMask>((uint64_t{1} << n) - 1); }
inline vpairs load_pairs(const c10::BFloat16* p) { return (vpairs)_mm512_loadu_si512(p); }
inline vpairs load_pairs(const c10::BFloat16* p, PairMask mask) { return (vpairs)_mm512_maskz_loadu_epi16(mask, p); }
inline vf dot_pairs(vf acc, vpairs a, vpairs b) {
  return reinterpret_cast<vf>(_mm512_dpbf16_ps(reinterpret_cast<__m512>(acc), a, b));
}
inline void pin(vpairs& v) { asm("" : "+v"(v)); }
#else
constexpr bool kNativeBf16Dot = false;
#endif

// --- horizontal reductions -------------------------------------------------------------
// Horizontal sums of W vectors in two stages that stay cheap on x86: sums of adjacent pairs
// within each 4-lane block (one in-block shuffle pair, like haddps) until each block of
// vector u_g holds the block partials of 4 inputs, then whole blocks are paired and added.
template <std::size_t... I>
inline vf pair_in_blocks(vf a, vf b, std::index_sequence<I...>) {
  // lane i: block i/4; its first two lanes come from a, the last two from b.
  constexpr auto pick = [](std::size_t i, std::size_t odd) {
    return (i % 4 < 2 ? 0 : W) + 4 * (i / 4) + 2 * (i % 2) + odd;
  };
  return __builtin_shufflevector(a, b, pick(I, 0)...) + __builtin_shufflevector(a, b, pick(I, 1)...);
}
template <std::size_t... I>
inline vf pair_blocks(vf a, vf b, std::index_sequence<I...>) {
  // block k of the result: blocks 2k, 2k+1 of a (first half) or of b (second half), summed.
  constexpr std::size_t nb = W / 4;
  constexpr auto pick = [](std::size_t i, std::size_t odd) {
    const std::size_t k = i / 4;
    return (k < nb / 2 ? 0 : W) + 4 * (2 * (k % (nb / 2 ? nb / 2 : 1)) + odd) + i % 4;
  };
  return __builtin_shufflevector(a, b, pick(I, 0)...) + __builtin_shufflevector(a, b, pick(I, 1)...);
}
// out lane n = sum of the lanes of v[n], for n < W (v is clobbered).
inline vf transpose_sum(vf* v) {
  constexpr auto seq = std::make_index_sequence<W>{};
  for (int width = W; width > W / 4; width /= 2)   // two in-block rounds: W -> W/4 vectors
    for (int i = 0; i < width / 2; ++i) v[i] = pair_in_blocks(v[2 * i], v[2 * i + 1], seq);
  if constexpr (W > 4)
    for (int width = W / 4; width > 1; width /= 2)
      for (int i = 0; i < width / 2; ++i) v[i] = pair_blocks(v[2 * i], v[2 * i + 1], seq);
  return v[0];
}
// Lane i of v and lane i + S of v (mod W), for a log2(W)-step horizontal reduction.
template <int S, std::size_t... I>
inline vf rotate(vf v, std::index_sequence<I...>) { return __builtin_shufflevector(v, v, ((I + S) % W)...); }
template <int S = W / 2>
inline vf all_max(vf v) {
  const vf r = rotate<S>(v, std::make_index_sequence<W>{});
  v = v > r ? v : r;
  if constexpr (S > 1) return all_max<S / 2>(v); else return v;
}
template <int S = W / 2>
inline vf all_sum(vf v) {
  v += rotate<S>(v, std::make_index_sequence<W>{});
  if constexpr (S > 1) return all_sum<S / 2>(v); else return v;
}
inline float lane_max(vf v) { return all_max(v)[0]; }
inline float lane_sum(vf v) { return all_sum(v)[0]; }

// exp(x) for x <= kExpMax (scores minus a reference max they may pass by up to kExpMax, see
// Worker::softmax_tile); lanes at -inf give 0. Range reduction x = n ln2 + r, |r| <= ln2 / 2
// (n rounded to nearest: the +128.5 keeps the truncating conversion a floor), degree-7 Taylor
// for e^r (relative error below 1e-8), 2^n built in the exponent field.
constexpr float kExpMax = 8.0f;
inline vf exp_bounded(vf x) {
  vi dead = x == splat(kNegInf);
  vf c = x < splat(-87.0f) ? splat(-87.0f) : x;
  vi n = __builtin_convertvector(c * 1.4426950408889634f + 128.5f, vi) - 128;
  vf nf = __builtin_convertvector(n, vf);
  vf r = c - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;
  vf p = splat(1.0f / 5040) + r * (1.0f / 40320);
  p = splat(1.0f / 720) + r * p;
  p = splat(1.0f / 120) + r * p;
  p = splat(1.0f / 24) + r * p;
  p = splat(1.0f / 6) + r * p;
  p = splat(0.5f) + r * p;
  p = splat(1.0f) + r * p;
  p = splat(1.0f) + r * p;
  vi bits = (n + 127) << 23;
  vf scale; std::memcpy(&scale, &bits, sizeof scale);
  vf e = p * scale;
  return dead ? splat(0.0f) : e;
}

// Whether any lane of a comparison result is set.
inline bool any_lane(vi m) {
#if defined(__AVX512F__)
  return _mm512_test_epi32_mask(reinterpret_cast<__m512i>(m), reinterpret_cast<__m512i>(m)) != 0;
#elif defined(__AVX2__)
  return !_mm256_testz_si256(reinterpret_cast<__m256i>(m), reinterpret_cast<__m256i>(m));
#else
  int32_t any = 0;
  for (int i = 0; i < W; ++i) any |= m[i];
  return any != 0;
#endif
}

// Keeps v in a register: without it GCC folds a load that feeds several FMAs into each of
// them as a memory operand, and the duplicated loads (not the FMAs) then set the pace.
inline void pin(vf& v) {
#if defined(__x86_64__)
  asm("" : "+x"(v));
#else
  (void)v;
#endif
}

}  // namespace
