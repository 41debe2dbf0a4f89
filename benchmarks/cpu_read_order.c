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
static float request(const char *k, const char *v, long r, int slot_major, long dist) {
  __m256 acc = _mm256_setzero_ps();
  for (long p0 = 0; p0 < ctx; p0 += TILE)
    for (const char *pool = k; pool; pool = pool == k ? v : NULL) {
      for (long n = 0; n < TILE && dist; ++n)
        if (p0 + n + dist < ctx)
          for (long b = 0; b < slot_bytes; b += 64) _mm_prefetch(pool + slot_of(r, p0 + n + dist) * slot_bytes + b, _MM_HINT_T1);
      for (long a = 0; a < TILE * HEADS; ++a) {
        const long n = slot_major ? a / HEADS : a % TILE, h = slot_major ? a % HEADS : a / TILE;
        acc = read_row(pool + slot_of(r, p0 + n) * slot_bytes + h * row_bytes, acc);
      }
    }
  return acc[0];
}
// Best seconds of PASSES passes; order: 0 sequential, 1 head-major, 2 slot-major.
static double timed(const char *k, const char *v, size_t bytes, int order, long dist) {
  double best = 1e30;
  volatile float sink = 0;
  for (int pass = 0; pass < PASSES; ++pass) {
    const double t0 = now();
    float s = 0;
    if (order == 0) {
#pragma omp parallel for reduction(+ : s)
      for (long c = 0; c < 64; ++c) {
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = c * (bytes / 64); b < (c + 1) * (bytes / 64); b += row_bytes)
          acc = read_row(v + b, read_row(k + b, acc));
        s += acc[0];
      }
    } else {
#pragma omp parallel for reduction(+ : s)
      for (long r = 0; r < bs; ++r) s += request(k, v, r, order == 2, dist);
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
  printf("  %-24s %8.2f ms %6.1f GB/s  1.00\n", "sequential", seq * 1e3, 2 * bytes / seq / 1e9);
  long dists[8] = {0}, nd = 1;
  for (int i = 5; i < argc && nd < 8; ++i) dists[nd++] = atol(argv[i]);
  for (int order = 1; order <= 2; ++order)
    for (long i = 0; i < nd; ++i) {
      char name[48];
      snprintf(name, sizeof name, "%s%s", order == 1 ? "head-major" : "slot-major", dists[i] ? ", prefetch " : "");
      if (dists[i]) snprintf(name + strlen(name), sizeof name - strlen(name), "%ld", dists[i]);
      const double t = timed(k, v, bytes, order, dists[i]);
      printf("  %-24s %8.2f ms %6.1f GB/s  %.2f\n", name, t * 1e3, 2 * bytes / t / 1e9, seq / t);
    }
  return 0;
}
