// disc CPU runtime abstraction layer: the `disc_ral` table that generated CPU programs call.
//
// Built by disc.runtime.ral.load_ral() through the toolchain. With DISC_HAVE_DNNL defined,
// GEMM goes to dnnl_sgemm or oneDNN's matmul primitive (chosen by shape) and convolution to
// oneDNN's convolution primitive; without it, the builtin fallbacks below (packed,
// cache-blocked loops with OpenMP) compute the same results.
//
// Thread-safety: every entry point may be called concurrently from many host threads. State
// shared between calls (oneDNN engine, primitive and reordered-weight caches) is immutable
// once published and guarded by a mutex while it is looked up or inserted; per-call buffers
// (oneDNN scratchpads, packing, blocked activations) come from `alloc` in that call.
// No C++ exception crosses the C boundary: each entry point catches and reports via `error`.

#include "ral.h"
#include "ral_half.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef DISC_HAVE_DNNL
#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl.hpp"
// The v3 API: primitive descriptors are built from the engine and the operation's arguments
// directly (v2's separate operation descriptors are gone). On AVX2 it also brings the brgemm
// convolution kernels, which run on NHWC as programs pass it.
static_assert(DNNL_VERSION_MAJOR >= 3, "disc's RAL needs oneDNN 3.x");
#endif

namespace {

// ---------------------------------------------------------------------------------------------
// Errors and memory

void ral_error(disc_ral_ctx* ctx, const char* message) {
  if (ctx == nullptr) return;
  // The first error wins. A CAS rather than a plain store because OpenMP workers of one call
  // may fail together; the host reads the message only after the call returned.
  int32_t expected = 0;
  if (__atomic_compare_exchange_n(&ctx->failed, &expected, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    std::snprintf(ctx->error, sizeof ctx->error, "%s", message ? message : "(no message)");
  }
}

__attribute__((format(printf, 2, 3))) int32_t fail(disc_ral_ctx* ctx, const char* fmt, ...) {
  char buf[sizeof(disc_ral_ctx::error)];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  ral_error(ctx, buf);
  return 1;
}

constexpr size_t kAlign = 64;

void* ral_alloc(disc_ral_ctx* ctx, int64_t bytes) {
  if (bytes < 0) {
    fail(ctx, "alloc: negative size %lld", static_cast<long long>(bytes));
    return nullptr;
  }
  // aligned_alloc needs a multiple of the alignment; a zero request still gets a unique block.
  size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, size);
  if (p == nullptr) fail(ctx, "alloc: out of memory (%lld bytes)", static_cast<long long>(bytes));
  return p;
}

void ral_free(disc_ral_ctx*, void* ptr) { std::free(ptr); }

// A buffer from `alloc`, released on scope exit (so early returns and exceptions cannot leak).
struct Scratch {
  disc_ral_ctx* ctx;
  void* ptr = nullptr;
  Scratch(disc_ral_ctx* c, int64_t bytes) : ctx(c) {
    if (bytes > 0) ptr = ral_alloc(c, bytes);
  }
  ~Scratch() { ral_free(ctx, ptr); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* f() const { return static_cast<float*>(ptr); }
};

// ---------------------------------------------------------------------------------------------
// GEMM: one 2-D problem, C[m, n] = alpha * A @ B + beta * C (C column stride 1)

struct Gemm2D {
  int64_t m, n, k;
  float alpha, beta;
  const float* a;
  int64_t ars, acs;
  const float* b;
  int64_t brs, bcs;
  float* c;
  int64_t crs;
  bool b_const = false;  // B is a constant the RAL may keep a packed copy of (2-D problems only)
};

// C = beta * C; beta == 0 overwrites (BLAS convention: NaNs already in C do not survive).
void scale_c(const Gemm2D& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    float* row = g.c + i * g.crs;
    if (g.beta == 0.0f) {
      std::fill(row, row + g.n, 0.0f);
    } else if (g.beta != 1.0f) {
      for (int64_t j = 0; j < g.n; ++j) row[j] *= g.beta;
    }
  }
}

// Copy a strided rows x cols matrix into a dense row-major buffer.
[[maybe_unused]] void pack_dense(const float* src, int64_t rs, int64_t cs, int64_t rows, int64_t cols, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = src[i * rs + j * cs];
}

// --- builtin: packed panels and a register-blocked micro-kernel (GCC vector extensions, so
// the same code uses AVX-512, AVX2 or SSE, whichever -march=native offers).
#if defined(__AVX512F__)
constexpr int kVW = 16;
#else
constexpr int kVW = 8;
#endif
typedef float vfloat __attribute__((vector_size(kVW * sizeof(float)), aligned(sizeof(float))));
constexpr int kMR = 6;         // rows of C per micro-tile
constexpr int kNR = 2 * kVW;   // columns of C per micro-tile (two vectors)
constexpr int64_t kMC = 96;    // rows of A per packed block (multiple of kMR)
constexpr int64_t kKC = 256;   // depth per packed block
constexpr int64_t kNC = 512;   // columns of B per packed block (multiple of kNR)

// Ap: ceil(mc/kMR) panels, each kc x kMR (row r of the panel at [p*kMR + r]); zero-padded.
void pack_a(const Gemm2D& g, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* ap) {
  for (int64_t ip = 0; ip < mc; ip += kMR) {
    float* panel = ap + ip * kc;
    for (int64_t p = 0; p < kc; ++p)
      for (int r = 0; r < kMR; ++r)
        panel[p * kMR + r] = (ip + r < mc) ? g.a[(i0 + ip + r) * g.ars + (p0 + p) * g.acs] : 0.0f;
  }
}

// Bp: ceil(nc/kNR) panels, each kc x kNR; zero-padded.
void pack_b(const Gemm2D& g, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* bp) {
  for (int64_t jp = 0; jp < nc; jp += kNR) {
    float* panel = bp + jp * kc;
    int64_t w = std::min<int64_t>(kNR, nc - jp);
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = g.b + (p0 + p) * g.brs + (j0 + jp) * g.bcs;
      float* dst = panel + p * kNR;
      if (g.bcs == 1) {
        std::memcpy(dst, src, w * sizeof(float));
      } else {
        for (int64_t j = 0; j < w; ++j) dst[j] = src[j * g.bcs];
      }
      for (int64_t j = w; j < kNR; ++j) dst[j] = 0.0f;
    }
  }
}

// C[mr, nr] += alpha * Ap_panel @ Bp_panel.
void micro_kernel(int64_t kc, const float* ap, const float* bp, float alpha, float* c, int64_t crs, int mr, int nr) {
  vfloat acc[kMR][2];
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = vfloat{};
  for (int64_t p = 0; p < kc; ++p) {
    vfloat b0 = *reinterpret_cast<const vfloat*>(bp + p * kNR);
    vfloat b1 = *reinterpret_cast<const vfloat*>(bp + p * kNR + kVW);
    for (int r = 0; r < kMR; ++r) {
      float a = ap[p * kMR + r];
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
  }
  alignas(64) float tile[kMR][kNR];
  for (int r = 0; r < kMR; ++r) {
    *reinterpret_cast<vfloat*>(&tile[r][0]) = acc[r][0];
    *reinterpret_cast<vfloat*>(&tile[r][kVW]) = acc[r][1];
  }
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nr; ++j) c[r * crs + j] += alpha * tile[r][j];
}

// Blocked GEMM over tiles of C; tiles are independent, so they are the unit of parallel work
// (each thread packs its own blocks: B is re-packed once per row block, ~1/kMC extra traffic).
[[maybe_unused]] int32_t builtin_gemm(disc_ral_ctx* ctx, const Gemm2D& g, bool parallel) {
  if (g.m == 0 || g.n == 0) return 0;
  if (g.k == 0 || g.alpha == 0.0f) {
    scale_c(g);
    return 0;
  }
  int nthr = parallel ? omp_get_max_threads() : 1;
  int64_t mc = kMC, nc = kNC;
  auto tiles = [&] { return ((g.m + mc - 1) / mc) * ((g.n + nc - 1) / nc); };
  // Shrink blocks until every thread has a tile (small m or n would otherwise run serially).
  while (tiles() < nthr && nc > kNR) nc = std::max<int64_t>(kNR, nc / 2 / kNR * kNR);
  while (tiles() < nthr && mc > kMR) mc = std::max<int64_t>(kMR, mc / 2 / kMR * kMR);
  int64_t tm = (g.m + mc - 1) / mc, tn = (g.n + nc - 1) / nc, kc_max = std::min<int64_t>(kKC, g.k);
  int32_t failed = 0;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
  {
    Scratch ap(ctx, (mc + kMR) * kc_max * sizeof(float));
    Scratch bp(ctx, (nc + kNR) * kc_max * sizeof(float));
    if (ap.ptr == nullptr || bp.ptr == nullptr) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tm * tn; ++t) {
      if (__atomic_load_n(&failed, __ATOMIC_RELAXED)) continue;
      int64_t i0 = (t / tn) * mc, j0 = (t % tn) * nc;
      int64_t mb = std::min(mc, g.m - i0), nb = std::min(nc, g.n - j0);
      for (int64_t i = 0; i < mb; ++i) {
        float* row = g.c + (i0 + i) * g.crs + j0;
        if (g.beta == 0.0f) {
          std::fill(row, row + nb, 0.0f);
        } else if (g.beta != 1.0f) {
          for (int64_t j = 0; j < nb; ++j) row[j] *= g.beta;
        }
      }
      for (int64_t p0 = 0; p0 < g.k; p0 += kKC) {
        int64_t kc = std::min(kKC, g.k - p0);
        pack_a(g, i0, mb, p0, kc, ap.f());
        pack_b(g, p0, kc, j0, nb, bp.f());
        for (int64_t jr = 0; jr < nb; jr += kNR)
          for (int64_t ir = 0; ir < mb; ir += kMR)
            micro_kernel(kc, ap.f() + ir * kc, bp.f() + jr * kc, g.alpha, g.c + (i0 + ir) * g.crs + j0 + jr, g.crs,
                         static_cast<int>(std::min<int64_t>(kMR, mb - ir)), static_cast<int>(std::min<int64_t>(kNR, nb - jr)));
      }
    }
  }
  return failed ? fail(ctx, "gemm: out of memory for packing buffers") : 0;
}

#ifdef DISC_HAVE_DNNL
// --- oneDNN: dnnl_sgemm is row-major; an operand is passed as 'N' (unit column stride, ld = row
// stride) or 'T' (unit row stride, ld = column stride). oneDNN requires ld >= max(1, extent);
// strides of a dim of extent <= 1 are never used, so they are replaced by valid values.
struct Layout {
  char trans;
  int64_t ld;
  bool pack;  // no usable unit stride (broadcast, gaps or overlap): copy to a dense buffer
};

Layout choose_layout(int64_t rs, int64_t cs, int64_t rows, int64_t cols) {
  if (cols <= 1) cs = 1;
  if (rows <= 1) rs = (cs == 1) ? std::max<int64_t>(cols, 1) : 1;
  if (cs == 1 && rs >= std::max<int64_t>(cols, 1)) return {'N', rs, false};
  if (rs == 1 && cs >= std::max<int64_t>(rows, 1)) return {'T', cs, false};
  return {'N', std::max<int64_t>(cols, 1), true};
}

std::optional<int32_t> run_brgemm(disc_ral_ctx* ctx, const Gemm2D& g, const Layout& la, const Layout& lb, int64_t ldc);
std::optional<int32_t> run_packed_b(disc_ral_ctx* ctx, const Gemm2D& g, const Layout& la, const Layout& lb, int64_t ldc);

// Which oneDNN routine runs a GEMM, from its shape at run time. dnnl_sgemm with B passed 'T'
// (a weight stored [n, k], as torch's Linear keeps it) is slow when k is large next to n: the
// FFN down-projections ran at 65-250 GFLOP/s where oneDNN's matmul primitive (brgemm kernels
// that copy B's blocks as they go) reaches 130-285, at every m from 16 rows up to about 2^20
// output elements; past that, and for fewer than 16 rows or other shapes, dnnl_sgemm is as fast
// or faster (`python -m benchmarks.gemm_library`, 2-core AVX-512 Xeon). DISC_RAL_GEMM=sgemm or
// =matmul forces one routine for every GEMM the matmul primitive can take (tests, benchmarks).
enum class GemmRoutine { kAuto, kSgemm, kMatmul };

GemmRoutine gemm_routine_override() {
  static const GemmRoutine mode = [] {
    const char* v = std::getenv("DISC_RAL_GEMM");
    const std::string s = v ? v : "";
    return s == "sgemm" ? GemmRoutine::kSgemm : s == "matmul" ? GemmRoutine::kMatmul : GemmRoutine::kAuto;
  }();
  return mode;
}

// `parallel` is false for one GEMM of a batch run one per thread: small ones, where the
// primitive's per-call setup (memory objects, a stream) would cost more than it saves.
bool prefer_matmul(const Gemm2D& g, const Layout& la, const Layout& lb, bool parallel) {
  if (la.pack || lb.pack || g.alpha != 1.0f || g.beta != 0.0f) return false;  // the primitive is set up for C = A @ B
  switch (gemm_routine_override()) {
    case GemmRoutine::kSgemm: return false;
    case GemmRoutine::kMatmul: return true;
    case GemmRoutine::kAuto: break;
  }
  return parallel && lb.trans == 'T' && g.k >= 2 * g.n && g.m >= 16 && g.m * g.n <= (int64_t{1} << 20);
}

// A constant B is read from its packed copy (run_packed_b) unless the GEMM is so small that the
// primitive's per-call setup (~3 us: a stream, three memory objects) outweighs the copy it saves:
// below 2^16 multiply-adds (a 64-wide layer at a few rows) dnnl_sgemm took 2-3 us to its 5-7.
constexpr int64_t kPackedMinMacs = int64_t{1} << 16;

bool use_packed_b(const Gemm2D& g, const Layout& la, const Layout& lb) {
  if (la.pack || lb.pack || g.alpha != 1.0f || g.beta != 0.0f) return false;  // the primitive is set up for C = A @ B
  return gemm_routine_override() == GemmRoutine::kAuto && g.m * g.n * g.k >= kPackedMinMacs;
}

// A GEMM whose two operands both keep k along their rows (A passed 'T', B 'N'), as a weight
// gradient dW = dY^T @ X does, ran at 50-90 GFLOP/s in dnnl_sgemm on a 2-core AVX2 EPYC when both
// row strides were multiples of 256 floats and one of them 256 or 512 (BERT-small's 256- and
// 1024-wide activations), against 130-165 once both were copied into rows 16 floats longer, the
// copy included; 768/768, 768/3072 and 1024/1024 were fast as they were (`python -m
// benchmarks.gemm_library`, "dW" rows). The copy is k * (m + n) floats, so tiny GEMMs skip it.
constexpr int64_t kRowPad = 16;

bool pad_k_outer_rows(const Gemm2D& g, const Layout& la, const Layout& lb, bool parallel) {
  if (!parallel || la.pack || lb.pack || la.trans != 'T' || lb.trans != 'N') return false;
  if (g.k < 64 || double(g.m) * double(g.n) * double(g.k) < double(1 << 22)) return false;
  return la.ld % 256 == 0 && lb.ld % 256 == 0 && std::min(la.ld, lb.ld) <= 512;
}

// rows x cols floats at `src` (row stride ld) into `dst` with row stride cols + kRowPad.
void copy_rows_padded(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * (cols + kRowPad), src + r * ld, cols * sizeof(float));
}

