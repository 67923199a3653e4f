"""C++ for each elementwise op: one table, read like the op set's spec.

Each entry formats operand expressions into a C++ expression. The helpers it
calls (``disc_gelu``...) live in ``PRELUDE``, generic over float/double, with
NaN propagated the way PyTorch propagates it.
"""

from __future__ import annotations

# The C++ type each IR dtype is computed in: 16-bit floats are widened to float when loaded,
# computed in float and rounded (to nearest even) once, where stored or explicitly converted.
C_TYPES = {
    "f16": "float",
    "bf16": "float",
    "f32": "float",
    "f64": "double",
    "i64": "int64_t",
    "i32": "int32_t",
    "i16": "int16_t",
    "i8": "int8_t",
    "u8": "uint8_t",
    "u16": "uint16_t",
    "u32": "uint32_t",
    "u64": "uint64_t",
    "i1": "bool",
}

# The element type of a buffer of each dtype computed in a wider one, and its conversions.
C_STORAGE = {"f16": "uint16_t", "bf16": "uint16_t"}
WIDEN = {"f16": "disc_from_f16({0})", "bf16": "disc_from_bf16({0})"}
NARROW = {"f16": "disc_to_f16({0})", "bf16": "disc_to_bf16({0})"}
FLOATS = ("f16", "bf16", "f32", "f64")


def storage_type(dtype: str) -> str:
    """The C++ element type of a buffer of ``dtype``."""
    return C_STORAGE.get(dtype, C_TYPES[dtype])


UNARY = {
    "neg": "(-{0})",
    "abs": "std::abs({0})",
    "sign": "disc_sign({0})",
    "exp": "disc_exp({0})",
    "expm1": "std::expm1({0})",
    "log": "std::log({0})",
    "log1p": "std::log1p({0})",
    "log2": "std::log2({0})",
    "log10": "std::log10({0})",
    "sqrt": "std::sqrt({0})",
    "rsqrt": "(1 / std::sqrt({0}))",
    "reciprocal": "(1 / {0})",
    "tanh": "std::tanh({0})",
    "sigmoid": "disc_sigmoid({0})",
    "sin": "std::sin({0})",
    "cos": "std::cos({0})",
    "erf": "std::erf({0})",
    "tan": "std::tan({0})",
    "asin": "std::asin({0})",
    "acos": "std::acos({0})",
    "atan": "std::atan({0})",
    "sinh": "std::sinh({0})",
    "cosh": "std::cosh({0})",
    "asinh": "std::asinh({0})",
    "acosh": "std::acosh({0})",
    "atanh": "std::atanh({0})",
    "floor": "std::floor({0})",
    "ceil": "std::ceil({0})",
    "round": "std::nearbyint({0})",  # half to even, as torch.round
    "relu": "disc_relu({0})",
    "logical_not": "(!{0})",
    "bitwise_not": "disc_bitnot({0})",
    "isnan": "({0} != {0})",
    "isinf": "disc_isinf({0})",
    "gelu": "disc_gelu({0})",
    "gelu_tanh": "disc_gelu_tanh({0})",
    "silu": "disc_silu({0})",
}

# Integer division and remainder: by 0 they record a fault that the call reports as torch's
# ZeroDivisionError (a hardware division would kill the process), and MIN / -1 wraps to MIN as
# torch's floor division gives (the hardware division traps there too); `s` is the kernel's Shapes.
INT_DIVISION = {
    "div": "disc_int_div({0}, {1}, s.fault)",
    "floor_div": "disc_int_floor_div({0}, {1}, s.fault)",
    "remainder": "disc_int_remainder({0}, {1}, s.fault)",
    "fmod": "disc_int_fmod({0}, {1}, s.fault)",
}

# Integer add, sub, mul, neg and abs wrap around as torch's do. Written through unsigned
# arithmetic: signed overflow is undefined in C++, and GCC used that to fold
# `x < x + (x + y)` into `0 < x + y`, which differs where the sum wraps (a wrong answer).
INT_WRAPPING = {
    "add": "disc_wrap_add({0}, {1})",
    "sub": "disc_wrap_sub({0}, {1})",
    "mul": "disc_wrap_mul({0}, {1})",
    "neg": "disc_wrap_neg({0})",
    "abs": "disc_wrap_abs({0})",
}

