// The machine's float32 compute ceiling: independent fused multiply-adds on the widest vectors the
// compiler targets (-march=native), on `threads` OpenMP threads. Compiled by benchmarks/machine.py
// with disc's toolchain, so it sees the same instruction set as generated programs and the RAL.
//
// Each thread keeps kChains accumulators, enough independent chains to cover the FMA latency
// (4-5 cycles) times the FMA units (2) of current x86 cores, so the loop is bound by throughput,
// not latency; more chains would spill registers on AVX2 (16 vector registers).
#include <immintrin.h>
#include <omp.h>

#include <cstdint>

namespace {

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif
constexpr int kLanes = kVectorBytes / static_cast<int>(sizeof(float));
constexpr int kChains = 12;
typedef float Vec __attribute__((vector_size(kVectorBytes)));

// An explicit FMA: -std=c++17 turns off GCC's contraction of a * b + c.
inline Vec fma(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  return reinterpret_cast<Vec>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
#elif defined(__FMA__)
  return reinterpret_cast<Vec>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b), reinterpret_cast<__m256>(c)));
#else
  return a * b + c;
#endif
}

}  // namespace

// Runs `rounds` rounds of kChains vector FMAs on each of `threads` threads and returns the
// seconds they took; *flops receives the floating-point operations done (2 per lane per FMA),
// *lanes the vector width in floats. The result of the arithmetic is folded into *sink so the
// compiler cannot drop the loop.
extern "C" double disc_fma_peak(int32_t threads, int64_t rounds, double* flops, int32_t* lanes, float* sink) {
  float total = 0.0f;
  const double start = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    Vec acc[kChains];
    Vec x, y;
    for (int l = 0; l < kLanes; ++l) {
      x[l] = 0.999f;  // |acc| converges to y / (1 - x): no overflow, no denormals
      y[l] = 1e-3f;
    }
    for (int c = 0; c < kChains; ++c)
      for (int l = 0; l < kLanes; ++l) acc[c][l] = 0.01f * static_cast<float>(c + omp_get_thread_num());
    for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) acc[c] = fma(acc[c], x, y);
    }
    for (int c = 0; c < kChains; ++c)
      for (int l = 0; l < kLanes; ++l) total += acc[c][l];
  }
  const double seconds = omp_get_wtime() - start;
  *flops = 2.0 * kLanes * kChains * static_cast<double>(rounds) * threads;
  *lanes = kLanes;
  *sink = total;
  return seconds;
}
