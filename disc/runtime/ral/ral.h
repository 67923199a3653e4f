/* disc runtime abstraction layer (RAL): the only interface between a compiled
 * disc program and its host.
 *
 * Generated programs include this header and call library routines and error
 * reporting through a `disc_ral` table of function pointers; they link against
 * nothing (no torch, no oneDNN), so the same artifact runs under PyTorch
 * (plug-in mode) or standalone. The CPU implementation is ral_cpu.cc.
 *
 * Everything a call needs lives in its `disc_ral_ctx`, created by the caller
 * per call, so a compiled program is stateless and may run on many threads.
 */
#ifndef DISC_RAL_H
#define DISC_RAL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DISC_RAL_ABI_VERSION 5
#define DISC_MAX_BATCH_DIMS 6

/* Per-call state. The host allocates it (ctypes) and reads `error` after a
 * nonzero return. */
typedef struct disc_ral_ctx {
  int32_t failed;    /* set by `error` */
  char error[1020];  /* NUL-terminated message of the first error */
} disc_ral_ctx;

/* Element types of a GEMM (A, B and C all of one). 16-bit products accumulate in f32 and C is
 * rounded once, to nearest even; they take alpha = 1, beta = 0 and no packed copy of B. */
#define DISC_GEMM_F32 0
#define DISC_GEMM_BF16 1
#define DISC_GEMM_F16 2

/* C[batch][m, n] = alpha * A[batch][m, k] @ B[batch][k, n] + beta * C[batch]
 * Element (i, p) of A is at a + i*a_rs + p*a_cs + sum_d(bi_d * a_bs[d]);
 * likewise B with (p, j) and C with (i, j) (C's column stride is always 1).
 * Strides are in elements; a stride of 0 repeats (broadcasts) along that dim.
 * Any of m, n, k, batch extents may be 0 or 1. `b_is_constant` says B never
 * changes between calls (a model's weight): the RAL may keep a repacked copy. */
typedef struct disc_gemm_args {
  int64_t m, n, k;
  int32_t batch_rank;                    /* 0..DISC_MAX_BATCH_DIMS */
  int64_t batch_shape[DISC_MAX_BATCH_DIMS];
  const void* a;
  int64_t a_rs, a_cs, a_bs[DISC_MAX_BATCH_DIMS];
  const void* b;
  int64_t b_rs, b_cs, b_bs[DISC_MAX_BATCH_DIMS];
  void* c;
  int64_t c_rs, c_bs[DISC_MAX_BATCH_DIMS];
  float alpha, beta;
  int32_t b_is_constant;
  int32_t dtype; /* DISC_GEMM_F32, DISC_GEMM_BF16 or DISC_GEMM_F16 */
} disc_gemm_args;

/* 2-D convolution, NCHW input/output (contiguous; NHWC when `channels_last`),
 * OIHW weight (contiguous, I = ci / groups). Output extents are given (the
 * program computed them). The forward call also applies its epilogue, in this
 * order: output += bias[channel] (when `bias` is not null), then ReLU (when
 * `relu`); the gradients read neither. */
typedef struct disc_conv2d_args {
  int64_t n, ci, h, w;
  int64_t co, kh, kw;
  int64_t oh, ow;
  int64_t stride[2], dilation[2];
  int64_t pad_lo[2], pad_hi[2];
  int64_t groups;
  int32_t channels_last; /* input and output are NHWC */
  const float* input;
  const float* weight;
  int32_t weight_is_constant; /* weights never change between calls: the RAL may cache a reordered copy */
  float* output;
  const float* bias; /* co values, or null */
  int32_t relu;
} disc_conv2d_args;

typedef struct disc_ral {
  int32_t abi_version;    /* DISC_RAL_ABI_VERSION */
  const char* gemm_library; /* e.g. "oneDNN 2.6.3" or "builtin" */
  /* Records the first error of the call; the program then returns nonzero. */
  void (*error)(disc_ral_ctx* ctx, const char* message);
  /* Scratch memory beyond the planned workspace (e.g. a library's packing). */
  void* (*alloc)(disc_ral_ctx* ctx, int64_t bytes);
  void (*free)(disc_ral_ctx* ctx, void* ptr);
  /* Return 0 on success; on failure they call `error` and return nonzero. */
  int32_t (*gemm)(disc_ral_ctx* ctx, const disc_gemm_args* args);
  int32_t (*conv2d)(disc_ral_ctx* ctx, const disc_conv2d_args* args);
  /* The gradients of conv2d, described by the forward problem's args: backward_data writes
   * dL/dx into `input` from dL/dy in `output` and `weight`; backward_weights writes dL/dw
   * into `weight` from `input` and dL/dy in `output`. weight_is_constant is not read. */
  int32_t (*conv2d_backward_data)(disc_ral_ctx* ctx, const disc_conv2d_args* args);
  int32_t (*conv2d_backward_weights)(disc_ral_ctx* ctx, const disc_conv2d_args* args);
} disc_ral;

/* Exported by the RAL library: the table for this process. */
const disc_ral* disc_ral_cpu(void);

#ifdef __cplusplus
}
#endif

#endif /* DISC_RAL_H */
