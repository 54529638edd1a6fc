/* safetensors.c — see safetensors.h.
 *
 * Invariants kept by every function here:
 *  - set->tensors is always sorted by name and holds no duplicate names
 *    (st_parse_buffer merges each file's tensors in and refuses a name that is
 *    already present, which is how duplicates across shards are caught);
 *  - a failed st_parse_buffer leaves the set exactly as it was;
 *  - a failed st_open_dir leaves the set empty (everything unmapped and freed);
 *  - st_close never munmaps a shard whose map is NULL, so sets built by hand
 *    around st_parse_buffer (the fuzz target, tests) can be closed safely.
 * The parser never dereferences tensor data: it only computes pointers. */
#include "safetensors.h"
#include "../util/json_brief.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    size_t size;
} st_dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1},   [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},
    [ST_U16] = {"U16", 2},     [ST_I16] = {"I16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},   [ST_U32] = {"U32", 4},   [ST_I32] = {"I32", 4},
    [ST_F32] = {"F32", 4},     [ST_U64] = {"U64", 8},   [ST_I64] = {"I64", 8},
    [ST_F64] = {"F64", 8},     [ST_F8_E4M3] = {"F8_E4M3", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(st_dtype t) {
    if ((int)t < 0 || t >= ST_DTYPE_COUNT) return "?";
    return st_dtypes[t].name;
}

size_t st_dtype_size(st_dtype t) {
    if ((int)t < 0 || t >= ST_DTYPE_COUNT) return 0;
    return st_dtypes[t].size;
}

static int dtype_from_name(const char *s, st_dtype *out) {
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Small formatting helpers for error messages.                              */

/* A short rendering of a JSON value for "found ..." in messages. */

static void shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* ------------------------------------------------------------------------- */
/* Header parsing.                                                           */

typedef struct {
    const char *name; /* borrowed from the json object until copied */
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;
} st_entry;

static int cmp_entry_offset(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int cmp_key_tensor(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const st_tensor *)elem)->name);
}

/* Validate one header entry into *e. `dlen` is the size of the data region. */
static int parse_entry(const char *fname, const char *name, json_t *v, uint64_t dlen, st_entry *e,
                       lilac_err *err) {
    char found[64];
    e->name = name;
    if (!json_is_object(v)) {
        json_brief(v, found, sizeof found);
        return lilac_fail(err, "%s: tensor \"%s\": expected an object {dtype, shape, data_offsets}, found %s",
                          fname, name, found);
    }
    json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd)) {
        json_brief(jd, found, sizeof found);
        return lilac_fail(err, "%s: tensor \"%s\": dtype: expected a string, found %s", fname, name, found);
    }
    if (dtype_from_name(json_string_value(jd), &e->dtype) != 0) {
        json_brief(jd, found, sizeof found);
        return lilac_fail(err,
                          "%s: tensor \"%s\": dtype: expected one of BOOL,U8,I8,U16,I16,F16,BF16,U32,I32,"
                          "F32,U64,I64,F64,F8_E4M3,F8_E5M2, found %s",
                          fname, name, found);
    }
    json_t *js = json_object_get(v, "shape");
    if (!json_is_array(js)) {
        json_brief(js, found, sizeof found);
        return lilac_fail(err, "%s: tensor \"%s\": shape: expected an array of non-negative integers, found %s",
                          fname, name, found);
    }
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return lilac_fail(err, "%s: tensor \"%s\": shape: expected at most %d dimensions, found %zu", fname,
                          name, ST_MAX_DIMS, nd);
    e->ndim = (int)nd;
    /* Element count with overflow guard: a zero dimension makes the count 0
     * whatever the other dimensions are; otherwise refuse anything whose byte
     * size would not fit in 64 bits. */
    bool zero = false, overflow = false;
    uint64_t count = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0) {
            json_brief(d, found, sizeof found);
            return lilac_fail(err, "%s: tensor \"%s\": shape[%zu]: expected a non-negative integer, found %s",
                              fname, name, i, found);
        }
        uint64_t x = (uint64_t)json_integer_value(d);
        e->shape[i] = (int64_t)x;
        if (x == 0)
            zero = true;
        else if (count > UINT64_MAX / x)
            overflow = true;
        else
            count *= x;
    }
    size_t esz = st_dtype_size(e->dtype);
    uint64_t need = 0;
    if (!zero) {
        if (overflow || count > UINT64_MAX / esz) {
            char sh[160];
            shape_str(e->shape, e->ndim, sh, sizeof sh);
            return lilac_fail(err, "%s: tensor \"%s\": shape %s: byte size overflows 64 bits", fname, name, sh);
        }
        need = count * esz;
    }
    json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)) || json_integer_value(json_array_get(jo, 0)) < 0 ||
        json_integer_value(json_array_get(jo, 1)) < 0) {
        json_brief(jo, found, sizeof found);
        return lilac_fail(err,
                          "%s: tensor \"%s\": data_offsets: expected [begin,end] non-negative integers, found %s",
                          fname, name, found);
    }
    e->begin = (uint64_t)json_integer_value(json_array_get(jo, 0));
    e->end = (uint64_t)json_integer_value(json_array_get(jo, 1));
    if (e->begin > e->end)
        return lilac_fail(err, "%s: tensor \"%s\": data_offsets [%llu,%llu]: expected begin <= end", fname, name,
                          (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > dlen)
        return lilac_fail(err,
                          "%s: tensor \"%s\": data_offsets [%llu,%llu] end past the data region "
                          "(%llu bytes; file truncated?)",
                          fname, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)dlen);
    if (e->end - e->begin != need) {
        char sh[160];
        shape_str(e->shape, e->ndim, sh, sizeof sh);
        return lilac_fail(err, "%s: tensor \"%s\": data_offsets [%llu,%llu] but %s %s needs %llu bytes", fname,
                          name, (unsigned long long)e->begin, (unsigned long long)e->end,
                          st_dtype_name(e->dtype), sh, (unsigned long long)need);
    }
    return 0;
}