int32_t dnnl_gemm(disc_ral_ctx* ctx, const Gemm2D& g, bool parallel) {
  if (g.m == 0 || g.n == 0) return 0;
  if (g.k == 0) {
    scale_c(g);
    return 0;
  }
  Layout la = choose_layout(g.ars, g.acs, g.m, g.k);
  Layout lb = choose_layout(g.brs, g.bcs, g.k, g.n);
  const int64_t ldc = g.m <= 1 ? std::max<int64_t>(g.n, 1) : g.crs;
  if (g.b_const && parallel && use_packed_b(g, la, lb))
    if (std::optional<int32_t> rc = run_packed_b(ctx, g, la, lb, ldc)) return *rc;
  if (prefer_matmul(g, la, lb, parallel))
    if (std::optional<int32_t> rc = run_brgemm(ctx, g, la, lb, ldc)) return *rc;
  const bool pad = pad_k_outer_rows(g, la, lb, parallel);
  const int64_t a_floats = la.pack ? g.m * g.k : pad ? (g.m + kRowPad) * g.k : 0;
  const int64_t b_floats = lb.pack ? g.k * g.n : pad ? (g.n + kRowPad) * g.k : 0;
  Scratch pa(ctx, a_floats * int64_t(sizeof(float)));
  Scratch pb(ctx, b_floats * int64_t(sizeof(float)));
  if ((a_floats > 0 && pa.ptr == nullptr) || (b_floats > 0 && pb.ptr == nullptr)) return 1;
  const float* a = g.a;
  const float* b = g.b;
  if (la.pack) pack_dense(g.a, g.ars, g.acs, g.m, g.k, pa.f()), a = pa.f();
  if (lb.pack) pack_dense(g.b, g.brs, g.bcs, g.k, g.n, pb.f()), b = pb.f();
  if (pad) {
    copy_rows_padded(g.a, la.ld, g.k, g.m, pa.f()), a = pa.f(), la.ld = g.m + kRowPad;
    copy_rows_padded(g.b, lb.ld, g.k, g.n, pb.f()), b = pb.f(), lb.ld = g.n + kRowPad;
  }
  dnnl_status_t st = dnnl_sgemm(la.trans, lb.trans, g.m, g.n, g.k, g.alpha, a, la.ld, b, lb.ld, g.beta, g.c, ldc);
  if (st != dnnl_success)
    return fail(ctx, "gemm: dnnl_sgemm failed with status %d (m=%lld n=%lld k=%lld)", static_cast<int>(st),
                static_cast<long long>(g.m), static_cast<long long>(g.n), static_cast<long long>(g.k));
  return 0;
}
#endif

int32_t gemm_2d(disc_ral_ctx* ctx, const Gemm2D& g, bool parallel) {
#ifdef DISC_HAVE_DNNL
  return dnnl_gemm(ctx, g, parallel);  // oneDNN threads by itself, single-threaded inside a parallel region
#else
  return builtin_gemm(ctx, g, parallel);
#endif
}

struct BatchDims {
  int rank = 0;
  int64_t count = 1;
  int64_t shape[DISC_MAX_BATCH_DIMS], as[DISC_MAX_BATCH_DIMS], bs[DISC_MAX_BATCH_DIMS], cs[DISC_MAX_BATCH_DIMS];

  void offsets(int64_t idx, int64_t* oa, int64_t* ob, int64_t* oc) const {
    *oa = *ob = *oc = 0;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t i = idx % shape[d];
      idx /= shape[d];
      *oa += i * as[d];
      *ob += i * bs[d];
      *oc += i * cs[d];
    }
  }
};

int32_t gemm_16bit(disc_ral_ctx* ctx, const disc_gemm_args& x, BatchDims bd);  // below, beside the other oneDNN calls

// --- tiny GEMMs: attention's Q @ K^T and P @ V at a few tokens, one per head. A library call
// spends 2-3 us setting up a product of a few thousand multiply-adds (GPT-2 decode at 16 tokens:
// 4 heads of 16x64 @ 64x16 took 10 us through dnnl_sgemm, one per thread at a time), so they are
// summed here: B copied into rows of whole vectors (K^T is read along its columns), then 8 rows
// of C at a time, one vector of columns each, so 8 sums are in flight.
constexpr double kTinyGemmMacs = double(1 << 18);
constexpr int64_t kTinyGemmFloats = 8192;  // the largest copy of B (on the stack: 32 KB)

// DISC_RAL_TINY_GEMM=0 (or disc_ral_cpu_set_tiny_gemm(0)) leaves them to the library (tests, benchmarks).
std::atomic<int>& tiny_gemm_setting() {
  static std::atomic<int> on{[] {
    const char* v = std::getenv("DISC_RAL_TINY_GEMM");
    return (v != nullptr && std::strcmp(v, "0") == 0) ? 0 : 1;
  }()};
  return on;
}

// Calls of the tiny-GEMM path in this process (tests check which routine ran).
std::atomic<int64_t>& tiny_gemm_calls() {
  static std::atomic<int64_t> calls{0};
  return calls;
}

int64_t tiny_gemm_ldb(int64_t n) { return (n + kVW - 1) / kVW * kVW; }

bool tiny_gemm_fits(const Gemm2D& g) {
  return double(g.m) * double(g.n) * double(g.k) <= kTinyGemmMacs && g.k * tiny_gemm_ldb(g.n) <= kTinyGemmFloats;
}

// Rows i0..i0+R of C, columns j0..j0+kVW (those below n), from B's copy `bt` (rows of ldb floats).
template <int R>
void tiny_tile(const Gemm2D& g, int64_t i0, const float* bt, int64_t ldb, int64_t j0) {
  vfloat acc[R] = {};
  const float* a = g.a + i0 * g.ars;
  for (int64_t p = 0; p < g.k; ++p) {
    const vfloat b = *reinterpret_cast<const vfloat*>(bt + p * ldb + j0);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] += a[r * g.ars + p * g.acs] * b;
  }
  const int64_t cols = std::min<int64_t>(kVW, g.n - j0);
  for (int r = 0; r < R; ++r) {
    float* c = g.c + (i0 + r) * g.crs + j0;
    for (int64_t l = 0; l < cols; ++l) c[l] = g.beta == 0.0f ? g.alpha * acc[r][l] : g.alpha * acc[r][l] + g.beta * c[l];
  }
}

// C[m, n] = alpha * A @ B + beta * C (beta == 0 overwrites, as BLAS does) where tiny_gemm_fits(g).
void tiny_gemm(const Gemm2D& g) {
  const int64_t ldb = tiny_gemm_ldb(g.n);
  alignas(64) float bt[kTinyGemmFloats];
  for (int64_t p = 0; p < g.k; ++p) std::fill(bt + p * ldb + g.n, bt + (p + 1) * ldb, 0.0f);
  if (g.bcs == 1 || g.brs != 1) {
    for (int64_t p = 0; p < g.k; ++p)
      for (int64_t j = 0; j < g.n; ++j) bt[p * ldb + j] = g.b[p * g.brs + j * g.bcs];
  } else {
    for (int64_t j = 0; j < g.n; ++j)  // along B's columns, which are contiguous
      for (int64_t p = 0; p < g.k; ++p) bt[p * ldb + j] = g.b[p + j * g.bcs];
  }
  for (int64_t j0 = 0; j0 < g.n; j0 += kVW) {
    int64_t i = 0;
    for (; i + 8 <= g.m; i += 8) tiny_tile<8>(g, i, bt, ldb, j0);
    switch (g.m - i) {
      case 1: tiny_tile<1>(g, i, bt, ldb, j0); break;
      case 2: tiny_tile<2>(g, i, bt, ldb, j0); break;
      case 3: tiny_tile<3>(g, i, bt, ldb, j0); break;
      case 4: tiny_tile<4>(g, i, bt, ldb, j0); break;
      case 5: tiny_tile<5>(g, i, bt, ldb, j0); break;
      case 6: tiny_tile<6>(g, i, bt, ldb, j0); break;
      case 7: tiny_tile<7>(g, i, bt, ldb, j0); break;
      default: break;
    }
  }
}

int32_t ral_gemm_impl(disc_ral_ctx* ctx, const disc_gemm_args* args) {
  if (args == nullptr) return fail(ctx, "gemm: null args");
  const disc_gemm_args& x = *args;
  if (x.m < 0 || x.n < 0 || x.k < 0)
    return fail(ctx, "gemm: negative extent (m=%lld n=%lld k=%lld)", (long long)x.m, (long long)x.n, (long long)x.k);
  if (x.batch_rank < 0 || x.batch_rank > DISC_MAX_BATCH_DIMS) return fail(ctx, "gemm: batch_rank %d out of range", x.batch_rank);
  BatchDims bd;
  for (int d = 0; d < x.batch_rank; ++d) {
    if (x.batch_shape[d] < 0) return fail(ctx, "gemm: negative batch extent %lld", (long long)x.batch_shape[d]);
    if (x.batch_shape[d] == 0) return 0;
    if (x.batch_shape[d] == 1) continue;  // its strides are never used
    bd.shape[bd.rank] = x.batch_shape[d];
    bd.as[bd.rank] = x.a_bs[d];
    bd.bs[bd.rank] = x.b_bs[d];
    bd.cs[bd.rank] = x.c_bs[d];
    ++bd.rank;
  }
  if (x.m == 0 || x.n == 0) return 0;
  if (x.dtype != DISC_GEMM_F32) return gemm_16bit(ctx, x, bd);
  Gemm2D g{x.m,   x.n,    x.k,    x.alpha, x.beta, static_cast<const float*>(x.a), x.a_rs, x.a_cs, static_cast<const float*>(x.b),
           x.b_rs, x.b_cs, static_cast<float*>(x.c), x.c_rs, x.b_is_constant != 0};
  // A shared (stride-0) B whose A and C batches continue their rows is one taller GEMM
  // ([B, S, K] @ [K, N]): fold such innermost batch dims into m.
  while (bd.rank > 0) {
    int d = bd.rank - 1;
    int64_t ars = g.m == 1 ? bd.as[d] : g.ars, crs = g.m == 1 ? bd.cs[d] : g.crs;
    if (bd.bs[d] != 0 || bd.as[d] != g.m * ars || bd.cs[d] != g.m * crs) break;
    g.ars = ars, g.crs = crs, g.m *= bd.shape[d];
    --bd.rank;
  }
  for (int d = 0; d < bd.rank; ++d) bd.count *= bd.shape[d];
  if (g.m > 1 && g.crs < g.n) return fail(ctx, "gemm: C rows overlap (row stride %lld < n=%lld)", (long long)g.crs, (long long)g.n);
  for (int d = 0; d < bd.rank; ++d)
    if (bd.cs[d] == 0) return fail(ctx, "gemm: C has batch stride 0 along batch dim of extent %lld", (long long)bd.shape[d]);
  if (g.c == nullptr || (g.k > 0 && (g.a == nullptr || g.b == nullptr))) return fail(ctx, "gemm: null operand");

  if (bd.count == 1) return gemm_2d(ctx, g, true);
  g.b_const = false;  // slices of B are not the buffers programs hold, so their copies could not be freed
  int nthr = omp_get_max_threads();
  double macs = double(g.m) * double(g.n) * double(g.k);
  if (tiny_gemm_fits(g) && tiny_gemm_setting() != 0) {
    tiny_gemm_calls().fetch_add(1, std::memory_order_relaxed);
#pragma omp parallel for schedule(static) if (nthr > 1 && macs * double(bd.count) >= double(1 << 14))
    for (int64_t bi = 0; bi < bd.count; ++bi) {
      int64_t oa, ob, oc;
      bd.offsets(bi, &oa, &ob, &oc);
      Gemm2D gi = g;
      gi.a += oa, gi.b += ob, gi.c += oc;
      tiny_gemm(gi);
    }
    return 0;
  }
  // Many small GEMMs: one per thread at a time (a library barely threads a 128x64 GEMM). One
  // or a few large ones: sequentially, each threaded by the library/builtin loop.
  bool over_batch = nthr > 1 && bd.count >= nthr && (bd.count >= 4 * nthr || macs < double(1 << 24));
  if (!over_batch) {
    for (int64_t bi = 0; bi < bd.count; ++bi) {
      int64_t oa, ob, oc;
      bd.offsets(bi, &oa, &ob, &oc);
      Gemm2D gi = g;
      gi.a += oa, gi.b += ob, gi.c += oc;
      if (gemm_2d(ctx, gi, true) != 0) return 1;
    }
    return 0;
  }
  int32_t failed = 0;
#pragma omp parallel for schedule(static)
  for (int64_t bi = 0; bi < bd.count; ++bi) {
    if (__atomic_load_n(&failed, __ATOMIC_RELAXED)) continue;
    int64_t oa, ob, oc;
    bd.offsets(bi, &oa, &ob, &oc);
    Gemm2D gi = g;
    gi.a += oa, gi.b += ob, gi.c += oc;
    int32_t rc;
    try {
      rc = gemm_2d(ctx, gi, false);
    } catch (...) {  // exceptions must not leave an OpenMP region either
      rc = fail(ctx, "gemm: unexpected exception in a batch worker");
    }
    if (rc != 0) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
  }
  return failed;
}

int32_t ral_gemm(disc_ral_ctx* ctx, const disc_gemm_args* args) {
  try {
    return ral_gemm_impl(ctx, args);
  } catch (const std::exception& e) {
    return fail(ctx, "gemm: %s", e.what());
  } catch (...) {
    return fail(ctx, "gemm: unknown exception");
  }
}

// ---------------------------------------------------------------------------------------------
// Convolution

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

int32_t check_conv(disc_ral_ctx* ctx, const disc_conv2d_args& x) {
  const int64_t dims[] = {x.n, x.ci, x.h, x.w, x.co, x.kh, x.kw, x.oh, x.ow};
  for (int64_t v : dims)
    if (v < 0) return fail(ctx, "conv2d: negative extent");
  for (int i = 0; i < 2; ++i)
    if (x.stride[i] < 1 || x.dilation[i] < 1 || x.pad_lo[i] < 0 || x.pad_hi[i] < 0)
      return fail(ctx, "conv2d: invalid stride/dilation/padding in dim %d", i);
  if (x.groups < 1 || x.ci % x.groups != 0 || x.co % x.groups != 0)
    return fail(ctx, "conv2d: groups=%lld must divide ci=%lld and co=%lld", (long long)x.groups, (long long)x.ci,
                (long long)x.co);
  const int64_t in[2] = {x.h, x.w}, k[2] = {x.kh, x.kw}, out[2] = {x.oh, x.ow};
  for (int i = 0; i < 2; ++i) {
    int64_t span = x.dilation[i] * (k[i] - 1) + 1;
    int64_t expect = floor_div(in[i] + x.pad_lo[i] + x.pad_hi[i] - span, x.stride[i]) + 1;
    if (out[i] != std::max<int64_t>(expect, 0))
      return fail(ctx, "conv2d: output extent %lld in dim %d does not match the input (expected %lld)", (long long)out[i], i,
                  (long long)std::max<int64_t>(expect, 0));
  }
  return 0;
}

// Direct convolution: parallel over (image, output channel); the innermost loop runs along an
// output row, contiguous in the output (and in the input when the stride is 1).
[[maybe_unused]] void builtin_conv2d_nchw(const disc_conv2d_args& x) {
  const int64_t cig = x.ci / x.groups, cog = x.co / x.groups;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < x.n; ++b) {
    for (int64_t co = 0; co < x.co; ++co) {
      const int64_t g = co / cog;
      float* out = x.output + (b * x.co + co) * x.oh * x.ow;
      std::fill(out, out + x.oh * x.ow, 0.0f);
      for (int64_t c = 0; c < cig; ++c) {
        const float* in = x.input + ((b * x.ci) + g * cig + c) * x.h * x.w;
        const float* wk = x.weight + (co * cig + c) * x.kh * x.kw;
        for (int64_t ky = 0; ky < x.kh; ++ky) {
          for (int64_t kx = 0; kx < x.kw; ++kx) {
            const float wv = wk[ky * x.kw + kx];
            const int64_t off_x = kx * x.dilation[1] - x.pad_lo[1];
            // Output columns whose input column lies inside the image.
            const int64_t ox0 = std::max<int64_t>(0, ceil_div(-off_x, x.stride[1]));
            const int64_t ox1 = std::min<int64_t>(x.ow, floor_div(x.w - 1 - off_x, x.stride[1]) + 1);
            for (int64_t oy = 0; oy < x.oh; ++oy) {
              const int64_t iy = oy * x.stride[0] - x.pad_lo[0] + ky * x.dilation[0];
              if (iy < 0 || iy >= x.h) continue;
              const float* irow = in + iy * x.w + off_x;
              float* orow = out + oy * x.ow;
              if (x.stride[1] == 1) {
                for (int64_t ox = ox0; ox < ox1; ++ox) orow[ox] += wv * irow[ox];
              } else {
                for (int64_t ox = ox0; ox < ox1; ++ox) orow[ox] += wv * irow[ox * x.stride[1]];
              }
            }
          }
        }
      }
    }
  }
}

