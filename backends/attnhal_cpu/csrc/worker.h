// One task of the cpu attention kernel: a row's query vectors of a group of KV heads
// against one KV split, with an online softmax (Worker<T>), the launch description it reads
// (Problem, RowView) and the per-thread buffers it works in. See simd.h for why this header
// keeps an anonymous namespace.
#pragma once

#include "simd.h"
#include "tiles.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

// --- dtype-generic access to q and out (not on the hot path) ---------------------------
// f(p as a pointer to the element type t names).
template <typename F>
void visit_typed(const void* p, at::ScalarType t, F&& f) {
  switch (t) {
    case at::kFloat: f(static_cast<const float*>(p)); break;
    case at::kBFloat16: f(static_cast<const c10::BFloat16*>(p)); break;
    case at::kHalf: f(static_cast<const c10::Half*>(p)); break;
    default: TORCH_CHECK(false, "unreachable dtype");
  }
}
void write_float(void* base, at::ScalarType t, int64_t i, float x) {
  switch (t) {
    case at::kFloat: static_cast<float*>(base)[i] = x; break;
    case at::kBFloat16: static_cast<c10::BFloat16*>(base)[i] = c10::BFloat16(x); break;
    case at::kHalf: static_cast<c10::Half*>(base)[i] = c10::Half(x); break;
    default: TORCH_CHECK(false, "unreachable dtype");
  }
}

// Everything one launch reads; pointers into the op's tensors.
struct Problem {
  const void* q; at::ScalarType q_type; int64_t q_s0, q_s1;
  const void* k; const void* v; int64_t k_s0, k_s1, v_s0, v_s1;
  const int32_t* table; int64_t table_s0; int64_t page;
  const int64_t* req; const int32_t* seq;
  const int32_t* ext;        // [rows] real query tokens per row, or null (= T)
  const bool* mask;          // [rows, T, T] tree mask, or null (causal)
  const int64_t* extra; int64_t extra_s0; int64_t num_extra;  // [rows, >= num_extra] slots after the prefix
  int64_t rows, T, G, KV, D, S;
  int64_t HG;                // KV heads per task (a divisor of KV)
  int64_t TV;                // vectors per tile: a tile is TV * W KV positions (1, 2 or 4)
  int64_t ahead;             // tiles prefetched ahead (0: none); see Worker::run
  bool burst;                // prefetch every head's rows of a tile at once instead of per head
  float scale;
  float* mid_o;    // [rows, KV, S, M, D]: each split's normalised output
  float* mid_lse;  // [rows, KV, S, M]: each split's log-sum-exp (-inf: attended nothing)
};

// Which KV positions row r's tokens see. Positions 0..len-1 come from the page table,
// len..len+num_extra-1 are the extra slots (draft decode's path), seen by every token.
// Token t sees table positions p < open_t always; p in [open_t, len) only through the tree
// mask (mask mode, where open_t = prefix) — causal mode has open_t = min(prefix + t + 1, len).
struct RowView {
  int64_t len, prefix, total, min_open;
};

// One thread's buffers, kept across launches: sized by the first launch of a shape and
// reused after, so a warm launch (a graph replay included) allocates nothing.
struct Buffers {
  std::vector<vf> q;  // floats, as vectors: rows start vector-aligned (a straddling load costs two)
  std::vector<vf> q_bf16;  // bf16 queries for the native dot, 2W to a vector (aligned the same way)
  std::vector<float> p, run_max, alpha, out_row, sum;
  std::vector<vf> sc, run_sum;
  std::vector<float*> acc;
  std::vector<int64_t> open;
};
inline Buffers& thread_buffers() {
  static thread_local Buffers buffers;
  return buffers;
}
template <typename V>
inline V& sized(V& v, int64_t n) {
  v.resize(n);  // keeps the capacity: no allocation once a thread has seen this size
  return v;
}

template <typename T>
struct Worker {
  const Problem& P;
  int64_t M, J;                           // query vectors per KV head (T * G), per task (HG * M)
  int64_t Dp;                             // q row stride: D rounded up to W (rows stay aligned)
  float* q;                               // scaled queries [J, Dp], kernel order
  bool native;                            // bf16 q and K on a CPU with a bf16 dot: scores use it
  int64_t Dq;                             // q_bf16 row stride: D rounded up to 2W
  c10::BFloat16* q_bf16;                  // native only: unscaled queries [J, Dq], natural order
  int64_t N;                              // KV positions per tile (TV * W)
  std::vector<float>& p;                  // weights of one tile [M, N]
  std::vector<float>& run_max;            // [J] reference max of each vector's scores (see softmax_tile)
  std::vector<vf>& run_sum;               // [J] sum of exp(score - reference max), per lane
  std::vector<float>& alpha;              // [M] rescale of each accumulator for the current tile
  std::vector<vf>& sc;                    // [TV, M] scores of the current tile (vector k: positions kW..)
  std::vector<float*>& acc;               // [J] each vector's accumulator (its slice of mid_o)
  std::vector<int64_t>& open;             // [T]
  std::vector<float>& out_row;            // [D] one output row in natural order

