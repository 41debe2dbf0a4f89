// Register-blocked tiles of the cpu attention kernel: the order q and the accumulators
// are kept in, and the two inner products of one tile of KV positions (scores = q.K for W
// rows at a time, then acc += p.V over the tile's TV * W rows). See simd.h for why this header
// keeps an anonymous namespace.
#pragma once

#include "simd.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

// --- the order q and the accumulators are kept in --------------------------------------
// K/V elements are consumed 2W at a time, as two vectors. For bf16 caches those are the
// even and the odd elements of the 2W (one load, then a shift or a mask each: bf16 is the
// high half of an fp32), which halves the cost of widening; q is stored in that same order
// and the accumulators come out in it, so dot products and sums are unchanged and only
// the final output is put back in place. Other dtypes keep the natural order.
template <typename T> constexpr bool kPairSplit = std::is_same_v<T, c10::BFloat16>;

template <typename T>
inline void load_pair(const T* p, vf& a, vf& b) { a = load(p); b = load(p + W); }
inline void load_pair(const c10::BFloat16* p, vf& a, vf& b) {
  vu u; std::memcpy(&u, p, sizeof u);  // lane i: element 2i in the low half, 2i + 1 in the high half
  const vu lo = u << 16, hi = u & 0xffff0000u;
  std::memcpy(&a, &lo, sizeof a); std::memcpy(&b, &hi, sizeof b);
}

// dst = scale * src, a row of D elements, from natural into kernel order (to_kernel) or back:
// in the body (whole 2W pairs) of a pair-split cache element c0 + i sits at c0 + (i % 2) * W
// + i / 2, as load_pair reads it; the rest keeps its place. Loops of compile-time width (the
// compiler vectorises them) instead of an index computed per element: once per query vector
// and task, it cost several per cent of a decode.
template <typename T, bool to_kernel, typename S>
inline void reorder(const S* src, float* dst, int64_t D, float scale) {
  const int64_t body = kPairSplit<T> ? D - D % (2 * W) : 0;
  for (int64_t c0 = 0; c0 < body; c0 += 2 * W)
    for (int i = 0; i < 2 * W; ++i) {
      const int64_t split = c0 + (i % 2) * W + i / 2;
      if constexpr (to_kernel) dst[split] = static_cast<float>(src[c0 + i]) * scale;
      else dst[c0 + i] = static_cast<float>(src[split]) * scale;
    }
  for (int64_t c = body; c < D; ++c) dst[c] = static_cast<float>(src[c]) * scale;
}

// Register blocks of the two inner products. A block holds MB query vectors (MB <= 4) and
// enough K rows (scores) or V pairs (accumulate) that eight independent sums are in
// flight: FMA latency is hidden, every K/V load feeds MB FMAs, and blocks stay within the
// 16 vector registers of AVX2.
template <int MB> constexpr int kRowsPerBlock = MB == 1 ? 4 : 2;
template <int MB> constexpr int kPairsPerBlock = MB <= 2 ? 2 : 1;

// sc[m] lane n = q[m] . rows[n] for the MB query vectors q[m] = q + m * qs (kernel order)
// and W rows (one vector of a tile). K rows are widened to fp32 in registers, never copied.
template <int MB, typename T>
inline void tile_scores(const float* q, int64_t qs, const T* const* rows, int64_t D, vf* sc) {
  constexpr int NB = kRowsPerBlock<MB>;
  const int64_t body = D - D % (2 * W), chunks = D - D % W;
  vf part[MB][W];
  for (int n0 = 0; n0 < W; n0 += NB) {
    vf a[MB][NB];
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < NB; ++j) a[m][j] = splat(0);
    for (int64_t c = 0; c < body; c += 2 * W) {
      vf x[NB][2];
      for (int j = 0; j < NB; ++j) { load_pair(rows[n0 + j] + c, x[j][0], x[j][1]); pin(x[j][0]); pin(x[j][1]); }
      for (int m = 0; m < MB; ++m) {
        vf q0 = load(q + m * qs + c), q1 = load(q + m * qs + c + W);
        pin(q0); pin(q1);
        for (int j = 0; j < NB; ++j) { a[m][j] += q0 * x[j][0]; a[m][j] += q1 * x[j][1]; }
      }
    }
    for (int64_t c = body; c < chunks; c += W)  // an odd chunk (head sizes not a multiple of 2W)
      for (int m = 0; m < MB; ++m)
        for (int j = 0; j < NB; ++j) a[m][j] += load(q + m * qs + c) * load(rows[n0 + j] + c);
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < NB; ++j) part[m][n0 + j] = a[m][j];
  }
  for (int m = 0; m < MB; ++m) {
    sc[m] = transpose_sum(part[m]);
    for (int64_t c = chunks; c < D; ++c)  // head sizes not a multiple of W
      for (int n = 0; n < W; ++n) sc[m][n] += q[m * qs + c] * static_cast<float>(rows[n][c]);
  }
}