// Channels last: parallel over output pixels; the innermost loop runs over a group's input
// channels, contiguous in the input.
[[maybe_unused]] void builtin_conv2d_nhwc(const disc_conv2d_args& x) {
  const int64_t cig = x.ci / x.groups, cog = x.co / x.groups, taps = x.kh * x.kw;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < x.n; ++b) {
    for (int64_t oy = 0; oy < x.oh; ++oy) {
      for (int64_t ox = 0; ox < x.ow; ++ox) {
        float* out = x.output + ((b * x.oh + oy) * x.ow + ox) * x.co;
        for (int64_t co = 0; co < x.co; ++co) {
          const int64_t g = co / cog;
          float acc = 0.0f;
          for (int64_t ky = 0; ky < x.kh; ++ky) {
            const int64_t iy = oy * x.stride[0] - x.pad_lo[0] + ky * x.dilation[0];
            if (iy < 0 || iy >= x.h) continue;
            for (int64_t kx = 0; kx < x.kw; ++kx) {
              const int64_t ix = ox * x.stride[1] - x.pad_lo[1] + kx * x.dilation[1];
              if (ix < 0 || ix >= x.w) continue;
              const float* in = x.input + ((b * x.h + iy) * x.w + ix) * x.ci + g * cig;
              const float* wk = x.weight + co * cig * taps + ky * x.kw + kx;
              for (int64_t c = 0; c < cig; ++c) acc += in[c] * wk[c * taps];
            }
          }
          out[co] = acc;
        }
      }
    }
  }
}

// The forward call's epilogue (bias, then ReLU) over the output, after the builtin convolution.
[[maybe_unused]] void builtin_conv2d_epilogue(const disc_conv2d_args& x) {
  if (x.bias == nullptr && !x.relu) return;
  const int64_t pixels = x.n * x.oh * x.ow, plane = x.oh * x.ow;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pixels; ++p) {
    for (int64_t co = 0; co < x.co; ++co) {
      // NHWC: pixel p's channels are contiguous; NCHW: channel co of image p / plane is a plane.
      float& v = x.channels_last ? x.output[p * x.co + co] : x.output[((p / plane) * x.co + co) * plane + p % plane];
      if (x.bias != nullptr) v += x.bias[co];
      if (x.relu) v = std::max(v, 0.0f);
    }
  }
}

[[maybe_unused]] void builtin_conv2d(const disc_conv2d_args& x) {
  if (x.channels_last)
    builtin_conv2d_nhwc(x);
  else
    builtin_conv2d_nchw(x);
  builtin_conv2d_epilogue(x);
}

// Element offsets of x and y (NCHW, or NHWC with channels_last) and of w (OIHW).
struct ConvIndex {
  const disc_conv2d_args& a;
  int64_t x(int64_t b, int64_t c, int64_t i, int64_t j) const {
    return a.channels_last ? ((b * a.h + i) * a.w + j) * a.ci + c : ((b * a.ci + c) * a.h + i) * a.w + j;
  }
  int64_t y(int64_t b, int64_t c, int64_t i, int64_t j) const {
    return a.channels_last ? ((b * a.oh + i) * a.ow + j) * a.co + c : ((b * a.co + c) * a.oh + i) * a.ow + j;
  }
  int64_t w(int64_t o, int64_t c, int64_t i, int64_t j) const { return ((o * (a.ci / a.groups) + c) * a.kh + i) * a.kw + j; }
};

// dL/dx: each input element gathers from the outputs whose window covers it (no write races).
[[maybe_unused]] void builtin_conv2d_backward_data(const disc_conv2d_args& a) {
  const ConvIndex at{a};
  const int64_t cig = a.ci / a.groups, cog = a.co / a.groups;
  float* gx = const_cast<float*>(a.input);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < a.n; ++b) {
    for (int64_t c = 0; c < a.ci; ++c) {
      const int64_t g = c / cig;
      for (int64_t i = 0; i < a.h; ++i) {
        for (int64_t j = 0; j < a.w; ++j) {
          float acc = 0.0f;
          for (int64_t ky = 0; ky < a.kh; ++ky) {
            const int64_t ty = i + a.pad_lo[0] - ky * a.dilation[0];
            if (ty < 0 || ty % a.stride[0] != 0 || ty / a.stride[0] >= a.oh) continue;
            for (int64_t kx = 0; kx < a.kw; ++kx) {
              const int64_t tx = j + a.pad_lo[1] - kx * a.dilation[1];
              if (tx < 0 || tx % a.stride[1] != 0 || tx / a.stride[1] >= a.ow) continue;
              for (int64_t o = g * cog; o < (g + 1) * cog; ++o)
                acc += a.output[at.y(b, o, ty / a.stride[0], tx / a.stride[1])] * a.weight[at.w(o, c - g * cig, ky, kx)];
            }
          }
          gx[at.x(b, c, i, j)] = acc;
        }
      }
    }
  }
}

// dL/dw: each weight sums over the batch and the output positions (no write races).
[[maybe_unused]] void builtin_conv2d_backward_weights(const disc_conv2d_args& a) {
  const ConvIndex at{a};
  const int64_t cig = a.ci / a.groups, cog = a.co / a.groups;
  float* gw = const_cast<float*>(a.weight);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t o = 0; o < a.co; ++o) {
    for (int64_t c = 0; c < cig; ++c) {
      const int64_t ic = (o / cog) * cig + c;
      for (int64_t ky = 0; ky < a.kh; ++ky) {
        for (int64_t kx = 0; kx < a.kw; ++kx) {
          double acc = 0.0;  // long sums over batch x positions
          for (int64_t b = 0; b < a.n; ++b) {
            for (int64_t oy = 0; oy < a.oh; ++oy) {
              const int64_t iy = oy * a.stride[0] - a.pad_lo[0] + ky * a.dilation[0];
              if (iy < 0 || iy >= a.h) continue;
              for (int64_t ox = 0; ox < a.ow; ++ox) {
                const int64_t ix = ox * a.stride[1] - a.pad_lo[1] + kx * a.dilation[1];
                if (ix < 0 || ix >= a.w) continue;
                acc += static_cast<double>(a.output[at.y(b, o, oy, ox)]) * a.input[at.x(b, ic, iy, ix)];
              }
            }
          }
          gw[at.w(o, c, ky, kx)] = static_cast<float>(acc);
        }
      }
    }
  }
}

#ifdef DISC_HAVE_DNNL
using dnnl::memory;
using tag = dnnl::memory::format_tag;

dnnl::engine& cpu_engine() {
  static dnnl::engine eng = [] {
    dnnl::set_primitive_cache_capacity(0);  // the plan caches below keep what is reused, bounded
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();  // engines are thread-safe
  return eng;
}

// How src/dst are handed to the primitive. "auto" (default): a channels-last program's own NHWC,
// unless oneDNN has only its reference kernel for NHWC at that problem, then as for NCHW
// programs "any" (oneDNN picks its preferred layout and the caller's buffers are reordered per
// call when it differs); "any" for every call; "nhwc" forces NHWC; "user" runs on the caller's
// layout as given (for NCHW oneDNN then falls back to im2col+GEMM, 1.5-2x slower on ResNet-18
// layers even counting the reorders). DISC_RAL_CONV_LAYOUT overrides.
// NHWC first because "any" picks blocked nChw8c for a stem of 3 input channels: its jit:avx2
// kernel is as fast on NHWC (0.70 ms at 2x3x288x224, 3x3/2 -> 64), but the two reorders around
// it cost 0.6 ms more. Elsewhere oneDNN's brgconv/brdgmm kernels pick NHWC themselves.
enum class ActLayout { kAuto, kUser, kAny, kNhwc };

ActLayout act_layout() {
  static const ActLayout mode = [] {
    const char* v = std::getenv("DISC_RAL_CONV_LAYOUT");
    const std::string s = v ? v : "";
    return s == "user" ? ActLayout::kUser : s == "nhwc" ? ActLayout::kNhwc : s == "any" ? ActLayout::kAny : ActLayout::kAuto;
  }();
  return mode;
}

constexpr int kConvKeyLen = 22;
using ConvKey = std::array<int64_t, kConvKeyLen>;

ConvKey conv_key(const disc_conv2d_args& x) {
  return {x.n,         x.ci,          x.h,           x.w,           x.co,          x.kh,     x.kw,
          x.oh,        x.ow,          x.stride[0],   x.stride[1],   x.dilation[0], x.dilation[1],
          x.pad_lo[0], x.pad_lo[1],   x.pad_hi[0],   x.pad_hi[1],   x.groups,      x.channels_last,
          static_cast<int64_t>(act_layout()), x.bias != nullptr, x.relu != 0};
}

template <size_t N>
struct ArrayHash {
  size_t operator()(const std::array<int64_t, N>& a) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : a) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

dnnl::primitive_attr user_scratchpad() {
  // With library-managed scratchpads (and oneDNN's default build) a primitive must not run on
  // two threads at once; a per-call scratchpad makes a shared primitive safe to execute anywhere.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// A reorder between two layouts, with its scratchpad size (user mode, like every cached primitive).
struct Reorder {
  dnnl::reorder prim;
  size_t scratch = 0;
  Reorder() = default;
  Reorder(const memory::desc& from, const memory::desc& to) {
    dnnl::reorder::primitive_desc pd(cpu_engine(), from, cpu_engine(), to, user_scratchpad());
    prim = dnnl::reorder(pd);
    scratch = pd.scratchpad_desc().get_size();
  }
};

// Everything derived from a ConvKey; immutable once built, shared by all threads.
struct ConvPlan {
  dnnl::convolution_forward prim;
  std::string impl;  // oneDNN's name for the kernel it chose (e.g. "brgconv:avx2")
  size_t scratch = 0;
  memory::desc user_src, user_wei, user_dst, src, wei, dst;
  bool src_reorder = false, wei_reorder = false, dst_reorder = false;
  Reorder to_src, to_wei, from_dst;
};

// The memory descriptors and geometry of one convolution, shared by the forward and both gradients:
// the caller's layouts (user_*) and the layouts oneDNN may choose (*_any, per DISC_RAL_CONV_LAYOUT).
struct ConvDescs {
  memory::desc user_src, user_wei, user_dst, src_any, wei_any, dst_any;
  memory::dims strides, dilation, pad_lo, pad_hi;
};

ConvDescs conv_descs(const disc_conv2d_args& x) {
  const memory::dims src_dims{x.n, x.ci, x.h, x.w}, dst_dims{x.n, x.co, x.oh, x.ow};
  const memory::dims wei_dims = x.groups == 1 ? memory::dims{x.co, x.ci, x.kh, x.kw}
                                              : memory::dims{x.groups, x.co / x.groups, x.ci / x.groups, x.kh, x.kw};
  const auto f32 = memory::data_type::f32;
  const tag user_act = x.channels_last ? tag::nhwc : tag::nchw;
  const tag act = act_layout() == ActLayout::kUser ? user_act : act_layout() == ActLayout::kNhwc ? tag::nhwc : tag::any;
  return ConvDescs{memory::desc(src_dims, f32, user_act),
                   memory::desc(wei_dims, f32, x.groups == 1 ? tag::oihw : tag::goihw),
                   memory::desc(dst_dims, f32, user_act),
                   memory::desc(src_dims, f32, act),
                   memory::desc(wei_dims, f32, tag::any),
                   memory::desc(dst_dims, f32, act),
                   {x.stride[0], x.stride[1]},
                   {x.dilation[0] - 1, x.dilation[1] - 1},  // oneDNN counts dilation from 0 (a dense kernel has 0)
                   {x.pad_lo[0], x.pad_lo[1]},
                   {x.pad_hi[0], x.pad_hi[1]}};
}

memory::desc bias_desc(int64_t co) { return memory::desc({co}, memory::data_type::f32, tag::a); }

std::shared_ptr<const ConvPlan> make_plan(const disc_conv2d_args& x) {
  auto plan = std::make_shared<ConvPlan>();
  const ConvDescs c = conv_descs(x);
  plan->user_src = c.user_src;
  plan->user_dst = c.user_dst;
  plan->user_wei = c.user_wei;
  // The epilogue runs inside the kernel while the output is in cache: the bias as the
  // primitive's bias, the ReLU as an eltwise post-op.
  dnnl::primitive_attr attr = user_scratchpad();
  if (x.relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  auto forward = [&](const memory::desc& src, const memory::desc& dst) {
    const auto prop = dnnl::prop_kind::forward_inference;
    const auto algo = dnnl::algorithm::convolution_direct;
    if (x.bias != nullptr)
      return dnnl::convolution_forward::primitive_desc(cpu_engine(), prop, algo, src, c.wei_any, bias_desc(x.co), dst, c.strides, c.dilation,
                                                       c.pad_lo, c.pad_hi, attr);
    return dnnl::convolution_forward::primitive_desc(cpu_engine(), prop, algo, src, c.wei_any, dst, c.strides, c.dilation, c.pad_lo,
                                                     c.pad_hi, attr);
  };
  dnnl::convolution_forward::primitive_desc pd;
  if (act_layout() == ActLayout::kAuto && x.channels_last) {
    pd = forward(c.user_src, c.user_dst);
    if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) pd = forward(c.src_any, c.dst_any);
  } else {
    pd = forward(c.src_any, c.dst_any);
  }
  plan->impl = pd.impl_info_str();
  plan->prim = dnnl::convolution_forward(pd);
  plan->scratch = pd.scratchpad_desc().get_size();
  plan->src = pd.src_desc();
  plan->wei = pd.weights_desc();
  plan->dst = pd.dst_desc();
  plan->src_reorder = plan->src != plan->user_src;
  plan->wei_reorder = plan->wei != plan->user_wei;
  plan->dst_reorder = plan->dst != plan->user_dst;
  if (plan->src_reorder) plan->to_src = Reorder(plan->user_src, plan->src);
  if (plan->wei_reorder) plan->to_wei = Reorder(plan->user_wei, plan->wei);
  if (plan->dst_reorder) plan->from_dst = Reorder(plan->dst, plan->user_dst);
  return plan;
}

// A map whose values are built outside the lock (primitive creation takes milliseconds and must
// not serialise unrelated calls); if two threads race, the first insertion wins. Dynamic shapes
// make the key space unbounded (a decoder meets a new length every step, and each GEMM of a new
// m is a new primitive, ~50 KB of JIT code): past `capacity` entries the least recently used
// plan is dropped (a call still running it keeps it alive through its shared_ptr).
template <typename K, typename V, typename H>
class SharedCache {
 public:
  explicit SharedCache(size_t capacity) : capacity_(capacity) {}
  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(map_.size());
  }
  std::shared_ptr<const V> find(const K& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    recent_.splice(recent_.begin(), recent_, it->second.second);
    return it->second.first;
  }
  std::shared_ptr<const V> insert(const K& key, std::shared_ptr<const V> value) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second.first;
    if (map_.size() >= capacity_) {
      map_.erase(recent_.back());
      recent_.pop_back();
    }
    recent_.push_front(key);
    ++built_;
    return map_.emplace(key, Entry{std::move(value), recent_.begin()}).first->second.first;
  }
  int64_t built() {  // plans ever inserted (misses), for tests
    std::lock_guard<std::mutex> lock(mu_);
    return built_;
  }

 private:
  using Entry = std::pair<std::shared_ptr<const V>, typename std::list<K>::iterator>;
  std::mutex mu_;
  const size_t capacity_;
  std::list<K> recent_;  // most recently used first
  int64_t built_ = 0;
  std::unordered_map<K, Entry, H> map_;
};

