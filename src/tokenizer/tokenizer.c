/* tokenizer.c — byte-level BPE from tokenizer.json; see tokenizer.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "tok_internal.h"
#include "hf_unicode.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------- */
/* ids                                                                       */

void lilac_ids_push(lilac_ids *v, int32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 256;
        v->ids = xrealloc(v->ids, v->cap * sizeof(int32_t));
    }
    v->ids[v->n++] = id;
}

void lilac_ids_free(lilac_ids *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

/* ------------------------------------------------------------------------- */
/* UTF-8                                                                     */

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 if invalid or
 * incomplete. Rejects overlongs, surrogates and code points > U+10FFFF. */
static inline int utf8_seq(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0;
        if (c == 0xED && s[1] >= 0xA0) return 0;
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && s[1] < 0x90) return 0;
        if (c == 0xF4 && s[1] >= 0x90) return 0;
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
              (s[3] & 0x3F);
        return 4;
    }
    return 0;
}

/* ASCII fast path: the index of the first non-ASCII byte at or after i in an
 * 8-byte word (or a position within 8 bytes of n), 8 bytes at a time. */
static inline size_t ascii_skip(const uint8_t *s, size_t i, size_t n) {
    while (i + 8 <= n) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull) break;
        i += 8;
    }
    return i;
}

size_t lilac_utf8_check(const char *str, size_t len) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    while (i < len) {
        i = ascii_skip(s, i, len);
        if (i >= len) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = utf8_seq(s + i, len - i, &cp);
        if (!k) return i;
        i += (size_t)k;
    }
    return len;
}

/* Length of a maximal invalid subpart starting at s (>= 1): the longest prefix
 * of a well-formed sequence, as Unicode's "substitution of maximal subparts"
 * (what Python's errors="replace" and Rust's from_utf8_lossy do). */
size_t tok_utf8_invalid_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c < 0xE0) need = 1;
    else if (c >= 0xE0 && c < 0xF0) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c < 0xF5) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 1;
    size_t k = 1;
    for (int j = 0; j < need && k < n; j++) {
        uint8_t b = s[k];
        if (b < lo || b > hi) break;
        lo = 0x80;
        hi = 0xBF;
        k++;
    }
    return k;
}

/* Is s[0..n) the incomplete start of a well-formed sequence (it could still
 * become valid with more bytes)? */
bool tok_utf8_incomplete(const uint8_t *s, size_t n) {
    if (n == 0 || n >= 4) return false;
    size_t k = tok_utf8_invalid_len(s, n);
    if (k != n) return false;
    uint8_t c = s[0];
    size_t full = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1;
    return full > n;
}

void tok_buf_put(tok_buf *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n + 1) c *= 2;
        b->p = xrealloc(b->p, c);
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Append s[0..n) to b, invalid sequences replaced by U+FFFD. */
void tok_utf8_lossy(tok_buf *b, const uint8_t *s, size_t n) {
    size_t i = 0, run = 0;
    while (i < n) {
        size_t v = lilac_utf8_check((const char *)s + i, n - i);
        tok_buf_put(b, s + i, v);
        i += v;
        if (i >= n) break;
        run = tok_utf8_invalid_len(s + i, n - i);
        tok_buf_put(b, "\xEF\xBF\xBD", 3);
        i += run;
    }
}

char *lilac_utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    tok_buf b = {0};
    tok_buf_put(&b, "", 0);
    tok_utf8_lossy(&b, (const uint8_t *)s, len);
    if (out_len) *out_len = b.n;
    return b.p;
}

/* ------------------------------------------------------------------------- */
/* GPT-2 byte-level alphabet: byte <-> code point.                           */

static uint32_t byte_to_cp[256];
static int16_t cp_to_byte[324]; /* code points 0..323 -> byte, or -1 */

static void byte_alphabet_init(void) {
    int n = 0;
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_to_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

/* HF ByteLevel decoder on one token string: if every character is in the
 * byte alphabet, the bytes they stand for; otherwise the string's own bytes. */
static void bytelevel_decode(const char *s, size_t n, tok_buf *out) {
    size_t start = out->n;
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int k = utf8_seq(u + i, n - i, &cp);
        if (!k || cp >= 324 || cp_to_byte[cp] < 0) {
            out->n = start;
            tok_buf_put(out, s, n);
            return;
        }
        uint8_t b = (uint8_t)cp_to_byte[cp];
        tok_buf_put(out, &b, 1);
        i += (size_t)k;
    }
}

/* ------------------------------------------------------------------------- */
/* NFC with a fast path: a bitmap of the code points that can change under    */
/* NFC or make a neighbour change (ccc != 0, NFC_QC No/Maybe: anything that is */
/* not NFC by itself, and every second element of a primary composition).     */
/* Text with none of them is NFC already.                                     */

static uint8_t *nfc_unsafe; /* bit per code point, 0..0x10FFFF */
static pthread_once_t nfc_once = PTHREAD_ONCE_INIT;

static void mark_unsafe(uint32_t cp) { nfc_unsafe[cp >> 3] |= (uint8_t)(1u << (cp & 7)); }

static void nfc_init(void) {
    byte_alphabet_init();
    nfc_unsafe = xcalloc(0x110000 / 8, 1);
    for (uint32_t cp = 0x80; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp < 0xE000) continue;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (p->combining_class) {
            mark_unsafe(cp);
            continue;
        }
        if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) continue;
        /* a canonical decomposition: compare NFC(cp) with cp */
        utf8proc_int32_t buf[8];
        utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)cp, buf, 8, UTF8PROC_DECOMPOSE, NULL);
        if (n <= 0 || n > 8) {
            mark_unsafe(cp);
            continue;
        }
        utf8proc_int32_t comp[8];
        memcpy(comp, buf, sizeof(utf8proc_int32_t) * (size_t)n);
        utf8proc_ssize_t m = utf8proc_reencode(comp, n, UTF8PROC_COMPOSE | UTF8PROC_STABLE);
        /* reencode writes UTF-8 into the buffer; decode the result back */
        uint32_t first;
        const uint8_t *enc = (const uint8_t *)comp;
        int k = m > 0 ? utf8_seq(enc, (size_t)m, &first) : 0;
        if (!(k == m && first == cp)) {
            mark_unsafe(cp); /* not NFC by itself (singleton, exclusion, ...) */
            continue;
        }
        mark_unsafe((uint32_t)buf[n - 1]); /* a primary composite: its last part composes */
    }
    /* Hangul: medial vowels and trailing consonants compose algorithmically. */
    for (uint32_t cp = 0x1161; cp <= 0x1175; cp++) mark_unsafe(cp);
    for (uint32_t cp = 0x11A8; cp <= 0x11C2; cp++) mark_unsafe(cp);
}

void tok_global_init(void) { pthread_once(&nfc_once, nfc_init); }

/* Is s[0..n) (valid UTF-8) NFC already, by the fast test? */
static bool nfc_quick(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        i = ascii_skip(s, i, n);
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c < 0xCC) { /* U+0080..U+02FF: never unsafe */
            i += 2;
            continue;
        }
        uint32_t cp;
        int k = utf8_seq(s + i, n - i, &cp);
        if (!k) return false;
        if (nfc_unsafe[cp >> 3] & (1u << (cp & 7))) return false;
        i += (size_t)k;
    }
    return true;
}

/* Hugging Face `tokenizers` normalizes with old Unicode tables (its
 * unicode-normalization-alignments crate predates Unicode 10): the combining
 * marks added in Unicode 10..15 are unknown to it, so it treats them as plain
 * starters (ccc 0, no composition). utf8proc (Unicode 15) knows them. To match
 * HF exactly they are kept inert here. This list was found by probing HF's NFC
 * against Python's unicodedata (Unicode 14) on every mark and decomposable code
 * point (hf_nfc_unknown in hf_unicode.h, made by tools/corpus/probe_hf_unicode.py). */
static bool hf_nfc_inert(uint32_t cp) {
    size_t lo = 0, hi = sizeof hf_nfc_unknown / sizeof hf_nfc_unknown[0];
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (cp < hf_nfc_unknown[m][0]) hi = m;
        else if (cp > hf_nfc_unknown[m][1]) lo = m + 1;
        else return true;
    }
    return false;
}

