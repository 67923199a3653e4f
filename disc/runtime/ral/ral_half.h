// 16-bit floats for disc's generated kernels and its RAL: both include this file, so the two
// convert alike. A 16-bit value is kept as its bits, widened to float to compute and rounded
// back to nearest even once.
#ifndef DISC_RAL_HALF_H
#define DISC_RAL_HALF_H

#include <cstdint>
#include <cstring>

// GCC 12 has no bf16 arithmetic: the conversions are integer steps.
static inline float disc_from_bf16(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline uint16_t disc_to_bf16(float f) {  // to nearest even; a NaN stays a (quiet) NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return f != f ? uint16_t((u >> 16) | 0x40) : uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
// f16 in integer and float steps with selects, not through _Float16: GCC 12 leaves loops that
// convert _Float16 scalar even where the CPU converts vectors of them.
static inline float disc_from_f16(uint16_t h) {
  const uint32_t em = uint32_t(h & 0x7FFF) << 13;  // exponent and mantissa at float's positions
  const uint32_t e = em & 0x0F800000u;
  float sub;  // a subnormal: 2^-14 * (1 + m/1024) - 2^-14
  const uint32_t biased = em + (113u << 23);
  std::memcpy(&sub, &biased, 4);
  sub -= 6.103515625e-05f;
  uint32_t sub_bits;
  std::memcpy(&sub_bits, &sub, 4);
  uint32_t bits = e == 0x0F800000u ? em + (224u << 23) : (e == 0 ? sub_bits : em + (112u << 23));
  bits |= uint32_t(h & 0x8000) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
static inline uint16_t disc_to_f16(float f) {  // to nearest even; past 65504 to inf; NaN stays NaN
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  const uint32_t normal = (a - (112u << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  float magnitude, aligned;  // below 2^-14: adding 0.5 makes the float adder round it to a multiple of 2^-24
  std::memcpy(&magnitude, &a, 4);
  aligned = magnitude + 0.5f;
  uint32_t aligned_bits;
  std::memcpy(&aligned_bits, &aligned, 4);
  const uint32_t sub = aligned_bits - 0x3F000000u;
  const uint32_t big = a > 0x7F800000u ? 0x7E00u : 0x7C00u;
  return uint16_t((a >= 0x47800000u ? big : (a < 0x38800000u ? sub : normal)) | sign);
}

#endif  // DISC_RAL_HALF_H
