/* fuzz_safetensors.c — libFuzzer target for st_parse_buffer.
 * The input is a whole safetensors file image. It is parsed from an unaligned
 * copy (offset 1) into a set with one hand-built shard whose map is NULL,
 * then parsed a second time as another shard (exercises the merge and the
 * cross-shard duplicate check), the set's invariants (the tensors tile the
 * data region) are checked, and
 * st_close frees everything. Any crash, leak, UB or broken invariant aborts. */
#include <stdio.h>
#include <stdlib.h>

#include "model/safetensors.h"

#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s\n", #c); abort(); } } while (0)

static void check_set(const st_set *set, const unsigned char *buf, size_t len) {
    for (int i = 0; i < set->n_tensors; i++) {
        const st_tensor *t = &set->tensors[i];
        REQUIRE(t->name != NULL);
        if (i > 0) REQUIRE(strcmp(set->tensors[i - 1].name, t->name) < 0);
        REQUIRE(st_find(set, t->name) == t);
        REQUIRE(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        REQUIRE((int)t->dtype >= 0 && t->dtype < ST_DTYPE_COUNT);
        const unsigned char *d = t->data;
        REQUIRE(d >= buf && d <= buf + len && t->nbytes <= (size_t)(buf + len - d));
        uint64_t n = st_dtype_size(t->dtype);
        for (int k = 0; k < t->ndim; k++) n *= (uint64_t)t->shape[k];
        REQUIRE(n == t->nbytes);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *mem = malloc(size + 1);
    if (!mem) return 0;
    unsigned char *buf = mem + 1; /* deliberately unaligned */
    if (size) memcpy(buf, data, size);

    st_set set;
    memset(&set, 0, sizeof set);
    set.shards = calloc(2, sizeof(st_shard));
    set.n_shards = 2;
    set.shards[0].path = xstrdup("fuzz-0.safetensors");
    set.shards[1].path = xstrdup("fuzz-1.safetensors");

    lilac_err err;
    err.msg[0] = 0;
    int rc = st_parse_buffer(&set, 0, buf, size, "fuzz-0.safetensors", &err);
    if (rc != 0) {
        REQUIRE(err.msg[0] != 0 && strchr(err.msg, '\n') == NULL);
        REQUIRE(set.n_tensors == 0);
    } else {
        check_set(&set, buf, size);
        /* the tensors tile the data region: their bytes add up to it exactly */
        uint64_t hlen = 0, covered = 0;
        for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
        for (int i = 0; i < set.n_tensors; i++) covered += set.tensors[i].nbytes;
        REQUIRE(covered == size - 8 - hlen);
        int n = set.n_tensors;
        err.msg[0] = 0;
        rc = st_parse_buffer(&set, 1, buf, size, "fuzz-1.safetensors", &err);
        if (n > 0) {
            REQUIRE(rc != 0 && strstr(err.msg, "duplicate") != NULL);
            REQUIRE(set.n_tensors == n);
        } else {
            REQUIRE(rc == 0 && set.n_tensors == 0);
        }
        check_set(&set, buf, size);
    }
    st_close(&set);
    REQUIRE(set.n_tensors == 0 && set.tensors == NULL && set.shards == NULL);
    free(mem);
    return 0;
}
