/* test_safetensors.c — header validation (in memory) and directory opening
 * (single file, plain shards, index + shards) in a mkdtemp directory, with
 * every refusal naming the file and the tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "model/safetensors.h"

/* Build a safetensors image: 8-byte LE length, `json` (single quotes turned
 * into double quotes), padded with spaces to a multiple of 8, then `dlen`
 * data bytes with byte i = (i * 7 + 1) & 255. Caller frees. */
static unsigned char *build(const char *json, size_t dlen, size_t *out_len, size_t *out_hdr) {
    size_t jl = strlen(json), hl = (jl + 7) / 8 * 8;
    unsigned char *b = xmalloc(8 + hl + dlen);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    for (size_t i = 0; i < hl; i++) b[8 + i] = i < jl ? (unsigned char)(json[i] == '\'' ? '"' : json[i]) : ' ';
    for (size_t i = 0; i < dlen; i++) b[8 + hl + i] = (unsigned char)((i * 7 + 1) & 255);
    *out_len = 8 + hl + dlen;
    if (out_hdr) *out_hdr = 8 + hl;
    return b;
}

static int parse(st_set *set, const char *json, size_t dlen, lilac_err *err) {
    size_t len;
    unsigned char *b = build(json, dlen, &len, NULL);
    err->msg[0] = 0;
    int rc = st_parse_buffer(set, 0, b, len, "model.safetensors", err);
    free(b); /* pointers into b are not used after this */
    return rc;
}

#define EXPECT_FAIL(rc, err, ...) CHECK_FAIL_MSG(rc, err, __VA_ARGS__)

static const char *TWO =
    "{'__metadata__':{'format':'pt'},"
    "'z.weight':{'dtype':'F32','shape':[2],'data_offsets':[12,20]},"
    "'a.weight':{'dtype':'BF16','shape':[2,3],'data_offsets':[0,12]}}";

static void test_dtypes(void) {
    static const char *names[] = {"BOOL", "U8", "I8", "U16", "I16", "F16", "BF16", "U32",
                                  "I32", "F32", "U64", "I64", "F64", "F8_E4M3", "F8_E5M2"};
    static const size_t sizes[] = {1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8, 1, 1};
    CHECK(ST_DTYPE_COUNT == 15);
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        CHECKF(strcmp(st_dtype_name((st_dtype)i), names[i]) == 0, "%d", i);
        CHECKF(st_dtype_size((st_dtype)i) == sizes[i], "%d", i);
        /* every dtype parses, with the right size check */
        char json[256];
        snprintf(json, sizeof json, "{'t':{'dtype':'%s','shape':[3,1],'data_offsets':[0,%zu]}}", names[i],
                 3 * sizes[i]);
        st_set set = {0};
        lilac_err err;
        int rc = parse(&set, json, 3 * sizes[i], &err);
        CHECKF(rc == 0, "%s: %s", names[i], err.msg);
        CHECK(set.n_tensors == 1 && set.tensors[0].dtype == (st_dtype)i && set.tensors[0].nbytes == 3 * sizes[i]);
        st_close(&set);
    }
    st_set set = {0};
    lilac_err err;
    int rc = parse(&set, "{'w':{'dtype':'Q4_0','shape':[2],'data_offsets':[0,2]}}", 2, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "\"w\"", "dtype", "Q4_0");
    rc = parse(&set, "{'w':{'dtype':'bf16','shape':[2],'data_offsets':[0,4]}}", 4, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "bf16");
    CHECK(set.n_tensors == 0);
}