static int nfc_part(const uint8_t *s, size_t n, tok_buf *out, lilac_err *err) {
    if (n == 0) return 0;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t m = utf8proc_map(s, (utf8proc_ssize_t)n, &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (m < 0) return lilac_fail(err, "NFC normalisation failed: %s", utf8proc_errmsg(m));
    tok_buf_put(out, dst, (size_t)m);
    free(dst);
    return 0;
}

/* NFC of s[0..n) (valid UTF-8) into out (replacing its contents), with the
 * HF-unknown marks acting as inert starters: NFC(A x B) = NFC(A) x NFC(B). */
static int nfc(const uint8_t *s, size_t n, tok_buf *out, lilac_err *err) {
    out->n = 0;
    tok_buf_put(out, "", 0);
    size_t i = 0, st = 0;
    while (i < n) {
        uint32_t cp;
        int k = utf8_seq(s + i, n - i, &cp);
        if (!k) return lilac_fail(err, "NFC: invalid UTF-8");
        if (cp >= 0x7FD && hf_nfc_inert(cp)) {
            if (nfc_part(s + st, i - st, out, err)) return -1;
            tok_buf_put(out, s + i, (size_t)k);
            st = i + (size_t)k;
        }
        i += (size_t)k;
    }
    return nfc_part(s + st, n - st, out, err);
}

static inline bool cp_unsafe(uint32_t cp) { return cp >= 0x300 && (nfc_unsafe[cp >> 3] & (1u << (cp & 7))); }

/* NFC of a span that failed the quick test: only windows around the unsafe
 * characters are normalized, each from the last safe character before a run of
 * unsafe ones to the end of the run. A safe character has ccc 0, is NFC by
 * itself and composes with nothing before it, so the text between windows is
 * unaffected and the windows do not interact. */
static int nfc_windows(const uint8_t *s, size_t n, tok_buf *out, lilac_err *err) {
    out->n = 0;
    tok_buf_put(out, "", 0);
    size_t i = 0, copied = 0, last_safe = SIZE_MAX;
    tok_buf w = {0};
    while (i < n) {
        if (s[i] < 0x80) {
            last_safe = i++;
            continue;
        }
        uint32_t cp;
        int k = utf8_seq(s + i, n - i, &cp);
        if (!k) {
            free(w.p);
            return lilac_fail(err, "NFC: invalid UTF-8");
        }
        if (!cp_unsafe(cp)) {
            last_safe = i;
            i += (size_t)k;
            continue;
        }
        size_t ws = (last_safe != SIZE_MAX && last_safe >= copied) ? last_safe : i, j = i + (size_t)k;
        while (j < n && s[j] >= 0x80) {
            uint32_t c2;
            int k2 = utf8_seq(s + j, n - j, &c2);
            if (!k2 || !cp_unsafe(c2)) break;
            j += (size_t)k2;
        }
        tok_buf_put(out, s + copied, ws - copied);
        if (nfc(s + ws, j - ws, &w, err)) {
            free(w.p);
            return -1;
        }
        tok_buf_put(out, w.p, w.n);
        copied = i = j;
        last_safe = SIZE_MAX;
    }
    tok_buf_put(out, s + copied, n - copied);
    free(w.p);
    return 0;
}

/* Make PCRE2 read the pattern as HF's Oniguruma does:
 *  - Onig reads \s as Unicode White_Space; PCRE2 with UCP also counts U+180E:
 *    \s and \S are spelled out;
 *  - Onig's Unicode tables are newer (16 vs 14): \p{L}, \p{N}, \p{M} get the
 *    code points assigned since (HF_EXTRA_* in hf_unicode.h). */
#define WS_CLASS                                                                                                      \
    "\\t\\n\\x0B\\f\\r\\x20\\x85\\xA0\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static char *rewrite_ws(const char *pat) {
    static const char ws_pos[] = "[" WS_CLASS "]", ws_neg[] = "[^" WS_CLASS "]";
    tok_buf b = {0};
    tok_buf_put(&b, "", 0);
    bool in_class = false;
    size_t class_start = 0;
    for (size_t i = 0; pat[i]; i++) {
        char c = pat[i];
        if (c == '\\' && pat[i + 1]) {
            char e = pat[i + 1];
            if (e == 's' && !in_class) tok_buf_put(&b, ws_pos, strlen(ws_pos));
            else if (e == 'S' && !in_class) tok_buf_put(&b, ws_neg, strlen(ws_neg));
            else if (e == 's' && in_class) tok_buf_put(&b, WS_CLASS, strlen(WS_CLASS));
            else if (e == 'p' && pat[i + 2] == '{' && strchr("LNM", pat[i + 3]) && pat[i + 3] && pat[i + 4] == '}') {
                const char *extra = pat[i + 3] == 'L' ? HF_EXTRA_L : pat[i + 3] == 'N' ? HF_EXTRA_N : HF_EXTRA_M;
                if (!in_class) tok_buf_put(&b, "[", 1);
                tok_buf_put(&b, pat + i, 5);
                tok_buf_put(&b, extra, strlen(extra));
                if (!in_class) tok_buf_put(&b, "]", 1);
                i += 4;
                continue;
            }
            else if (e == 'Q') { /* \Q...\E: copy verbatim */
                const char *q = strstr(pat + i + 2, "\\E");
                size_t len = q ? (size_t)(q + 2 - (pat + i)) : strlen(pat + i);
                tok_buf_put(&b, pat + i, len);
                i += len - 1;
                continue;
            } else
                tok_buf_put(&b, pat + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            tok_buf_put(&b, &c, 1);
            if (pat[i + 1] == '^') {
                tok_buf_put(&b, "^", 1);
                i++;
            }
            if (pat[i + 1] == ']') { /* a leading ] is literal */
                tok_buf_put(&b, "]", 1);
                i++;
            }
            class_start = i + 1;
            continue;
        }
        if (in_class && c == '[' && pat[i + 1] == ':') { /* [:name:] */
            const char *q = strstr(pat + i + 2, ":]");
            size_t len = q ? (size_t)(q + 2 - (pat + i)) : 1;
            tok_buf_put(&b, pat + i, len);
            i += len - 1;
            continue;
        }
        if (in_class && c == ']' && i >= class_start) in_class = false;
        tok_buf_put(&b, &c, 1);
    }
    return b.p;
}

/* ------------------------------------------------------------------------- */
/* Hash maps                                                                 */

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    /* FNV-1a on 8-byte words, then a final mix. */
    uint64_t h = 0xcbf29ce484222325ull ^ (n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static inline uint64_t hash_u64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

/* string -> int32 map over an arena; everything a lookup needs is in the slot
 * (one cache miss for the slot, one for the key bytes). */
typedef struct {
    uint32_t tag, off, len; /* len == UINT32_MAX: empty */
    int32_t val;
} sm_slot;

typedef struct strmap_ {
    sm_slot *s;
    size_t mask, n;
    tok_buf arena;
} strmap;

static sm_slot *sm_alloc(size_t sz) {
    sm_slot *s = xmalloc(sz * sizeof(sm_slot));
    memset(s, 0xFF, sz * sizeof(sm_slot));
    return s;
}

static void sm_init(strmap *m, size_t expect) {
    size_t sz = 1024;
    while (sz < expect * 2) sz *= 2;
    m->s = sm_alloc(sz);
    m->mask = sz - 1;
    m->n = 0;
    memset(&m->arena, 0, sizeof m->arena);
}

static void sm_free(strmap *m) {
    free(m->s);
    free(m->arena.p);
    m->s = NULL;
}

static void sm_grow(strmap *m) {
    size_t sz = (m->mask + 1) * 2;
    sm_slot *ns = sm_alloc(sz);
    for (size_t i = 0; i <= m->mask; i++) {
        const sm_slot *e = &m->s[i];
        if (e->len == UINT32_MAX) continue;
        uint64_t h = hash_bytes((const uint8_t *)m->arena.p + e->off, e->len);
        size_t j = h & (sz - 1);
        while (ns[j].len != UINT32_MAX) j = (j + 1) & (sz - 1);
        ns[j] = *e;
    }
    free(m->s);
    m->s = ns;
    m->mask = sz - 1;
}

static const sm_slot *sm_find(const strmap *m, const void *k, size_t n) {
    uint64_t h = hash_bytes(k, n);
    size_t j = h & m->mask;
    uint32_t tag = (uint32_t)(h >> 32);
    for (;; j = (j + 1) & m->mask) {
        const sm_slot *e = &m->s[j];
        if (e->len == UINT32_MAX) return NULL;
        if (e->tag == tag && e->len == n && !memcmp(m->arena.p + e->off, k, n)) return e;
    }
}

/* Insert or overwrite. */
static void sm_put(strmap *m, const void *k, size_t n, int32_t v) {
    sm_slot *f = (sm_slot *)sm_find(m, k, n);
    if (f) {
        f->val = v;
        return;
    }
    if ((m->n + 1) * 2 > m->mask + 1) sm_grow(m);
    uint64_t h = hash_bytes(k, n);
    size_t j = h & m->mask;
    while (m->s[j].len != UINT32_MAX) j = (j + 1) & m->mask;
    m->s[j].tag = (uint32_t)(h >> 32);
    m->s[j].off = (uint32_t)m->arena.n;
    m->s[j].len = (uint32_t)n;
    m->s[j].val = v;
    tok_buf_put(&m->arena, k, n);
    m->n++;
}

/* merges: (left id, right id) -> (rank, merged id): merge_slot in tok_internal.h */

static inline const merge_slot *merge_find(const lilac_tokenizer *t, int32_t a, int32_t b) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t j = hash_u64(k) & t->merge_mask;
    for (;;) {
        const merge_slot *s = &t->merges[j];
        if (s->key == k) return s;
        if (s->key == UINT64_MAX) return NULL;
        j = (j + 1) & t->merge_mask;
    }
}

static void merge_put(lilac_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t j = hash_u64(k) & t->merge_mask;
    for (;;) {
        merge_slot *s = &t->merges[j];
        if (s->key == k || s->key == UINT64_MAX) {
            s->key = k;
            s->rank = rank;
            s->id = id;
            return;
        }
        j = (j + 1) & t->merge_mask;
    }
}

/* ------------------------------------------------------------------------- */
/* A small JSON scanner for tokenizer.json: the two big members (model.vocab  */
/* and model.merges) are read directly, everything else is handed to jansson. */

typedef struct {
    const char *p, *end, *base;
    lilac_err *err;
    tok_buf str; /* the last decoded string */
} jscan;

static int js_fail(jscan *j, const char *what) {
    return lilac_fail(j->err, "tokenizer.json: %s at byte %zu", what, (size_t)(j->p - j->base));
}

static void js_ws(jscan *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int js_hex4(jscan *j, uint32_t *v) {
    if (j->end - j->p < 4) return js_fail(j, "truncated \\u escape");
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval((unsigned char)j->p[i]);
        if (h < 0) return js_fail(j, "bad \\u escape");
        x = x * 16 + (uint32_t)h;
    }
    j->p += 4;
    *v = x;
    return 0;
}

static void put_utf8(tok_buf *b, uint32_t cp) {
    uint8_t o[4];
    size_t n;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        o[0] = (uint8_t)(0xF0 | (cp >> 18));
        o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 4;
    }
    tok_buf_put(b, o, n);
}