// Plans kept per kind. oneDNN's own primitive cache is switched off (cpu_engine): it would keep
// the primitives these caches drop alive.
constexpr size_t kMaxConvPlans = 1024;
constexpr size_t kMaxMatmulPlans = 256;

SharedCache<ConvKey, ConvPlan, ArrayHash<kConvKeyLen>>& plan_cache() {
  static auto* cache = new SharedCache<ConvKey, ConvPlan, ArrayHash<kConvKeyLen>>(kMaxConvPlans);  // never destroyed: no exit-order races
  return *cache;
}

// Reordered copies of constant weights. Keyed by the weight's address and extents, then by the
// layout the primitive wants: input shapes (n, h, w) that select the same layout share one copy,
// so a dynamic-shape program does not repack (and keep) every weight once per input shape.
// A few sampled values are compared on every hit so that a freed-and-reused address holding
// different weights is noticed and repacked (a cheap guard, not a proof).
constexpr int kWeightSamples = 16;
using WeightKey = std::array<int64_t, 6>;

struct PackedWeights {
  memory::desc md;
  std::unique_ptr<float, void (*)(void*)> data{nullptr, std::free};
  float sample[kWeightSamples];
  int64_t budgeted_bytes = 0;  // counted against the packed-GEMM budget (GEMM weights only)
};

void sample_weights(const disc_conv2d_args& x, float* out) {
  int64_t count = x.co * (x.ci / x.groups) * x.kh * x.kw;
  for (int i = 0; i < kWeightSamples; ++i) out[i] = x.weight[(count - 1) * i / (kWeightSamples - 1)];
}

class WeightCache {
 public:
  std::shared_ptr<const PackedWeights> find(const WeightKey& key, const memory::desc& md) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    for (const auto& e : it->second)
      if (e->md == md) return e;
    return nullptr;
  }
  // The copy in layout `md` if its sampled values are still `now` (else it is stale: repack).
  std::shared_ptr<const PackedWeights> current(const WeightKey& key, const memory::desc& md, const float* now) {
    std::shared_ptr<const PackedWeights> e = find(key, md);
    return e && std::memcmp(e->sample, now, sizeof e->sample) == 0 ? e : nullptr;
  }
  // Replaces an entry of the same layout (a repack after the sampled values changed).
  void insert(const WeightKey& key, std::shared_ptr<const PackedWeights> entry) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& bucket = map_[key];
    for (auto& e : bucket)
      if (e->md == entry->md) {
        budgeted_ -= e->budgeted_bytes;
        e = std::move(entry);
        return;
      }
    bucket.push_back(std::move(entry));
  }
  // Bytes of packed GEMM weights are reserved before packing, up to `limit` in all; an entry
  // gives its bytes back when it is replaced or dropped (or `release` when packing failed).
  bool contains(const WeightKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.count(key) > 0;
  }
  bool fits(int64_t bytes, int64_t limit) {
    std::lock_guard<std::mutex> lock(mu_);
    return budgeted_ + bytes <= limit;
  }
  bool reserve(int64_t bytes, int64_t limit) {
    std::lock_guard<std::mutex> lock(mu_);
    if (budgeted_ + bytes > limit) return false;
    budgeted_ += bytes;
    return true;
  }
  void release(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    budgeted_ -= bytes;
  }
  int64_t budgeted_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return budgeted_;
  }
  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (const auto& kv : map_) n += static_cast<int64_t>(kv.second.size());
    return n;
  }
  // Programs say which weight addresses they hold (two programs may share a model's weights):
  // when the last holder of an address lets go, its packed copies are freed with it, instead
  // of outliving the program (ResNet-18: 45 MB per compiled program).
  void hold(int64_t address) {
    std::lock_guard<std::mutex> lock(mu_);
    ++holders_[address];
  }
  void let_go(int64_t address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto h = holders_.find(address);
    if (h == holders_.end() || --h->second > 0) return;
    holders_.erase(h);
    drop_copies(address);
  }
  // The weight at `address` changed in place: its copies go now, and the next call packs afresh
  // (the sampled values catch most changes, but not one that misses every sample).
  void forget(int64_t address) {
    std::lock_guard<std::mutex> lock(mu_);
    drop_copies(address);
  }

 private:
  void drop_copies(int64_t address) {  // with mu_ held
    for (auto it = map_.begin(); it != map_.end();) {
      if (it->first[0] != address) {
        ++it;
        continue;
      }
      for (const auto& e : it->second) budgeted_ -= e->budgeted_bytes;
      it = map_.erase(it);
    }
  }

  std::mutex mu_;
  std::unordered_map<WeightKey, std::vector<std::shared_ptr<const PackedWeights>>, ArrayHash<6>> map_;
  std::unordered_map<int64_t, int64_t> holders_;  // weight address -> programs holding it
  int64_t budgeted_ = 0;                          // bytes of the packed GEMM weights held
};

WeightCache& weight_cache() {
  static auto* cache = new WeightCache();  // never destroyed: no exit-order races
  return *cache;
}

void run(const dnnl::primitive& p, dnnl::stream& s, std::unordered_map<int, memory> args, size_t scratch_bytes, void* scratch) {
  if (scratch_bytes > 0) args.emplace(DNNL_ARG_SCRATCHPAD, memory({{static_cast<int64_t>(scratch_bytes)}, memory::data_type::u8, tag::a},
                                                                  cpu_engine(), scratch));
  p.execute(s, args);
}

// A fresh copy of constant weights: `to` reorders `from` into `md` (with `scratch` of to.scratch
// bytes), and the copy takes the place of any stale one under `key`. `budgeted` of its bytes count
// against the packed-GEMM budget (0 for convolution weights). nullptr: out of memory (reported).
std::shared_ptr<const PackedWeights> pack_weights(disc_ral_ctx* ctx, dnnl::stream& s, const WeightKey& key, const memory::desc& md,
                                                  const float* now, const Reorder& to, const memory& from, void* scratch, int64_t budgeted) {
  auto fresh = std::make_shared<PackedWeights>();
  fresh->md = md;
  fresh->data.reset(static_cast<float*>(ral_alloc(ctx, static_cast<int64_t>(md.get_size()))));
  if (!fresh->data) return nullptr;
  fresh->budgeted_bytes = budgeted;
  std::memcpy(fresh->sample, now, sizeof fresh->sample);
  run(to.prim, s, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, memory(md, cpu_engine(), fresh->data.get())}}, to.scratch, scratch);
  s.wait();
  weight_cache().insert(key, fresh);
  return fresh;
}

// --- the matmul primitive for one 2-D GEMM. Plans are keyed by extents and strides (m changes
// with the input shape; creating a primitive takes 0.05-0.2 ms, so each shape pays it once).
constexpr int kMatmulKeyLen = 8;
using MatmulKey = std::array<int64_t, kMatmulKeyLen>;

// A plan reads B either as stored (b == b_user) or, for a constant B, in the blocked layout oneDNN
// chose for it (b: "any" resolved; the caller packs a copy of B into it once).
struct MatmulPlan {
  dnnl::matmul prim;
  size_t scratch = 0;
  memory::desc a, b_user, b, c;
  bool usable = false;  // oneDNN chose a brgemm kernel (else dnnl_sgemm is as good or better)
};

memory::desc operand_desc(int64_t rows, int64_t cols, const Layout& l) {
  return memory::desc({rows, cols}, memory::data_type::f32, l.trans == 'N' ? memory::dims{l.ld, 1} : memory::dims{1, l.ld});
}

std::shared_ptr<const MatmulPlan> make_matmul_plan(const Gemm2D& g, const Layout& la, const Layout& lb, int64_t ldc, bool packed_b) {
  auto plan = std::make_shared<MatmulPlan>();
  plan->a = operand_desc(g.m, g.k, la);
  plan->b_user = operand_desc(g.k, g.n, lb);
  plan->c = memory::desc({g.m, g.n}, memory::data_type::f32, memory::dims{ldc, 1});
  const memory::desc b = packed_b ? memory::desc({g.k, g.n}, memory::data_type::f32, tag::any) : plan->b_user;
  dnnl::matmul::primitive_desc pd(cpu_engine(), plan->a, b, plan->c, user_scratchpad());
  plan->usable = std::string(pd.impl_info_str()).rfind("brg", 0) == 0;
  plan->prim = dnnl::matmul(pd);
  plan->scratch = pd.scratchpad_desc().get_size();
  plan->b = pd.weights_desc();
  return plan;
}

// Plans for B as stored and for packed B are kept apart: the same GEMM may have both (a weight
// past the packing budget, next to one within it).
using MatmulCache = SharedCache<MatmulKey, MatmulPlan, ArrayHash<kMatmulKeyLen>>;

MatmulCache& matmul_cache(bool packed_b) {
  static auto* as_stored = new MatmulCache(kMaxMatmulPlans);  // never destroyed
  static auto* packed = new MatmulCache(kMaxMatmulPlans);
  return packed_b ? *packed : *as_stored;
}

std::shared_ptr<const MatmulPlan> matmul_plan(const Gemm2D& g, const Layout& la, const Layout& lb, int64_t ldc, bool packed_b) {
  MatmulCache& cache = matmul_cache(packed_b);
  const MatmulKey key{g.m, g.n, g.k, la.trans, la.ld, lb.trans, lb.ld, ldc};
  std::shared_ptr<const MatmulPlan> plan = cache.find(key);
  return plan ? plan : cache.insert(key, make_matmul_plan(g, la, lb, ldc, packed_b));
}

// Runs a usable plan on A, B (in plan.b's layout) and C; returns the call's status.
int32_t execute_matmul(disc_ral_ctx* ctx, dnnl::stream& s, const MatmulPlan& plan, const float* a, const float* b, float* c) {
  Scratch scratch(ctx, static_cast<int64_t>(plan.scratch));
  if (plan.scratch > 0 && scratch.ptr == nullptr) return 1;
  dnnl::engine& eng = cpu_engine();
  run(plan.prim, s,
      {{DNNL_ARG_SRC, memory(plan.a, eng, const_cast<float*>(a))},
       {DNNL_ARG_WEIGHTS, memory(plan.b, eng, const_cast<float*>(b))},
       {DNNL_ARG_DST, memory(plan.c, eng, c)}},
      plan.scratch, scratch.ptr);
  s.wait();
  return 0;
}

// Runs g through the matmul primitive if oneDNN has a brgemm kernel for it and returns the call's
// status; nullopt: it has none, use dnnl_sgemm.
std::optional<int32_t> run_brgemm(disc_ral_ctx* ctx, const Gemm2D& g, const Layout& la, const Layout& lb, int64_t ldc) {
  std::shared_ptr<const MatmulPlan> plan = matmul_plan(g, la, lb, ldc, /*packed_b=*/false);
  if (!plan->usable) return std::nullopt;
  dnnl::stream s(cpu_engine());
  return execute_matmul(ctx, s, *plan, g.a, g.b, g.c);
}

// --- a constant B (a model's weight) packed once. Given B as stored, oneDNN's brgemm matmul copies
// its blocks (16 rows of k by 64 columns of n) on every call, and dnnl_sgemm packs it on every
// call too: with torch's [n, k] weights that per-call copy is a transpose, and on a 2-core Zen 4
// it held BERT's projections at 16 rows to 54-133 GFLOP/s where the matmul primitive on B already
// in its blocked layout ran at 135-192, and at 64 rows to 117-187 against 174-208 (`python -m
// benchmarks.gemm_library --quick`, "packed" column; a weight stored [k, n] gained nothing). The blocked
// layout is the same for every m, so one copy per weight serves every input shape (one plan per
// m, like run_brgemm's). By default every constant GEMM weight gets its copy: one per weight (and
// layout), so the copies never exceed the model's own GEMM weights plus block padding, and packing
// them all made BERT-base 5-24% faster at few tokens. DISC_RAL_PACKED_GEMM_MB caps the copies a
// process keeps, for memory-tight deployments (0 turns packing off); GEMMs on weights past the cap
// read B as stored. A copy goes when the last program holding its weight does (WeightCache::let_go).
constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();

// Megabytes as bytes: a negative or NaN budget is 0, one too large for int64 bytes (or +inf) no cap.
int64_t budget_bytes(double mb) {
  if (!(mb > 0.0)) return 0;
  return mb < 8.0e12 ? static_cast<int64_t>(mb * 1048576.0) : kNoCap;
}

std::atomic<int64_t>& packed_gemm_budget() {
  static std::atomic<int64_t> bytes{[] {
    const char* v = std::getenv("DISC_RAL_PACKED_GEMM_MB");
    return (v != nullptr && *v != '\0') ? budget_bytes(std::atof(v)) : kNoCap;
  }()};
  return bytes;
}

// A GEMM's constant B (as stored: `b_user` at `b`) packed into `md`: the cached copy, or one packed
// now and counted against the packed-GEMM budget. nullopt: past the budget (the caller reads B as
// stored); nullptr: out of memory (reported in ctx).
std::optional<std::shared_ptr<const PackedWeights>> packed_gemm_weight(disc_ral_ctx* ctx, dnnl::stream& s, const WeightKey& key, const memory::desc& md,
                                                                      const memory::desc& b_user, const void* b, const float* now) {
  std::shared_ptr<const PackedWeights> packed = weight_cache().current(key, md, now);
  if (packed) return packed;
  const int64_t bytes = static_cast<int64_t>(md.get_size());
  if (!weight_cache().reserve(bytes, packed_gemm_budget().load())) return std::nullopt;
  const Reorder to_b(b_user, md);  // once per weight: not worth caching
  Scratch reorder_scratch(ctx, static_cast<int64_t>(to_b.scratch));
  if (to_b.scratch == 0 || reorder_scratch.ptr != nullptr)
    packed = pack_weights(ctx, s, key, md, now, to_b, memory(b_user, cpu_engine(), const_cast<void*>(b)), reorder_scratch.ptr, bytes);
  if (!packed) weight_cache().release(bytes);
  return packed;
}

// kWeightSamples elements of a k x n B spread over it, as floats (a 16-bit B's bits are exact in one):
// the values a packed copy is checked against at every call.
template <class T>
void sample_b(const T* b, int64_t k, int64_t n, int64_t brs, int64_t bcs, float* out) {
  const int64_t count = k * n;
  for (int i = 0; i < kWeightSamples; ++i) {
    const int64_t at = (count - 1) * i / (kWeightSamples - 1);
    out[i] = static_cast<float>(b[(at / n) * brs + (at % n) * bcs]);
  }
}

// --- few rows on a packed B: a register-tiled kernel of our own. oneDNN's brgemm matmul spends a
// few microseconds a call on its own setup and splits few rows poorly: on the same packed copy of
// BERT's projections it ran at 0.37-0.69x of this kernel at 1 row, 0.64-0.90x at 16 and
// 0.89-0.97x at 64 (hot in cache; `python -m benchmarks.gemm_library --quick`, "packed" against
// "panels"). In GPT-2's decode stream whole programs got 1.35x faster at 1-3 tokens.
// It reads the same packed copy oneDNN's matmul does: with AVX-512, oneDNN lays a packed f32 B out
// in panels of 64 columns, each ceil16(k) rows deep and contiguous (format BA16a64b, zero padded),
// at every m. Any other layout (another ISA, another oneDNN) leaves small GEMMs to oneDNN.
constexpr int64_t kPanelCols = 64;

// How many 64-column panels hold n columns.
int64_t panel_count(int64_t n) { return (n + kPanelCols - 1) / kPanelCols; }
constexpr int64_t kSmallRowsDefault = 64;

// GEMMs of at most this many rows take the panel kernel (DISC_RAL_SMALL_M_ROWS, or
// disc_ral_cpu_set_small_m_rows; 0 turns it off). Without AVX-512 it is always 0: the kernel keeps
// up to 6 x 4 vector accumulators, written for AVX-512's 32 registers.
std::atomic<int64_t>& small_m_limit() {
  static std::atomic<int64_t> rows{[] {
    const char* v = std::getenv("DISC_RAL_SMALL_M_ROWS");
    return (v != nullptr && *v != '\0') ? std::max<int64_t>(std::atoll(v), 0) : kSmallRowsDefault;
  }()};
  return rows;
}

