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
// Vector width W follows the instruction set the extension was compiled for (AVX-512: 16
// floats, AVX2: 8, otherwise 4): vectors wider than the registers run several times slower.
// A tile (the KV positions one online-softmax step covers) is tile_vectors (1, 2 or 4) such
// vectors, a runtime argument measured per host: wider tiles load and store the accumulators
// and run the softmax's bookkeeping once per more positions, but keep more rows in flight.
// Inside a tile, scores and P.V are register-blocked (up to 4 query vectors × 2-4 K rows
// or V pairs per block, see kRowsPerBlock): each K/V load feeds several FMAs and eight
// independent sums hide FMA latency.

// The layers, bottom up: simd.h (vector types for the instruction set), tiles.h (register-
// blocked inner products over one tile), worker.h (one task's online softmax); this file
// merges the splits, checks the op's arguments and registers the op.

#include "worker.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

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
            int64_t page_size, double sm_scale, int64_t num_splits, int64_t prefetch, int64_t max_vectors,
            bool prefetch_burst, int64_t tile_vectors) {
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
  TORCH_CHECK(prefetch >= 0 && prefetch <= 1024, "prefetch=", prefetch, " (supported: 0..1024 positions)");
  TORCH_CHECK(max_vectors >= 1, "max_vectors=", max_vectors, " (supported: >= 1)");
  TORCH_CHECK(tile_vectors == 1 || tile_vectors == 2 || tile_vectors == 4, "tile_vectors=", tile_vectors,
              " (supported: 1, 2, 4)");
  P.G = q.size(1) / P.KV;
  P.S = num_splits;
  P.TV = tile_vectors;
  P.ahead = (prefetch + P.TV * W - 1) / (P.TV * W);  // whole tiles: a tile's rows are prefetched together
  P.burst = prefetch_burst;
  // Heads per task: as many KV heads as keep a task's query vectors within max_vectors (q and
  // the accumulators stay in L1/L2; the bound is measured per host, tuning.py),
  // but no more than leave every thread a task (one short row would otherwise run on one
  // core). Rows, splits and threads are fixed per captured graph, so HG is too.
  const int64_t threads = at::get_num_threads();
  P.HG = 1;
  for (int64_t hg = P.KV; hg >= 1; --hg) {
    const bool fits = P.KV % hg == 0 && hg * P.T * P.G <= max_vectors;
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

// The instruction set and vector width this build uses (for `attnhal info --build`).
std::string isa() { return std::string(kIsa) + ", vectors of " + std::to_string(W) + " floats"; }
// Positions per vector (a tile is tile_vectors of them; prefetch distances are rounded up to
// whole tiles, see the sweep's candidates).
int64_t tile_width() { return W; }

// Each instruction set's build registers under a namespace of its own (build.py passes
// -DATTNHAL_CPU_NS=attnhal_cpu_avx2, ...), so that several builds load into one process and race.
#ifndef ATTNHAL_CPU_NS
#define ATTNHAL_CPU_NS attnhal_cpu
#endif

TORCH_LIBRARY(ATTNHAL_CPU_NS, m) {
  m.def("attend(Tensor(a!) out, Tensor(b!) mid_o, Tensor(c!) mid_lse, Tensor q, Tensor k_cache, "
        "Tensor v_cache, Tensor req_to_page, Tensor req_pool_indices, Tensor seq_lens, Tensor? ext_lens, "
        "Tensor? mask, Tensor? extra_slots, int num_extra, int tokens_per_row, int page_size, "
        "float sm_scale, int num_splits, int prefetch=16, int max_vectors=64, bool prefetch_burst=False, int tile_vectors=1) -> ()");
  m.def("isa() -> str", &isa);
  m.def("tile_width() -> int", &tile_width);
}

TORCH_LIBRARY_IMPL(ATTNHAL_CPU_NS, CPU, m) { m.impl("attend", &attend); }