/* Parse a JSON string at j->p into j->str. */
static int js_string(jscan *j) {
    js_ws(j);
    if (j->p >= j->end || *j->p != '"') return js_fail(j, "expected a string");
    j->p++;
    j->str.n = 0;
    tok_buf_put(&j->str, "", 0);
    for (;;) {
        const char *s = j->p;
        while (j->p < j->end && *j->p != '"' && *j->p != '\\' && (unsigned char)*j->p >= 0x20) j->p++;
        tok_buf_put(&j->str, s, (size_t)(j->p - s));
        if (j->p >= j->end) return js_fail(j, "unterminated string");
        char c = *j->p++;
        if (c == '"') return 0;
        if (c != '\\') return js_fail(j, "control character in string");
        if (j->p >= j->end) return js_fail(j, "unterminated string");
        char e = *j->p++;
        switch (e) {
        case '"': tok_buf_put(&j->str, "\"", 1); break;
        case '\\': tok_buf_put(&j->str, "\\", 1); break;
        case '/': tok_buf_put(&j->str, "/", 1); break;
        case 'b': tok_buf_put(&j->str, "\b", 1); break;
        case 'f': tok_buf_put(&j->str, "\f", 1); break;
        case 'n': tok_buf_put(&j->str, "\n", 1); break;
        case 'r': tok_buf_put(&j->str, "\r", 1); break;
        case 't': tok_buf_put(&j->str, "\t", 1); break;
        case 'u': {
            uint32_t u;
            if (js_hex4(j, &u)) return -1;
            if (u >= 0xD800 && u < 0xDC00) {
                uint32_t lo;
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u') return js_fail(j, "lone surrogate");
                j->p += 2;
                if (js_hex4(j, &lo)) return -1;
                if (lo < 0xDC00 || lo >= 0xE000) return js_fail(j, "lone surrogate");
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            } else if (u >= 0xDC00 && u < 0xE000)
                return js_fail(j, "lone surrogate");
            put_utf8(&j->str, u);
            break;
        }
        default: return js_fail(j, "bad escape");
        }
    }
}

/* Skip one JSON value (syntax checked loosely; jansson checks what it reads). */
static int js_skip(jscan *j) {
    js_ws(j);
    int depth = 0;
    do {
        if (j->p >= j->end) return js_fail(j, "truncated value");
        char c = *j->p;
        if (c == '"') {
            j->p++;
            while (j->p < j->end && *j->p != '"') j->p += (*j->p == '\\') ? 2 : 1;
            if (j->p >= j->end) return js_fail(j, "unterminated string");
            j->p++;
        } else if (c == '{' || c == '[') {
            depth++;
            j->p++;
        } else if (c == '}' || c == ']') {
            if (--depth < 0) return js_fail(j, "unbalanced bracket");
            j->p++;
        } else if (c == ',' || c == ':' || c == ' ' || c == '\n' || c == '\r' || c == '\t') {
            if (depth == 0) return js_fail(j, "unexpected character");
            j->p++;
        } else {
            const char *s = j->p;
            while (j->p < j->end && strchr(",:}] \n\r\t", *j->p) == NULL) j->p++;
            if (j->p == s) return js_fail(j, "unexpected character");
        }
    } while (depth > 0);
    return 0;
}

/* Parse the value at j->p with jansson. */
static json_t *js_value(jscan *j) {
    js_ws(j);
    const char *s = j->p;
    if (js_skip(j)) return NULL;
    json_error_t e;
    json_t *v = json_loadb(s, (size_t)(j->p - s), JSON_DECODE_ANY, &e);
    if (!v) {
        j->p = s;
        js_fail(j, e.text);
    }
    return v;
}

static int js_expect(jscan *j, char c) {
    js_ws(j);
    if (j->p >= j->end || *j->p != c) {
        char m[32];
        snprintf(m, sizeof m, "expected '%c'", c);
        return js_fail(j, m);
    }
    j->p++;
    return 0;
}

/* After a member or element: returns 1 to continue, 0 at the closing bracket. */
static int js_next(jscan *j, char close) {
    js_ws(j);
    if (j->p < j->end && *j->p == ',') {
        j->p++;
        return 1;
    }
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return 0;
    }
    return js_fail(j, "expected ',' or a closing bracket");
}

static int js_peek(jscan *j, char c) {
    js_ws(j);
    return j->p < j->end && *j->p == c;
}

/* ------------------------------------------------------------------------- */
/* Loading                                                                   */

struct load_state {
    strmap vocab;    /* token string -> id */
    long max_id;
    json_t *added, *normalizer, *pretok, *decoder;
    json_t *model_opts; /* object of the small model members */
    bool have_model, have_vocab, have_merges;
    /* merges as pairs of strings, kept until the vocab is known */
    tok_buf merge_arena;
    struct pending_merge {
        size_t a_off, b_off;
        uint32_t a_len, b_len;
    } *pm;
    size_t n_pm, cap_pm;
};