int64_t small_m_rows() {
#if defined(__AVX512F__)
  return small_m_limit().load(std::memory_order_relaxed);
#else
  return 0;
#endif
}

// The padded depth of each 64-column panel if `md` is that panel layout for a k x n B, else 0.
int64_t panel_depth(const memory::desc& md, int64_t k, int64_t n) {
  if (md.get_format_kind() != memory::format_kind::blocked) return 0;
  const memory::dims blks = md.get_inner_blks(), idxs = md.get_inner_idxs(), strides = md.get_strides();
  const memory::dims padded = md.get_padded_dims();
  if (blks != memory::dims{16, kPanelCols} || idxs != memory::dims{0, 1}) return 0;
  const int64_t depth = (k + 15) / 16 * 16;
  if (padded != memory::dims{depth, panel_count(n) * kPanelCols}) return 0;
  return strides == memory::dims{16 * kPanelCols, depth * kPanelCols} ? depth : 0;
}

// Calls of the panel kernel in this process (tests check which routine ran; 0 without AVX-512).
std::atomic<int64_t>& panel_gemm_calls() {
  static std::atomic<int64_t> calls{0};
  return calls;
}

#if defined(__AVX512F__)
// Depth of the slice of a panel that every row tile reads before the next slice (16 KB of B).
constexpr int64_t kPanelSlice = 64;
// How far ahead the row tiles ask for the panel's rows (two slices: 32 KB), and into which cache
// (__builtin_prefetch's locality 2: L2; into L1 was 7-24% slower at 8-24 rows).
constexpr int64_t kPanelAhead = 2 * kPanelSlice;
constexpr int kPanelAheadLocality = 2;

// Which share of the slice ahead a row tile asks for: share `index` of `of` (of == 0: none).
struct AheadShare {
  int index, of;
};

// C[MR rows, `cols` <= 64] (+)= A[MR rows, k0:k1] @ rows k0:k1 of one panel of B; the sum
// continues the one C holds unless k0 is 0, in the order one pass over k would take.
template <int MR>
void panel_tile(int64_t k0, int64_t k1, const float* a, int64_t lda, const float* panel, float* c, int64_t ldc, int64_t cols, AheadShare share) {
  vfloat acc[MR][4];
  // Whole panels copy C as vectors; a partial one goes through a zero-padded row (a copy of a
  // size known only at run time is a library call, which cost ~10% at 4 slices a panel).
  const bool whole = cols == kPanelCols;
  alignas(64) float tile[kPanelCols];
  if (!whole) std::fill(tile, tile + kPanelCols, 0.0f);
  for (int r = 0; r < MR; ++r) {
    if (k0 == 0) {
      acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = vfloat{};
    } else if (whole) {
      std::memcpy(acc[r], c + r * ldc, sizeof acc[r]);
    } else {
      std::memcpy(tile, c + r * ldc, cols * sizeof(float));
      std::memcpy(acc[r], tile, sizeof acc[r]);
    }
  }
  // This tile's share of the slice ahead's cache lines (4 a row), a few asked for at each step:
  // `owed` counts quarter-lines, so `of` tiles together ask for 4 lines a step.
  const bool asks = share.of > 0;
  const int of = std::max(share.of, 1);
  const float* next = panel + (k0 + kPanelAhead) * kPanelCols + share.index * (4 * (k1 - k0)) / of * 16;
  int owed = 0;
  // Two steps an iteration: ~2% at 24-64 rows (`python -m benchmarks.weight_stream`).
#pragma GCC unroll 2
  for (int64_t p = k0; p < k1; ++p) {
    const vfloat* row = reinterpret_cast<const vfloat*>(panel + p * kPanelCols);
    vfloat b0 = row[0], b1 = row[1], b2 = row[2], b3 = row[3];
    // Without this GCC folds the loads into each FMA at MR <= 4, loading B MR times per step,
    // which halved the throughput (60 of 114 GFLOP/s a core).
    asm("" : "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3));
    if (asks)
      for (owed += 4; owed >= of; owed -= of, next += 16) __builtin_prefetch(next, 0, kPanelAheadLocality);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const float x = a[r * lda + p];
      acc[r][0] += x * b0;
      acc[r][1] += x * b1;
      acc[r][2] += x * b2;
      acc[r][3] += x * b3;
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (whole) {
      std::memcpy(c + r * ldc, acc[r], sizeof acc[r]);
    } else {
      std::memcpy(tile, acc[r], sizeof tile);
      std::memcpy(c + r * ldc, tile, cols * sizeof(float));
    }
  }
}

// C[m, cols] = A[m, k] @ one panel of B (k of its rows, `cols` <= 64 of its columns used), slice
// by slice: every row tile reads a 16 KB slice while it is in L1, and the full row tiles ask for
// the rows two slices ahead as they go (a last, shorter tile asks only when it is the only one).
void panel_product(int64_t m, int64_t k, const float* a, int64_t lda, const float* panel, float* c, int64_t ldc, int64_t cols) {
  const int full = static_cast<int>(m / 6);
  auto share = [full](int64_t row) {
    if (full == 0) return AheadShare{0, 1};
    return row / 6 < full ? AheadShare{static_cast<int>(row / 6), full} : AheadShare{0, 0};
  };
  for (int64_t k0 = 0; k0 < k; k0 += kPanelSlice) {
    const int64_t k1 = std::min(k, k0 + kPanelSlice);
    int64_t i = 0;
    for (; i + 6 <= m; i += 6) panel_tile<6>(k0, k1, a + i * lda, lda, panel, c + i * ldc, ldc, cols, share(i));
    const float* at = a + i * lda;
    float* ct = c + i * ldc;
    switch (m - i) {
      case 1: panel_tile<1>(k0, k1, at, lda, panel, ct, ldc, cols, share(i)); break;
      case 2: panel_tile<2>(k0, k1, at, lda, panel, ct, ldc, cols, share(i)); break;
      case 3: panel_tile<3>(k0, k1, at, lda, panel, ct, ldc, cols, share(i)); break;
      case 4: panel_tile<4>(k0, k1, at, lda, panel, ct, ldc, cols, share(i)); break;
      case 5: panel_tile<5>(k0, k1, at, lda, panel, ct, ldc, cols, share(i)); break;
      default: break;
    }
  }
}

// C = A @ B for A with unit column stride (row stride lda) and B in 64-column panels of `depth`
// rows; the panels are shared out among the threads, and each streams from memory once.
// Tile by tile over whole panels, with the hardware's prefetcher alone, compute and memory time
// added up instead of overlapping: one pass over BERT-base's 72 GEMM weights took 21.7 ms at 8
// rows (16 GB/s of weights; 12.7 ms at 1 row), 15.8 ms slice by slice; 24 rows 29.2 -> 18.5 ms,
// 64 rows 49.5 -> 40.4 ms (`python -m benchmarks.weight_stream`).
void panel_gemm(const Gemm2D& g, int64_t lda, const float* panels, int64_t depth) {
  panel_gemm_calls().fetch_add(1, std::memory_order_relaxed);
  const int64_t count = panel_count(g.n);
#pragma omp parallel for schedule(static) if (count > 1)
  for (int64_t j = 0; j < count; ++j)
    panel_product(g.m, g.k, g.a, lda, panels + j * depth * kPanelCols, g.c + j * kPanelCols, g.crs, std::min(kPanelCols, g.n - j * kPanelCols));
}
#else
void panel_gemm(const Gemm2D&, int64_t, const float*, int64_t) {}  // unreachable: small_m_rows() is 0
#endif

// The layout oneDNN packs a constant B into does not depend on m (above), so GEMMs for the panel
// kernel take it from the plan of a one-row GEMM: one plan per weight shape instead of one per m
// (a decoder's growing sequence otherwise builds a plan, ~80 KB, at every length).
std::shared_ptr<const MatmulPlan> layout_plan(const Gemm2D& g, const Layout& lb) {
  Gemm2D one = g;
  one.m = 1;
  return matmul_plan(one, Layout{'N', std::max<int64_t>(g.k, 1), false}, lb, std::max<int64_t>(g.n, 1), /*packed_b=*/true);
}

// Runs g on its packed B (packing it on first use) and returns the call's status; nullopt: no
// brgemm kernel for it, or the budget is spent, so B is read as stored.
std::optional<int32_t> run_packed_b(disc_ral_ctx* ctx, const Gemm2D& g, const Layout& la, const Layout& lb, int64_t ldc) {
  // -1 in the last place: a GEMM's B (a convolution's key ends with its groups, >= 1).
  const WeightKey wkey{static_cast<int64_t>(reinterpret_cast<uintptr_t>(g.b)), g.k, g.n, g.brs, g.bcs, -1};
  // A weight past the budget skips building plans it would not use (k * n floats: the least a copy takes).
  if (!weight_cache().contains(wkey) && !weight_cache().fits(g.k * g.n * int64_t(sizeof(float)), packed_gemm_budget().load()))
    return std::nullopt;
  std::shared_ptr<const MatmulPlan> plan;
  int64_t depth = 0;  // > 0: the panel kernel runs it
  if (g.m <= small_m_rows() && la.trans == 'N') {
    plan = layout_plan(g, lb);
    depth = plan->usable ? panel_depth(plan->b, g.k, g.n) : 0;
  }
  if (depth == 0) plan = matmul_plan(g, la, lb, ldc, /*packed_b=*/true);
  if (!plan->usable) return std::nullopt;
  float now[kWeightSamples];
  sample_b(g.b, g.k, g.n, g.brs, g.bcs, now);
  dnnl::stream s(cpu_engine());
  const std::optional<std::shared_ptr<const PackedWeights>> held = packed_gemm_weight(ctx, s, wkey, plan->b, plan->b_user, g.b, now);
  if (!held) return std::nullopt;
  if (!*held) return 1;
  const std::shared_ptr<const PackedWeights>& packed = *held;
  if (depth > 0) {
    panel_gemm(g, la.ld, packed->data.get(), depth);
    return 0;
  }
  return execute_matmul(ctx, s, *plan, g.a, packed->data.get(), g.c);
}

// --- 3x3 convolutions of stride 1 by Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray,
// "Fast Algorithms for Convolutional Neural Networks", 2015). Each 2x2 block of outputs (a tile)
// comes from the 4x4 block of input around it as Y = A^T [(G g G^T) * (B^T d B)] A: 16 products
// per input and output channel pair where the direct sum takes 36. Over all tiles the products
// are 16 GEMMs, one per point of the 4x4 block (tiles x ci by ci x co), 4/9 of the direct
// convolution's multiply-adds, on the panel kernel. B and A hold only 0 and +-1 and G halves, so
// the transforms add no rounding beyond a few additions. oneDNN 3.x has no f32 Winograd kernel
// for AVX-512 (convolution_winograd finds no implementation).
// DISC_RAL_WINOGRAD (or disc_ral_cpu_set_winograd): 0 never, 1 for every convolution it can run
// (tests), 2 (default) where it wins. Without AVX-512 the kernel does not exist and it is not read.
std::atomic<int>& winograd_setting() {
  static std::atomic<int> mode{[] {
    const char* v = std::getenv("DISC_RAL_WINOGRAD");
    return (v != nullptr && (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0)) ? std::atoi(v) : 2;
  }()};
  return mode;
}

// Calls of the Winograd convolution in this process (tests check which routine ran).
std::atomic<int64_t>& winograd_calls() {
  static std::atomic<int64_t> calls{0};
  return calls;
}

#if defined(__AVX512F__)
constexpr int kWinoPoints = 16;

bool winograd_fits(const disc_conv2d_args& x) {
  return x.channels_last && x.weight_is_constant && x.groups == 1 && x.kh == 3 && x.kw == 3 && x.stride[0] == 1 && x.stride[1] == 1 &&
         x.dilation[0] == 1 && x.dilation[1] == 1;
}

// Where it wins, against oneDNN's direct kernels on the 2-core Emerald Rapids (`python -m
// benchmarks.conv_library`): 1.4-1.7x from 64 to 256 channels (ResNet-18's layers 1-3 at every
// image size of the CPU suite's stream), 1.2-1.6x at 512 channels from 6x6 outputs up (its layer
// 4). Each call reads all the filters (16/9 of the weights), which at 512 channels takes as long
// as the direct sums over ~30 output pixels: on fewer it loses (0.84x at 5x5, 0.67x at 3x3), and
// with fewer input channels the transforms outweigh the products (0.76x at 32, 0.35x at 16).
bool use_winograd(const disc_conv2d_args& x) {
  const int mode = winograd_setting().load(std::memory_order_relaxed);
  if (mode == 0 || !winograd_fits(x)) return false;
  return mode == 1 || (x.ci >= 64 && x.co >= 64 && x.n * x.oh * x.ow >= 36);
}

// The transforms, on one value (a channel's) or a vector of them. In: the 4x4 block d; out: B^T d B.
template <typename T>
void winograd_input_tile(const T (&d)[4][4], T (&v)[kWinoPoints]) {
  T t[4][4];
  for (int j = 0; j < 4; ++j) {
    t[0][j] = d[0][j] - d[2][j];
    t[1][j] = d[1][j] + d[2][j];
    t[2][j] = d[2][j] - d[1][j];
    t[3][j] = d[1][j] - d[3][j];
  }
  for (int i = 0; i < 4; ++i) {
    v[4 * i + 0] = t[i][0] - t[i][2];
    v[4 * i + 1] = t[i][1] + t[i][2];
    v[4 * i + 2] = t[i][2] - t[i][1];
    v[4 * i + 3] = t[i][1] - t[i][3];
  }
}

// In: the 4x4 products m; out: the 2x2 outputs A^T m A.
template <typename T>
void winograd_output_tile(const T (&m)[kWinoPoints], T (&y)[2][2]) {
  T s[2][4];
  for (int j = 0; j < 4; ++j) {
    s[0][j] = m[j] + m[4 + j] + m[8 + j];
    s[1][j] = m[4 + j] - m[8 + j] - m[12 + j];
  }
  for (int i = 0; i < 2; ++i) {
    y[i][0] = s[i][0] + s[i][1] + s[i][2];
    y[i][1] = s[i][1] - s[i][2] - s[i][3];
  }
}

// The filters G g G^T, laid out for the panel kernel: point p's ci x co matrix in 64-column
// panels, u[((p * panels + panel) * ci + c) * 64 + column], the last panel's spare columns zero.
void winograd_filters(const disc_conv2d_args& x, float* u) {
  const int64_t panels = panel_count(x.co);
  std::fill(u, u + kWinoPoints * panels * x.ci * kPanelCols, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < x.co; ++k) {
    for (int64_t c = 0; c < x.ci; ++c) {
      const float* g = x.weight + (k * x.ci + c) * 9;
      float gg[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        gg[0][j] = g[j];
        gg[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
        gg[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
        gg[3][j] = g[6 + j];
      }
      float* out = u + ((k / kPanelCols) * x.ci + c) * kPanelCols + k % kPanelCols;
      const int64_t point_stride = panels * x.ci * kPanelCols;
      for (int i = 0; i < 4; ++i) {  // (G g) G^T
        const float a = gg[i][0], b = gg[i][1], e = gg[i][2];
        out[(4 * i + 0) * point_stride] = a;
        out[(4 * i + 1) * point_stride] = 0.5f * (a + b + e);
        out[(4 * i + 2) * point_stride] = 0.5f * (a - b + e);
        out[(4 * i + 3) * point_stride] = e;
      }
    }
  }
}

// The transformed filters of a constant weight, made on first use and cached like oneDNN's
// reordered copies (dropped with the weight's last program). nullptr: out of memory (reported).
std::shared_ptr<const PackedWeights> winograd_weights(disc_ral_ctx* ctx, const disc_conv2d_args& x) {
  const int64_t panels = panel_count(x.co);
  // The last place tells these apart from the oneDNN copies of the same weight (groups, >= 1).
  const WeightKey key{static_cast<int64_t>(reinterpret_cast<uintptr_t>(x.weight)), x.co, x.ci, x.kh, x.kw, -3};
  const memory::desc md({kWinoPoints, panels, x.ci, kPanelCols}, memory::data_type::f32, tag::abcd);
  float now[kWeightSamples];
  sample_weights(x, now);
  if (std::shared_ptr<const PackedWeights> held = weight_cache().current(key, md, now)) return held;
  auto fresh = std::make_shared<PackedWeights>();
  fresh->md = md;
  fresh->data.reset(static_cast<float*>(ral_alloc(ctx, static_cast<int64_t>(md.get_size()))));
  if (!fresh->data) return nullptr;
  std::memcpy(fresh->sample, now, sizeof fresh->sample);
  winograd_filters(x, fresh->data.get());
  weight_cache().insert(key, fresh);
  return fresh;
}

// Where the tiles are: `across` tiles a row of the output, `per_image` in each image.
struct WinoTiles {
  int64_t across, per_image, count;
  explicit WinoTiles(const disc_conv2d_args& x)
      : across((x.ow + 1) / 2), per_image(((x.oh + 1) / 2) * across), count(x.n * per_image) {}
  struct Origin {
    int64_t image, y, x;  // the tile's first output row and column
  };
  Origin origin(int64_t t) const {
    const int64_t within = t % per_image;
    return {t / per_image, within / across * 2, within % across * 2};
  }
};

// V: point p's rows x ci matrix at v + p * rows * ci, row r the transformed input of tile t0 + r.
// Input outside the image (padding, or past an odd edge) reads from `zeros` (ci floats).
void winograd_inputs(const disc_conv2d_args& x, const WinoTiles& tiles, int64_t t0, int64_t rows, const float* zeros, float* v) {
  const int64_t ci = x.ci, plane = rows * ci;
  for (int64_t r = 0; r < rows; ++r) {
    const WinoTiles::Origin at = tiles.origin(t0 + r);
    const int64_t image = at.image, y0 = at.y - x.pad_lo[0], x0 = at.x - x.pad_lo[1];
    const float* src[4][4];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        const int64_t y = y0 + i, xx = x0 + j;
        src[i][j] = (y >= 0 && y < x.h && xx >= 0 && xx < x.w) ? x.input + ((image * x.h + y) * x.w + xx) * ci : zeros;
      }
    float* out = v + r * ci;
    int64_t c = 0;
    for (; c + kVW <= ci; c += kVW) {
      vfloat d[4][4], p16[kWinoPoints];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) std::memcpy(&d[i][j], src[i][j] + c, sizeof(vfloat));
      winograd_input_tile(d, p16);
      for (int p = 0; p < kWinoPoints; ++p) std::memcpy(out + p * plane + c, &p16[p], sizeof(vfloat));
    }
    for (; c < ci; ++c) {
      float d[4][4], p16[kWinoPoints];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) d[i][j] = src[i][j][c];
      winograd_input_tile(d, p16);
      for (int p = 0; p < kWinoPoints; ++p) out[p * plane + c] = p16[p];
    }
  }
}

