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
 * model.safetensors); with an index, also mtp.safetensors (the MTP sidecar)
 * when the index does not list it. Validates everything, rejects duplicate names across
 * shards, a missing shard, or an index entry that names a tensor its shard
 * lacks. Returns 0 or -1 + err. */
int st_open_dir(st_set *set, const char *dir, lilac_err *err);

/* Binary search by exact name; NULL if absent. */
const st_tensor *st_find(const st_set *set, const char *name);

void st_close(st_set *set);

/* Truncation guard. The shards stay mmapped (MAP_PRIVATE, read-only): the CPU
 * backend reads its weights in place, so 19 GB are neither copied nor held
 * twice. A shard truncated (or replaced by a shorter file written in place)
 * while lilac runs would raise SIGBUS at the next access to a page past its
 * new end and kill the process. st_open_dir installs a SIGBUS handler that,
 * for a fault inside a mapped shard, maps zero pages over the rest of that
 * shard (the access then completes, with zeros) and records the damage;
 * faults anywhere else keep their previous disposition. Whoever computes with
 * the weights checks st_damaged() after the work and reports a clean error
 * instead of the zeros' result. Returns true, with the shard's path in
 * path[0..cap) when path is not NULL, once any shard has faulted. */
bool st_damaged(char *path, size_t cap);

#endif