static int parse_vocab(jscan *j, struct load_state *L) {
    if (js_expect(j, '{')) return -1;
    sm_init(&L->vocab, 1 << 17);
    if (js_peek(j, '}')) {
        j->p++;
        return 0;
    }
    for (;;) {
        if (js_string(j)) return -1;
        if (js_expect(j, ':')) return -1;
        js_ws(j);
        long v = 0;
        const char *s = j->p;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9' && v <= INT32_MAX) v = v * 10 + (*j->p++ - '0');
        if (j->p == s || v > INT32_MAX - 1) return js_fail(j, "model.vocab: expected a token id");
        sm_put(&L->vocab, j->str.p, j->str.n, (int32_t)v);
        if (v > L->max_id) L->max_id = v;
        int r = js_next(j, '}');
        if (r < 0) return -1;
        if (!r) break;
    }
    return 0;
}

static void pm_add(struct load_state *L, const char *a, size_t an, const char *b, size_t bn) {
    if (L->n_pm == L->cap_pm) {
        L->cap_pm = L->cap_pm ? L->cap_pm * 2 : 1 << 16;
        L->pm = xrealloc(L->pm, L->cap_pm * sizeof *L->pm);
    }
    struct pending_merge *m = &L->pm[L->n_pm++];
    m->a_off = L->merge_arena.n;
    m->a_len = (uint32_t)an;
    tok_buf_put(&L->merge_arena, a, an);
    m->b_off = L->merge_arena.n;
    m->b_len = (uint32_t)bn;
    tok_buf_put(&L->merge_arena, b, bn);
}

static int parse_merges(jscan *j, struct load_state *L) {
    if (js_expect(j, '[')) return -1;
    if (js_peek(j, ']')) {
        j->p++;
        return 0;
    }
    tok_buf tmp = {0};
    for (;;) {
        js_ws(j);
        if (js_peek(j, '[')) { /* ["a", "b"] */
            j->p++;
            if (js_string(j)) goto fail;
            tmp.n = 0;
            tok_buf_put(&tmp, j->str.p, j->str.n);
            if (js_expect(j, ',') || js_string(j) || js_expect(j, ']')) goto fail;
            pm_add(L, tmp.p, tmp.n, j->str.p, j->str.n);
        } else { /* "a b" */
            if (js_string(j)) goto fail;
            char *sp = memchr(j->str.p, ' ', j->str.n);
            if (!sp || memchr(sp + 1, ' ', j->str.n - (size_t)(sp + 1 - j->str.p))) {
                js_fail(j, "model.merges: a merge string must be two tokens separated by one space");
                goto fail;
            }
            pm_add(L, j->str.p, (size_t)(sp - j->str.p), sp + 1, j->str.n - (size_t)(sp + 1 - j->str.p));
        }
        int r = js_next(j, ']');
        if (r < 0) goto fail;
        if (!r) break;
    }
    free(tmp.p);
    return 0;
fail:
    free(tmp.p);
    return -1;
}

static int parse_model(jscan *j, struct load_state *L) {
    if (js_expect(j, '{')) return -1;
    L->model_opts = json_object();
    if (js_peek(j, '}')) {
        j->p++;
        return 0;
    }
    tok_buf key = {0};
    int rc = -1;
    for (;;) {
        if (js_string(j)) goto out;
        key.n = 0;
        tok_buf_put(&key, j->str.p, j->str.n);
        if (js_expect(j, ':')) goto out;
        if (!strcmp(key.p, "vocab") && strlen(key.p) == key.n) {
            if (L->have_vocab) {
                js_fail(j, "model.vocab given twice");
                goto out;
            }
            if (parse_vocab(j, L)) goto out;
            L->have_vocab = true;
        } else if (!strcmp(key.p, "merges") && strlen(key.p) == key.n) {
            if (parse_merges(j, L)) goto out;
            L->have_merges = true;
        } else {
            json_t *v = js_value(j);
            if (!v) goto out;
            if (strlen(key.p) == key.n) json_object_set_new(L->model_opts, key.p, v);
            else json_decref(v);
        }
        int r = js_next(j, '}');
        if (r < 0) goto out;
        if (!r) break;
    }
    rc = 0;
out:
    free(key.p);
    return rc;
}

static int parse_top(jscan *j, struct load_state *L) {
    if (js_expect(j, '{')) return -1;
    if (js_peek(j, '}')) return js_fail(j, "empty object");
    tok_buf key = {0};
    int rc = -1;
    for (;;) {
        if (js_string(j)) goto out;
        key.n = 0;
        tok_buf_put(&key, j->str.p, j->str.n);
        if (js_expect(j, ':')) goto out;
        json_t **slot = NULL;
        if (!strcmp(key.p, "model")) {
            if (L->have_model) {
                js_fail(j, "\"model\" given twice");
                goto out;
            }
            if (parse_model(j, L)) goto out;
            L->have_model = true;
        } else {
            if (!strcmp(key.p, "added_tokens")) slot = &L->added;
            else if (!strcmp(key.p, "normalizer")) slot = &L->normalizer;
            else if (!strcmp(key.p, "pre_tokenizer")) slot = &L->pretok;
            else if (!strcmp(key.p, "decoder")) slot = &L->decoder;
            if (slot) {
                json_t *v = js_value(j);
                if (!v) goto out;
                json_decref(*slot);
                *slot = v;
            } else if (js_skip(j))
                goto out;
        }
        int r = js_next(j, '}');
        if (r < 0) goto out;
        if (!r) break;
    }
    js_ws(j);
    if (j->p != j->end) {
        js_fail(j, "trailing characters");
        goto out;
    }
    rc = 0;
out:
    free(key.p);
    return rc;
}

/* The normalizer: null, NFC, or a Sequence of those. */
static int load_normalizer(lilac_tokenizer *t, json_t *n, lilac_err *err) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return lilac_fail(err, "tokenizer.json: normalizer without a type");
    if (!strcmp(type, "NFC")) {
        t->nfc = true;
        return 0;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *a = json_object_get(n, "normalizers");
        size_t i;
        json_t *x;
        if (!json_is_array(a)) return lilac_fail(err, "tokenizer.json: normalizer Sequence without a list");
        json_array_foreach(a, i, x) {
            if (load_normalizer(t, x, err)) return -1;
        }
        return 0;
    }
    return lilac_fail(err, "tokenizer.json: unsupported normalizer \"%s\" (lilac supports NFC)", type);
}

static const char *GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pretok(lilac_tokenizer *t, json_t *p, lilac_err *err, const char **pattern, bool *literal) {
    if (!p || json_is_null(p)) return lilac_fail(err, "tokenizer.json: no pre_tokenizer (lilac needs ByteLevel)");
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return lilac_fail(err, "tokenizer.json: pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *a = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *x;
        if (!json_is_array(a)) return lilac_fail(err, "tokenizer.json: pre_tokenizer Sequence without a list");
        json_array_foreach(a, i, x) {
            if (load_pretok(t, x, err, pattern, literal)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "Split")) {
        if (*pattern) return lilac_fail(err, "tokenizer.json: more than one Split pre-tokenizer is not supported");
        json_t *pat = json_object_get(p, "pattern");
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        json_t *inv = json_object_get(p, "invert");
        if (!beh || strcmp(beh, "Isolated"))
            return lilac_fail(err, "tokenizer.json: Split behavior \"%s\" not supported (only Isolated)",
                              beh ? beh : "?");
        if (inv && json_is_true(inv)) return lilac_fail(err, "tokenizer.json: Split with invert not supported");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (re) *pattern = re;
        else if (lit) {
            *pattern = lit;
            *literal = true;
        } else
            return lilac_fail(err, "tokenizer.json: Split without a pattern");
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (json_is_true(json_object_get(p, "add_prefix_space")))
            return lilac_fail(err, "tokenizer.json: ByteLevel add_prefix_space=true is not supported");
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) {
            if (*pattern) return lilac_fail(err, "tokenizer.json: Split and ByteLevel(use_regex) together");
            *pattern = GPT2_PATTERN;
        }
        t->bytelevel = true;
        return 0;
    }
    return lilac_fail(err, "tokenizer.json: unsupported pre_tokenizer \"%s\"", type);
}

