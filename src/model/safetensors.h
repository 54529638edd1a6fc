/* safetensors.h — memory-mapped safetensors files (single file or index + shards).
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {...}}, then the data region; offsets are relative to its start.
 * Every header is validated before any tensor is used: offsets inside the file,
 * no overlapping tensors, dtype size x shape product == byte length, no duplicate
 * names (also across shards). Data is never copied: tensors point into the mmap. */
#ifndef LILAC_SAFETENSORS_H
#define LILAC_SAFETENSORS_H

#include "../util/common.h"

typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_U16, ST_I16, ST_F16, ST_BF16, ST_U32, ST_I32, ST_F32,
    ST_U64, ST_I64, ST_F64, ST_F8_E4M3, ST_F8_E5M2, ST_DTYPE_COUNT
} st_dtype;

#define ST_MAX_DIMS 8

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;   /* points into the shard's mmap */
    size_t nbytes;
    int shard;          /* index into st_set.shards */
} st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
} st_shard;

typedef struct {
    st_shard *shards;
    int n_shards;
    st_tensor *tensors; /* sorted by name */
    int n_tensors;
} st_set;

const char *st_dtype_name(st_dtype t);
size_t st_dtype_size(st_dtype t);

/* Parse and validate one header held in memory (the whole file image: 8-byte
 * length + JSON + data). Appends tensors to *set with shard index `shard`
 * (data pointers into `buf`). `fname` is used in error messages only.
 * This is the pure parser the fuzz target drives. Returns 0 or -1 + err. */
int st_parse_buffer(st_set *set, int shard, const void *buf, size_t len, const char *fname,
                    lilac_err *err);

/* Open a model directory: model.safetensors.index.json + shards if the index
 * exists, else every *.safetensors file in the directory (normally one
 * model.safetensors). Validates everything, rejects duplicate names across
 * shards, a missing shard, or an index entry that names a tensor its shard
 * lacks. Returns 0 or -1 + err. */
int st_open_dir(st_set *set, const char *dir, lilac_err *err);

/* Binary search by exact name; NULL if absent. */
const st_tensor *st_find(const st_set *set, const char *name);

void st_close(st_set *set);

#endif
