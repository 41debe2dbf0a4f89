// Fused paged attention for CPUs: one pass over the KV cache, read in place by slot.
//
// Why this shape. A decode step is bound by reading K/V. Plain torch must gather
// scattered K/V rows into a buffer before it can compute on them (read + write + read);
// here each K/V row is read once, straight from the pool, widened to fp32 in registers,
// and consumed by an online softmax. Work is split over (row, kv head, KV split) so that
// small batches still keep every core busy; the splits are merged by a second pass.
//
// One kernel serves every phase with a few query tokens per row (decode, draft decode,
// draft extend, target verify): row r has T query tokens and G query heads per KV head,
// so one task holds M = T * G query vectors against the same K/V rows.
//
// Tile width W follows the instruction set the extension was compiled for (AVX-512: 16
// floats, AVX2: 8, otherwise 4): tiles wider than the registers run several times slower.
// Inside a tile, scores and P.V are register-blocked (up to 4 query vectors × 2-4 K rows
// or V pairs per block, see kRowsPerBlock): each K/V load feeds several FMAs and eight
// independent sums hide FMA latency.

#include <ATen/ATen.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

#if defined(__AVX512F__)
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
// K/V rows of the tile after next are prefetched (into L2) while this tile computes.
constexpr int kPrefetchTiles = 2;
// Query vectors one task holds at most when grouping KV heads (q and accumulators stay in L1/L2).
constexpr int64_t kMaxVectors = 64;

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