static int cmp_added_first(const void *a, const void *b, void *ctx) {
    const lilac_tokenizer *t = ctx;
    const tok_added *x = &t->added[*(const int *)a], *y = &t->added[*(const int *)b];
    const char *xs = x->norm ? x->norm : x->content, *ys = y->norm ? y->norm : y->content;
    size_t xn = x->norm ? x->norm_len : x->len, yn = y->norm ? y->norm_len : y->len;
    if ((uint8_t)xs[0] != (uint8_t)ys[0]) return (uint8_t)xs[0] - (uint8_t)ys[0];
    if (xn != yn) return xn > yn ? -1 : 1;
    return 0;
}

/* Build the first-byte index of one matching set (normalized or not). */
static void build_match_set(lilac_tokenizer *t, tok_matchset *ms, bool normalized) {
    int n = 0;
    ms->order = xmalloc(sizeof(int) * (size_t)(t->n_added + 1));
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].len > 0) ms->order[n++] = i;
    qsort_r(ms->order, (size_t)n, sizeof(int), cmp_added_first, t);
    ms->n = n;
    for (int b = 0; b <= 256; b++) ms->start[b] = 0;
    for (int k = 0; k < n; k++) {
        const tok_added *a = &t->added[ms->order[k]];
        uint8_t b = (uint8_t)(a->norm ? a->norm[0] : a->content[0]);
        ms->start[b + 1]++;
    }
    for (int b = 0; b < 256; b++) ms->start[b + 1] += ms->start[b];
    int distinct = 0, last = -1;
    for (int b = 0; b < 256; b++)
        if (ms->start[b + 1] > ms->start[b]) {
            distinct++;
            last = b;
        }
    ms->single_first = distinct == 1 ? last : -1;
}

static int load_added(lilac_tokenizer *t, json_t *arr, const strmap *vocab, lilac_err *err) {
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return lilac_fail(err, "tokenizer.json: added_tokens is not a list");
    size_t n = json_array_size(arr);
    t->added = xcalloc(n + 1, sizeof(tok_added));
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) {
        json_t *id = json_object_get(x, "id");
        json_t *c = json_object_get(x, "content");
        if (!json_is_integer(id) || !json_is_string(c) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX)
            return lilac_fail(err, "tokenizer.json: added_tokens[%zu] needs an integer id and a string content", i);
        if (json_string_length(c) == 0) continue; /* HF ignores empty tokens */
        tok_added *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(id);
        /* HF: a token already in the model's vocab keeps its vocab id */
        const sm_slot *in_vocab = vocab && vocab->s ? sm_find(vocab, json_string_value(c), json_string_length(c)) : NULL;
        if (in_vocab) a->id = in_vocab->val;
        a->len = json_string_length(c);
        a->content = xmalloc(a->len + 1);
        memcpy(a->content, json_string_value(c), a->len + 1);
        a->single_word = json_is_true(json_object_get(x, "single_word"));
        a->lstrip = json_is_true(json_object_get(x, "lstrip"));
        a->rstrip = json_is_true(json_object_get(x, "rstrip"));
        json_t *nz = json_object_get(x, "normalized");
        a->normalized = nz ? json_is_true(nz) : !json_is_true(json_object_get(x, "special"));
        a->special = json_is_true(json_object_get(x, "special"));
        if (a->normalized && t->nfc) {
            tok_buf b = {0};
            if (nfc((const uint8_t *)a->content, a->len, &b, err)) {
                free(b.p);
                return -1;
            }
            if (b.n == 0) {
                free(b.p);
                t->n_added--;
                free(a->content);
                continue;
            }
            a->norm = b.p;
            a->norm_len = b.n;
        }
        if (a->id > t->max_id) t->max_id = a->id;
    }
    return 0;
}

static lilac_tokenizer *load_fail(lilac_tokenizer *t, struct load_state *L) {
    if (L->vocab.s) sm_free(&L->vocab);
    json_decref(L->added);
    json_decref(L->normalizer);
    json_decref(L->pretok);
    json_decref(L->decoder);
    json_decref(L->model_opts);
    free(L->merge_arena.p);
    free(L->pm);
    lilac_tok_free(t);
    return NULL;
}

