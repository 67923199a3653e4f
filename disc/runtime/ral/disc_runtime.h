/* disc standalone runtime: run a saved disc program (a folder written by disc.save) from C,
 * with no Python and no PyTorch.
 *
 * The folder holds interface.txt (what the program takes and returns, and the digests of the
 * other files), program.so (the generated code) and constants.bin (the parameters). Loading
 * checks every file against interface.txt, the library's ABI and the CPU it was built for, and
 * refuses with a message naming the file and the reason; nothing is loaded half-way. A saved
 * program is native code: load only programs you trust.
 *
 * A loaded model is read-only: any number of threads may call disc_model_run on it at once.
 * Every error is returned through a disc_error the caller owns; messages name the input, the
 * dim and the rule, as the Python API's do. The functions live in the RAL library (the same
 * library the program calls for GEMMs and convolutions).
 */
#ifndef DISC_RUNTIME_H
#define DISC_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DISC_RUNTIME_VERSION 1
#define DISC_MAX_RANK 16

/* Status codes (disc_error.status and the return value of the calls that return int32_t). */
#define DISC_OK 0
#define DISC_ERROR_FILE 1        /* a file of the folder is missing, damaged or not a disc program */
#define DISC_ERROR_INPUT 2       /* wrong number of inputs, dtype or rank, or a null buffer */
#define DISC_ERROR_SHAPE 3       /* an input dim breaks a rule of the compiled program */
#define DISC_ERROR_RUN 4         /* the program or a library routine failed at run time */
#define DISC_ERROR_UNSUPPORTED 5 /* the program needs PyTorch, a GPU or another CPU */
#define DISC_ERROR_MEMORY 6      /* an allocation failed */

/* Element types, in the IR's names: f16 bf16 f32 f64 i8 u8 i16 i32 i64 i1 (bool, one byte) u16 u32
 * u64 (numbered in the order they joined, so saved programs keep their codes). */
#define DISC_F16 0
#define DISC_BF16 1
#define DISC_F32 2
#define DISC_F64 3
#define DISC_I8 4
#define DISC_U8 5
#define DISC_I16 6
#define DISC_I32 7
#define DISC_I64 8
#define DISC_BOOL 9
#define DISC_U16 10
#define DISC_U32 11
#define DISC_U64 12

typedef struct disc_error {
  int32_t status;     /* DISC_OK or a DISC_ERROR_* */
  char message[1024]; /* NUL-terminated; empty when status is DISC_OK */
} disc_error;

/* What an input or output is. `dims[d]` is the dim's text: a number ("768") for a static dim,
 * the symbol's name ("batch", "s0") for a dynamic one, "?" for one the program computes; the
 * array ends with a null pointer after its `rank` entries. The strings belong to the model and
 * live as long as it. */
typedef struct disc_tensor_info {
  const char* name;
  int32_t dtype;
  int32_t rank;
  const char* const* dims;
} disc_tensor_info;

/* A dense, contiguous (row-major) tensor. */
typedef struct disc_tensor {
  int32_t dtype;
  int32_t rank;
  int64_t shape[DISC_MAX_RANK];
  void* data; /* may be null when the tensor has no elements */
} disc_tensor;

typedef struct disc_model disc_model;

/* Load the program saved in `folder`; null on failure (then `error` says why). */
disc_model* disc_model_load(const char* folder, disc_error* error);
void disc_model_free(disc_model* model);

const char* disc_model_name(const disc_model* model);
int32_t disc_model_num_inputs(const disc_model* model);
int32_t disc_model_num_outputs(const disc_model* model);
/* DISC_OK, or DISC_ERROR_INPUT for an index out of range. */
int32_t disc_model_input_info(const disc_model* model, int32_t index, disc_tensor_info* info);
int32_t disc_model_output_info(const disc_model* model, int32_t index, disc_tensor_info* info);

/* The dtype, rank and shape of every output for these inputs (their data is not read, and the
 * outputs' `data` is left as it is): what a caller allocates before disc_model_run. An output
 * whose length depends on the data (a nonzero's count) gets the most it can be. */
int32_t disc_model_output_shapes(const disc_model* model, const disc_tensor* inputs, int32_t num_inputs,
                                 disc_tensor* outputs, int32_t num_outputs, disc_error* error);

/* Run the program. For each output, `data` null asks the runtime to allocate it (release it with
 * disc_free); otherwise it must hold as many elements as disc_model_output_shapes gave (the
 * runtime cannot check a caller's buffer size). On success each output's dtype, rank and shape
 * are the ones it was computed at (a data-dependent output may be shorter than its buffer; its
 * elements come first). On failure nothing is allocated (outputs whose `data` was null stay
 * null), but a caller's buffers may have been partly written. */
int32_t disc_model_run(const disc_model* model, const disc_tensor* inputs, int32_t num_inputs,
                       disc_tensor* outputs, int32_t num_outputs, disc_error* error);

void disc_free(void* data);
size_t disc_dtype_size(int32_t dtype);   /* 0 for an unknown dtype */
const char* disc_dtype_name(int32_t dtype); /* "f32", ...; "?" for an unknown dtype */

#ifdef __cplusplus
}
#endif

#endif /* DISC_RUNTIME_H */