static const char *shard_label(const st_set *set, int shard, char *buf, size_t cap) {
    if (shard >= 0 && shard < set->n_shards && set->shards && set->shards[shard].path)
        return set->shards[shard].path;
    snprintf(buf, cap, "shard %d", shard);
    return buf;
}

int st_parse_buffer(st_set *set, int shard, const void *buf, size_t len, const char *fname,
                    lilac_err *err) {
    if (!fname) fname = "(buffer)";
    if (!set) return lilac_fail(err, "%s: no tensor set given", fname);
    const unsigned char *p = buf;
    if (len < 8 || !p)
        return lilac_fail(err, "%s: file is %zu bytes, too short for the 8-byte header length (truncated?)",
                          fname, p ? len : (size_t)0);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    uint64_t avail = (uint64_t)(len - 8);
    if (hlen > avail)
        return lilac_fail(err, "%s: header length %llu exceeds the %llu bytes after the length field (truncated?)",
                          fname, (unsigned long long)hlen, (unsigned long long)avail);
    if (hlen < 2)
        return lilac_fail(err, "%s: header length %llu: expected at least 2 bytes of JSON", fname,
                          (unsigned long long)hlen);
    const unsigned char *data = p + 8 + hlen;
    uint64_t dlen = avail - hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return lilac_fail(err, "%s: header is not valid JSON (line %d, column %d): %s", fname, jerr.line,
                          jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return lilac_fail(err, "%s: header: expected a JSON object, found another JSON value", fname);
    }

    size_t cap = json_object_size(root);
    st_entry *ents = xmalloc(sizeof(st_entry) * (cap ? cap : 1));
    size_t n = 0;
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        if (parse_entry(fname, key, val, dlen, &ents[n], err) != 0) {
            rc = -1;
            break;
        }
        n++;
    }

    /* The tensors must tile the data region exactly, as HF safetensors requires:
     * sorted by offset, each starts where the previous one ended, the first at 0
     * and the last at the end of the file. A gap (e.g. a header length cut into
     * its padding, which shifts every tensor) or an overlap is corruption. */
    if (rc == 0) {
        qsort(ents, n, sizeof *ents, cmp_entry_offset);
        uint64_t pos = 0;
        const st_entry *prev = NULL;
        for (size_t i = 0; i < n && rc == 0; i++) {
            const st_entry *e = &ents[i];
            if (e->begin < pos)
                rc = lilac_fail(err, "%s: tensor \"%s\": data_offsets [%llu,%llu] overlap tensor \"%s\" [%llu,%llu]",
                                fname, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                                prev->name, (unsigned long long)prev->begin, (unsigned long long)prev->end);
            else if (e->begin > pos)
                rc = lilac_fail(err, "%s: tensor \"%s\": data_offsets [%llu,%llu] leave a gap of %llu bytes after %s "
                                "(the tensors must tile the data region; header length wrong?)", fname, e->name,
                                (unsigned long long)e->begin, (unsigned long long)e->end,
                                (unsigned long long)(e->begin - pos), prev ? prev->name : "the header");
            pos = e->end;
            if (e->end > e->begin || !prev) prev = e;
        }
        if (rc == 0 && pos != dlen)
            rc = lilac_fail(err, "%s: the tensors cover %llu of the %llu data bytes: the file has %llu bytes no tensor "
                            "owns (header length wrong, or data appended?)", fname, (unsigned long long)pos,
                            (unsigned long long)dlen, (unsigned long long)(dlen - pos));
    }

    /* Duplicates against what the set already holds (other shards). Names
     * inside one header are unique (JSON_REJECT_DUPLICATES). */
    if (rc == 0 && set->n_tensors > 0 && set->tensors) {
        for (size_t i = 0; i < n; i++) {
            const st_tensor *t = bsearch(ents[i].name, set->tensors, (size_t)set->n_tensors,
                                         sizeof(st_tensor), cmp_key_tensor);
            if (t) {
                char lb[32];
                rc = lilac_fail(err, "%s: tensor \"%s\": duplicate name, already present in %s", fname,
                                ents[i].name, shard_label(set, t->shard, lb, sizeof lb));
                break;
            }
        }
    }

    if (rc == 0 && n > 0) {
        qsort(ents, n, sizeof *ents, cmp_entry_name);
        size_t old = (size_t)set->n_tensors;
        if (old + n > (size_t)INT32_MAX) {
            rc = lilac_fail(err, "%s: too many tensors (%zu)", fname, old + n);
        } else {
            /* Merge the two sorted runs into a new array. */
            st_tensor *merged = xmalloc(sizeof(st_tensor) * (old + n));
            size_t i = 0, j = 0, k = 0;
            while (i < old || j < n) {
                if (j == n || (i < old && strcmp(set->tensors[i].name, ents[j].name) < 0)) {
                    merged[k++] = set->tensors[i++];
                } else {
                    const st_entry *e = &ents[j++];
                    st_tensor *t = &merged[k++];
                    memset(t, 0, sizeof *t);
                    t->name = xstrdup(e->name);
                    t->dtype = e->dtype;
                    t->ndim = e->ndim;
                    memcpy(t->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
                    t->data = data + e->begin;
                    t->nbytes = (size_t)(e->end - e->begin);
                    t->shard = shard;
                }
            }
            free(set->tensors);
            set->tensors = merged;
            set->n_tensors = (int)(old + n);
        }
    }
    free(ents);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Directory / shards.                                                       */

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    while (a > 1 && dir[a - 1] == '/') a--;
    char *s = xmalloc(a + 1 + b + 1);
    memcpy(s, dir, a);
    s[a] = '/';
    memcpy(s + a + 1, name, b + 1);
    return s;
}