lilac_tokenizer *lilac_tok_load_mem(const char *json, size_t len, lilac_err *err) {
    tok_global_init();
    lilac_tokenizer *t = xcalloc(1, sizeof *t);
    struct load_state L;
    memset(&L, 0, sizeof L);
    L.max_id = -1;
    t->max_id = -1;

    size_t v = lilac_utf8_check(json, len);
    if (v != len) {
        lilac_fail(err, "tokenizer.json: invalid UTF-8 at byte %zu", v);
        return load_fail(t, &L);
    }
    jscan j = {.p = json, .end = json + len, .base = json, .err = err};
    int rc = parse_top(&j, &L);
    free(j.str.p);
    if (rc) return load_fail(t, &L);
    if (!L.have_model || !L.have_vocab) {
        lilac_fail(err, "tokenizer.json: no model.vocab");
        return load_fail(t, &L);
    }
    const char *mtype = json_string_value(json_object_get(L.model_opts, "type"));
    if (mtype && strcmp(mtype, "BPE")) {
        lilac_fail(err, "tokenizer.json: model type \"%s\" is not supported (lilac reads BPE)", mtype);
        return load_fail(t, &L);
    }
    {
        const char *cs = json_string_value(json_object_get(L.model_opts, "continuing_subword_prefix"));
        const char *ew = json_string_value(json_object_get(L.model_opts, "end_of_word_suffix"));
        json_t *dr = json_object_get(L.model_opts, "dropout");
        if ((cs && *cs) || (ew && *ew)) {
            lilac_fail(err, "tokenizer.json: BPE subword prefix/suffix not supported");
            return load_fail(t, &L);
        }
        if (dr && !json_is_null(dr) && !(json_is_number(dr) && json_number_value(dr) == 0.0)) {
            lilac_fail(err, "tokenizer.json: BPE dropout not supported");
            return load_fail(t, &L);
        }
        if (json_is_true(json_object_get(L.model_opts, "byte_fallback"))) {
            lilac_fail(err, "tokenizer.json: BPE byte_fallback not supported");
            return load_fail(t, &L);
        }
        t->ignore_merges = json_is_true(json_object_get(L.model_opts, "ignore_merges"));
    }
    if (load_normalizer(t, L.normalizer, err)) return load_fail(t, &L);
    const char *pattern = NULL;
    bool literal = false;
    if (load_pretok(t, L.pretok, err, &pattern, &literal)) return load_fail(t, &L);
    if (!t->bytelevel) {
        lilac_fail(err, "tokenizer.json: pre_tokenizer has no ByteLevel step (lilac reads byte-level BPE)");
        return load_fail(t, &L);
    }
    if (L.decoder && !json_is_null(L.decoder)) {
        const char *dt = json_string_value(json_object_get(L.decoder, "type"));
        if (!dt || strcmp(dt, "ByteLevel")) {
            lilac_fail(err, "tokenizer.json: decoder \"%s\" not supported (lilac decodes ByteLevel)", dt ? dt : "?");
            return load_fail(t, &L);
        }
    }

    /* vocab: id -> bytes */
    t->max_id = L.max_id;
    if (load_added(t, L.added, &L.vocab, err)) return load_fail(t, &L);
    t->n_ids = (int32_t)(t->max_id + 1);
    t->tok_off = xcalloc((size_t)t->n_ids + 1, sizeof(uint32_t));
    t->tok_len = xcalloc((size_t)t->n_ids + 1, sizeof(uint32_t));
    t->tok_kind = xcalloc((size_t)t->n_ids + 1, 1);
    tok_buf arena = {0};
    tok_buf_put(&arena, "", 0);
    for (size_t i = 0; i <= L.vocab.mask; i++) {
        const sm_slot *e = &L.vocab.s[i];
        if (e->len == UINT32_MAX) continue;
        int32_t id = e->val;
        t->tok_off[id] = (uint32_t)arena.n;
        bytelevel_decode(L.vocab.arena.p + e->off, e->len, &arena);
        t->tok_len[id] = (uint32_t)(arena.n - t->tok_off[id]);
        t->tok_kind[id] = TOK_KIND_VOCAB;
    }
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        t->tok_off[a->id] = (uint32_t)arena.n;
        bytelevel_decode(a->content, a->len, &arena);
        t->tok_len[a->id] = (uint32_t)(arena.n - t->tok_off[a->id]);
        t->tok_kind[a->id] = a->special ? TOK_KIND_SPECIAL : TOK_KIND_ADDED;
    }
    if (arena.n > UINT32_MAX) {
        free(arena.p);
        lilac_fail(err, "tokenizer.json: vocabulary too large");
        return load_fail(t, &L);
    }
    t->tok_bytes = (uint8_t *)arena.p;

    /* initial symbols: each byte's alphabet character */
    for (int b = 0; b < 256; b++) {
        tok_buf s = {0};
        put_utf8(&s, byte_to_cp[b]);
        const sm_slot *f = sm_find(&L.vocab, s.p, s.n);
        t->byte_id[b] = f ? f->val : -1;
        free(s.p);
    }

    /* merges */
    size_t sz = 1024;
    while (sz < L.n_pm * 2 + 2) sz *= 2;
    t->merges = xmalloc(sz * sizeof(merge_slot));
    for (size_t i = 0; i < sz; i++) t->merges[i].key = UINT64_MAX;
    t->merge_mask = sz - 1;
    tok_buf cat = {0};
    for (size_t i = 0; i < L.n_pm; i++) {
        const struct pending_merge *m = &L.pm[i];
        const char *a = L.merge_arena.p + m->a_off, *b = L.merge_arena.p + m->b_off;
        const sm_slot *ia = sm_find(&L.vocab, a, m->a_len), *ib = sm_find(&L.vocab, b, m->b_len);
        cat.n = 0;
        tok_buf_put(&cat, a, m->a_len);
        tok_buf_put(&cat, b, m->b_len);
        const sm_slot *ic = sm_find(&L.vocab, cat.p, cat.n);
        if (!ia || !ib || !ic) {
            lilac_fail(err, "tokenizer.json: merges[%zu] (\"%.*s\" \"%.*s\"): %s not in the vocab", i,
                       (int)(m->a_len > 40 ? 40 : m->a_len), a, (int)(m->b_len > 40 ? 40 : m->b_len), b,
                       !ia ? "left token" : !ib ? "right token" : "merged token");
            free(cat.p);
            return load_fail(t, &L);
        }
        merge_put(t, ia->val, ib->val, (uint32_t)i, ic->val);
    }
    free(cat.p);
    t->n_merges = L.n_pm;

    if (t->ignore_merges) { /* whole-piece lookup table: bytes -> id */
        t->piece_map = xcalloc(1, sizeof(strmap));
        sm_init(t->piece_map, L.vocab.n);
        for (size_t i = 0; i <= L.vocab.mask; i++) {
            if (L.vocab.s[i].len == UINT32_MAX) continue;
            int32_t id = L.vocab.s[i].val;
            sm_put(t->piece_map, t->tok_bytes + t->tok_off[id], t->tok_len[id], id);
        }
    }

    build_match_set(t, &t->raw_set, false);
    build_match_set(t, &t->norm_set, true);

    /* the split regex */
    if (pattern) {
        int ec;
        PCRE2_SIZE eo;
        uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
        char *rw = literal ? xstrdup(pattern) : rewrite_ws(pattern);
        t->re = pcre2_compile((PCRE2_SPTR)rw, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
        free(rw);
        if (!t->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            lilac_fail(err, "tokenizer.json: pre_tokenizer regex does not compile at offset %zu: %s", (size_t)eo,
                       (char *)msg);
            return load_fail(t, &L);
        }
        t->re_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    }

    sm_free(&L.vocab);

    json_decref(L.added);
    json_decref(L.normalizer);
    json_decref(L.pretok);
    json_decref(L.decoder);
    json_decref(L.model_opts);
    free(L.merge_arena.p);
    free(L.pm);
    return t;
}

lilac_tokenizer *lilac_tok_load(const char *path, lilac_err *err) {
    struct stat st;
    char *p = NULL;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t n = strlen(path) + 32;
        p = xmalloc(n);
        snprintf(p, n, "%s/tokenizer.json", path);
    }
    size_t len;
    char *buf = lilac_read_file(p ? p : path, &len, err);
    if (!buf) {
        free(p);
        return NULL;
    }
    lilac_tokenizer *t = lilac_tok_load_mem(buf, len, err);
    if (!t) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err ? err->msg : "");
        lilac_fail(err, "%s: %s", p ? p : path, m);
    }
    free(buf);
    free(p);
    return t;
}

void lilac_tok_free(lilac_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].norm);
    }
    free(t->added);
    free(t->raw_set.order);
    free(t->norm_set.order);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_kind);
    free(t->tok_bytes);
    free(t->merges);
    if (t->piece_map) {
        sm_free(t->piece_map);
        free(t->piece_map);
    }
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

int32_t lilac_tok_vocab_size(const lilac_tokenizer *t) { return t->n_ids; }
int lilac_tok_n_added(const lilac_tokenizer *t) { return t->n_added; }

int32_t lilac_tok_added_id(const lilac_tokenizer *t, const char *content) {
    size_t n = strlen(content);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, content, n)) return t->added[i].id;
    return -1;
}

bool lilac_tok_is_added(const lilac_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->tok_kind[id] >= TOK_KIND_ADDED;
}
bool lilac_tok_is_special(const lilac_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->tok_kind[id] == TOK_KIND_SPECIAL;
}

const uint8_t *lilac_tok_bytes(const lilac_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->tok_kind[id]) {
        *len = 0;
        return NULL;
    }
    *len = t->tok_len[id];
    return t->tok_bytes + t->tok_off[id];
}

char *lilac_tok_decode(const lilac_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, size_t *out_len) {
    tok_buf raw = {0}, out = {0};
    tok_buf_put(&raw, "", 0);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->tok_kind[id]) continue;
        if (skip_special && t->tok_kind[id] == TOK_KIND_SPECIAL) continue;
        tok_buf_put(&raw, t->tok_bytes + t->tok_off[id], t->tok_len[id]);
    }
    tok_buf_put(&out, "", 0);
    tok_utf8_lossy(&out, (const uint8_t *)raw.p, raw.n);
    free(raw.p);
    if (out_len) *out_len = out.n;
    return out.p;
}

/* ------------------------------------------------------------------------- */
/* BPE                                                                       */

/* Per-call scratch. */
typedef struct {
    const lilac_tokenizer *t;
    lilac_ids *out;
    lilac_err *err;
    pcre2_match_data *md;
    tok_buf norm; /* NFC output */
    /* BPE work arrays */
    int32_t *sid;
    uint32_t *srank;
    int32_t *snew;
    int32_t *prev, *next;
    uint64_t *heap;
    size_t cap_sym, cap_heap;
    /* piece cache */
    struct cache_slot {
        uint64_t h;
        uint32_t key_off, ids_off;
        uint16_t key_len, n_ids; /* key_len 0 = empty */
    } *cache;
    size_t cache_mask, cache_used;
    tok_buf cache_keys;
    int32_t *cache_ids;
    size_t n_cache_ids, cap_cache_ids;
} enc_ctx;

#define CACHE_MAX_KEY 48
#define SMALL_N 96

static void ensure_sym(enc_ctx *c, size_t n) {
    if (n <= c->cap_sym) return;
    size_t cap = c->cap_sym ? c->cap_sym : 256;
    while (cap < n) cap *= 2;
    c->sid = xrealloc(c->sid, cap * sizeof(int32_t));
    c->srank = xrealloc(c->srank, cap * sizeof(uint32_t));
    c->snew = xrealloc(c->snew, cap * sizeof(int32_t));
    c->prev = xrealloc(c->prev, cap * sizeof(int32_t));
    c->next = xrealloc(c->next, cap * sizeof(int32_t));
    c->cap_sym = cap;
}