// Writes the outputs of tiles t0 .. t0 + rows in channels co0 .. co0 + cols (cols <= 64) from the
// products M (point p's rows x 64 matrix at m + p * rows * 64), with the bias and the ReLU.
void winograd_outputs(const disc_conv2d_args& x, const WinoTiles& tiles, int64_t t0, int64_t rows, int64_t co0, int64_t cols, const float* m) {
  const int64_t plane = rows * kPanelCols;
  for (int64_t r = 0; r < rows; ++r) {
    const WinoTiles::Origin at = tiles.origin(t0 + r);
    const int64_t image = at.image, y0 = at.y, x0 = at.x;
    float* dst[2][2];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        dst[i][j] = (y0 + i < x.oh && x0 + j < x.ow) ? x.output + ((image * x.oh + y0 + i) * x.ow + x0 + j) * x.co + co0 : nullptr;
    for (int64_t q = 0; q < cols; q += kVW) {
      vfloat mv[kWinoPoints], y[2][2];
      for (int p = 0; p < kWinoPoints; ++p) std::memcpy(&mv[p], m + p * plane + r * kPanelCols + q, sizeof(vfloat));
      winograd_output_tile(mv, y);
      const bool whole = q + kVW <= cols;  // else the panel's last, partial vector of channels
      alignas(64) float lane[kVW] = {};
      vfloat bias{};
      if (x.bias != nullptr && whole) {
        std::memcpy(&bias, x.bias + co0 + q, sizeof bias);
      } else if (x.bias != nullptr) {
        std::memcpy(lane, x.bias + co0 + q, (cols - q) * sizeof(float));
        std::memcpy(&bias, lane, sizeof bias);
      }
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
          if (dst[i][j] == nullptr) continue;
          vfloat out = y[i][j] + bias;
          if (x.relu) out = out < 0.0f ? vfloat{} : out;  // keeps NaN, as the direct epilogue does
          if (whole) {
            std::memcpy(dst[i][j] + q, &out, sizeof out);
          } else {
            std::memcpy(lane, &out, sizeof out);
            std::memcpy(dst[i][j] + q, lane, (cols - q) * sizeof(float));
          }
        }
    }
  }
}

// Most tiles a thread transforms at once: its V (16 x rows x ci floats) stays within 1.5 MB of L2.
// Every block reads all of the filters (16 x ci x co floats), from L3 at ~10 GB/s a core on the
// 2-core Emerald Rapids measured: the more rows a block has, the fewer times they are read.
int64_t winograd_rows(int64_t ci) { return std::clamp<int64_t>(24576 / std::max<int64_t>(ci, 1) / 6 * 6, 12, 96); }

int32_t winograd_conv2d(disc_ral_ctx* ctx, const disc_conv2d_args& x) {
  winograd_calls().fetch_add(1, std::memory_order_relaxed);
  const std::shared_ptr<const PackedWeights> filters = winograd_weights(ctx, x);
  if (!filters) return 1;
  const WinoTiles tiles(x);
  const int64_t panels = panel_count(x.co);
  const int64_t threads = std::max(omp_get_max_threads(), 1);
  // Blocks of tiles. Enough of them: as many as a multiple of the threads, evenly filled. Few (a
  // small image's last layers): the threads share out the output channels' panels instead, each
  // over every block (transforming the input itself: little next to its products), so that the
  // filters are still read once per block in all.
  const int64_t most_rows = winograd_rows(x.ci);
  int64_t blocks = (tiles.count + most_rows - 1) / most_rows;
  int64_t groups = 1;
  if (blocks < 2 * threads && panels >= threads) {
    groups = threads;
  } else {
    blocks = (blocks + threads - 1) / threads * threads;
  }
  const int64_t rows = (tiles.count + blocks - 1) / blocks;
  blocks = (tiles.count + rows - 1) / rows;
  const int64_t v_floats = kWinoPoints * rows * x.ci, m_floats = kWinoPoints * rows * kPanelCols;
  Scratch buffers(ctx, (x.ci + threads * (v_floats + m_floats)) * int64_t(sizeof(float)));
  if (buffers.ptr == nullptr) return 1;
  float* zeros = static_cast<float*>(buffers.ptr);
  std::fill(zeros, zeros + x.ci, 0.0f);
  const float* u = filters->data.get();
  const int64_t items = blocks * groups;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t group = item / blocks, block = item % blocks;  // a thread's items: one group's blocks
    const int64_t t0 = block * rows, count = std::min(rows, tiles.count - t0);
    float* v = zeros + x.ci + omp_get_thread_num() * (v_floats + m_floats);
    float* m = v + v_floats;
    winograd_inputs(x, tiles, t0, count, zeros, v);
    for (int64_t j = group * panels / groups; j < (group + 1) * panels / groups; ++j) {
      const int64_t cols = std::min(kPanelCols, x.co - j * kPanelCols);
      for (int p = 0; p < kWinoPoints; ++p)
        panel_product(count, x.ci, v + p * count * x.ci, x.ci, u + (p * panels + j) * x.ci * kPanelCols, m + p * count * kPanelCols, kPanelCols, cols);
      winograd_outputs(x, tiles, t0, count, j * kPanelCols, cols, m);
    }
  }
  return 0;
}
#else
bool use_winograd(const disc_conv2d_args&) { return false; }
int32_t winograd_conv2d(disc_ral_ctx*, const disc_conv2d_args&) { return 1; }  // unreachable
#endif

// The cached plan of the forward convolution x describes, built on first use.
std::shared_ptr<const ConvPlan> forward_plan(const disc_conv2d_args& x) {
  const ConvKey key = conv_key(x);
  std::shared_ptr<const ConvPlan> plan = plan_cache().find(key);
  return plan ? plan : plan_cache().insert(key, make_plan(x));
}

int32_t dnnl_conv2d(disc_ral_ctx* ctx, const disc_conv2d_args& x) {
  if (use_winograd(x)) return winograd_conv2d(ctx, x);
  std::shared_ptr<const ConvPlan> plan = forward_plan(x);
  dnnl::engine& eng = cpu_engine();
  dnnl::stream s(eng);

  // One scratch buffer, large enough for the biggest primitive run in this call (they run in order).
  size_t scratch_bytes = std::max({plan->scratch, plan->to_src.scratch, plan->to_wei.scratch, plan->from_dst.scratch});
  Scratch scratch(ctx, static_cast<int64_t>(scratch_bytes));
  if (scratch_bytes > 0 && scratch.ptr == nullptr) return 1;

  memory user_src(plan->user_src, eng, const_cast<float*>(x.input));
  memory user_wei(plan->user_wei, eng, const_cast<float*>(x.weight));
  memory user_dst(plan->user_dst, eng, x.output);

  // Weights: as given, reordered once and cached (constant), or reordered for this call.
  memory wei = user_wei;
  std::shared_ptr<const PackedWeights> packed;
  Scratch wei_tmp(ctx, (plan->wei_reorder && !x.weight_is_constant) ? static_cast<int64_t>(plan->wei.get_size()) : 0);
  if (plan->wei_reorder && x.weight_is_constant) {
    const WeightKey wkey{static_cast<int64_t>(reinterpret_cast<uintptr_t>(x.weight)), x.co, x.ci, x.kh, x.kw, x.groups};
    float now[kWeightSamples];
    sample_weights(x, now);
    packed = weight_cache().current(wkey, plan->wei, now);
    if (!packed) packed = pack_weights(ctx, s, wkey, plan->wei, now, plan->to_wei, user_wei, scratch.ptr, 0);
    if (!packed) return 1;
    wei = memory(plan->wei, eng, packed->data.get());
  } else if (plan->wei_reorder) {
    if (wei_tmp.ptr == nullptr) return 1;
    wei = memory(plan->wei, eng, wei_tmp.ptr);
    run(plan->to_wei.prim, s, {{DNNL_ARG_FROM, user_wei}, {DNNL_ARG_TO, wei}}, plan->to_wei.scratch, scratch.ptr);
  }

  Scratch src_tmp(ctx, plan->src_reorder ? static_cast<int64_t>(plan->src.get_size()) : 0);
  Scratch dst_tmp(ctx, plan->dst_reorder ? static_cast<int64_t>(plan->dst.get_size()) : 0);
  if ((plan->src_reorder && !src_tmp.ptr) || (plan->dst_reorder && !dst_tmp.ptr)) return 1;
  memory src = plan->src_reorder ? memory(plan->src, eng, src_tmp.ptr) : user_src;
  memory dst = plan->dst_reorder ? memory(plan->dst, eng, dst_tmp.ptr) : user_dst;
  if (plan->src_reorder) run(plan->to_src.prim, s, {{DNNL_ARG_FROM, user_src}, {DNNL_ARG_TO, src}}, plan->to_src.scratch, scratch.ptr);
  std::unordered_map<int, memory> conv_args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  if (x.bias != nullptr) conv_args.emplace(DNNL_ARG_BIAS, memory(bias_desc(x.co), eng, const_cast<float*>(x.bias)));
  run(plan->prim, s, std::move(conv_args), plan->scratch, scratch.ptr);
  if (plan->dst_reorder) run(plan->from_dst.prim, s, {{DNNL_ARG_FROM, dst}, {DNNL_ARG_TO, user_dst}}, plan->from_dst.scratch, scratch.ptr);
  s.wait();
  return 0;
}

// The two gradients. Their plans are built like the forward's (layouts "any", reorders to and
// from the caller's buffers where oneDNN wants another layout), from a forward_training hint.
enum class ConvGrad : int64_t { kData = 1, kWeights = 2 };
using GradKey = std::array<int64_t, kConvKeyLen + 1>;

struct GradPlan {
  struct Operand {
    memory::desc user, own;
    int arg = 0;
    bool written = false, reorder = false;
    Reorder convert;  // user -> own for a read operand, own -> user for the written one
  };
  dnnl::primitive prim;
  size_t scratch = 0;
  std::array<Operand, 3> operands;  // src (x), weights, dst (y), each as read or written
};

std::shared_ptr<const GradPlan> make_grad_plan(const disc_conv2d_args& x, ConvGrad which) {
  const ConvDescs c = conv_descs(x);
  const auto& [user_src, user_wei, user_dst, src_any, wei_any, dst_any, strides, dil, pad_l, pad_r] = c;
  const auto algo = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc hint(cpu_engine(), dnnl::prop_kind::forward_training, algo, src_any, wei_any, dst_any, strides,
                                                 dil, pad_l, pad_r);
  auto plan = std::make_shared<GradPlan>();
  auto& [src, wei, dst] = plan->operands;
  if (which == ConvGrad::kData) {
    dnnl::convolution_backward_data::primitive_desc pd(cpu_engine(), algo, src_any, wei_any, dst_any, strides, dil, pad_l, pad_r, hint,
                                                       user_scratchpad());
    plan->prim = dnnl::convolution_backward_data(pd);
    plan->scratch = pd.scratchpad_desc().get_size();
    src = {user_src, pd.diff_src_desc(), DNNL_ARG_DIFF_SRC, true};
    wei = {user_wei, pd.weights_desc(), DNNL_ARG_WEIGHTS, false};
    dst = {user_dst, pd.diff_dst_desc(), DNNL_ARG_DIFF_DST, false};
  } else {
    dnnl::convolution_backward_weights::primitive_desc pd(cpu_engine(), algo, src_any, wei_any, dst_any, strides, dil, pad_l, pad_r, hint,
                                                          user_scratchpad());
    plan->prim = dnnl::convolution_backward_weights(pd);
    plan->scratch = pd.scratchpad_desc().get_size();
    src = {user_src, pd.src_desc(), DNNL_ARG_SRC, false};
    wei = {user_wei, pd.diff_weights_desc(), DNNL_ARG_DIFF_WEIGHTS, true};
    dst = {user_dst, pd.diff_dst_desc(), DNNL_ARG_DIFF_DST, false};
  }
  for (auto& op : plan->operands) {
    op.reorder = op.own != op.user;
    if (op.reorder) op.convert = op.written ? Reorder(op.own, op.user) : Reorder(op.user, op.own);
  }
  return plan;
}

SharedCache<GradKey, GradPlan, ArrayHash<kConvKeyLen + 1>>& grad_plan_cache() {
  static auto* cache = new SharedCache<GradKey, GradPlan, ArrayHash<kConvKeyLen + 1>>(kMaxConvPlans);  // never destroyed
  return *cache;
}