// exp(x) for x <= 0 (scores minus their running max); lanes at -inf give 0.
// Range reduction x = n ln2 + r, |r| <= ln2 / 2, degree-7 Taylor for e^r (relative error
// below 1e-8), 2^n built in the exponent field.
inline vf exp_nonpositive(vf x) {
  vi dead = x == splat(kNegInf);
  vf c = x < splat(-87.0f) ? splat(-87.0f) : x;
  vi n = -__builtin_convertvector(splat(0.5f) - c * 1.4426950408889634f, vi);
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

// --- dtype-generic scalar access for q and out (not on the hot path) --------------------
float read_float(const void* base, at::ScalarType t, int64_t i) {
  switch (t) {
    case at::kFloat: return static_cast<const float*>(base)[i];
    case at::kBFloat16: return static_cast<float>(static_cast<const c10::BFloat16*>(base)[i]);
    case at::kHalf: return static_cast<float>(static_cast<const c10::Half*>(base)[i]);
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

// Where element c of a row of D goes in kernel order (the body is the part in whole 2W pairs).
template <typename T>
inline int64_t kernel_index(int64_t c, int64_t D) {
  const int64_t body = D - D % (2 * W);
  if (!kPairSplit<T> || c >= body) return c;
  const int64_t i = c % (2 * W);
  return c - i + (i % 2) * W + i / 2;
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

// Register blocks of the two inner products. A block holds MB query vectors (MB <= 4) and
// enough K rows (scores) or V pairs (accumulate) that eight independent sums are in
// flight: FMA latency is hidden, every K/V load feeds MB FMAs, and blocks stay within the
// 16 vector registers of AVX2.
template <int MB> constexpr int kRowsPerBlock = MB == 1 ? 4 : 2;
template <int MB> constexpr int kPairsPerBlock = MB <= 2 ? 2 : 1;

// sc[m] lane n = q[m] . rows[n] for the MB query vectors q[m] = q + m * qs (kernel order)
// and the W rows of a tile. K rows are widened to fp32 in registers, never copied.
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

// acc[m] = alpha[m] * acc[m] + sum_n p[m][n] * rows[n] over D (kernel order), for MB query
// vectors. The rescale by alpha (online softmax) rides on the accumulator loads.
template <int MB, typename T>
inline void tile_accumulate(float* const* acc, const float* alpha, const float* p, const T* const* rows, int64_t D) {
  vf scale[MB];
  for (int m = 0; m < MB; ++m) scale[m] = splat(alpha[m]);
  // Accumulators for C vectors from c on; load(row, c, x) fills x[0..C) from one row.
  auto block = [&](int64_t c, auto vectors, auto load_row) {
    constexpr int C = decltype(vectors)::value;
    vf a[MB][C];
    for (int m = 0; m < MB; ++m)
      for (int k = 0; k < C; ++k) a[m][k] = load(acc[m] + c + k * W) * scale[m];
    for (int n = 0; n < W; ++n) {
      vf x[C];
      load_row(rows[n] + c, x);
      for (int k = 0; k < C; ++k) pin(x[k]);
      for (int m = 0; m < MB; ++m) {
        const vf w = splat(p[m * W + n]);
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
      for (int n = 0; n < W; ++n) s += p[m * W + n] * static_cast<float>(rows[n][c]);
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

// One thread's buffers, kept across launches: sized by the first launch of a shape and
// reused after, so a warm launch (a graph replay included) allocates nothing.
struct Buffers {
  std::vector<vf> q;  // floats, as vectors: rows start vector-aligned (a straddling load costs two)
  std::vector<float> p, run_max, run_sum, alpha, out_row, sum;
  std::vector<vf> sc;
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
  std::vector<float>& p;                  // weights of one tile [M, W]
  std::vector<float> &run_max, &run_sum;  // [J]
  std::vector<float>& alpha;              // [M] rescale of each accumulator for the current tile
  std::vector<vf>& sc;                    // [M] scores of the current tile
  std::vector<float*>& acc;               // [J] each vector's accumulator (its slice of mid_o)
  std::vector<int64_t>& open;             // [T]
  std::vector<float>& out_row;            // [D] one output row in natural order

  explicit Worker(const Problem& prob, Buffers& b = thread_buffers())
      : P(prob), M(prob.T * prob.G), J(prob.HG * M), Dp((prob.D + W - 1) / W * W),
        q(reinterpret_cast<float*>(sized(b.q, J * Dp / W).data())), p(sized(b.p, M * W)),
        run_max(sized(b.run_max, J)), run_sum(sized(b.run_sum, J)), alpha(sized(b.alpha, M)), sc(sized(b.sc, M)),
        acc(sized(b.acc, J)), open(sized(b.open, prob.T)), out_row(sized(b.out_row, prob.D)) {}

  int64_t slot(int64_t r, const RowView& row, int64_t pos) const {
    if (pos >= row.len) return P.extra[r * P.extra_s0 + (pos - row.len)];
    const int32_t* line = P.table + P.req[r] * P.table_s0;
    if (P.page == 1) return line[pos];
    return static_cast<int64_t>(line[pos / P.page]) * P.page + pos % P.page;
  }

  // The slots of positions [p0, p0 + n): one table read when the tile lies inside one page.
  void tile_slots(int64_t r, const RowView& row, int64_t p0, int n, int64_t* out) const {
    if (P.page % W == 0 && p0 + n <= row.len) {  // tiles start W-aligned: one page holds them all
      const int64_t first = slot(r, row, p0);
      for (int i = 0; i < n; ++i) out[i] = first + i;
    } else {
      for (int i = 0; i < n; ++i) out[i] = slot(r, row, p0 + i);
    }
  }

  const T* k_row(int64_t slot, int64_t h) const { return static_cast<const T*>(P.k) + slot * P.k_s0 + h * P.k_s1; }
  const T* v_row(int64_t slot, int64_t h) const { return static_cast<const T*>(P.v) + slot * P.v_s0 + h * P.v_s1; }

  // always_inline: GCC sees __builtin_prefetch as free of side effects, marks an
  // out-of-line prefetch function "const" and deletes its calls.
  __attribute__((always_inline)) void prefetch_tile(int64_t r, const RowView& row, int64_t h0, int64_t start,
                                                    int64_t end) const {
    if (start >= end) return;
    int64_t slots[W];
    const int n = static_cast<int>(std::min<int64_t>(W, end - start));
    tile_slots(r, row, start, n, slots);
    const int64_t bytes = P.D * static_cast<int64_t>(sizeof(T));
    for (int i = 0; i < n; ++i) {
      for (int64_t h = h0; h < h0 + P.HG; ++h) {
        const char* kp = reinterpret_cast<const char*>(k_row(slots[i], h));
        const char* vp = reinterpret_cast<const char*>(v_row(slots[i], h));
        for (int64_t b = 0; b < bytes; b += 64) {
          __builtin_prefetch(kp + b, 0, 2);  // into L2: the rows are read a few tiles later
          __builtin_prefetch(vp + b, 0, 2);
        }
      }
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
    const int64_t G = P.G, D = P.D;
    const RowView row = view(r);
    // Split s covers [begin, end), W-aligned, from this row's own length (read here, so
    // a captured graph follows new lengths at replay).
    int64_t per = (row.total + P.S - 1) / P.S;
    per = (per + W - 1) / W * W;
    const int64_t begin = std::min(row.total, s * per), end = std::min(row.total, begin + per);

    for (int64_t j = 0; j < J; ++j) {
      const int64_t h = h0 + j / M, m = j % M, t = m / G, g = m % G;
      acc[j] = P.mid_o + (((r * P.KV + h) * P.S + s) * M + m) * D;
      std::fill(acc[j], acc[j] + D, 0.0f);
      run_max[j] = kNegInf;
      run_sum[j] = 0.0f;
      const int64_t base = (r * P.T + t) * P.q_s0 + (h * G + g) * P.q_s1;
      for (int64_t c = 0; c < D; ++c)
        q[j * Dp + kernel_index<T>(c, D)] = read_float(P.q, P.q_type, base + c) * P.scale;
    }

    for (int64_t i = 0; i < kPrefetchTiles; ++i) prefetch_tile(r, row, h0, begin + i * W, end);
    int64_t tile[W];
    const T* rows[W];
    for (int64_t p0 = begin; p0 < end; p0 += W) {
      prefetch_tile(r, row, h0, p0 + kPrefetchTiles * W, end);
      const int n_valid = static_cast<int>(std::min<int64_t>(W, end - p0));
      tile_slots(r, row, p0, n_valid, tile);
      const bool full = p0 + n_valid <= row.min_open || p0 >= row.len;
      // Rows past the split's end repeat row 0: their scores are masked, their weights 0.
      for (int n = n_valid; n < W; ++n) tile[n] = tile[0];
      for (int64_t hh = 0; hh < P.HG; ++hh) {
        const float* qh = q + hh * M * Dp;
        for (int n = 0; n < W; ++n) rows[n] = k_row(tile[n], h0 + hh);
        for_blocks(M, [&](auto mb, int64_t m0) {
          tile_scores<decltype(mb)::value>(qh + m0 * Dp, Dp, rows, D, &sc[m0]);
        });
        for (int64_t m = 0; m < M; ++m) {
          for (int n = n_valid; n < W; ++n) sc[m][n] = kNegInf;
          if (!full) mask_tile(sc[m], r, row, m / G, p0, n_valid);
          softmax_tile(sc[m], hh * M + m, m);
        }
        for (int n = 0; n < W; ++n) rows[n] = v_row(tile[n], h0 + hh);
        float* const* acc_h = acc.data() + hh * M;
        for_blocks(M, [&](auto mb, int64_t m0) {
          tile_accumulate<decltype(mb)::value>(acc_h + m0, alpha.data() + m0, p.data() + m0 * W, rows, D);
        });
      }
    }

    for (int64_t j = 0; j < J; ++j) {
      const int64_t h = h0 + j / M, m = j % M;
      const float l = run_sum[j];
      P.mid_lse[((r * P.KV + h) * P.S + s) * M + m] = l > 0 ? run_max[j] + std::log(l) : kNegInf;
      const float inv = l > 0 ? 1.0f / l : 0.0f;
      for (int64_t c = 0; c < D; ++c) out_row[c] = acc[j][kernel_index<T>(c, D)];  // back to natural order
      for (int64_t c = 0; c < D; ++c) acc[j][c] = out_row[c] * inv;
    }
  }

  void mask_tile(vf& sc, int64_t r, const RowView& row, int64_t t, int64_t p0, int n_valid) const {
    for (int n = 0; n < n_valid; ++n) {
      const int64_t pos = p0 + n;
      if (pos < open[t] || pos >= row.len) continue;
      const bool seen = P.mask && P.mask[(r * P.T + t) * P.T + (pos - row.prefix)];
      if (!seen) sc[n] = kNegInf;
    }
  }

  // Online softmax: fold one tile's scores of query vector j (m-th of its head) into its
  // running max and sum; p[m] gets the tile's weights and alpha[m] the factor that rescales
  // what was accumulated before (1 unless the max grew).
  void softmax_tile(vf sc, int64_t j, int64_t m) {
    const float new_max = std::max(run_max[j], lane_max(sc));
    alpha[m] = 1.0f;
    vf e = splat(0);
    if (new_max != kNegInf) {
      if (new_max > run_max[j]) {
        alpha[m] = std::exp(run_max[j] - new_max);  // 0 when nothing was seen before
        run_sum[j] *= alpha[m];
        run_max[j] = new_max;
      }
      e = exp_nonpositive(sc - splat(new_max));
      run_sum[j] += lane_sum(e);
    }
    store(p.data() + m * W, e);
  }
};

// Merge the splits of every (row, KV head, query vector) into out[token, head, :].
void reduce(const Problem& P, void* out, at::ScalarType out_type, int64_t o_s0, int64_t o_s1) {
  const int64_t M = P.T * P.G, D = P.D, S = P.S;
  at::parallel_for(0, P.rows * P.KV * M, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float>& sum = sized(thread_buffers().sum, D);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t m = i % M, rh = i / M, h = rh % P.KV, r = rh / P.KV;
      const float* lse = P.mid_lse + rh * S * M + m;
      float top = kNegInf;
      for (int64_t s = 0; s < S; ++s) top = std::max(top, lse[s * M]);
      std::fill(sum.begin(), sum.end(), 0.0f);
      float total = 0;
      if (top != kNegInf) {
        for (int64_t s = 0; s < S; ++s) {
          if (lse[s * M] == kNegInf) continue;
          const float w = std::exp(lse[s * M] - top);
          total += w;
          const float* o = P.mid_o + ((rh * S + s) * M + m) * D;
          for (int64_t c = 0; c < D; ++c) sum[c] += w * o[c];
        }
      }
      const float inv = total > 0 ? 1.0f / total : 0.0f;
      const int64_t t = m / P.G, g = m % P.G;
      const int64_t base = (r * P.T + t) * o_s0 + (h * P.G + g) * o_s1;
      for (int64_t c = 0; c < D; ++c) write_float(out, out_type, base + c, sum[c] * inv);
    }
  });
}

template <typename T>
void attend_splits(const Problem& P) {
  const int64_t groups = P.KV / P.HG;
  at::parallel_for(0, P.rows * groups * P.S, 1, [&](int64_t lo, int64_t hi) {
    Worker<T> worker(P);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t s = i % P.S, rg = i / P.S;
      worker.run(rg / groups, rg % groups * P.HG, s);
    }
  });
}

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf,
              name, ".dtype=", t.scalar_type(), " (supported: float32, bfloat16, float16)");
  TORCH_CHECK(t.device().is_cpu(), name, ".device=", t.device(), " (supported: cpu)");
  TORCH_CHECK(t.stride(-1) == 1, name, ".stride(-1)=", t.stride(-1), " (supported: 1)");
}

void check_int(const at::Tensor& t, at::ScalarType type, const char* name) {
  TORCH_CHECK(t.scalar_type() == type, name, ".dtype=", t.scalar_type(), " (supported: ", type, ")");
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, " (supported: a contiguous cpu tensor)");
}

}  // namespace

// out [rows * T, Hq, D] = attention of q [rows * T, Hq, D] over the paged cache (see Problem).
void attend(at::Tensor out, at::Tensor mid_o, at::Tensor mid_lse, const at::Tensor& q,
            const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& req_to_page,
            const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
            const std::optional<at::Tensor>& ext_lens, const std::optional<at::Tensor>& mask,
            const std::optional<at::Tensor>& extra_slots, int64_t num_extra, int64_t tokens_per_row,
            int64_t page_size, double sm_scale, int64_t num_splits) {
  check_float(q, "q"); check_float(out, "out"); check_float(k_cache, "k_cache"); check_float(v_cache, "v_cache");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "v_cache.dtype=", v_cache.scalar_type(),
              " (supported: k_cache.dtype=", k_cache.scalar_type(), ")");
  check_int(req_to_page, at::kInt, "req_to_page");
  check_int(req_pool_indices, at::kLong, "req_pool_indices");
  check_int(seq_lens, at::kInt, "seq_lens");
  TORCH_CHECK(mid_o.scalar_type() == at::kFloat && mid_o.is_contiguous() && mid_lse.scalar_type() == at::kFloat
              && mid_lse.is_contiguous(), "mid_o/mid_lse (supported: contiguous float32 scratch)");
  Problem P{};
  P.rows = req_pool_indices.size(0);
  P.T = tokens_per_row;
  P.KV = k_cache.size(1);
  P.D = q.size(2);
  TORCH_CHECK(q.size(1) % P.KV == 0, "num_q_heads/num_kv_heads=", q.size(1), "/", P.KV,
              " (supported: num_kv_heads dividing num_q_heads)");
  TORCH_CHECK(k_cache.size(2) == P.D && v_cache.size(2) == P.D, "head_size of the cache=", k_cache.size(2),
              " (supported: q's head size ", P.D, ")");
  TORCH_CHECK(q.size(0) == P.rows * P.T && out.sizes() == q.sizes(), "q.shape[0]=", q.size(0),
              " (supported: rows * tokens_per_row = ", P.rows * P.T, ", out shaped like q)");
  TORCH_CHECK(page_size >= 1, "page_size=", page_size, " (supported: >= 1)");
  TORCH_CHECK(num_splits >= 1, "num_splits=", num_splits, " (supported: >= 1)");
  P.G = q.size(1) / P.KV;
  P.S = num_splits;
  // Heads per task: as many KV heads as keep a task's query vectors within kMaxVectors,
  // but no more than leave every thread a task (one short row would otherwise run on one
  // core). Rows, splits and threads are fixed per captured graph, so HG is too.
  const int64_t threads = at::get_num_threads();
  P.HG = 1;
  for (int64_t hg = P.KV; hg >= 1; --hg) {
    const bool fits = P.KV % hg == 0 && hg * P.T * P.G <= kMaxVectors;
    if (fits && P.rows * (P.KV / hg) * P.S >= threads) { P.HG = hg; break; }
  }
  const int64_t parts = P.rows * P.KV * P.S * P.T * P.G;
  TORCH_CHECK(mid_lse.numel() >= parts && mid_o.numel() >= parts * P.D, "mid_o/mid_lse numel=", mid_o.numel(), "/",
              mid_lse.numel(), " (supported: >= rows*kv_heads*splits*T*G=", parts, " [*head_size])");
  if (P.rows == 0) return;
  P.q = q.data_ptr(); P.q_type = q.scalar_type(); P.q_s0 = q.stride(0); P.q_s1 = q.stride(1);
  P.k = k_cache.data_ptr(); P.v = v_cache.data_ptr();
  P.k_s0 = k_cache.stride(0); P.k_s1 = k_cache.stride(1); P.v_s0 = v_cache.stride(0); P.v_s1 = v_cache.stride(1);
  P.table = req_to_page.data_ptr<int32_t>(); P.table_s0 = req_to_page.stride(0); P.page = page_size;
  P.req = req_pool_indices.data_ptr<int64_t>(); P.seq = seq_lens.data_ptr<int32_t>();
  P.ext = nullptr;
  if (ext_lens.has_value()) { check_int(*ext_lens, at::kInt, "ext_lens"); P.ext = ext_lens->data_ptr<int32_t>(); }
  P.mask = nullptr;
  if (mask.has_value()) {
    check_int(*mask, at::kBool, "mask");
    TORCH_CHECK(mask->numel() >= P.rows * P.T * P.T, "mask (supported: [rows, T, T] bool)");
    P.mask = mask->data_ptr<bool>();
  }
  P.extra = nullptr; P.extra_s0 = 0; P.num_extra = 0;
  if (extra_slots.has_value() && num_extra > 0) {
    TORCH_CHECK(extra_slots->scalar_type() == at::kLong && extra_slots->stride(1) == 1
                && extra_slots->size(1) >= num_extra, "extra_slots (supported: [rows, >= num_extra] int64)");
    P.extra = extra_slots->data_ptr<int64_t>(); P.extra_s0 = extra_slots->stride(0); P.num_extra = num_extra;
  }
  P.scale = static_cast<float>(sm_scale);
  P.mid_o = mid_o.data_ptr<float>(); P.mid_lse = mid_lse.data_ptr<float>();
  switch (k_cache.scalar_type()) {
    case at::kFloat: attend_splits<float>(P); break;
    case at::kBFloat16: attend_splits<c10::BFloat16>(P); break;
    case at::kHalf: attend_splits<c10::Half>(P); break;
    default: TORCH_CHECK(false, "unreachable");
  }
  reduce(P, out.data_ptr(), out.scalar_type(), out.stride(0), out.stride(1));
}

// The instruction set and tile width this build uses (for `attnhal info --build`).
std::string isa() { return std::string(kIsa) + ", tile " + std::to_string(W) + " floats"; }

TORCH_LIBRARY(attnhal_cpu, m) {
  m.def("attend(Tensor(a!) out, Tensor(b!) mid_o, Tensor(c!) mid_lse, Tensor q, Tensor k_cache, "
        "Tensor v_cache, Tensor req_to_page, Tensor req_pool_indices, Tensor seq_lens, Tensor? ext_lens, "
        "Tensor? mask, Tensor? extra_slots, int num_extra, int tokens_per_row, int page_size, "
        "float sm_scale, int num_splits) -> ()");
  m.def("isa() -> str", &isa);
}

TORCH_LIBRARY_IMPL(attnhal_cpu, CPU, m) { m.impl("attend", &attend); }