static inline void pair_rank(const lilac_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    const merge_slot *m = merge_find(t, a, b);
    if (m) {
        *rank = m->rank;
        *nid = m->id;
    } else {
        *rank = UINT32_MAX;
        *nid = -1;
    }
}

/* Small pieces: an array of symbols; repeatedly merge the lowest-ranked pair
 * (leftmost on ties). Returns the number of symbols left in c->sid. */
static size_t bpe_small(enc_ctx *c, size_t n) {
    const lilac_tokenizer *t = c->t;
    int32_t *id = c->sid;
    uint32_t *rk = c->srank;
    int32_t *nw = c->snew;
    for (size_t i = 0; i + 1 < n; i++) pair_rank(t, id[i], id[i + 1], &rk[i], &nw[i]);
    while (n > 1) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (rk[i] < best) {
                best = rk[i];
                bi = i;
            }
        if (best == UINT32_MAX) break;
        id[bi] = nw[bi];
        memmove(id + bi + 1, id + bi + 2, (n - bi - 2) * sizeof(int32_t));
        memmove(rk + bi + 1, rk + bi + 2, (n - bi - 2) * sizeof(uint32_t));
        memmove(nw + bi + 1, nw + bi + 2, (n - bi - 2) * sizeof(int32_t));
        n--;
        if (bi > 0) pair_rank(t, id[bi - 1], id[bi], &rk[bi - 1], &nw[bi - 1]);
        if (bi + 1 < n) pair_rank(t, id[bi], id[bi + 1], &rk[bi], &nw[bi]);
        else rk[bi] = UINT32_MAX;
    }
    return n;
}

/* Binary min-heap of (rank << 32 | position). */
static void heap_push(enc_ctx *c, size_t *hn, uint64_t v) {
    if (*hn == c->cap_heap) {
        c->cap_heap = c->cap_heap ? c->cap_heap * 2 : 1024;
        c->heap = xrealloc(c->heap, c->cap_heap * sizeof(uint64_t));
    }
    uint64_t *h = c->heap;
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(enc_ctx *c, size_t *hn) {
    uint64_t *h = c->heap;
    uint64_t top = h[0], v = h[--(*hn)];
    size_t n = *hn, i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        size_t m = (l + 1 < n && h[l + 1] < h[l]) ? l + 1 : l;
        if (h[m] >= v) break;
        h[i] = h[m];
        i = m;
    }
    if (n) h[i] = v;
    return top;
}

/* Long pieces: linked symbols and a heap, O(n log n) (HF's algorithm). */
static size_t bpe_large(enc_ctx *c, size_t n) {
    const lilac_tokenizer *t = c->t;
    int32_t *id = c->sid, *prev = c->prev, *next = c->next;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const merge_slot *m = merge_find(t, id[i], id[i + 1]);
        if (m) heap_push(c, &hn, ((uint64_t)m->rank << 32) | i);
    }
    while (hn) {
        uint64_t top = heap_pop(c, &hn);
        uint32_t rank = (uint32_t)(top >> 32);
        size_t pos = (size_t)(top & 0xffffffffu);
        if (id[pos] < 0 || next[pos] < 0) continue; /* removed, or last */
        size_t nx = (size_t)next[pos];
        const merge_slot *m = merge_find(t, id[pos], id[nx]);
        if (!m || m->rank != rank) continue; /* stale */
        id[pos] = m->id;
        id[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = (int32_t)pos;
        if (prev[pos] >= 0) {
            size_t p = (size_t)prev[pos];
            const merge_slot *q = merge_find(t, id[p], id[pos]);
            if (q) heap_push(c, &hn, ((uint64_t)q->rank << 32) | p);
        }
        if (next[pos] >= 0) {
            const merge_slot *q = merge_find(t, id[pos], id[next[pos]]);
            if (q) heap_push(c, &hn, ((uint64_t)q->rank << 32) | pos);
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) id[k++] = id[i];
    return k;
}

/* Test hook: force one algorithm (0 auto, 1 small, 2 large). */
int lilac_tok_bpe_force_ = 0;

static int bpe_piece(enc_ctx *c, const uint8_t *s, size_t n) {
    const lilac_tokenizer *t = c->t;
    if (n == 1) {
        if (t->byte_id[s[0]] >= 0) lilac_ids_push(c->out, t->byte_id[s[0]]);
        return 0;
    }
    if (t->piece_map) {
        const sm_slot *f = sm_find(t->piece_map, s, n);
        if (f) {
            lilac_ids_push(c->out, f->val);
            return 0;
        }
    }
    uint64_t h = 0;
    struct cache_slot *slot = NULL;
    if (n <= CACHE_MAX_KEY && c->cache) {
        h = hash_bytes(s, n);
        size_t j = h & c->cache_mask;
        for (;;) {
            struct cache_slot *e = &c->cache[j];
            if (!e->key_len) {
                slot = e;
                break;
            }
            if (e->h == h && e->key_len == n && !memcmp(c->cache_keys.p + e->key_off, s, n)) {
                for (uint16_t k = 0; k < e->n_ids; k++) lilac_ids_push(c->out, c->cache_ids[e->ids_off + k]);
                return 0;
            }
            j = (j + 1) & c->cache_mask;
        }
    }
    if (n > (size_t)INT32_MAX - 1) return lilac_fail(c->err, "piece too long");
    ensure_sym(c, n);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] >= 0) c->sid[m++] = t->byte_id[s[i]];
    size_t k = m;
    if (m > 1) {
        bool small = lilac_tok_bpe_force_ ? lilac_tok_bpe_force_ == 1 : m <= SMALL_N;
        k = small ? bpe_small(c, m) : bpe_large(c, m);
    }
    for (size_t i = 0; i < k; i++) lilac_ids_push(c->out, c->sid[i]);
    if (slot && (c->cache_used + 1) * 4 <= (c->cache_mask + 1) * 3) {
        if (c->n_cache_ids + k > c->cap_cache_ids) {
            c->cap_cache_ids = (c->cap_cache_ids + k) * 2;
            c->cache_ids = xrealloc(c->cache_ids, c->cap_cache_ids * sizeof(int32_t));
        }
        slot->h = h;
        slot->key_off = (uint32_t)c->cache_keys.n;
        slot->key_len = (uint16_t)n;
        slot->ids_off = (uint32_t)c->n_cache_ids;
        slot->n_ids = (uint16_t)k;
        tok_buf_put(&c->cache_keys, s, n);
        memcpy(c->cache_ids + c->n_cache_ids, c->sid, k * sizeof(int32_t));
        c->n_cache_ids += k;
        c->cache_used++;
    }
    return 0;
}

/* Split a normalized span with the regex and BPE every piece. */
static int split_and_bpe(enc_ctx *c, const uint8_t *s, size_t n) {
    const lilac_tokenizer *t = c->t;
    if (n == 0) return 0;
    if (!t->re) return bpe_piece(c, s, n);
    size_t gap = 0, off = 0; /* unmatched text starts at gap; search from off */
    while (off < n) {
        int rc = t->re_jit ? pcre2_jit_match(t->re, s, n, off, 0, c->md, NULL)
                           : pcre2_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
            rc == PCRE2_ERROR_NOMEMORY) {
            /* retry with the interpreter, whose limits are on the heap */
            rc = pcre2_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, c->md, NULL);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return lilac_fail(c->err, "pre-tokenizer regex failed at byte %zu: %s", off, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t a = ov[0], b = ov[1];
        if (b <= a) { /* an empty match yields no piece: step one character */
            size_t step = 1;
            while (a + step < n && (s[a + step] & 0xC0) == 0x80) step++;
            off = a + step;
            continue;
        }
        if (a > gap && bpe_piece(c, s + gap, a - gap)) return -1;
        if (bpe_piece(c, s + a, b - a)) return -1;
        gap = off = b;
    }
    if (gap < n && bpe_piece(c, s + gap, n - gap)) return -1;
    return 0;
}

/* A span between raw added tokens: NFC, then normalized added tokens, then split. */
static int encode_span(enc_ctx *c, const uint8_t *s, size_t n, bool allow_norm_added);