/* ---- truncation guard (see st_damaged in safetensors.h) ---- */

#define GUARD_MAX 256 /* shards guarded at once; the real checkpoint has a handful */

static struct {
    _Atomic uintptr_t lo, hi; /* [lo, hi): a mapped shard; 0, 0: a free slot */
    char path[512];
} g_guard[GUARD_MAX];
static atomic_int g_damaged = -1; /* slot of the first damaged shard */
static char g_damaged_path[512];
static struct sigaction g_old_bus;
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_guard_installed;
static uintptr_t g_page = 4096; /* set before the handler is installed: sysconf is not signal-safe */

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_MAX; i++) {
        uintptr_t lo = atomic_load(&g_guard[i].lo), hi = atomic_load(&g_guard[i].hi);
        if (a < lo || a >= hi) continue;
        uintptr_t page = a & ~(g_page - 1);
        /* zeros from the faulting page to the end of the shard: one fault per shard */
        if (mmap((void *)page, hi - page, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) break;
        int none = -1;
        atomic_compare_exchange_strong(&g_damaged, &none, i);
        return;
    }
    /* not a shard: the previous disposition (the default kills the process) */
    if (g_old_bus.sa_flags & SA_SIGINFO) {
        if (g_old_bus.sa_sigaction) {
            g_old_bus.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (g_old_bus.sa_handler != SIG_DFL && g_old_bus.sa_handler != SIG_IGN) {
        g_old_bus.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL); /* the access faults again and kills the process */
}

static void guard_add(const char *path, void *map, size_t size) {
    pthread_mutex_lock(&g_guard_mu);
    if (!g_guard_installed) {
        long ps = sysconf(_SC_PAGESIZE);
        if (ps > 0) g_page = (uintptr_t)ps;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        g_guard_installed = sigaction(SIGBUS, &sa, &g_old_bus) == 0;
    }
    for (int i = 0; i < GUARD_MAX; i++)
        if (!atomic_load(&g_guard[i].lo)) {
            snprintf(g_guard[i].path, sizeof g_guard[i].path, "%s", path);
            atomic_store(&g_guard[i].hi, (uintptr_t)map + size);
            atomic_store(&g_guard[i].lo, (uintptr_t)map);
            break;
        }
    pthread_mutex_unlock(&g_guard_mu);
}

static void guard_remove(void *map) {
    pthread_mutex_lock(&g_guard_mu);
    for (int i = 0; i < GUARD_MAX; i++)
        if (atomic_load(&g_guard[i].lo) == (uintptr_t)map) {
            if (atomic_load(&g_damaged) == i) snprintf(g_damaged_path, sizeof g_damaged_path, "%s", g_guard[i].path);
            atomic_store(&g_guard[i].lo, 0);
            atomic_store(&g_guard[i].hi, 0);
        }
    pthread_mutex_unlock(&g_guard_mu);
}

bool st_damaged(char *path, size_t cap) {
    int i = atomic_load(&g_damaged);
    if (i < 0) return false;
    if (path && cap) {
        pthread_mutex_lock(&g_guard_mu);
        snprintf(path, cap, "%s", atomic_load(&g_guard[i].lo) ? g_guard[i].path : g_damaged_path);
        pthread_mutex_unlock(&g_guard_mu);
    }
    return true;
}

/* mmap `path`, register it as a new shard and parse its header. */
static int open_shard(st_set *set, const char *path, lilac_err *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block the open */
    if (fd < 0) {
        if (errno == ENOENT) return lilac_fail(err, "%s: shard file does not exist", path);
        return lilac_fail(err, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return lilac_fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return lilac_fail(err, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return lilac_fail(err, "%s: file is %zu bytes, too short for the 8-byte header length (truncated?)", path,
                          size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return lilac_fail(err, "%s: mmap of %zu bytes failed: %s", path, size, strerror(e));

    int idx = set->n_shards;
    set->shards = xrealloc(set->shards, sizeof(st_shard) * (size_t)(idx + 1));
    set->shards[idx].path = xstrdup(path);
    set->shards[idx].map = map;
    set->shards[idx].size = size;
    set->n_shards = idx + 1;
    guard_add(path, map, size);
    return st_parse_buffer(set, idx, map, size, path, err);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int open_index(st_set *set, const char *dir, const char *ipath, lilac_err *err) {
    size_t len = 0;
    char *text = lilac_read_file(ipath, &len, err);
    if (!text) return -1;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return lilac_fail(err, "%s: not valid JSON (line %d, column %d): %s", ipath, jerr.line, jerr.column,
                          jerr.text);
    int rc = 0;
    const char **shards = NULL; /* distinct shard names, borrowed from `root` */
    size_t ns = 0;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        char found[64];
        json_brief(wm, found, sizeof found);
        rc = lilac_fail(err, "%s: weight_map: expected an object {tensor: shard file}, found %s", ipath, found);
        goto done;
    }
    if (json_object_size(wm) == 0) {
        rc = lilac_fail(err, "%s: weight_map: expected at least one tensor, found none", ipath);
        goto done;
    }
    shards = xmalloc(sizeof(char *) * json_object_size(wm));
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *f = json_string_value(val);
        if (!f || !*f || strchr(f, '/') || strcmp(f, ".") == 0 || strcmp(f, "..") == 0) {
            char found[64];
            json_brief(val, found, sizeof found);
            rc = lilac_fail(err, "%s: weight_map[\"%s\"]: expected a shard file name in %s, found %s", ipath, key,
                            dir, found);
            goto done;
        }
        shards[ns++] = f;
    }
    qsort(shards, ns, sizeof *shards, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < ns; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0) shards[u++] = shards[i];
    ns = u;

    for (size_t i = 0; i < ns; i++) {
        char *sp = path_join(dir, shards[i]);
        struct stat sb;
        if (stat(sp, &sb) != 0 && errno == ENOENT) {
            rc = lilac_fail(err, "%s: weight_map names shard \"%s\" but %s does not exist", ipath, shards[i], sp);
            free(sp);
            goto done;
        }
        rc = open_shard(set, sp, err);
        free(sp);
        if (rc != 0) goto done;
    }

    /* The MTP sidecar (lilac convert's mtp.safetensors beside an mlx-community checkpoint, whose
     * index stays mlx-lm's) joins the set when the index does not list it. */
    {
        bool listed = false;
        for (size_t i = 0; i < ns; i++) listed |= strcmp(shards[i], "mtp.safetensors") == 0;
        char *sp = path_join(dir, "mtp.safetensors");
        struct stat sb;
        if (!listed && stat(sp, &sb) == 0) rc = open_shard(set, sp, err);
        free(sp);
        if (rc != 0) goto done;
    }

    /* Every index entry must exist in the shard it names. */
    json_object_foreach(wm, key, val) {
        const char *f = json_string_value(val);
        const st_tensor *t = st_find(set, key);
        if (!t) {
            rc = lilac_fail(err, "%s: weight_map puts tensor \"%s\" in %s, but that shard has no such tensor", ipath,
                            key, f);
            goto done;
        }
        const char *tp = set->shards[t->shard].path;
        const char *base = strrchr(tp, '/');
        base = base ? base + 1 : tp;
        if (strcmp(base, f) != 0) {
            rc = lilac_fail(err, "%s: weight_map puts tensor \"%s\" in %s, but it is in %s", ipath, key, f, base);
            goto done;
        }
    }
done:
    free(shards);
    json_decref(root);
    return rc;
}

static bool has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int open_plain_dir(st_set *set, const char *dir, lilac_err *err) {
    DIR *d = opendir(dir);
    if (!d) return lilac_fail(err, "%s: cannot open model directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        if (!has_suffix(de->d_name, ".safetensors")) continue;
        if (n == cap) names = xrealloc(names, sizeof(char *) * (cap = cap ? cap * 2 : 8));
        names[n++] = xstrdup(de->d_name);
    }
    closedir(d);
    int rc = 0;
    if (n == 0) {
        rc = lilac_fail(err, "%s: no *.safetensors files and no model.safetensors.index.json in the directory", dir);
    } else {
        qsort(names, n, sizeof *names, cmp_str);
        for (size_t i = 0; i < n && rc == 0; i++) {
            char *sp = path_join(dir, names[i]);
            rc = open_shard(set, sp, err);
            free(sp);
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

int st_open_dir(st_set *set, const char *dir, lilac_err *err) {
    if (!set) return lilac_fail(err, "%s: no tensor set given", dir ? dir : "(null)");
    memset(set, 0, sizeof *set);
    if (!dir || !*dir) return lilac_fail(err, "model directory: expected a path, found an empty string");
    struct stat sb;
    if (stat(dir, &sb) != 0) return lilac_fail(err, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return lilac_fail(err, "%s: expected a model directory, found a file", dir);
    char *ipath = path_join(dir, "model.safetensors.index.json");
    int rc;
    if (stat(ipath, &sb) == 0)
        rc = open_index(set, dir, ipath, err);
    else
        rc = open_plain_dir(set, dir, err);
    free(ipath);
    if (rc != 0) st_close(set);
    return rc;
}

const st_tensor *st_find(const st_set *set, const char *name) {
    if (!set || !name || !set->tensors || set->n_tensors <= 0) return NULL;
    return bsearch(name, set->tensors, (size_t)set->n_tensors, sizeof(st_tensor), cmp_key_tensor);
}

void st_close(st_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n_tensors; i++) free(set->tensors[i].name);
    free(set->tensors);
    for (int i = 0; i < set->n_shards; i++) {
        if (set->shards[i].map && set->shards[i].map != MAP_FAILED) {
            guard_remove(set->shards[i].map);
            munmap(set->shards[i].map, set->shards[i].size);
        }
        free(set->shards[i].path);
    }
    free(set->shards);
    memset(set, 0, sizeof *set);
}