BINARY = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",  # floats; integers divide through INT_DIVISION
    "floor_div": "disc_floor_div({0}, {1})",
    "remainder": "disc_remainder({0}, {1})",
    "fmod": "disc_fmod({0}, {1})",
    "pow": "disc_pow({0}, {1})",
    "maximum": "disc_max({0}, {1})",
    "minimum": "disc_min({0}, {1})",
    "atan2": "std::atan2({0}, {1})",
    "logical_and": "({0} && {1})",
    "logical_or": "({0} || {1})",
    "logical_xor": "(bool({0}) != bool({1}))",
    "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})",
    "shift_left": "disc_shift_left({0}, {1})",
    "shift_right": "disc_shift_right({0}, {1})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
}

# Reductions: identity and the combining expression.
REDUCE_INIT = {
    "sum": "0",
    "prod": "1",
    "max": "-std::numeric_limits<{t}>::infinity()",
    "min": "std::numeric_limits<{t}>::infinity()",
    "any": "false",
    "all": "true",
}
REDUCE_INIT_INT = {"max": "std::numeric_limits<{t}>::lowest()", "min": "std::numeric_limits<{t}>::max()"}
REDUCE_STEP = {
    "sum": "{acc} += {x}",
    "prod": "{acc} *= {x}",
    "max": "{acc} = disc_max({acc}, {x})",
    "min": "{acc} = disc_min({acc}, {x})",
    "any": "{acc} = {acc} || {x}",
    "all": "{acc} = {acc} && {x}",
}
# Reductions OpenMP can vectorise with `simd reduction(op:acc)`; max/min use NaN-propagating helpers instead.
SIMD_REDUCTION = {"sum": "+", "prod": "*"}

PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <limits>
#include <memory>
#include <omp.h>
#include <type_traits>
#include <utility>
#include <vector>
#include "ral.h"

// Kernels are shared between the program's translation units but not exported from its library.
#define DISC_HIDDEN __attribute__((visibility("hidden")))

// glibc's vector math library (libmvec) has SIMD versions of these; declaring them lets
// `#pragma omp simd` loops call them instead of falling back to scalar code (glibc only
// declares them itself under -ffast-math, which would also drop NaN/inf semantics).
#define DISC_SIMD_MATH(name) \
  extern "C" float name##f(float) noexcept __attribute__((__simd__("notinbranch"))); \
  extern "C" double name(double) noexcept __attribute__((__simd__("notinbranch")));
DISC_SIMD_MATH(exp) DISC_SIMD_MATH(log) DISC_SIMD_MATH(tanh) DISC_SIMD_MATH(erf) DISC_SIMD_MATH(sin)
DISC_SIMD_MATH(cos) DISC_SIMD_MATH(expm1) DISC_SIMD_MATH(log1p) DISC_SIMD_MATH(log2) DISC_SIMD_MATH(log10)
DISC_SIMD_MATH(tan) DISC_SIMD_MATH(asin) DISC_SIMD_MATH(acos) DISC_SIMD_MATH(atan) DISC_SIMD_MATH(sinh)
DISC_SIMD_MATH(cosh) DISC_SIMD_MATH(asinh) DISC_SIMD_MATH(acosh) DISC_SIMD_MATH(atanh)
extern "C" float powf(float, float) noexcept __attribute__((__simd__("notinbranch")));
extern "C" double pow(double, double) noexcept __attribute__((__simd__("notinbranch")));
#undef DISC_SIMD_MATH