static void test_valid_two(void) {
    size_t len, hdr;
    unsigned char *b = build(TWO, 20, &len, &hdr);
    /* parse from an unaligned copy: the parser must not care */
    unsigned char *mem = xmalloc(len + 1), *u = mem + 1;
    memcpy(u, b, len);
    st_set set = {0};
    lilac_err err;
    int rc = st_parse_buffer(&set, 3, u, len, "model.safetensors", &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(set.n_tensors == 2);
    if (set.n_tensors == 2) {
        CHECK(strcmp(set.tensors[0].name, "a.weight") == 0 && strcmp(set.tensors[1].name, "z.weight") == 0);
        const st_tensor *a = st_find(&set, "a.weight"), *z = st_find(&set, "z.weight");
        CHECK(a == &set.tensors[0] && z == &set.tensors[1]);
        CHECK(a->dtype == ST_BF16 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3 && a->nbytes == 12);
        CHECK(z->dtype == ST_F32 && z->ndim == 1 && z->shape[0] == 2 && z->nbytes == 8);
        CHECK((const unsigned char *)a->data == u + hdr);
        CHECK((const unsigned char *)z->data == u + hdr + 12);
        CHECK(memcmp(z->data, b + hdr + 12, 8) == 0);
        CHECK(a->shard == 3 && z->shard == 3);
    }
    CHECK(st_find(&set, "a") == NULL && st_find(&set, "__metadata__") == NULL && st_find(&set, "") == NULL);
    st_close(&set);
    CHECK(set.n_tensors == 0 && set.tensors == NULL);
    free(mem);
    free(b);
}

static void test_edge_shapes(void) {
    st_set set = {0};
    lilac_err err;
    /* scalar, zero-size tensors where the tiling has reached, empty header */
    int rc = parse(&set,
                   "{'s':{'dtype':'F64','shape':[],'data_offsets':[0,8]},"
                   "'e':{'dtype':'F32','shape':[0,4],'data_offsets':[8,8]},"
                   "'f':{'dtype':'U8','shape':[3,0,99999999999],'data_offsets':[8,8]}}",
                   8, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(set.n_tensors == 3 && st_find(&set, "s")->ndim == 0 && st_find(&set, "e")->nbytes == 0);
    st_close(&set);
    /* a zero-size tensor "inside" another breaks the tiling (HF refuses it too) */
    rc = parse(&set,
               "{'s':{'dtype':'F64','shape':[],'data_offsets':[0,8]},"
               "'e':{'dtype':'F32','shape':[0,4],'data_offsets':[4,4]}}",
               8, &err);
    EXPECT_FAIL(rc, err, "\"e\"", "[4,4]", "overlap", "\"s\"");
    rc = parse(&set, "{}", 0, &err);
    CHECKF(rc == 0 && set.n_tensors == 0, "%s", err.msg);
    st_close(&set);
    rc = parse(&set, "{'w':{'dtype':'U8','shape':[1,1,1,1,1,1,1,1,1],'data_offsets':[0,1]}}", 1, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "\"w\"", "at most 8", "found 9");
    rc = parse(&set, "{'w':{'dtype':'U8','shape':[2,-1],'data_offsets':[0,1]}}", 1, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "shape[1]", "-1");
    rc = parse(&set, "{'w':{'dtype':'U8','shape':[2.5],'data_offsets':[0,1]}}", 1, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "shape[0]", "2.5");
    rc = parse(&set, "{'w':{'dtype':'U8','shape':'2','data_offsets':[0,1]}}", 1, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "shape");
    rc = parse(&set, "{'w':{'dtype':'F64','shape':[4294967296,4294967296],'data_offsets':[0,1]}}", 1, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "overflow");
    rc = parse(&set, "{'w':{'dtype':'F64','shape':[4611686018427387904],'data_offsets':[0,1]}}", 1, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "overflow");
    rc = parse(&set, "{'w':{'dtype':'U8','shape':[1],'data_offsets':[0]}}", 1, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "data_offsets", "[0]");
    rc = parse(&set, "{'w':{'dtype':'U8','shape':[1],'data_offsets':[-1,0]}}", 1, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "data_offsets");
    rc = parse(&set, "{'w':[1]}", 1, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "object");
    rc = parse(&set, "{'w':{'shape':[1],'data_offsets':[0,1]}}", 1, &err);
    EXPECT_FAIL(rc, err, "\"w\"", "dtype", "nothing");
    CHECK(set.n_tensors == 0);
}

static void test_wrong_length(void) {
    st_set set = {0};
    lilac_err err;
    int rc = parse(&set, "{'x.weight':{'dtype':'BF16','shape':[3,2],'data_offsets':[0,10]}}", 16, &err);
    CHECKF(rc != 0 && strcmp(err.msg, "model.safetensors: tensor \"x.weight\": data_offsets [0,10] but BF16 [3,2] "
                                      "needs 12 bytes") == 0,
           "%s", err.msg);
    rc = parse(&set, "{'x.weight':{'dtype':'U32','shape':[2],'data_offsets':[0,12]}}", 16, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "\"x.weight\"", "[0,12]", "U32 [2] needs 8 bytes");
    CHECK(set.n_tensors == 0);
}

static void test_offsets(void) {
    st_set set = {0};
    lilac_err err;
    int rc = parse(&set,
                   "{'a':{'dtype':'U8','shape':[8],'data_offsets':[0,8]},"
                   "'b':{'dtype':'U8','shape':[8],'data_offsets':[6,14]}}",
                   16, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "\"a\"", "\"b\"", "overlap");
    /* containment overlaps too, whatever the header order */
    rc = parse(&set,
                   "{'big':{'dtype':'U8','shape':[16],'data_offsets':[0,16]},"
                   "'mid':{'dtype':'U8','shape':[2],'data_offsets':[10,12]},"
                   "'c':{'dtype':'U8','shape':[1],'data_offsets':[15,16]}}",
                   16, &err);
    EXPECT_FAIL(rc, err, "\"big\"", "overlap");
    rc = parse(&set, "{'a':{'dtype':'U8','shape':[4],'data_offsets':[14,18]}}", 16, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "\"a\"", "[14,18]", "past", "16 bytes");
    rc = parse(&set, "{'a':{'dtype':'U8','shape':[0],'data_offsets':[17,17]}}", 16, &err);
    EXPECT_FAIL(rc, err, "\"a\"", "past");
    rc = parse(&set, "{'a':{'dtype':'U8','shape':[2],'data_offsets':[4,2]}}", 16, &err);
    EXPECT_FAIL(rc, err, "\"a\"", "[4,2]", "begin <= end");
    rc = parse(&set, "{'a':{'dtype':'U8','shape':[2],'data_offsets':[0,18446744073709551615]}}", 16, &err);
    EXPECT_FAIL(rc, err, "model.safetensors");
    /* adjacent tensors are fine */
    rc = parse(&set,
                   "{'a':{'dtype':'U8','shape':[8],'data_offsets':[0,8]},"
                   "'b':{'dtype':'U8','shape':[8],'data_offsets':[8,16]}}",
                   16, &err);
    CHECKF(rc == 0, "%s", err.msg);
    st_close(&set);
}

/* The tensors must tile the data region: no gap, no unowned tail, no hole at the
 * start (HF safetensors refuses each). */
static void test_tiling(void) {
    st_set set = {0};
    lilac_err err;
    int rc = parse(&set, TWO, 24, &err); /* 4 bytes after the last tensor */
    EXPECT_FAIL(rc, err, "model.safetensors", "cover 20 of the 24 data bytes");
    rc = parse(&set,
               "{'a':{'dtype':'U8','shape':[4],'data_offsets':[0,4]},"
               "'b':{'dtype':'U8','shape':[4],'data_offsets':[6,10]}}",
               10, &err);
    EXPECT_FAIL(rc, err, "\"b\"", "[6,10]", "gap of 2 bytes", "a");
    rc = parse(&set, "{'a':{'dtype':'U8','shape':[4],'data_offsets':[2,6]}}", 6, &err);
    EXPECT_FAIL(rc, err, "\"a\"", "gap of 2 bytes", "header");
    CHECK(set.n_tensors == 0);
}

/* The corruption: the header length cut by 1..5 bytes into its space
 * padding. The JSON still parses, every tensor shifts, and the data region
 * gains bytes no tensor owns: refused. The uncut file loads. */
static void test_header_length_cut(void) {
    size_t len, hdr;
    char padded[400]; /* TWO with 8 more spaces: at least 8 bytes of padding to cut into */
    snprintf(padded, sizeof padded, "%s        ", TWO);
    unsigned char *b = build(padded, 20, &len, &hdr);
    st_set set = {0};
    lilac_err err;
    int rc = st_parse_buffer(&set, 0, b, len, "model.safetensors", &err);
    CHECKF(rc == 0, "%s", err.msg);
    st_close(&set);
    CHECK(hdr - 8 - strlen(TWO) >= 8);
    for (int cut = 1; cut <= 5; cut++) {
        uint64_t hl = hdr - 8 - (uint64_t)cut;
        for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hl >> (8 * i));
        rc = st_parse_buffer(&set, 0, b, len, "model.safetensors", &err);
        CHECKF(rc != 0 && strstr(err.msg, "data bytes"), "cut %d: rc %d %s", cut, rc, rc ? err.msg : "");
        CHECK(set.n_tensors == 0);
    }
    free(b);
}

static void test_truncated_buffer(void) {
    st_set set = {0};
    lilac_err err;
    size_t len, hdr;
    unsigned char *b = build(TWO, 20, &len, &hdr);
    for (size_t cut = 0; cut < 8; cut++) {
        int rc = st_parse_buffer(&set, 0, b, cut, "m.safetensors", &err);
        EXPECT_FAIL(rc, err, "m.safetensors", "8-byte");
    }
    int rc = st_parse_buffer(&set, 0, b, hdr - 1, "m.safetensors", &err);
    EXPECT_FAIL(rc, err, "m.safetensors", "header length");
    rc = st_parse_buffer(&set, 0, b, len - 1, "m.safetensors", &err);
    EXPECT_FAIL(rc, err, "m.safetensors", "\"z.weight\"", "past");
    rc = st_parse_buffer(&set, 0, NULL, 0, "m.safetensors", &err);
    EXPECT_FAIL(rc, err, "m.safetensors");
    /* header length with the top bit set */
    b[7] = 0x80;
    rc = st_parse_buffer(&set, 0, b, len, "m.safetensors", &err);
    EXPECT_FAIL(rc, err, "m.safetensors", "header length");
    CHECK(set.n_tensors == 0);
    free(b);
}

static void test_bad_header_json(void) {
    st_set set = {0};
    lilac_err err;
    int rc = parse(&set, "{'a':", 0, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "JSON");
    rc = parse(&set, "[1,2,3]", 0, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "object");
    rc = parse(&set,
               "{'a':{'dtype':'U8','shape':[1],'data_offsets':[0,1]},"
               "'a':{'dtype':'U8','shape':[1],'data_offsets':[1,2]}}",
               2, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "duplicate");
    CHECK(set.n_tensors == 0);
}

/* Appending: a second buffer merges in sorted order; a failing one (or one
 * with a name already present) leaves the set untouched. A hand-built set
 * with unmapped shards closes cleanly. */
static void test_append_and_dup(void) {
    st_set set = {0};
    set.shards = xcalloc(2, sizeof(st_shard));
    set.n_shards = 2;
    set.shards[0].path = xstrdup("s0.safetensors");
    set.shards[1].path = xstrdup("s1.safetensors");
    size_t l1, l2, l3;
    unsigned char *b1 = build("{'m':{'dtype':'U8','shape':[1],'data_offsets':[0,1]},"
                              "'c':{'dtype':'U8','shape':[1],'data_offsets':[1,2]}}", 2, &l1, NULL);
    unsigned char *b2 = build("{'d':{'dtype':'U8','shape':[1],'data_offsets':[0,1]},"
                              "'z':{'dtype':'U8','shape':[1],'data_offsets':[1,2]},"
                              "'a':{'dtype':'U8','shape':[1],'data_offsets':[2,3]}}", 3, &l2, NULL);
    unsigned char *b3 = build("{'q':{'dtype':'U8','shape':[1],'data_offsets':[0,1]},"
                              "'m':{'dtype':'U8','shape':[1],'data_offsets':[1,2]}}", 2, &l3, NULL);
    lilac_err err;
    int rc = st_parse_buffer(&set, 0, b1, l1, "s0.safetensors", &err);
    CHECKF(rc == 0, "%s", err.msg);
    rc = st_parse_buffer(&set, 1, b2, l2, "s1.safetensors", &err);
    CHECKF(rc == 0, "%s", err.msg);
    const char *want[] = {"a", "c", "d", "m", "z"};
    CHECK(set.n_tensors == 5);
    for (int i = 0; i < 5 && i < set.n_tensors; i++) CHECKF(strcmp(set.tensors[i].name, want[i]) == 0, "%d", i);
    CHECK(st_find(&set, "m")->shard == 0 && st_find(&set, "z")->shard == 1);
    rc = st_parse_buffer(&set, 1, b3, l3, "s1.safetensors", &err);
    EXPECT_FAIL(rc, err, "s1.safetensors", "\"m\"", "duplicate", "s0.safetensors");
    CHECK(set.n_tensors == 5 && st_find(&set, "q") == NULL);
    rc = st_parse_buffer(&set, 1, b3, 5, "s1.safetensors", &err);
    CHECK(rc != 0 && set.n_tensors == 5);
    st_close(&set);
    CHECK(set.shards == NULL && set.n_shards == 0 && set.tensors == NULL);
    st_close(&set); /* twice is fine */
    free(b1);
    free(b2);
    free(b3);
}

/* --- directories --------------------------------------------------------- */

static char *mkdir_tmp(void) {
    char tmpl[] = "/tmp/lilac_st_XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? xstrdup(d) : NULL;
}

static void write_file(const char *dir, const char *name, const void *data, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

static void write_st(const char *dir, const char *name, const char *json, size_t dlen) {
    size_t len;
    unsigned char *b = build(json, dlen, &len, NULL);
    write_file(dir, name, b, len);
    free(b);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char *s = xstrdup(text);
    for (char *p = s; *p; p++)
        if (*p == '\'') *p = '"';
    write_file(dir, name, s, strlen(s));
    free(s);
}

static void rm_dir(char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
    free(dir);
}

static const char *SH1 = "{'x.a':{'dtype':'BF16','shape':[2,2],'data_offsets':[0,8]},"
                         "'x.b':{'dtype':'U32','shape':[1],'data_offsets':[8,12]}}";
static const char *SH2 = "{'y.c':{'dtype':'F32','shape':[3],'data_offsets':[0,12]}}";
static const char *INDEX = "{'metadata':{'total_size':24},'weight_map':{"
                           "'x.a':'model-00001-of-00002.safetensors',"
                           "'x.b':'model-00001-of-00002.safetensors',"
                           "'y.c':'model-00002-of-00002.safetensors'}}";

static void test_dir_single(void) {
    char *dir = mkdir_tmp();
    if (!dir) return;
    write_st(dir, "model.safetensors", TWO, 20);
    write_text(dir, "config.json", "{}");
    st_set set;
    lilac_err err;
    int rc = st_open_dir(&set, dir, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(set.n_shards == 1 && set.n_tensors == 2);
    if (rc == 0) {
        CHECK(strstr(set.shards[0].path, "model.safetensors") != NULL);
        const st_tensor *z = st_find(&set, "z.weight");
        CHECK(z && z->shard == 0);
        const unsigned char *map = set.shards[0].map;
        size_t hl = (strlen(TWO) + 7) / 8 * 8;
        CHECK(z && (const unsigned char *)z->data == map + 8 + hl + 12);
        CHECK(z && ((const unsigned char *)z->data)[0] == (unsigned char)((12 * 7 + 1) & 255));
        CHECK(set.shards[0].size == 8 + hl + 20);
    }
    st_close(&set);
    /* trailing slash on the dir is fine */
    char d2[600];
    snprintf(d2, sizeof d2, "%s/", dir);
    rc = st_open_dir(&set, d2, &err);
    CHECKF(rc == 0, "%s", err.msg);
    st_close(&set);
    rm_dir(dir);
}

static void test_dir_plain_shards(void) {
    char *dir = mkdir_tmp();
    if (!dir) return;
    write_st(dir, "b.safetensors", SH2, 12);
    write_st(dir, "a.safetensors", SH1, 12);
    st_set set;
    lilac_err err;
    int rc = st_open_dir(&set, dir, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(set.n_shards == 2 && set.n_tensors == 3);
    if (rc == 0) {
        CHECK(strstr(set.shards[0].path, "/a.safetensors") != NULL); /* sorted */
        CHECK(st_find(&set, "x.a")->shard == 0 && st_find(&set, "y.c")->shard == 1);
    }
    st_close(&set);
    /* the same tensor name in two files */
    write_st(dir, "c.safetensors", "{'x.b':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}", 1);
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "c.safetensors", "\"x.b\"", "duplicate", "a.safetensors");
    CHECK(set.n_shards == 0 && set.n_tensors == 0 && set.shards == NULL);
    rm_dir(dir);
}

static void test_dir_index(void) {
    char *dir = mkdir_tmp();
    if (!dir) return;
    write_st(dir, "model-00001-of-00002.safetensors", SH1, 12);
    write_st(dir, "model-00002-of-00002.safetensors", SH2, 12);
    write_st(dir, "stray.safetensors", "{'junk':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}", 1);
    write_text(dir, "model.safetensors.index.json", INDEX);
    st_set set;
    lilac_err err;
    int rc = st_open_dir(&set, dir, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(set.n_shards == 2 && set.n_tensors == 3); /* only the index's shards */
    CHECK(st_find(&set, "junk") == NULL);
    const st_tensor *c = st_find(&set, "y.c");
    CHECK(c && c->dtype == ST_F32 && c->shape[0] == 3 && c->nbytes == 12);
    CHECK(c && strstr(set.shards[c->shard].path, "model-00002-of-00002.safetensors") != NULL);
    st_close(&set);
    rm_dir(dir);
}

static void test_dir_index_duplicate(void) {
    char *dir = mkdir_tmp();
    if (!dir) return;
    write_st(dir, "model-00001-of-00002.safetensors", SH1, 12);
    write_st(dir, "model-00002-of-00002.safetensors",
             "{'y.c':{'dtype':'F32','shape':[3],'data_offsets':[0,12]},"
             "'x.a':{'dtype':'BF16','shape':[2,2],'data_offsets':[12,20]}}", 20);
    write_text(dir, "model.safetensors.index.json", INDEX);
    st_set set;
    lilac_err err;
    int rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model-00002-of-00002.safetensors", "\"x.a\"", "duplicate",
                "model-00001-of-00002.safetensors");
    CHECK(set.n_shards == 0 && set.n_tensors == 0);
    rm_dir(dir);
}

static void test_dir_index_missing_shard(void) {
    char *dir = mkdir_tmp();
    if (!dir) return;
    write_st(dir, "model-00001-of-00002.safetensors", SH1, 12);
    write_text(dir, "model.safetensors.index.json", INDEX);
    st_set set;
    lilac_err err;
    int rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors.index.json", "model-00002-of-00002.safetensors", "does not exist");
    CHECK(set.n_shards == 0 && set.n_tensors == 0);
    rm_dir(dir);
}

static void test_dir_index_tensor_not_in_shard(void) {
    char *dir = mkdir_tmp();
    if (!dir) return;
    write_st(dir, "model-00001-of-00002.safetensors", SH1, 12);
    write_st(dir, "model-00002-of-00002.safetensors", SH2, 12);
    write_text(dir, "model.safetensors.index.json",
               "{'weight_map':{'x.a':'model-00001-of-00002.safetensors',"
               "'ghost.weight':'model-00002-of-00002.safetensors'}}");
    st_set set;
    lilac_err err;
    int rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors.index.json", "\"ghost.weight\"", "model-00002-of-00002.safetensors",
                "no such tensor");
    /* a tensor that exists, but in the other shard */
    write_text(dir, "model.safetensors.index.json",
               "{'weight_map':{'x.a':'model-00001-of-00002.safetensors',"
               "'x.b':'model-00002-of-00002.safetensors'}}");
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "\"x.b\"", "model-00002-of-00002.safetensors", "it is in model-00001-of-00002.safetensors");
    /* broken indexes */
    write_text(dir, "model.safetensors.index.json", "{'weight_map':");
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors.index.json", "JSON");
    write_text(dir, "model.safetensors.index.json", "{'metadata':{}}");
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors.index.json", "weight_map");
    write_text(dir, "model.safetensors.index.json", "{'weight_map':{'x.a':'../etc/passwd'}}");
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors.index.json", "\"x.a\"", "../etc/passwd");
    write_text(dir, "model.safetensors.index.json", "{'weight_map':{'x.a':3}}");
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors.index.json", "\"x.a\"", "found 3");
    CHECK(set.n_shards == 0 && set.n_tensors == 0);
    rm_dir(dir);
}