  explicit Worker(const Problem& prob, Buffers& b = thread_buffers())
      : P(prob), M(prob.T * prob.G), J(prob.HG * M), Dp((prob.D + W - 1) / W * W),
        q(reinterpret_cast<float*>(sized(b.q, J * Dp / W).data())),
        native(kNativeBf16Dot && std::is_same_v<T, c10::BFloat16> && prob.q_type == at::kBFloat16),
        Dq((prob.D + 2 * W - 1) / (2 * W) * (2 * W)),
        q_bf16(reinterpret_cast<c10::BFloat16*>(sized(b.q_bf16, native ? J * Dq / (2 * W) : 0).data())),
        N(prob.TV * W), p(sized(b.p, M * N)),
        run_max(sized(b.run_max, J)), run_sum(sized(b.run_sum, J)), alpha(sized(b.alpha, M)),
        sc(sized(b.sc, M * prob.TV)),
        acc(sized(b.acc, J)), open(sized(b.open, prob.T)), out_row(sized(b.out_row, prob.D)) {}

  int64_t slot(int64_t r, const RowView& row, int64_t pos) const {
    if (pos >= row.len) return P.extra[r * P.extra_s0 + (pos - row.len)];
    const int32_t* line = P.table + P.req[r] * P.table_s0;
    if (P.page == 1) return line[pos];
    return static_cast<int64_t>(line[pos / P.page]) * P.page + pos % P.page;
  }

  // The slots of positions [p0, p0 + n): one table read per page the tile touches.
  void tile_slots(int64_t r, const RowView& row, int64_t p0, int n, int64_t* out) const {
    if (P.page > 1 && p0 + n <= row.len) {
      int64_t first = 0;                // the slot of position p0 + i is first + i within a page
      int64_t in_page = p0 % P.page;    // counted, not divided per position (a division is slow)
      for (int i = 0; i < n; ++i) {
        if (i == 0 || in_page == 0) first = slot(r, row, p0 + i) - i;
        out[i] = first + i;
        if (++in_page == P.page) in_page = 0;
      }
    } else {
      for (int i = 0; i < n; ++i) out[i] = slot(r, row, p0 + i);
    }
  }

  const T* k_row(int64_t slot, int64_t h) const { return static_cast<const T*>(P.k) + slot * P.k_s0 + h * P.k_s1; }
  const T* v_row(int64_t slot, int64_t h) const { return static_cast<const T*>(P.v) + slot * P.v_s0 + h * P.v_s1; }

  // The slots of the tile at start (clipped at end); n = 0 past the end.
  int ahead_slots(int64_t r, const RowView& row, int64_t start, int64_t end, int64_t* slots) const {
    if (start >= end) return 0;
    const int n = static_cast<int>(std::min<int64_t>(N, end - start));
    tile_slots(r, row, start, n, slots);
    return n;
  }

