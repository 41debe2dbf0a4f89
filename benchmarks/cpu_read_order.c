// How fast the cpu decode kernel's K/V access order can be read, with no arithmetic at all:
// the ceiling that order puts on the kernel's "% of read bandwidth", beside a sequential read
// of the same bytes (what `sum` measures) on the same host, in one run.
//
//   cc -O2 -mavx2 -fopenmp -o /tmp/cpu_read_order benchmarks/cpu_read_order.c
//   OMP_NUM_THREADS=2 /tmp/cpu_read_order [ITEMSIZE=2] [PAGE=16] [BS=16] [CTX=2048] [DIST...]
//
// The pools are laid out as the kernel's: [slots, 8 KV heads, 128] for K and for V, pages of
// PAGE slots in a random order (seed 1), BS requests of CTX positions. The orders, per tile of 8
// positions, K then V (requests split over the threads, as the kernel's tasks are):
//   sequential   the pools front to back (no paging): the host's streaming read rate;
//   head-major   for each head, its row of each of the 8 slots (the kernel's order: a head's
//                q vectors against the tile's rows), optionally with the slots DIST positions
//                ahead prefetched (the kernel's prefetch distance);
//   2 / 4 heads  the same with 2 or 4 adjacent heads a pass: each slot's rows of those heads
//                (one contiguous block of 2 or 4 rows), slot after slot, then the next heads;
//   slot-major   for each slot, every head's row (one contiguous block per slot).
// Each line: the best of 9 passes, GB/s of K and V, and the ratio to sequential.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { HEADS = 8, DIM = 128, TILE = 8, PASSES = 9 };
static long row_bytes, slot_bytes, page, bs, ctx;
static int *page_order;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static long slot_of(long r, long pos) {
  const long p = r * ctx + pos;
  return (long)page_order[p / page] * page + p % page;
}
static __m256 read_row(const char *p, __m256 acc) {
  for (long b = 0; b < row_bytes; b += 32)
    acc = _mm256_add_ps(acc, _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(p + b))));
  return acc;
}
// One request's K and V, tile by tile, `per_pass` adjacent heads a pass (1: head-major, HEADS:
// slot-major).
static float request(const char *k, const char *v, long r, long per_pass, long dist) {
  __m256 acc = _mm256_setzero_ps();
  for (long p0 = 0; p0 < ctx; p0 += TILE)
    for (const char *pool = k; pool; pool = pool == k ? v : NULL) {
      for (long n = 0; n < TILE && dist; ++n)
        if (p0 + n + dist < ctx)
          for (long b = 0; b < slot_bytes; b += 64) _mm_prefetch(pool + slot_of(r, p0 + n + dist) * slot_bytes + b, _MM_HINT_T1);
      for (long h0 = 0; h0 < HEADS; h0 += per_pass)
        for (long n = 0; n < TILE; ++n)
          for (long h = h0; h < h0 + per_pass; ++h)
            acc = read_row(pool + slot_of(r, p0 + n) * slot_bytes + h * row_bytes, acc);
    }
  return acc[0];
}
// Best seconds of PASSES passes; per_pass 0: sequential, else request()'s heads a pass.
static double timed(const char *k, const char *v, size_t bytes, long per_pass, long dist) {
  double best = 1e30;
  volatile float sink = 0;
  for (int pass = 0; pass < PASSES; ++pass) {
    const double t0 = now();
    float s = 0;
    if (per_pass == 0) {
#pragma omp parallel for reduction(+ : s)
      for (long c = 0; c < 64; ++c) {
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = c * (bytes / 64); b < (c + 1) * (bytes / 64); b += row_bytes)
          acc = read_row(v + b, read_row(k + b, acc));
        s += acc[0];
      }
    } else {
#pragma omp parallel for reduction(+ : s)
      for (long r = 0; r < bs; ++r) s += request(k, v, r, per_pass, dist);
    }
    const double t = now() - t0;
    sink += s;
    if (t < best) best = t;
  }
  return best;
}
int main(int argc, char **argv) {
  const long itemsize = argc > 1 ? atol(argv[1]) : 2;
  page = argc > 2 ? atol(argv[2]) : 16, bs = argc > 3 ? atol(argv[3]) : 16, ctx = argc > 4 ? atol(argv[4]) : 2048;
  if (itemsize < 1 || page < 1 || bs < 1 || ctx < TILE || ctx % page || ctx % TILE) {
    fprintf(stderr, "ITEMSIZE PAGE BS CTX: positive, CTX a multiple of PAGE and of %d\n", TILE);
    return 2;
  }
  row_bytes = DIM * itemsize, slot_bytes = HEADS * row_bytes;
  const long pages = bs * ctx / page;
  const size_t bytes = (size_t)pages * page * slot_bytes;
  char *k = aligned_alloc(4096, bytes), *v = aligned_alloc(4096, bytes);
  page_order = malloc(pages * sizeof *page_order);
  if (!k || !v || !page_order) return 3;
  memset(k, 1, bytes), memset(v, 1, bytes);
  srand(1);
  for (long i = 0; i < pages; ++i) page_order[i] = (int)i;
  for (long i = pages - 1; i > 0; --i) {
    const long j = rand() % (i + 1);
    const int t = page_order[i];
    page_order[i] = page_order[j], page_order[j] = t;
  }
  printf("%d threads, itemsize %ld, page %ld, %ld x %ld, 8 KV heads of %d: %.0f MB of K and V\n",
         omp_get_max_threads(), itemsize, page, bs, ctx, DIM, 2 * bytes / 1e6);
  const double seq = timed(k, v, bytes, 0, 0);
  printf("  %-28s %8.2f ms %6.1f GB/s  1.00\n", "sequential", seq * 1e3, 2 * bytes / seq / 1e9);
  long dists[8] = {0}, nd = 1;
  for (int i = 5; i < argc && nd < 8; ++i) dists[nd++] = atol(argv[i]);
  const long passes[] = {1, 2, 4, HEADS};  // heads a pass: head-major ... slot-major
  for (size_t o = 0; o < sizeof passes / sizeof *passes; ++o)
    for (long i = 0; i < nd; ++i) {
      char name[48];
      const long per = passes[o];
      if (per == 1) snprintf(name, sizeof name, "head-major");
      else if (per == HEADS) snprintf(name, sizeof name, "slot-major");
      else snprintf(name, sizeof name, "%ld heads a pass", per);
      if (dists[i]) snprintf(name + strlen(name), sizeof name - strlen(name), ", prefetch %ld", dists[i]);
      const double t = timed(k, v, bytes, per, dists[i]);
      printf("  %-28s %8.2f ms %6.1f GB/s  %.2f\n", name, t * 1e3, 2 * bytes / t / 1e9, seq / t);
    }
  return 0;
}