#if defined(__AVX512BF16__)
// tile_scores for bf16 q and K with the native dot: sc[m] lane n = scale * (q[m] . rows[n]),
// q[m] = q + m * qs unscaled in natural order (bf16 products are exact in fp32 and the
// scale is applied once per score, so the scores equal the widening path's up to the order
// of fp32 sums). Same register blocks as tile_scores.
template <int MB>
inline void tile_scores_native(const c10::BFloat16* q, int64_t qs, const c10::BFloat16* const* rows, int64_t D,
                               float scale, vf* sc) {
  constexpr int NB = kRowsPerBlock<MB>;
  const int64_t body = D - D % (2 * W);
  const PairMask tail = tail_mask(D - body);
  vf part[MB][W];
  for (int n0 = 0; n0 < W; n0 += NB) {
    vf a[MB][NB];
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < NB; ++j) a[m][j] = splat(0);
    auto chunk = [&](int64_t c, auto load) {
      vpairs x[NB];
      for (int j = 0; j < NB; ++j) { x[j] = load(rows[n0 + j] + c); pin(x[j]); }
      for (int m = 0; m < MB; ++m) {
        vpairs qm = load(q + m * qs + c);
        pin(qm);
        for (int j = 0; j < NB; ++j) a[m][j] = dot_pairs(a[m][j], qm, x[j]);
      }
    };
    for (int64_t c = 0; c < body; c += 2 * W) chunk(c, [](const c10::BFloat16* p) { return load_pairs(p); });
    if (tail) chunk(body, [tail](const c10::BFloat16* p) { return load_pairs(p, tail); });
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < NB; ++j) part[m][n0 + j] = a[m][j];
  }
  for (int m = 0; m < MB; ++m) sc[m] = transpose_sum(part[m]) * scale;
}
#endif

// acc[m] = alpha[m] * acc[m] + sum_n p[m][n] * rows[n] over D (kernel order), for MB query
// vectors and the N = TV * W positions of a tile (p[m] = p + m * N). The rescale by alpha
// (online softmax) rides on the accumulator loads, and is skipped when every alpha is 1 (the
// running max did not grow: most tiles past the first few), which saves a multiply per
// accumulator on the FMA ports. A wider tile loads and stores each accumulator once per N
// positions instead of once per W.
template <int MB, int TV, typename T>
inline void tile_accumulate(float* const* acc, const float* alpha, const float* p, const T* const* rows, int64_t D) {
  constexpr int N = TV * W;
  bool rescale = false;
  vf scale[MB];
  for (int m = 0; m < MB; ++m) { scale[m] = splat(alpha[m]); rescale |= alpha[m] != 1.0f; }
  // Accumulators for C vectors from c on; load(row, c, x) fills x[0..C) from one row.
  auto block = [&](int64_t c, auto vectors, auto load_row) {
    constexpr int C = decltype(vectors)::value;
    vf a[MB][C];
    for (int m = 0; m < MB; ++m)
      for (int k = 0; k < C; ++k) a[m][k] = load(acc[m] + c + k * W);
    if (rescale)
      for (int m = 0; m < MB; ++m)
        for (int k = 0; k < C; ++k) a[m][k] *= scale[m];
    for (int n = 0; n < N; ++n) {
      vf x[C];
      load_row(rows[n] + c, x);
      for (int k = 0; k < C; ++k) pin(x[k]);
      for (int m = 0; m < MB; ++m) {
        const vf w = splat(p[m * N + n]);
        for (int k = 0; k < C; ++k) a[m][k] += w * x[k];
      }
    }
    for (int m = 0; m < MB; ++m)
      for (int k = 0; k < C; ++k) store(acc[m] + c + k * W, a[m][k]);
  };
  constexpr int PB = kPairsPerBlock<MB>;
  const int64_t body = D - D % (2 * W);
  int64_t c = 0;
  for (; c + 2 * W * PB <= body; c += 2 * W * PB)
    block(c, std::integral_constant<int, 2 * PB>{}, [](const T* r, vf* x) {
      for (int k = 0; k < PB; ++k) load_pair(r + 2 * W * k, x[2 * k], x[2 * k + 1]);
    });
  for (; c < body; c += 2 * W)
    block(c, std::integral_constant<int, 2>{}, [](const T* r, vf* x) { load_pair(r, x[0], x[1]); });
  for (; c + W <= D; c += W)
    block(c, std::integral_constant<int, 1>{}, [](const T* r, vf* x) { x[0] = load(r); });
  for (; c < D; ++c)
    for (int m = 0; m < MB; ++m) {
      float s = acc[m][c] * alpha[m];
      for (int n = 0; n < N; ++n) s += p[m * N + n] * static_cast<float>(rows[n][c]);
      acc[m][c] = s;
    }
}

// Calls f(std::integral_constant<int, MB>{}, m0) for blocks of up to 4 of M query vectors.
template <typename F>
inline void for_blocks(int64_t M, F&& f) {
  int64_t m0 = 0;
  for (; m0 + 4 <= M; m0 += 4) f(std::integral_constant<int, 4>{}, m0);
  switch (M - m0) {
    case 3: f(std::integral_constant<int, 3>{}, m0); break;
    case 2: f(std::integral_constant<int, 2>{}, m0); break;
    case 1: f(std::integral_constant<int, 1>{}, m0); break;
    default: break;
  }
}

}  // namespace