  // Prefetch (into L2) head h's K rows (k) or V rows (!k) of n slots. always_inline: GCC sees
  // __builtin_prefetch as free of side effects, marks an out-of-line prefetch function
  // "const" and deletes its calls.
  __attribute__((always_inline)) void prefetch_rows(const int64_t* slots, int n, int64_t h, bool k) const {
    const int64_t bytes = P.D * static_cast<int64_t>(sizeof(T));
    for (int i = 0; i < n; ++i) {
      const char* row = reinterpret_cast<const char*>(k ? k_row(slots[i], h) : v_row(slots[i], h));
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 2);
    }
  }

  RowView view(int64_t r) {
    RowView row;
    row.len = P.seq[r];
    const int64_t real = P.ext ? P.ext[r] : P.T;
    row.prefix = row.len - real > 0 ? row.len - real : 0;
    row.total = row.len + P.num_extra;
    row.min_open = row.len;
    for (int64_t t = 0; t < P.T; ++t) {
      open[t] = P.mask ? row.prefix : std::min(row.prefix + t + 1, row.len);
      row.min_open = std::min(row.min_open, open[t]);
    }
    return row;
  }

  // One task: row r, KV heads [h0, h0 + HG), split s. All heads of a group read each
  // slot together: a slot's K (or V) row of every head is one contiguous block, so a
  // group touches each page once instead of once per head (TLB misses dominated otherwise).
  void run(int64_t r, int64_t h0, int64_t s) {
    switch (P.TV) {
      case 1: run_tiles<1>(r, h0, s); break;
      case 2: run_tiles<2>(r, h0, s); break;
      default: run_tiles<4>(r, h0, s); break;
    }
  }

  // run() with tiles of TV vectors (N = TV * W positions).
  template <int TV>
  void run_tiles(int64_t r, int64_t h0, int64_t s) {
    const int64_t G = P.G, D = P.D;
    const RowView row = view(r);
    // Split s covers [begin, end), tile-aligned, from this row's own length (read here, so
    // a captured graph follows new lengths at replay).
    int64_t per = (row.total + P.S - 1) / P.S;
    per = (per + N - 1) / N * N;
    const int64_t begin = std::min(row.total, s * per), end = std::min(row.total, begin + per);

    for (int64_t j = 0; j < J; ++j) {
      const int64_t h = h0 + j / M, m = j % M, t = m / G, g = m % G;
      acc[j] = P.mid_o + (((r * P.KV + h) * P.S + s) * M + m) * D;
      std::fill(acc[j], acc[j] + D, 0.0f);
      run_max[j] = kNegInf;
      run_sum[j] = splat(0);
      const int64_t base = (r * P.T + t) * P.q_s0 + (h * G + g) * P.q_s1;
      if (native)
        std::copy_n(static_cast<const c10::BFloat16*>(P.q) + base, D, q_bf16 + j * Dq);
      else
        visit_typed(P.q, P.q_type, [&](auto* typed) { reorder<T, true>(typed + base, q + j * Dp, D, P.scale); });
    }

    // K/V rows P.ahead tiles ahead are prefetched while this tile computes, one head's K
    // rows just after its scores and its V rows just after its P.V: small bursts spread
    // through the arithmetic. After, not before: with a slot stride of a multiple of 4 KB (8
    // heads of 128 fp32), every position's line of one head and column falls in one L1 set,
    // so rows prefetched before the current ones are read can evict them (1-6 % less CPU
    // time on the Zen 3, docs/cpu.md). One burst of every head's K and V rows per tile filled
    // the miss buffers and stalled the arithmetic queued behind it, so the kernel took the
    // sum of its memory and compute times (docs/cpu.md, AVX-512 host). The distance that keeps the
    // reads ahead, and whether the burst or the spread suits the miss buffers, differ between
    // microarchitectures: both are measured on the host (tuning.py); P.burst is the old burst.
    constexpr int kN = TV * W;
    int64_t tile[kN], ahead[kN];
    const T* rows[kN];
    for (int64_t i = 0; i < P.ahead; ++i) {
      const int n = ahead_slots(r, row, begin + i * kN, end, ahead);
      for (int64_t h = h0; h < h0 + P.HG; ++h) { prefetch_rows(ahead, n, h, true); prefetch_rows(ahead, n, h, false); }
    }
    for (int64_t p0 = begin; p0 < end; p0 += kN) {
      int n_ahead = P.ahead > 0 ? ahead_slots(r, row, p0 + P.ahead * kN, end, ahead) : 0;
      if (P.burst) {
        for (int64_t h = h0; h < h0 + P.HG; ++h) {
          prefetch_rows(ahead, n_ahead, h, true);
          prefetch_rows(ahead, n_ahead, h, false);
        }
        n_ahead = 0;  // nothing left to spread over the heads
      }
      const int n_valid = static_cast<int>(std::min<int64_t>(kN, end - p0));
      tile_slots(r, row, p0, n_valid, tile);
      const bool full = p0 + n_valid <= row.min_open || p0 >= row.len;
      // Rows past the split's end repeat row 0: their scores are masked, their weights 0.
      for (int n = n_valid; n < kN; ++n) tile[n] = tile[0];
      for (int64_t hh = 0; hh < P.HG; ++hh) {
        for (int n = 0; n < kN; ++n) rows[n] = k_row(tile[n], h0 + hh);
        scores<TV>(hh, rows);
        prefetch_rows(ahead, n_ahead, h0 + hh, true);
        for (int64_t m = 0; m < M; ++m) {
          for (int k = 0; k < TV; ++k) {
            vf& v = sc[k * M + m];
            for (int n = std::max(0, n_valid - k * W); n < W; ++n) v[n] = kNegInf;
            if (!full) mask_tile(v, r, row, m / G, p0 + k * W, n_valid - k * W);
          }
          softmax_tile<TV>(hh * M + m, m);
        }
        for (int n = 0; n < kN; ++n) rows[n] = v_row(tile[n], h0 + hh);
        float* const* acc_h = acc.data() + hh * M;
        for_blocks(M, [&](auto mb, int64_t m0) {
          tile_accumulate<decltype(mb)::value, TV>(acc_h + m0, alpha.data() + m0, p.data() + m0 * kN, rows, D);
        });
        prefetch_rows(ahead, n_ahead, h0 + hh, false);
      }
    }

    for (int64_t j = 0; j < J; ++j) {
      const int64_t h = h0 + j / M, m = j % M;
      const float l = lane_sum(run_sum[j]);
      P.mid_lse[((r * P.KV + h) * P.S + s) * M + m] = l > 0 ? run_max[j] + std::log(l) : kNegInf;
      const float inv = l > 0 ? 1.0f / l : 0.0f;
      reorder<T, false>(acc[j], out_row.data(), D, inv);  // back to natural order
      std::copy_n(out_row.data(), D, acc[j]);
    }
  }

  // sc[k * M + m] = scores of query vector m of head h0 + hh against rows [kW, kW + W), for
  // m < M and k < TV.
  template <int TV>
  void scores(int64_t hh, const T* const* rows) {
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (native) {
        const c10::BFloat16* qh = q_bf16 + hh * M * Dq;
        for (int k = 0; k < TV; ++k)
          for_blocks(M, [&](auto mb, int64_t m0) {
            tile_scores_native<decltype(mb)::value>(qh + m0 * Dq, Dq, rows + k * W, P.D, P.scale, &sc[k * M + m0]);
          });
        return;
      }
    }