int32_t dnnl_conv2d_grad(disc_ral_ctx* ctx, const disc_conv2d_args& x, ConvGrad which) {
  const ConvKey base = conv_key(x);
  GradKey key;
  std::copy(base.begin(), base.end(), key.begin());
  key[kConvKeyLen] = static_cast<int64_t>(which);
  std::shared_ptr<const GradPlan> plan = grad_plan_cache().find(key);
  if (!plan) plan = grad_plan_cache().insert(key, make_grad_plan(x, which));
  dnnl::engine& eng = cpu_engine();
  dnnl::stream s(eng);

  size_t scratch_bytes = plan->scratch;
  for (const auto& op : plan->operands) scratch_bytes = std::max(scratch_bytes, op.convert.scratch);
  Scratch scratch(ctx, static_cast<int64_t>(scratch_bytes));
  if (scratch_bytes > 0 && scratch.ptr == nullptr) return 1;
  void* user_ptr[3] = {const_cast<float*>(x.input), const_cast<float*>(x.weight), x.output};
  std::array<std::unique_ptr<Scratch>, 3> tmp;
  std::unordered_map<int, memory> args;
  std::array<memory, 3> user, own;
  for (int i = 0; i < 3; ++i) {
    const auto& op = plan->operands[i];
    user[i] = memory(op.user, eng, user_ptr[i]);
    own[i] = user[i];
    if (op.reorder) {
      tmp[i] = std::make_unique<Scratch>(ctx, static_cast<int64_t>(op.own.get_size()));
      if (tmp[i]->ptr == nullptr) return 1;
      own[i] = memory(op.own, eng, tmp[i]->ptr);
      if (!op.written) run(op.convert.prim, s, {{DNNL_ARG_FROM, user[i]}, {DNNL_ARG_TO, own[i]}}, op.convert.scratch, scratch.ptr);
    }
    args.emplace(op.arg, own[i]);
  }
  run(plan->prim, s, args, plan->scratch, scratch.ptr);
  for (int i = 0; i < 3; ++i) {
    const auto& op = plan->operands[i];
    if (op.written && op.reorder) run(op.convert.prim, s, {{DNNL_ARG_FROM, own[i]}, {DNNL_ARG_TO, user[i]}}, op.convert.scratch, scratch.ptr);
  }
  s.wait();
  return 0;
}
#endif

// ---------------------------------------------------------------------------------------------
// 16-bit GEMMs (bf16, f16): oneDNN's matmul on the operands as stored, f32 accumulation and one
// rounding of C (its AMX or AVX512_BF16 kernels where the CPU has them), one 2-D problem per
// batch index. Strides oneDNN cannot describe (0 along a dim of extent > 1) and builds without
// oneDNN take a plain loop with the same arithmetic.

float widen16(uint16_t h, int32_t dtype) { return dtype == DISC_GEMM_BF16 ? disc_from_bf16(h) : disc_from_f16(h); }

uint16_t narrow16(float f, int32_t dtype) { return dtype == DISC_GEMM_BF16 ? disc_to_bf16(f) : disc_to_f16(f); }  // as the kernels round

void gemm_16bit_loop(const disc_gemm_args& x, const uint16_t* a, const uint16_t* b, uint16_t* c) {
#pragma omp parallel for schedule(static) if (x.m * x.n * x.k >= 32768)
  for (int64_t i = 0; i < x.m; ++i)
    for (int64_t j = 0; j < x.n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < x.k; ++p) acc += widen16(a[i * x.a_rs + p * x.a_cs], x.dtype) * widen16(b[p * x.b_rs + j * x.b_cs], x.dtype);
      c[i * x.c_rs + j] = narrow16(acc, x.dtype);
    }
}

#ifdef DISC_HAVE_DNNL
// An operand's strides as oneDNN takes them: a dim of extent 1 gets the stride a contiguous
// layout would give it (its own is never used, and may be 0). False: a stride 0 along a longer
// dim (a broadcast row or column), which oneDNN's memory descriptors do not describe.
bool plain_strides(int64_t rows, int64_t cols, int64_t& rs, int64_t& cs) {
  if (rows == 1) rs = cols * std::max<int64_t>(cs, 1);
  if (cols == 1) cs = 1;
  return rs > 0 && cs > 0;
}

struct Matmul16Plan {
  dnnl::matmul prim;
  size_t scratch = 0;
  memory::desc a, b, c;
  memory::desc b_user;  // B as stored, where `b` is the layout a constant B is packed into
  bool usable = false;  // oneDNN has a matmul for this type on this CPU (else the plain loop runs)
};
constexpr int kMatmul16KeyLen = 10;
using Matmul16Key = std::array<int64_t, kMatmul16KeyLen>;

SharedCache<Matmul16Key, Matmul16Plan, ArrayHash<kMatmul16KeyLen>>& matmul16_cache() {
  static auto* cache = new SharedCache<Matmul16Key, Matmul16Plan, ArrayHash<kMatmul16KeyLen>>(kMaxMatmulPlans);  // never destroyed
  return *cache;
}

constexpr int64_t kPackedLayoutRows = 64;  // the rows of the GEMM a 16-bit B's packed layout is chosen for, if fewer

// `packed_b`: B in the layout oneDNN's kernel reads (a constant B, packed once by gemm_16bit).
std::shared_ptr<const Matmul16Plan> matmul16_plan(const disc_gemm_args& x, int64_t ars, int64_t acs, int64_t brs, int64_t bcs, int64_t crs,
                                                  bool packed_b) {
  const Matmul16Key key{x.m, x.n, x.k, ars, acs, brs, bcs, crs, x.dtype, packed_b ? 1 : 0};
  if (auto plan = matmul16_cache().find(key)) return plan;
  const auto dt = x.dtype == DISC_GEMM_BF16 ? memory::data_type::bf16 : memory::data_type::f16;
  auto plan = std::make_shared<Matmul16Plan>();
  plan->a = memory::desc({x.m, x.k}, dt, memory::dims{ars, acs});
  plan->b_user = memory::desc({x.k, x.n}, dt, memory::dims{brs, bcs});
  plan->b = packed_b ? memory::desc({x.k, x.n}, dt, tag::any) : plan->b_user;
  plan->c = memory::desc({x.m, x.n}, dt, memory::dims{crs, 1});
  try {
    dnnl::matmul::primitive_desc pd(cpu_engine(), plan->a, plan->b, plan->c, user_scratchpad());
    if (packed_b && pd.weights_desc() == plan->b_user && x.m < kPackedLayoutRows) {
      // For a few rows oneDNN picks its gemm kernel, which packs B at every call; its brgemm takes
      // the packed layout it chooses for more rows at any m (8 rows of BERT-small's projections
      // under autocast: 12-16 us a call, packed 3-5).
      const memory::desc more_a({kPackedLayoutRows, x.k}, dt, tag::ab), more_c({kPackedLayoutRows, x.n}, dt, tag::ab);
      const memory::desc packed = dnnl::matmul::primitive_desc(cpu_engine(), more_a, plan->b, more_c, user_scratchpad()).weights_desc();
      if (packed != plan->b_user) pd = dnnl::matmul::primitive_desc(cpu_engine(), plan->a, packed, plan->c, user_scratchpad());
    }
    plan->prim = dnnl::matmul(pd);
    plan->b = pd.weights_desc();
    plan->scratch = pd.scratchpad_desc().get_size();
    plan->usable = true;
  } catch (const dnnl::error&) {  // no 16-bit matmul in this oneDNN build or on this CPU
  }
  return matmul16_cache().insert(key, plan);
}
#endif

#ifdef DISC_HAVE_DNNL
// A constant 16-bit B (a weight: bf16 or f16 models, autocast's narrowed copies) packed once into
// the layout oneDNN's kernel reads. As stored, oneDNN's 16-bit matmul falls back to its gemm
// kernel, which packs B at every call: BERT-small under bf16 autocast on a 2-core AVX512-BF16 Xeon
// spent most of its GEMM time there. Counted against the packed-GEMM budget like float32 weights;
// nullopt: no such kernel, or past the budget (B is read as stored).
std::optional<int32_t> run_packed_b16(disc_ral_ctx* ctx, const disc_gemm_args& x, int64_t ars, int64_t acs, int64_t brs, int64_t bcs, int64_t crs) {
  if (x.m * x.n * x.k < kPackedMinMacs) return std::nullopt;
  std::shared_ptr<const Matmul16Plan> plan = matmul16_plan(x, ars, acs, brs, bcs, crs, /*packed_b=*/true);
  if (!plan->usable || plan->b == plan->b_user) return std::nullopt;
  const auto* b = static_cast<const uint16_t*>(x.b);
  // -2 in the last place: a 16-bit GEMM's B (float32 GEMMs have -1, convolutions their groups).
  const WeightKey wkey{static_cast<int64_t>(reinterpret_cast<uintptr_t>(b)), x.k, x.n, brs, bcs, -2};
  float now[kWeightSamples];
  sample_b(b, x.k, x.n, brs, bcs, now);
  dnnl::stream s(cpu_engine());
  const std::optional<std::shared_ptr<const PackedWeights>> packed = packed_gemm_weight(ctx, s, wkey, plan->b, plan->b_user, b, now);
  if (!packed) return std::nullopt;
  if (!*packed) return 1;
  Scratch scratch(ctx, static_cast<int64_t>(plan->scratch));
  if (plan->scratch > 0 && scratch.ptr == nullptr) return 1;
  dnnl::engine& eng = cpu_engine();
  run(plan->prim, s,
      {{DNNL_ARG_SRC, memory(plan->a, eng, const_cast<void*>(x.a))},
       {DNNL_ARG_WEIGHTS, memory(plan->b, eng, (*packed)->data.get())},
       {DNNL_ARG_DST, memory(plan->c, eng, x.c)}},
      plan->scratch, scratch.ptr);
  s.wait();
  return 0;
}

// Small 16-bit GEMMs (attention's products, one per head) through float32: oneDNN's 16-bit matmul
// spent ~10 us of setup on each 33x64x33 product of BERT-small under bf16 autocast (0.14 MFLOP),
// where widening both operands, dnnl_sgemm and one rounding of C take 1-3 us. Exact in the same
// sense as oneDNN's: 16-bit values are exact in float32, products summed in float32, C rounded
// once (to nearest even, as the kernels round). Batches go one per thread, as float32's do.
constexpr int64_t kSmall16Macs = int64_t{1} << 20;

int32_t gemm_16bit_via_f32(disc_ral_ctx* ctx, const disc_gemm_args& x, const BatchDims& bd) {
  const auto* a = static_cast<const uint16_t*>(x.a);
  const auto* b = static_cast<const uint16_t*>(x.b);
  auto* c = static_cast<uint16_t*>(x.c);
  const int64_t af = x.m * x.k, bf = x.k * x.n, per = af + bf + x.m * x.n;
  const int nthr = omp_get_max_threads();
  const bool over_batch = nthr > 1 && bd.count >= nthr;
  Scratch buf(ctx, (over_batch ? nthr : 1) * per * int64_t(sizeof(float)));
  if (buf.ptr == nullptr) return 1;
  auto one = [&](int64_t bi, float* w) {
    int64_t oa, ob, oc;
    bd.offsets(bi, &oa, &ob, &oc);
    float *fa = w, *fb = w + af, *fc = w + af + bf;
    for (int64_t i = 0; i < x.m; ++i)
      for (int64_t p = 0; p < x.k; ++p) fa[i * x.k + p] = widen16(a[oa + i * x.a_rs + p * x.a_cs], x.dtype);
    for (int64_t p = 0; p < x.k; ++p)
      for (int64_t j = 0; j < x.n; ++j) fb[p * x.n + j] = widen16(b[ob + p * x.b_rs + j * x.b_cs], x.dtype);
    const dnnl_status_t st = dnnl_sgemm('N', 'N', x.m, x.n, x.k, 1.0f, fa, x.k, fb, x.n, 0.0f, fc, x.n);
    if (st != dnnl_success) return false;
    for (int64_t i = 0; i < x.m; ++i)
      for (int64_t j = 0; j < x.n; ++j) c[oc + i * x.c_rs + j] = narrow16(fc[i * x.n + j], x.dtype);
    return true;
  };
  int32_t failed = 0;
  if (!over_batch) {
    for (int64_t bi = 0; bi < bd.count && !failed; ++bi) failed = !one(bi, buf.f());
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t bi = 0; bi < bd.count; ++bi)
      if (!__atomic_load_n(&failed, __ATOMIC_RELAXED) && !one(bi, buf.f() + omp_get_thread_num() * per)) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
  }
  return failed ? fail(ctx, "gemm: dnnl_sgemm failed (m=%lld n=%lld k=%lld)", (long long)x.m, (long long)x.n, (long long)x.k) : 0;
}
#endif

// `bd`: the batch dims of extent > 1, as ral_gemm_impl collected them (m and n are not 0).
int32_t gemm_16bit(disc_ral_ctx* ctx, const disc_gemm_args& x, BatchDims bd) {
  if (x.dtype != DISC_GEMM_BF16 && x.dtype != DISC_GEMM_F16) return fail(ctx, "gemm: unknown element type %d", x.dtype);
  if (x.alpha != 1.0f || x.beta != 0.0f) return fail(ctx, "gemm: 16-bit GEMMs take alpha = 1 and beta = 0");
  for (int d = 0; d < bd.rank; ++d) bd.count *= bd.shape[d];
  if (x.c == nullptr || (x.k > 0 && (x.a == nullptr || x.b == nullptr))) return fail(ctx, "gemm: null operand");
  const auto* a = static_cast<const uint16_t*>(x.a);
  const auto* b = static_cast<const uint16_t*>(x.b);
  auto* c = static_cast<uint16_t*>(x.c);
#ifdef DISC_HAVE_DNNL
  int64_t ars = x.a_rs, acs = x.a_cs, brs = x.b_rs, bcs = x.b_cs, crs = x.m == 1 ? x.n : x.c_rs;
  const bool plain = x.k > 0 && plain_strides(x.m, x.k, ars, acs) && plain_strides(x.k, x.n, brs, bcs) && crs >= x.n;
  if (plain && x.b_is_constant && bd.count == 1)
    if (std::optional<int32_t> rc = run_packed_b16(ctx, x, ars, acs, brs, bcs, crs)) return *rc;
  // (A constant B that was not packed, past the budget, is read by oneDNN as stored rather than widened at every call.)
  if (x.k > 0 && x.m * x.n * x.k < kSmall16Macs && !(x.b_is_constant && bd.count == 1)) return gemm_16bit_via_f32(ctx, x, bd);
  std::shared_ptr<const Matmul16Plan> plan;
  if (plain) plan = matmul16_plan(x, ars, acs, brs, bcs, crs, /*packed_b=*/false);
  if (plan && plan->usable) {
    Scratch scratch(ctx, static_cast<int64_t>(plan->scratch));
    if (plan->scratch > 0 && scratch.ptr == nullptr) return 1;
    dnnl::stream s(cpu_engine());
    dnnl::engine& eng = cpu_engine();
    for (int64_t bi = 0; bi < bd.count; ++bi) {
      int64_t oa, ob, oc;
      bd.offsets(bi, &oa, &ob, &oc);
      run(plan->prim, s,
          {{DNNL_ARG_SRC, memory(plan->a, eng, const_cast<uint16_t*>(a + oa))},
           {DNNL_ARG_WEIGHTS, memory(plan->b, eng, const_cast<uint16_t*>(b + ob))},
           {DNNL_ARG_DST, memory(plan->c, eng, c + oc)}},
          plan->scratch, scratch.ptr);
    }
    s.wait();
    return 0;
  }
#endif
  for (int64_t bi = 0; bi < bd.count; ++bi) {
    int64_t oa, ob, oc;
    bd.offsets(bi, &oa, &ob, &oc);
    gemm_16bit_loop(x, a + oa, b + ob, c + oc);
  }
  return 0;
}

int32_t ral_conv2d_impl(disc_ral_ctx* ctx, const disc_conv2d_args* args) {
  if (args == nullptr) return fail(ctx, "conv2d: null args");
  const disc_conv2d_args& x = *args;
  if (check_conv(ctx, x) != 0) return 1;
  if (x.n == 0 || x.co == 0 || x.oh == 0 || x.ow == 0) return 0;  // empty output
  if (x.output == nullptr || (x.ci > 0 && (x.input == nullptr || x.weight == nullptr))) return fail(ctx, "conv2d: null operand");
  // Degenerate reductions oneDNN rejects (no input channels or an empty kernel): the sum is 0.
  if (x.ci == 0 || x.kh == 0 || x.kw == 0 || x.h == 0 || x.w == 0) {
    std::fill(x.output, x.output + x.n * x.co * x.oh * x.ow, 0.0f);
    builtin_conv2d_epilogue(x);
    return 0;
  }
#ifdef DISC_HAVE_DNNL
  return dnnl_conv2d(ctx, x);
#else
  builtin_conv2d(x);
  return 0;
#endif
}