// exp's range reduction: x = n ln2 + r, |r| <= ln2/2; returns r, with n + 0x4B400000 in *bits.
static inline float disc_exp_reduce(float x, int32_t* bits) {
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float t = x * 1.44269504088896341f + shifter;
  std::memcpy(bits, &t, 4);
  const float n = t - shifter;
  return (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;  // ln2 in two parts
}
// e^r by its Taylor polynomial of degree 6 or 7, by Horner.
template <int Degree> static inline float disc_exp_taylor(float r) {
  static_assert(Degree == 6 || Degree == 7, "disc_exp_taylor: degree 6 or 7");
  float p = 1.0f / 720.0f;
  if constexpr (Degree == 7) p = (1.0f / 5040.0f) * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}
// float exp as straight-line code the vectoriser inlines. libmvec's expf is as fast on ordinary
// inputs but drops to scalar code for a whole vector when one lane underflows, which is every
// masked position of an attention softmax (x + finfo.min): 4x slower there. exp(x) = 2^n e^r with
// n = round(x/ln2), |r| <= ln2/2, e^r by its degree-7 Taylor polynomial (< 1 ulp measured over
// [-110, 90] against double exp), 2^n applied in two halves so subnormal results round once and
// 2^n stays representable after x is clamped; NaN passes through the arithmetic unchanged.
static inline float disc_exp(float x) {
  x = x < -104.0f ? -104.0f : x;
  x = x > 89.0f ? 89.0f : x;
  int32_t tb;
  const float p = disc_exp_taylor<7>(disc_exp_reduce(x, &tb));
  const int32_t k = tb - 0x4B400000, k1 = k >> 1, k2 = k - k1;
  const int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  return p * s1 * s2;
}
static inline double disc_exp(double x) { return std::exp(x); }
// disc_exp for x <= 0 or NaN (x minus its row's max, as in every softmax), bit for bit, in fewer
// operations: no upper clamp, and 2^n as one scale 2^(n+64) (a normal float for every n >= -151)
// times 2^-64, which rounds once into the subnormals as disc_exp's two halves do. Masked softmax
// at 96 MB on the AVX2 EPYC: 13.8 -> 11.7 ms a call.
static inline float disc_exp_nonpositive_arg(float x) {
  x = x < -104.0f ? -104.0f : x;
  int32_t tb;
  const float p = disc_exp_taylor<7>(disc_exp_reduce(x, &tb));
  const int32_t bits = (tb - 0x4B400000 + 64 + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale * 5.42101086242752217e-20f;  // 2^-64
}
static inline double disc_exp_nonpositive_arg(double x) { return std::exp(x); }

// random_uniform (disc/ir/ops/random.py): a SplitMix64 mix of (seed, site, position), the same bits
// as the reference; 64-bit multiplies vectorise with AVX-512DQ.
static inline float disc_uniform(int64_t seed, uint64_t site_offset, int64_t i) {
  uint64_t z = uint64_t(seed) + site_offset + uint64_t(i) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(int32_t(z >> 40)) * 5.9604644775390625e-08f;
}

// NaN-propagating max/min (a NaN in either operand wins, as in torch). Written as two selects:
// as one select on `a != a || a > b`, GCC on AVX2 left a max-pool window loop scalar (it sank
// the window's loads into branches), 2.4 ms of ResNet-18's 26 ms at 224x224.
template <class T> static inline T disc_max(T a, T b) { const T m = a > b ? a : b; return a != a ? a : m; }
template <class T> static inline T disc_min(T a, T b) { const T m = a < b ? a : b; return a != a ? a : m; }
template <class T> static inline T disc_relu(T x) { return x < T(0) ? T(0) : x; }
template <class T> static inline T disc_sign(T x) { return T((T(0) < x) - (x < T(0))); }
template <class T> static inline bool disc_isinf(T x) {
  if constexpr (std::is_floating_point<T>::value) return x == std::numeric_limits<T>::infinity() || x == -std::numeric_limits<T>::infinity();
  else return false;  // integers are never infinite (torch.isinf agrees)
}
static inline bool disc_bitnot(bool x) { return !x; }
// A bool read from memory, as a byte compared with 0: GCC (12) does not vectorise a select or a
// float conversion on a loaded `bool` on AVX2 ("relevant stmt not supported"), and so left BERT
// training's LayerNorm-backward and masked kernels scalar; on a loaded byte it does.
static inline bool disc_load_bool(const bool* p) { return *reinterpret_cast<const uint8_t*>(p) != 0; }
#include "ral_half.h"  // disc_from_bf16, disc_to_bf16, disc_from_f16, disc_to_f16
template <class T> static inline T disc_bitnot(T x) { return ~x; }
template <class T> static inline T disc_sigmoid(T x) { return T(1) / (T(1) + disc_exp(-x)); }
template <class T> static inline T disc_silu(T x) { return x / (T(1) + disc_exp(-x)); }
template <class T> static inline T disc_gelu(T x) { return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440))); }
template <class T> static inline T disc_gelu_tanh(T x) {
  return T(0.5) * x * (T(1) + std::tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x)));
}
// e^x for x in [-87, 0], where the result is a normal float: one 2^n scale and no clamps, e^r by
// its degree-6 Taylor polynomial (|r| <= ln2/2: < 1.3e-7 relative). For callers that bound x.
static inline float disc_exp_nonpositive(float x) {
  int32_t tb;
  const float p = disc_exp_taylor<6>(disc_exp_reduce(x, &tb));
  const int32_t bits = (tb - 0x4B400000 + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}
// float GELU as straight-line code the vectoriser inlines, 1.3-1.4x faster than with libmvec's erff
// (the bias + GELU after an FFN GEMM is compute-bound). gelu(x) = x/2 (1 + erf(z)), z = x/sqrt2;
// 1 + erf(z) is erfc(|z|) for z < 0 and 2 - erfc(|z|) otherwise, so the negative tail keeps its
// relative accuracy (1 + erf(z) cancels there). erfc(a) = e^(-a^2) t P(t), t = 1/(1 + 0.4a), P of
// degree 8 fitted by reweighted least squares against double erfc for a in [0, 10] (relative error
// < 7e-8); a^2 = x^2/2 is taken as hi + lo (fma) so e^(-a^2) does not amplify its rounding. Max
// relative error on [-13.5, 13.5]: 5.1e-7 (eager's float GELU: 0.27 at x = -5). Below x = -13 the
// result is -0 (it is under 1e-37): capping |x| keeps every lane's arithmetic in normal floats,
// since subnormal operands cost 8x. +-inf give NaN, as eager's float kernels do (its one-element
// path and double give inf for +inf; we follow the kernel every tensor but a scalar meets).
static inline float disc_gelu(float x) {
  const float ax = std::min(std::fabs(x), 13.0f);
  const float t = 1.0f / (1.0f + 0.4f * 0.70710678118654752f * ax);
  float p = 0.0412563942f;
  p = p * t - 0.140335262f;
  p = p * t + 0.0840196982f;
  p = p * t + 0.0879281908f;
  p = p * t + 0.0797807202f;
  p = p * t + 0.193383247f;
  p = p * t + 0.201890036f;
  p = p * t + 0.226442784f;
  p = p * t + 0.225634247f;
  const float sq = ax * ax;
  const float lo = std::fma(ax, ax, -sq);
  float erfc = t * p * disc_exp_nonpositive(-0.5f * sq) * (1.0f - 0.5f * lo);
  const float big = std::fabs(x);
  erfc = big < 13.0f ? erfc : big - big;  // 0 for a finite tail, NaN for inf and NaN
  return 0.5f * x * (x >= 0.0f ? 2.0f - erfc : erfc);
}
template <class T> static inline T disc_pow(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::pow(a, b);
  T r = 1; for (T i = 0; i < b; ++i) r *= a; return r;
}
// Floor of the exact quotient (torch's and Python's //): floor(a / b) is wrong where a / b rounds
// up to an integer the exact quotient lies just below (3.3238 / -0.01222 = -272.00001 -> -272.0).
// a - fmod(a, b) is an exact multiple of b, so their quotient is the truncated quotient up to
// rounding; step down where fmod's sign differs from b's, then round that near-integer.
template <class T> static inline T disc_floor_div(T a, T b) {
  if (b == 0) return a / b;
  const T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
  if (div == 0) return std::copysign(T(0), a / b);
  const T down = std::floor(div);
  return div - down > T(0.5) ? down + T(1) : down;
}
template <class T> static inline T disc_remainder(T a, T b) { T r = std::fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
template <class T> static inline T disc_fmod(T a, T b) { return std::fmod(a, b); }
// Integer arithmetic that wraps (INT_WRAPPING): unsigned, and at least as wide as unsigned int,
// so 8- and 16-bit operands are not promoted to a signed int that could overflow.
template <class T> using disc_wide_unsigned = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
template <class T> static inline T disc_wrap_add(T a, T b) { using U = disc_wide_unsigned<T>; return T(U(a) + U(b)); }
template <class T> static inline T disc_wrap_sub(T a, T b) { using U = disc_wide_unsigned<T>; return T(U(a) - U(b)); }
template <class T> static inline T disc_wrap_mul(T a, T b) { using U = disc_wide_unsigned<T>; return T(U(a) * U(b)); }
template <class T> static inline T disc_wrap_neg(T a) { using U = disc_wide_unsigned<T>; return T(U(0) - U(a)); }
template <class T> static inline T disc_wrap_abs(T a) { return a < T(0) ? disc_wrap_neg(a) : a; }
// Shifts by any amount (C++ leaves a negative or too wide one undefined): outside [0, bits) what
// the sign fill alone gives, as ONNX's BitShift and PyTorch define it. A left shift goes through
// the unsigned type: a signed one past the sign bit is undefined before C++20.
template <class T> static inline bool disc_shift_outside(T b) {
  if constexpr (std::is_signed<T>::value) return b < T(0) || b >= T(8 * sizeof(T));
  else return b >= T(8 * sizeof(T));
}
template <class T> static inline T disc_shift_left(T a, T b) {
  using U = disc_wide_unsigned<T>;
  return disc_shift_outside(b) ? T(0) : T(U(a) << b);
}
template <class T> static inline T disc_shift_right(T a, T b) {
  return disc_shift_outside(b) ? (a < T(0) ? T(-1) : T(0)) : T(a >> b);
}
template <class To, class From> static inline To disc_bitcast(From x) {
  static_assert(sizeof(To) == sizeof(From), "disc_bitcast keeps the width");
  To y;
  std::memcpy(&y, &x, sizeof(To));
  return y;
}
// Integers divide through these (INT_DIVISION), never the float forms above.
template <class T> static inline T disc_int_div(T a, T b, int32_t* fault) {
  if (b == 0) { __atomic_store_n(fault, 1, __ATOMIC_RELAXED); return 0; }
  if constexpr (std::is_signed<T>::value) {
    if (b == T(-1)) return T(T(0) - std::make_unsigned_t<T>(a));  // wraps at MIN, where a / -1 traps
  }
  return a / b;
}
template <class T> static inline T disc_int_floor_div(T a, T b, int32_t* fault) {
  const T q = disc_int_div(a, b, fault);
  if constexpr (!std::is_signed<T>::value) return q;
  return (b != 0 && b != T(-1) && q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <class T> static inline T disc_int_fmod(T a, T b, int32_t* fault) {
  if (b == 0) { __atomic_store_n(fault, 1, __ATOMIC_RELAXED); return 0; }
  if constexpr (std::is_signed<T>::value) return b == T(-1) ? T(0) : T(a % b);
  return T(a % b);
}
template <class T> static inline T disc_int_remainder(T a, T b, int32_t* fault) {
  const T r = disc_int_fmod(a, b, fault);
  if constexpr (!std::is_signed<T>::value) return r;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// An index read from data (gather, index_select): with `wrap` a negative one counts from the end;
// out of range it records a fault the call reports as an IndexError and gives -1, so the kernel
// reads nothing (eager raises; reading there would return garbage or kill the process).
static inline int64_t disc_checked_index(int64_t i, int64_t size, bool wrap, int32_t* fault) {
  const int64_t j = wrap && i < 0 ? i + size : i;
  if (j >= 0 && j < size) return j;
  __atomic_store_n(fault, 2, __ATOMIC_RELAXED);
  return -1;
}
// b = 0 gives 0: the program's check that the divisor is positive then reports the error
// (computing a symbol precedes checking it), where a hardware division would kill the process.
static inline int64_t disc_floordiv_i(int64_t a, int64_t b) { if (b == 0) return 0; int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t disc_threads() { return omp_get_max_threads(); }
// Threads for `work` elements, each given at least `grain` of them (1: run on the calling thread).
static inline int disc_team(int64_t work, int64_t grain) { return (int)std::max<int64_t>(1, std::min<int64_t>(disc_threads(), work / grain)); }

// nonzero: the positions of mask's true elements, ascending, into out (room for n); returns how
// many. One pass writes every position and advances only past true ones (no branch to mispredict
// on a random mask). Large masks take two passes over one chunk per thread: count, then write
// from the chunk's first position (with a branch: a chunk must not write past its own part).
static inline int64_t disc_nonzero(const bool* mask, int64_t n, int64_t* out) {
  const uint8_t* m = reinterpret_cast<const uint8_t*>(mask);
  if (n < (int64_t(1) << 16) || omp_get_max_threads() == 1) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i) { out[k] = i; k += m[i] != 0; }
    return k;
  }
  std::vector<int64_t> start(omp_get_max_threads() + 1, 0);
  int chunks = 1;
  #pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    int64_t count = 0;
    for (int64_t i = lo; i < hi; ++i) count += m[i] != 0;
    start[t + 1] = count;
    #pragma omp barrier
    #pragma omp single
    {
      chunks = nt;
      for (int j = 0; j < nt; ++j) start[j + 1] += start[j];
    }
    int64_t k = start[t];
    for (int64_t i = lo; i < hi; ++i) if (m[i]) out[k++] = i;
  }
  return start[chunks];
}
static inline int64_t disc_align(int64_t bytes) { return (bytes + 63) & ~int64_t(63); }

// Offsets for n workspace slots at this call's sizes; returns the workspace bytes. Slot i must
// not overlap the slots clash[clash_start[i] .. clash_start[i+1]) (live at the same time).
// Largest first, each at the lowest offset clear of its already placed clashing slots
// (first-fit decreasing): deterministic, so disc_shapes and disc_run agree.
static inline int64_t disc_place_slots(int n, const int64_t* bytes, const int32_t* clash_start, const int32_t* clash, int64_t* off) {
  std::vector<int> order(n);
  std::vector<char> placed(n, 0);
  std::vector<std::pair<int64_t, int64_t>> taken;
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return disc_align(bytes[a]) > disc_align(bytes[b]); });
  int64_t total = 0;
  for (int i : order) {
    const int64_t size = disc_align(bytes[i]);
    taken.clear();
    for (int c = clash_start[i]; c < clash_start[i + 1]; ++c)
      if (placed[clash[c]] && bytes[clash[c]] > 0) taken.emplace_back(off[clash[c]], off[clash[c]] + disc_align(bytes[clash[c]]));
    std::sort(taken.begin(), taken.end());
    int64_t at = 0;
    for (const auto& t : taken) {  // the first gap that fits
      if (t.first >= at + size) break;
      if (t.second > at) at = t.second;
    }
    off[i] = at;
    placed[i] = 1;
    if (at + size > total) total = at + size;
  }
  return total;
}
"""


def bitcast(expr: str, source: str, target: str) -> str:
    """``expr`` (a ``source`` value, as computed) with its bits read as ``target``: a 16-bit float is
    computed in float, so its bits are those of its rounding (exact: it holds a 16-bit value)."""
    if source in NARROW:
        expr = NARROW[source].format(expr)
    bits = f"disc_bitcast<{'uint8_t' if target == 'i1' else storage_type(target)}>({'uint8_t' if source == 'i1' else storage_type(source)}({expr}))"
    if target == "i1":
        return f"({bits} != 0)"
    return WIDEN[target].format(bits) if target in WIDEN else bits


def literal(value: object, dtype: str) -> str:
    """A C++ literal of ``value`` in ``dtype`` (inf and nan included)."""
    t = C_TYPES[dtype]
    if dtype == "i1":
        return "true" if value else "false"
    if dtype in FLOATS:
        v = float(value)  # type: ignore[arg-type]
        if v != v:
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if v in (float("inf"), float("-inf")):
            return f"{'-' if v < 0 else ''}std::numeric_limits<{t}>::infinity()"
        return f"{t}({v!r})"
    if dtype in ("u32", "u64"):  # past INT64_MAX a literal without the suffix is ill-formed
        return f"{t}({int(value)}ull)"  # type: ignore[call-overload]
    return f"{t}({int(value)})"  # type: ignore[call-overload]
