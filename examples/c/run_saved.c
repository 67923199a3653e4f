/* run_saved: run a program saved by disc.save from C, with no Python.
 *
 *   run_saved FOLDER OUTDIR INPUT.npy...
 *
 * Loads the saved program in FOLDER, prints what it takes and returns, reads one .npy file per
 * input (format 1.0 or 2.0, little-endian, C order), runs it and writes OUTDIR/output<k>.npy for
 * each output. bf16 tensors travel as <u2 arrays holding their raw bits (numpy has no bf16).
 * Prints "ok" and exits 0; on any error prints why to stderr and exits 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disc_runtime.h"

/* The .npy type string of each DISC_* dtype, in the header's order. */
static const char* const NPY_DESCR[] = {"<f2", "<u2", "<f4", "<f8", "|i1", "|u1", "<i2", "<i4", "<i8", "|b1"};

static void die(const char* what, const char* detail) {
  fprintf(stderr, "run_saved: %s%s\n", what, detail);
  exit(1);
}

static size_t numel(const disc_tensor* t) {
  size_t n = 1;
  for (int32_t d = 0; d < t->rank; ++d) n *= (size_t)t->shape[d];
  return n;
}

static void print_info(const char* kind, const disc_tensor_info* info) {
  printf("%s %s: %s [", kind, info->name, disc_dtype_name(info->dtype));
  for (int32_t d = 0; d < info->rank; ++d) printf("%s%s", d ? ", " : "", info->dims[d]);
  printf("]\n");
}

/* Reads a .npy file into `t` (its data is malloc'ed). */
static void read_npy(const char* path, disc_tensor* t) {
  FILE* f = fopen(path, "rb");
  unsigned char magic[8], len[4];
  if (f == NULL) die("cannot open ", path);
  if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "\x93NUMPY", 6) != 0 || magic[6] < 1 || magic[6] > 3) die("not a .npy file: ", path);
  size_t header_len;
  if (magic[6] == 1) {  /* format 1.0: a 2-byte header length; 2.0 and later: 4 bytes */
    if (fread(len, 1, 2, f) != 2) die("cut short: ", path);
    header_len = len[0] | (size_t)len[1] << 8;
  } else {
    if (fread(len, 1, 4, f) != 4) die("cut short: ", path);
    header_len = len[0] | (size_t)len[1] << 8 | (size_t)len[2] << 16 | (size_t)len[3] << 24;
  }
  char* header = malloc(header_len + 1);
  if (header == NULL || fread(header, 1, header_len, f) != header_len) die("cannot read the header of ", path);
  header[header_len] = '\0';

  /* The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } */
  const char* descr = strstr(header, "'descr':");
  const char* shape = strstr(header, "'shape':");
  if (descr == NULL || shape == NULL || strstr(header, "'fortran_order': False") == NULL) die("not a little-endian C-order array: ", path);
  descr = strchr(descr + 8, '\'');
  t->dtype = -1;
  for (int32_t d = 0; d <= DISC_BOOL && descr != NULL; ++d)
    if (strncmp(descr + 1, NPY_DESCR[d], 3) == 0 && descr[4] == '\'') t->dtype = d;
  if (t->dtype < 0) die("unsupported dtype (not one of <f2 <u2 <f4 <f8 |i1 |u1 <i2 <i4 <i8 |b1) in ", path);

  const char* p = strchr(shape, '(');
  t->rank = 0;
  while (p != NULL && *p != ')') {
    char* end;
    long long dim = strtoll(p + 1, &end, 10);
    if (end != p + 1) {
      if (t->rank == DISC_MAX_RANK || dim < 0) die("bad shape in ", path);
      t->shape[t->rank++] = dim;
    }
    p = strpbrk(end, ",)");
  }
  if (p == NULL) die("bad shape in ", path);
  free(header);

  size_t bytes = numel(t) * disc_dtype_size(t->dtype);
  t->data = malloc(bytes ? bytes : 1);
  if (t->data == NULL || fread(t->data, 1, bytes, f) != bytes) die("cannot read the data of ", path);
  fclose(f);
}

/* Writes `t` as a format 1.0 .npy file. */
static void write_npy(const char* path, const disc_tensor* t) {
  char shape[DISC_MAX_RANK * 24 + 8] = "", header[512];
  for (int32_t d = 0; d < t->rank; ++d)
    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%lld%s", (long long)t->shape[d], t->rank == 1 ? "," : d + 1 < t->rank ? ", " : "");
  int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", NPY_DESCR[t->dtype], shape);
  while ((10 + n + 1) % 64 != 0) header[n++] = ' ';  /* pad so the data starts 64-byte aligned */
  header[n++] = '\n';
  unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
  size_t bytes = numel(t) * disc_dtype_size(t->dtype);
  FILE* f = fopen(path, "wb");
  if (f == NULL || fwrite(prefix, 1, 10, f) != 10 || fwrite(header, 1, (size_t)n, f) != (size_t)n || fwrite(t->data, 1, bytes, f) != bytes || fclose(f) != 0)
    die("cannot write ", path);
}

int main(int argc, char** argv) {
  if (argc < 3) die("usage: run_saved FOLDER OUTDIR INPUT.npy...", "");
  disc_error error;
  disc_model* model = disc_model_load(argv[1], &error);
  if (model == NULL) die(error.message, "");

  int32_t num_inputs = disc_model_num_inputs(model), num_outputs = disc_model_num_outputs(model);
  disc_tensor_info info;
  printf("model %s\n", disc_model_name(model));
  for (int32_t i = 0; i < num_inputs; ++i) disc_model_input_info(model, i, &info), print_info("input", &info);
  for (int32_t k = 0; k < num_outputs; ++k) disc_model_output_info(model, k, &info), print_info("output", &info);
  if (argc - 3 != num_inputs) die("the program takes one .npy file per input", "");

  disc_tensor* inputs = calloc((size_t)num_inputs + 1, sizeof(disc_tensor));
  disc_tensor* outputs = calloc((size_t)num_outputs + 1, sizeof(disc_tensor)); /* data NULL: the runtime allocates */
  if (inputs == NULL || outputs == NULL) die("out of memory", "");
  for (int32_t i = 0; i < num_inputs; ++i) read_npy(argv[3 + i], &inputs[i]);

  if (disc_model_run(model, inputs, num_inputs, outputs, num_outputs, &error) != DISC_OK) die(error.message, "");

  for (int32_t k = 0; k < num_outputs; ++k) {
    char path[4096];
    snprintf(path, sizeof path, "%s/output%d.npy", argv[2], (int)k);
    write_npy(path, &outputs[k]);
    disc_free(outputs[k].data);
  }
  for (int32_t i = 0; i < num_inputs; ++i) free(inputs[i].data);
  free(inputs);
  free(outputs);
  disc_model_free(model);
  printf("ok\n");
  return 0;
}