/* Sorted, merged "plain" ranges and a cursor over them. */
typedef struct {
    const lilac_span *sp;
    size_t n, i;
} plain_set;

/* May an added token occupy [a, b)? (a never decreases between calls) */
static bool plain_allows(plain_set *ps, size_t a, size_t b) {
    if (!ps) return true;
    while (ps->i < ps->n && ps->sp[ps->i].off + ps->sp[ps->i].len <= a) ps->i++;
    if (ps->i == ps->n) return true;
    return ps->sp[ps->i].off >= b;
}

static bool plain_overlaps(const plain_set *ps, size_t a, size_t b) {
    if (!ps) return false;
    for (size_t i = 0; i < ps->n; i++) {
        size_t x = ps->sp[i].off, y = x + ps->sp[i].len;
        if (x < b && y > a && ps->sp[i].len) return true;
    }
    return false;
}

static bool is_ws_cp(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool is_word_cp(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ND) || k == UTF8PROC_CATEGORY_NL ||
           k == UTF8PROC_CATEGORY_PC;
}

/* Code point ending at s[0..i) (i > 0, valid UTF-8). */
static uint32_t cp_before(const uint8_t *s, size_t i, size_t *start) {
    size_t j = i - 1;
    while (j > 0 && (s[j] & 0xC0) == 0x80) j--;
    uint32_t cp = 0;
    utf8_seq(s + j, i - j, &cp);
    if (start) *start = j;
    return cp;
}

/* Find added tokens of set `ms` in s[0..n), HF find_matches semantics
 * (leftmost-longest, then single_word / lstrip / rstrip), and encode the text
 * between them with `between`. `ps` restricts where matches may lie. */
static int split_added(enc_ctx *c, const tok_matchset *ms, const uint8_t *s, size_t n, plain_set *ps,
                       int (*between)(enc_ctx *, const uint8_t *, size_t, bool), bool norm) {
    const lilac_tokenizer *t = c->t;
    size_t start_offset = 0, i = 0;
    while (ms->n && i < n) {
        /* next candidate position */
        if (ms->single_first >= 0) {
            const uint8_t *q = memchr(s + i, ms->single_first, n - i);
            if (!q) break;
            i = (size_t)(q - s);
        } else {
            while (i < n && ms->start[s[i] + 1] == ms->start[s[i]]) i++;
            if (i >= n) break;
        }
        int hit = -1;
        size_t hl = 0;
        for (int k = ms->start[s[i]]; k < ms->start[s[i] + 1]; k++) {
            const tok_added *a = &t->added[ms->order[k]];
            const char *ct = norm ? a->norm : a->content;
            size_t cl = norm ? a->norm_len : a->len;
            if (cl <= n - i && !memcmp(s + i, ct, cl)) {
                hit = ms->order[k];
                hl = cl;
                break; /* sorted longest first */
            }
        }
        if (hit < 0 || !plain_allows(ps, i, i + hl)) {
            i++;
            continue;
        }
        const tok_added *a = &t->added[hit];
        size_t start = i, stop = i + hl;
        i = stop; /* the automaton continues after this match either way */
        if (a->single_word) {
            bool start_space = start == 0 || !is_word_cp(cp_before(s, start, NULL));
            uint32_t nc = 0;
            bool stop_space = stop == n || (utf8_seq(s + stop, n - stop, &nc), !is_word_cp(nc));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t j;
                uint32_t cp = cp_before(s, ns, &j);
                if (!is_ws_cp(cp)) break;
                ns = j;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int k = utf8_seq(s + stop, n - stop, &cp);
                if (!k || !is_ws_cp(cp)) break;
                stop += (size_t)k;
            }
        }
        if (start > start_offset && between(c, s + start_offset, start - start_offset, !plain_overlaps(ps, start_offset, start)))
            return -1;
        lilac_ids_push(c->out, a->id);
        start_offset = stop;
        if (i < stop) i = stop;
    }
    if (start_offset < n &&
        between(c, s + start_offset, n - start_offset, !plain_overlaps(ps, start_offset, n)))
        return -1;
    return 0;
}

static int between_split(enc_ctx *c, const uint8_t *s, size_t n, bool unused) {
    (void)unused;
    return split_and_bpe(c, s, n);
}

static int encode_span(enc_ctx *c, const uint8_t *s, size_t n, bool allow_norm_added) {
    const lilac_tokenizer *t = c->t;
    if (n == 0) return 0;
    const uint8_t *u = s;
    size_t un = n;
    tok_buf local = {0};
    if (t->nfc && !nfc_quick(s, n)) {
        if (nfc_windows(s, n, &local, c->err)) {
            free(local.p);
            return -1;
        }
        u = (const uint8_t *)local.p;
        un = local.n;
    }
    int rc;
    if (allow_norm_added && t->norm_set.n) rc = split_added(c, &t->norm_set, u, un, NULL, between_split, true);
    else rc = split_and_bpe(c, u, un);
    free(local.p);
    return rc;
}

static int between_span(enc_ctx *c, const uint8_t *s, size_t n, bool allow) { return encode_span(c, s, n, allow); }

static int cmp_span(const void *a, const void *b) {
    const lilac_span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int encode_impl(const lilac_tokenizer *t, const char *text, size_t len, int mode, const lilac_span *plain,
                       size_t n_plain, lilac_ids *out, lilac_err *err) {
    size_t v = lilac_utf8_check(text, len);
    if (v != len) return lilac_fail(err, "input is not valid UTF-8 (byte %zu)", v);
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.out = out;
    c.err = err;
    if (t->re) {
        c.md = pcre2_match_data_create_from_pattern(t->re, NULL);
        if (!c.md) return lilac_fail(err, "out of memory (regex match data)");
    }
    size_t slots = 256;
    while (slots < len / 2 && slots < (1u << 17)) slots *= 2;
    c.cache = xcalloc(slots, sizeof *c.cache);
    c.cache_mask = slots - 1;

    plain_set ps = {0}, *psp = NULL;
    lilac_span *sorted = NULL;
    if (mode == 2) { /* masked */
        sorted = xmalloc(sizeof(lilac_span) * (n_plain + 1));
        size_t m = 0;
        for (size_t i = 0; i < n_plain; i++)
            if (plain[i].len) sorted[m++] = plain[i];
        qsort(sorted, m, sizeof *sorted, cmp_span);
        size_t k = 0; /* merge overlapping */
        for (size_t i = 0; i < m; i++) {
            if (k && sorted[i].off <= sorted[k - 1].off + sorted[k - 1].len) {
                size_t e = sorted[i].off + sorted[i].len;
                if (e > sorted[k - 1].off + sorted[k - 1].len) sorted[k - 1].len = e - sorted[k - 1].off;
            } else
                sorted[k++] = sorted[i];
        }
        ps.sp = sorted;
        ps.n = k;
        psp = &ps;
    }
    int rc;
    if (mode == LILAC_TOK_PLAIN) rc = encode_span(&c, (const uint8_t *)text, len, false);
    else rc = split_added(&c, &t->raw_set, (const uint8_t *)text, len, psp, between_span, false);

    free(sorted);
    if (c.md) pcre2_match_data_free(c.md);
    free(c.norm.p);
    free(c.sid);
    free(c.srank);
    free(c.snew);
    free(c.prev);
    free(c.next);
    free(c.heap);
    free(c.cache);
    free(c.cache_keys.p);
    free(c.cache_ids);
    return rc;
}

int lilac_tok_encode(const lilac_tokenizer *t, const char *text, size_t len, int mode, lilac_ids *out,
                     lilac_err *err) {
    return encode_impl(t, text, len, mode == LILAC_TOK_SPECIAL ? LILAC_TOK_SPECIAL : LILAC_TOK_PLAIN, NULL, 0, out,
                       err);
}

int lilac_tok_encode_masked(const lilac_tokenizer *t, const char *text, size_t len, const lilac_span *plain,
                            size_t n_plain, lilac_ids *out, lilac_err *err) {
    return encode_impl(t, text, len, 2, plain, n_plain, out, err);
}