static void test_dir_errors(void) {
    st_set set;
    lilac_err err;
    char *dir = mkdir_tmp();
    if (!dir) return;
    int rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, dir, "no *.safetensors");
    write_text(dir, "config.json", "{}");
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, dir, "no *.safetensors");

    /* truncated files on disk */
    write_file(dir, "model.safetensors", "\x10\x00\x00", 3);
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "3 bytes", "truncated");
    write_file(dir, "model.safetensors", "", 0);
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "0 bytes");
    size_t len, hdr;
    unsigned char *b = build(TWO, 20, &len, &hdr);
    write_file(dir, "model.safetensors", b, hdr - 3); /* header past EOF */
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "header length", "truncated");
    write_file(dir, "model.safetensors", b, len - 4); /* data past EOF */
    rc = st_open_dir(&set, dir, &err);
    EXPECT_FAIL(rc, err, "model.safetensors", "\"z.weight\"", "past the data region");
    free(b);
    CHECK(set.n_shards == 0 && set.n_tensors == 0);

    char missing[600];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    rc = st_open_dir(&set, missing, &err);
    EXPECT_FAIL(rc, err, missing);
    snprintf(missing, sizeof missing, "%s/config.json", dir);
    rc = st_open_dir(&set, missing, &err);
    EXPECT_FAIL(rc, err, missing, "directory");
    rm_dir(dir);
}