int32_t ral_conv2d(disc_ral_ctx* ctx, const disc_conv2d_args* args) {
  try {
    return ral_conv2d_impl(ctx, args);
  } catch (const std::exception& e) {
    return fail(ctx, "conv2d: %s", e.what());
  } catch (...) {
    return fail(ctx, "conv2d: unknown exception");
  }
}

int32_t ral_conv2d_grad_impl(disc_ral_ctx* ctx, const disc_conv2d_args* args, bool weights) {
  const char* what = weights ? "conv2d_backward_weights" : "conv2d_backward_data";
  if (args == nullptr) return fail(ctx, "%s: null args", what);
  const disc_conv2d_args& x = *args;
  if (check_conv(ctx, x) != 0) return 1;
  const int64_t written = weights ? x.co * (x.ci / x.groups) * x.kh * x.kw : x.n * x.ci * x.h * x.w;
  if (written == 0) return 0;
  const int64_t sizes[3] = {x.n * x.ci * x.h * x.w, x.co * (x.ci / x.groups) * x.kh * x.kw, x.n * x.co * x.oh * x.ow};
  const void* ptrs[3] = {x.input, x.weight, x.output};
  for (int i = 0; i < 3; ++i)
    if (ptrs[i] == nullptr && sizes[i] > 0) return fail(ctx, "%s: null operand", what);
  float* out = const_cast<float*>(weights ? x.weight : x.input);
  // Nothing flows back through an empty output (or an empty kernel / channel group): zeros.
  if (x.n == 0 || x.co == 0 || x.oh == 0 || x.ow == 0 || x.ci == 0 || x.kh == 0 || x.kw == 0) {
    std::fill(out, out + written, 0.0f);
    return 0;
  }
#ifdef DISC_HAVE_DNNL
  return dnnl_conv2d_grad(ctx, x, weights ? ConvGrad::kWeights : ConvGrad::kData);
#else
  if (weights)
    builtin_conv2d_backward_weights(x);
  else
    builtin_conv2d_backward_data(x);
  return 0;
#endif
}

int32_t ral_conv2d_backward_data(disc_ral_ctx* ctx, const disc_conv2d_args* args) {
  try {
    return ral_conv2d_grad_impl(ctx, args, false);
  } catch (const std::exception& e) {
    return fail(ctx, "conv2d_backward_data: %s", e.what());
  } catch (...) {
    return fail(ctx, "conv2d_backward_data: unknown exception");
  }
}

int32_t ral_conv2d_backward_weights(disc_ral_ctx* ctx, const disc_conv2d_args* args) {
  try {
    return ral_conv2d_grad_impl(ctx, args, true);
  } catch (const std::exception& e) {
    return fail(ctx, "conv2d_backward_weights: %s", e.what());
  } catch (...) {
    return fail(ctx, "conv2d_backward_weights: unknown exception");
  }
}

const char* library_name() {
#ifdef DISC_HAVE_DNNL
  static const std::string name = [] {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }();
  return name.c_str();
#else
  return "builtin";
#endif
}

}  // namespace

// Not part of the ABI: cache sizes for tests and diagnostics (0: conv plans, 1: packed weights,
// 2: matmul-primitive plans on B as stored, 3: those built so far, 4: matmul-primitive plans on
// packed B, 5: bytes of packed GEMM weights counted against the budget, 6: panel-kernel GEMMs run,
// 7: the panel kernel's row limit, 8: Winograd convolutions run, 9: batches of tiny GEMMs run).
extern "C" __attribute__((visibility("default"))) int64_t disc_ral_cpu_cache_entries(int32_t which) {
  if (which == 9) return tiny_gemm_calls().load(std::memory_order_relaxed);  // every build has the tiny GEMMs
#ifdef DISC_HAVE_DNNL
  switch (which) {
    case 0: return plan_cache().size();
    case 1: return weight_cache().size();
    case 2: return matmul_cache(false).size();
    case 3: return matmul_cache(false).built();
    case 4: return matmul_cache(true).size();
    case 5: return weight_cache().budgeted_bytes();
    case 6: return panel_gemm_calls().load(std::memory_order_relaxed);
    case 7: return small_m_rows();
    case 8: return winograd_calls().load(std::memory_order_relaxed);
    default: return -1;
  }
#else
  (void)which;
  return 0;
#endif
}

// Not part of the ABI: sets up to how many rows a GEMM on a packed weight takes the panel kernel
// (tests, benchmarks) and returns the previous limit.
extern "C" __attribute__((visibility("default"))) int64_t disc_ral_cpu_set_small_m_rows(int64_t rows) {
#ifdef DISC_HAVE_DNNL
  return small_m_limit().exchange(std::max<int64_t>(rows, 0));
#else
  (void)rows;
  return 0;
#endif
}

// Not part of the ABI: turns the tiny-GEMM path for batches of small products on (1) or off (0)
// and returns the previous setting.
extern "C" __attribute__((visibility("default"))) int32_t disc_ral_cpu_set_tiny_gemm(int32_t on) {
  return tiny_gemm_setting().exchange(on != 0 ? 1 : 0);
}

// Not part of the ABI: sets when convolutions run by Winograd's F(2x2, 3x3) (0 never, 1 whenever
// they can, 2 where it wins) and returns the previous setting; without AVX-512 it stays 0.
extern "C" __attribute__((visibility("default"))) int32_t disc_ral_cpu_set_winograd(int32_t mode) {
#if defined(DISC_HAVE_DNNL) && defined(__AVX512F__)
  return winograd_setting().exchange(std::clamp(mode, 0, 2));
#else
  (void)mode;
  return 0;
#endif
}

// Not part of the ABI: sets the packed-GEMM budget to `mb` megabytes (tests, benchmarks; +inf: no
// cap) and returns the previous one. Copies already made stay; only new ones are checked against it.
extern "C" __attribute__((visibility("default"))) double disc_ral_cpu_set_packed_gemm_mb(double mb) {
#ifdef DISC_HAVE_DNNL
  const int64_t previous = packed_gemm_budget().exchange(budget_bytes(mb));
  return previous == kNoCap ? std::numeric_limits<double>::infinity() : static_cast<double>(previous) / 1048576.0;
#else
  (void)mb;
  return 0.0;
#endif
}

// Not part of the ABI: how the forward convolution `args` describes runs, for tests and
// diagnostics: "<oneDNN kernel>; reorders: <operands reordered per call, or none>" (the weight
// of a constant is reordered once and cached), or "winograd_2x3:ral; reorders: none" for the
// RAL's own Winograd kernel. Returns 0, or 1 without oneDNN or on bad args.
extern "C" __attribute__((visibility("default"))) int32_t disc_ral_cpu_conv_plan(const disc_conv2d_args* args, char* out, int64_t len) {
#ifdef DISC_HAVE_DNNL
  disc_ral_ctx ctx{};
  if (args == nullptr || out == nullptr || len <= 0 || check_conv(&ctx, *args) != 0) return 1;
  try {
    if (use_winograd(*args)) {
      std::snprintf(out, static_cast<size_t>(len), "winograd_2x3:ral; reorders: none");
      return 0;
    }
    std::shared_ptr<const ConvPlan> plan = forward_plan(*args);
    std::string reorders;
    for (const auto& [name, on] : {std::pair<const char*, bool>{"src", plan->src_reorder}, {"weights", plan->wei_reorder}, {"dst", plan->dst_reorder}})
      if (on) reorders += (reorders.empty() ? "" : ",") + std::string(name);
    std::snprintf(out, static_cast<size_t>(len), "%s; reorders: %s", plan->impl.c_str(), reorders.empty() ? "none" : reorders.c_str());
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
#else
  (void)args, (void)out, (void)len;
  return 1;
#endif
}

// Not part of the ABI: a program holds (`held` 1) or lets go of (0) its `n` constant buffers, so
// that packed copies of them live as long as some program that reads them.
extern "C" __attribute__((visibility("default"))) void disc_ral_cpu_hold_constants(const void* const* constants, int64_t n, int32_t held) {
#ifdef DISC_HAVE_DNNL
  for (int64_t i = 0; i < n; ++i) {
    const auto address = static_cast<int64_t>(reinterpret_cast<uintptr_t>(constants[i]));
    if (held)
      weight_cache().hold(address);
    else
      weight_cache().let_go(address);
  }
#else
  (void)constants, (void)n, (void)held;
#endif
}

// Not part of the ABI: the `n` constant buffers changed in place (a model's weights updated after
// compilation); their packed copies are dropped so that no program reads a stale one.
extern "C" __attribute__((visibility("default"))) void disc_ral_cpu_forget_constants(const void* const* constants, int64_t n) {
#ifdef DISC_HAVE_DNNL
  for (int64_t i = 0; i < n; ++i) weight_cache().forget(static_cast<int64_t>(reinterpret_cast<uintptr_t>(constants[i])));
#else
  (void)constants, (void)n;
#endif
}

// ---------------------------------------------------------------------------------------------
// Output buffers for the plug-in host (not part of the ABI: generated programs never call these).
//
// A call's outputs go to its caller, so they cannot live in the kept workspace. A fresh buffer of a
// megabyte or more comes from the OS as untouched pages, which the kernel writing it faults in one
// by one after the OS zeroes them: on the 2-core EPYC VM a fresh 96 MB output cost 30 ms to write
// where reused memory took 7 ms, more than the fused kernel itself. So a freed output comes back
// here rather than to the OS, and the next call of about its size reuses it. The host wraps a block
// as a torch tensor through DLPack (the legacy `DLManagedTensor`, whose layout below is the DLPack
// spec's); torch calls `deleter` once the last view of it is gone, on whichever thread that is.
//
// Bounds: at most `max_blocks` cached blocks (the least recently returned go first); a block
// serves only requests of at least half its capacity, so reuse never more than doubles an
// output's memory; a request no cached block can serve first frees the cached blocks smaller than
// it. `disc_ral_cpu_output_cache_release` gives every cached block back to the OS.
namespace {

struct DLDevice { int32_t device_type, device_id; };     // kDLCPU = 1
struct DLDataType { uint8_t code, bits; uint16_t lanes; };  // kDLUInt = 1
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

class OutputCache {
 public:
  // A 1-D uint8 DLPack tensor of `bytes` bytes (page-aligned data), or nullptr if out of memory.
  DLManagedTensor* take(int64_t bytes) {
    Block* block = nullptr;
    std::vector<Block*> too_small;
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t best = cached_.size();
      for (size_t i = 0; i < cached_.size(); ++i) {
        const int64_t cap = cached_[i]->capacity;
        if (cap >= bytes && cap / 2 <= bytes && (best == cached_.size() || cap < cached_[best]->capacity)) best = i;
      }
      if (best < cached_.size()) {
        block = cached_[best];
        cached_.erase(cached_.begin() + static_cast<std::ptrdiff_t>(best));
        ++hits_;
      } else {
        // Shapes grew past these blocks: free them before allocating, so that a stream of growing
        // outputs does not hold its old sizes on top of the new one.
        ++misses_;
        for (size_t i = 0; i < cached_.size();) {
          if (cached_[i]->capacity < bytes) {
            too_small.push_back(cached_[i]);
            cached_.erase(cached_.begin() + static_cast<std::ptrdiff_t>(i));
          } else {
            ++i;
          }
        }
      }
    }
    for (Block* b : too_small) destroy(b);
    if (block == nullptr) {
      const int64_t capacity = (std::max<int64_t>(bytes, 1) + kPage - 1) / kPage * kPage;
      void* data = std::aligned_alloc(kPage, static_cast<size_t>(capacity));
      if (data == nullptr) return nullptr;
      block = new Block();
      block->capacity = capacity;
      block->managed.dl_tensor.data = data;
      block->managed.dl_tensor.device = {1, 0};
      block->managed.dl_tensor.ndim = 1;
      block->managed.dl_tensor.dtype = {1, 8, 1};
      block->managed.dl_tensor.shape = &block->size;
      block->managed.dl_tensor.strides = &block->stride;
      block->managed.manager_ctx = this;
      block->managed.deleter = &OutputCache::deleter;
    }
    block->size = bytes;
    return &block->managed;
  }

  // The tensor's last user is gone: keep its block for a later call.
  void give_back(DLManagedTensor* managed) {
    Block* block = reinterpret_cast<Block*>(managed);  // `managed` is a Block's first member
    {
      std::lock_guard<std::mutex> lock(mu_);
      cached_.push_back(block);
    }
    trim();
  }

  // Frees every cached block; returns the bytes given back.
  int64_t release() {
    std::vector<Block*> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all.swap(cached_);
    }
    int64_t bytes = 0;
    for (Block* b : all) {
      bytes += b->capacity;
      destroy(b);
    }
    return bytes;
  }

  int64_t set_max_blocks(int64_t n) {
    int64_t old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      old = max_blocks_;
      max_blocks_ = std::max<int64_t>(n, 0);
    }
    trim();
    return old;
  }

  // 0: cached blocks, 1: their bytes, 2: requests served from the cache, 3: requests that allocated.
  int64_t stat(int32_t which) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t bytes = 0;
    for (const Block* b : cached_) bytes += b->capacity;
    switch (which) {
      case 0: return static_cast<int64_t>(cached_.size());
      case 1: return bytes;
      case 2: return hits_;
      case 3: return misses_;
      default: return -1;
    }
  }

 private:
  struct Block {
    DLManagedTensor managed;  // first: a DLManagedTensor* is its Block*
    int64_t size = 0, stride = 1, capacity = 0;
  };
  static constexpr int64_t kPage = 4096;

  static void deleter(DLManagedTensor* managed) { static_cast<OutputCache*>(managed->manager_ctx)->give_back(managed); }
  static void destroy(Block* b) {
    std::free(b->managed.dl_tensor.data);
    delete b;
  }
  void trim() {
    std::vector<Block*> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (static_cast<int64_t>(cached_.size()) > max_blocks_) {
        evicted.push_back(cached_.front());
        cached_.erase(cached_.begin());
      }
    }
    for (Block* b : evicted) destroy(b);
  }

  std::mutex mu_;
  std::vector<Block*> cached_;  // least recently returned first
  int64_t max_blocks_ = 4;
  int64_t hits_ = 0, misses_ = 0;
};

// Never destroyed: tensors torch frees during interpreter shutdown still call its deleter.
OutputCache& output_cache() {
  static OutputCache* cache = new OutputCache();
  return *cache;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void* disc_ral_cpu_output_take(int64_t bytes) { return output_cache().take(bytes); }

// For a tensor the host took but could not hand to torch: back to the cache as if torch had freed it.
extern "C" __attribute__((visibility("default"))) void disc_ral_cpu_output_give_back(void* managed) {
  output_cache().give_back(static_cast<DLManagedTensor*>(managed));
}

extern "C" __attribute__((visibility("default"))) int64_t disc_ral_cpu_output_cache_release(void) { return output_cache().release(); }

// Sets the most blocks kept (0: none, every freed output goes back to the OS); returns the old limit.
extern "C" __attribute__((visibility("default"))) int64_t disc_ral_cpu_output_cache_limit(int64_t max_blocks) {
  return output_cache().set_max_blocks(max_blocks);
}

extern "C" __attribute__((visibility("default"))) int64_t disc_ral_cpu_output_cache_stat(int32_t which) { return output_cache().stat(which); }

extern "C" __attribute__((visibility("default"))) const disc_ral* disc_ral_cpu(void) {
  static const disc_ral table = {DISC_RAL_ABI_VERSION, library_name(), ral_error,         ral_alloc,
                                   ral_free,             ral_gemm,       ral_conv2d,        ral_conv2d_backward_data,
                                   ral_conv2d_backward_weights};
  return &table;
}