#endif
    const float* qh = q + hh * M * Dp;
    for (int k = 0; k < TV; ++k)
      for_blocks(M, [&](auto mb, int64_t m0) {
        tile_scores<decltype(mb)::value>(qh + m0 * Dp, Dp, rows + k * W, P.D, &sc[k * M + m0]);
      });
  }

  // Masks the n_valid (may be <= 0 or > W) positions of one score vector from p0 on.
  void mask_tile(vf& sc, int64_t r, const RowView& row, int64_t t, int64_t p0, int n_valid) const {
    for (int n = 0; n < std::min(n_valid, W); ++n) {
      const int64_t pos = p0 + n;
      if (pos < open[t] || pos >= row.len) continue;
      const bool seen = P.mask && P.mask[(r * P.T + t) * P.T + (pos - row.prefix)];
      if (!seen) sc[n] = kNegInf;
    }
  }

  // Online softmax: fold one tile's scores of query vector j (m-th of its head) into its
  // reference max and sum; p[m] gets the tile's weights and alpha[m] the factor that rescales
  // what was accumulated before (1 unless the reference moved). Scores are exponentiated
  // against the reference max even when they pass it by up to kExpMax (e^8 and its sums stay
  // far inside fp32; the final division by the sum is unchanged): the reference moves, and
  // the accumulators are rescaled, only when a score passes it by more, which after the first
  // tiles is rare. A tile then costs a compare instead of horizontal max and sum reductions,
  // and the P.V that follows skips its rescale (tile_accumulate).
  template <int TV>
  void softmax_tile(int64_t j, int64_t m) {
    alpha[m] = 1.0f;
    float* pm = p.data() + m * N;
    vf top = sc[m];
    for (int k = 1; k < TV; ++k) top = top > sc[k * M + m] ? top : sc[k * M + m];
    if (run_max[j] == kNegInf || any_lane(top > splat(run_max[j] + kExpMax))) {
      const float new_max = std::max(run_max[j], lane_max(top));
      if (new_max == kNegInf) {
        for (int k = 0; k < TV; ++k) store(pm + k * W, splat(0));
        return;
      }
      if (new_max > run_max[j]) {
        alpha[m] = std::exp(run_max[j] - new_max);  // 0 when nothing was seen before
        run_sum[j] *= alpha[m];
        run_max[j] = new_max;
      }
    }
    vf sum = run_sum[j];
    for (int k = 0; k < TV; ++k) {
      const vf e = exp_bounded(sc[k * M + m] - splat(run_max[j]));
      store(pm + k * W, e);
      sum += e;
    }
    run_sum[j] = sum;
  }
};

}  // namespace