/* A FIFO as a shard is refused at once (the open does not wait for a writer). */
static void test_dir_fifo_shard(void) {
    char *dir = mkdir_tmp();
    if (!dir) return;
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(mkfifo(path, 0600) == 0);
    st_set set;
    lilac_err err;
    alarm(10); /* a hang fails the test instead of the suite */
    int rc = st_open_dir(&set, dir, &err);
    alarm(0);
    EXPECT_FAIL(rc, err, "model.safetensors", "not a regular file");
    rm_dir(dir);
}

/* A shard truncated while mapped: reading a tensor past the new end does not
 * kill the process (SIGBUS), it reads zeros and st_damaged() names the file. */
static void test_truncated_while_mapped(void) {
    char *dir = mkdir_tmp();
    if (!dir) return;
    long page = sysconf(_SC_PAGESIZE);
    char json[200];
    size_t big = (size_t)page * 4;
    snprintf(json, sizeof json, "{'w':{'dtype':'U8','shape':[%zu],'data_offsets':[0,%zu]}}", big, big);
    write_st(dir, "model.safetensors", json, big);
    st_set set;
    lilac_err err;
    int rc = st_open_dir(&set, dir, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc == 0) {
        CHECK(!st_damaged(NULL, 0));
        const st_tensor *w = st_find(&set, "w");
        char path[600];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(truncate(path, page) == 0);
        const volatile unsigned char *d = w->data;
        unsigned sum = 0;
        for (size_t i = (size_t)page * 2; i < big; i++) sum += d[i]; /* past the new end of the file */
        CHECK(sum == 0);
        char got[512];
        CHECK(st_damaged(got, sizeof got) && strstr(got, "model.safetensors"));
        st_close(&set);
        CHECK(st_damaged(got, sizeof got) && strstr(got, "model.safetensors"));
    }
    rm_dir(dir);
}

int main(void) {
    TEST(test_dtypes);
    TEST(test_valid_two);
    TEST(test_edge_shapes);
    TEST(test_wrong_length);
    TEST(test_offsets);
    TEST(test_truncated_buffer);
    TEST(test_bad_header_json);
    TEST(test_append_and_dup);
    TEST(test_dir_single);
    TEST(test_dir_plain_shards);
    TEST(test_dir_index);
    TEST(test_dir_index_duplicate);
    TEST(test_dir_index_missing_shard);
    TEST(test_dir_index_tensor_not_in_shard);
    TEST(test_dir_errors);
    TEST(test_tiling);
    TEST(test_header_length_cut);
    TEST(test_dir_fifo_shard);
    TEST(test_truncated_while_mapped); /* last: it leaves the process marked damaged */
    return check_summary();
}
