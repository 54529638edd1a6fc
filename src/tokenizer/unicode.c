/* unicode.c — the tokenizer's text handling: UTF-8 validation and repair, the
 * GPT-2 byte-level alphabet, and NFC normalisation as HF's tokenizers does it. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "tok_internal.h"
#include "hf_unicode.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------- */
/* UTF-8                                                                     */


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
        int k = tok_utf8_seq(s + i, len - i, &cp);
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

uint32_t tok_byte_to_cp[256];
static int16_t cp_to_byte[324]; /* code points 0..323 -> byte, or -1 */

static void byte_alphabet_init(void) {
    int n = 0;
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        tok_byte_to_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_to_byte[tok_byte_to_cp[b]] = (int16_t)b;
    }
}

/* HF ByteLevel decoder on one token string: if every character is in the
 * byte alphabet, the bytes they stand for; otherwise the string's own bytes. */
void tok_bytelevel_decode(const char *s, size_t n, tok_buf *out) {
    size_t start = out->n;
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int k = tok_utf8_seq(u + i, n - i, &cp);
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
        int k = m > 0 ? tok_utf8_seq(enc, (size_t)m, &first) : 0;
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
bool tok_nfc_quick(const uint8_t *s, size_t n) {
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
        int k = tok_utf8_seq(s + i, n - i, &cp);
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
int tok_nfc(const uint8_t *s, size_t n, tok_buf *out, lilac_err *err) {
    out->n = 0;
    tok_buf_put(out, "", 0);
    size_t i = 0, st = 0;
    while (i < n) {
        uint32_t cp;
        int k = tok_utf8_seq(s + i, n - i, &cp);
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
int tok_nfc_windows(const uint8_t *s, size_t n, tok_buf *out, lilac_err *err) {
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
        int k = tok_utf8_seq(s + i, n - i, &cp);
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
            int k2 = tok_utf8_seq(s + j, n - j, &c2);
            if (!k2 || !cp_unsafe(c2)) break;
            j += (size_t)k2;
        }
        tok_buf_put(out, s + copied, ws - copied);
        if (tok_nfc(s + ws, j - ws, &w, err)) {
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
