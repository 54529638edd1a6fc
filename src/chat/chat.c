/* chat.c — the Qwen3.6 chat template in C; see chat.h. Each block below follows
 * the corresponding part of chat_template.jinja, in the same order, so that the
 * same inputs fail with the same error. */
#include "chat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------- */
/* Strings that remember, byte by byte, whether they came from the caller.   */

typedef struct {
    char *s;
    uint8_t *m; /* 1 = caller data, 0 = template text */
    size_t n, cap;
} tstr;

static void ts_put(tstr *t, const char *s, size_t n, uint8_t mark) {
    if (t->n + n + 1 > t->cap) {
        size_t c = t->cap ? t->cap : 64;
        while (c < t->n + n + 1) c *= 2;
        t->s = xrealloc(t->s, c);
        t->m = xrealloc(t->m, c);
        t->cap = c;
    }
    if (n) {
        memcpy(t->s + t->n, s, n);
        memset(t->m + t->n, mark, n);
    }
    t->n += n;
    t->s[t->n] = 0;
}

static void ts_lit(tstr *t, const char *s) { ts_put(t, s, strlen(s), 0); }
static void ts_data(tstr *t, const char *s, size_t n) { ts_put(t, s, n, 1); }

/* Append src[off, off+n) keeping its marks. */
static void ts_sub(tstr *t, const tstr *src, size_t off, size_t n) {
    if (!n) return;
    ts_put(t, src->s + off, n, 0);
    memcpy(t->m + t->n - n, src->m + off, n);
}

static void ts_free(tstr *t) {
    free(t->s);
    free(t->m);
    memset(t, 0, sizeof *t);
}

static void ts_init(tstr *t) {
    memset(t, 0, sizeof *t);
    ts_put(t, "", 0, 0);
}

/* Replace *t by its slice [off, off+n). */
static void ts_slice(tstr *t, size_t off, size_t n) {
    memmove(t->s, t->s + off, n);
    memmove(t->m, t->m + off, n);
    t->n = n;
    t->s[n] = 0;
}

/* Python str.isspace() */
static bool py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

static int dec(const char *s, size_t n, uint32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (k <= 0) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = (uint32_t)c;
    return (int)k;
}

/* |trim: Python str.strip() */
static void ts_strip(tstr *t) {
    size_t a = 0, b = t->n;
    while (a < b) {
        uint32_t c;
        int k = dec(t->s + a, b - a, &c);
        if (!py_space(c)) break;
        a += (size_t)k;
    }
    while (b > a) {
        size_t j = b - 1;
        while (j > a && ((uint8_t)t->s[j] & 0xC0) == 0x80) j--;
        uint32_t c;
        dec(t->s + j, b - j, &c);
        if (!py_space(c)) break;
        b = j;
    }
    ts_slice(t, a, b - a);
}

static const char *find(const tstr *t, const char *needle) {
    return memmem(t->s, t->n, needle, strlen(needle));
}

static const char *find_last(const tstr *t, const char *needle) {
    size_t nl = strlen(needle);
    const char *last = NULL, *p = t->s;
    while ((p = memmem(p, t->n - (size_t)(p - t->s), needle, nl))) {
        last = p;
        p++;
    }
    return last;
}

/* ------------------------------------------------------------------------- */
/* Python's str() and json.dumps() of JSON values.                           */

/* repr(float): the shortest digits that read back to x, Python's layout. */
static void py_float(tstr *t, double x, uint8_t mark) {
    char buf[64], digits[32];
    if (isnan(x)) {
        ts_put(t, "NaN", 3, mark);
        return;
    }
    if (isinf(x)) {
        ts_put(t, x < 0 ? "-Infinity" : "Infinity", x < 0 ? 9 : 8, mark);
        return;
    }
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    const char *q = buf;
    bool neg = *q == '-';
    if (neg) q++;
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    digits[nd] = 0;
    int e = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    int decpt = e + 1;
    char out[96];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -decpt; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
            for (int i = nd; i < decpt; i++) out[o++] = '0';
            out[o++] = '.';
            out[o++] = '0';
        } else {
            for (int i = 0; i < nd; i++) {
                if (i == decpt) out[o++] = '.';
                out[o++] = digits[i];
            }
        }
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    ts_put(t, out, o, mark);
}

static void py_int(tstr *t, json_int_t v, uint8_t mark) {
    char b[32];
    int n = snprintf(b, sizeof b, "%lld", (long long)v);
    ts_put(t, b, (size_t)n, mark);
}

/* json.dumps(v, ensure_ascii=False) — transformers' tojson */
static void py_json(tstr *t, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: ts_data(t, "null", 4); break;
    case JSON_TRUE: ts_data(t, "true", 4); break;
    case JSON_FALSE: ts_data(t, "false", 5); break;
    case JSON_INTEGER: py_int(t, json_integer_value(v), 1); break;
    case JSON_REAL: py_float(t, json_real_value(v), 1); break;
    case JSON_STRING: {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        ts_data(t, "\"", 1);
        size_t st = 0;
        for (size_t i = 0; i < n; i++) {
            uint8_t c = (uint8_t)s[i];
            const char *esc = NULL;
            char u[8];
            if (c == '"') esc = "\\\"";
            else if (c == '\\') esc = "\\\\";
            else if (c == '\n') esc = "\\n";
            else if (c == '\r') esc = "\\r";
            else if (c == '\t') esc = "\\t";
            else if (c == '\b') esc = "\\b";
            else if (c == '\f') esc = "\\f";
            else if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
            if (esc) {
                ts_data(t, s + st, i - st);
                ts_data(t, esc, strlen(esc));
                st = i + 1;
            }
        }
        ts_data(t, s + st, n - st);
        ts_data(t, "\"", 1);
        break;
    }
    case JSON_ARRAY: {
        ts_data(t, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) ts_data(t, ", ", 2);
            py_json(t, json_array_get(v, i));
        }
        ts_data(t, "]", 1);
        break;
    }
    case JSON_OBJECT: {
        ts_data(t, "{", 1);
        const char *k;
        json_t *x;
        int i = 0;
        json_object_foreach((json_t *)v, k, x) {
            if (i++) ts_data(t, ", ", 2);
            json_t *ks = json_string(k);
            py_json(t, ks);
            json_decref(ks);
            ts_data(t, ": ", 2);
            py_json(t, x);
        }
        ts_data(t, "}", 1);
        break;
    }
    }
}

/* repr(str) */
static void py_repr_str(tstr *t, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    ts_data(t, &q, 1);
    size_t i = 0;
    while (i < n) {
        uint32_t c;
        int k = dec(s + i, n - i, &c);
        char b[16];
        const char *esc = NULL;
        if (c == '\\') esc = "\\\\";
        else if (c == (uint32_t)q) esc = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7F) {
            snprintf(b, sizeof b, "\\x%02x", c);
            esc = b;
        } else if (c >= 0x80) {
            utf8proc_category_t g = utf8proc_category((utf8proc_int32_t)c);
            bool printable = !(g == UTF8PROC_CATEGORY_CC || g == UTF8PROC_CATEGORY_CF || g == UTF8PROC_CATEGORY_CS ||
                               g == UTF8PROC_CATEGORY_CO || g == UTF8PROC_CATEGORY_CN || g == UTF8PROC_CATEGORY_ZL ||
                               g == UTF8PROC_CATEGORY_ZP || g == UTF8PROC_CATEGORY_ZS);
            if (!printable) {
                if (c < 0x100) snprintf(b, sizeof b, "\\x%02x", c);
                else if (c < 0x10000) snprintf(b, sizeof b, "\\u%04x", c);
                else snprintf(b, sizeof b, "\\U%08x", c);
                esc = b;
            }
        }
        if (esc) ts_data(t, esc, strlen(esc));
        else ts_data(t, s + i, (size_t)k);
        i += (size_t)k;
    }
    ts_data(t, &q, 1);
}

static void py_repr(tstr *t, const json_t *v);

/* str(v) as jinja2 prints a value */
static void py_str(tstr *t, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: ts_data(t, "None", 4); break;
    case JSON_TRUE: ts_data(t, "True", 4); break;
    case JSON_FALSE: ts_data(t, "False", 5); break;
    case JSON_INTEGER: py_int(t, json_integer_value(v), 1); break;
    case JSON_REAL: py_float(t, json_real_value(v), 1); break;
    case JSON_STRING: ts_data(t, json_string_value(v), json_string_length(v)); break;
    default: py_repr(t, v); break;
    }
}

static void py_repr(tstr *t, const json_t *v) {
    if (json_is_string(v)) {
        py_repr_str(t, json_string_value(v), json_string_length(v));
    } else if (json_is_array(v)) {
        ts_data(t, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) ts_data(t, ", ", 2);
            py_repr(t, json_array_get(v, i));
        }
        ts_data(t, "]", 1);
    } else if (json_is_object(v)) {
        ts_data(t, "{", 1);
        const char *k;
        json_t *x;
        int i = 0;
        json_object_foreach((json_t *)v, k, x) {
            if (i++) ts_data(t, ", ", 2);
            py_repr_str(t, k, strlen(k));
            ts_data(t, ": ", 2);
            py_repr(t, x);
        }
        ts_data(t, "}", 1);
    } else
        py_str(t, v);
}

/* ------------------------------------------------------------------------- */
/* The template                                                              */

typedef struct {
    const lilac_chat_opts *o;
    int image_count, video_count;
    lilac_err *err;
} render_ctx;

static int tmpl_raise(render_ctx *c, const char *msg) { return lilac_fail(c->err, "%s", msg); }

/* macro render_content(content, do_vision_count, is_system_content) */
static int render_content(render_ctx *c, const json_t *content, bool do_vision_count, bool is_system, tstr *out) {
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) {
        ts_data(out, json_string_value(content), json_string_length(content));
        return 0;
    }
    if (!json_is_array(content)) return tmpl_raise(c, "Unexpected content type.");
    for (size_t i = 0; i < json_array_size(content); i++) {
        const json_t *item = json_array_get(content, i);
        lilac_part_kind k = lilac_content_part_kind(item);
        if (k == LILAC_PART_INVALID) return lilac_fail(c->err, "content part %zu: expected an object or a string", i);
        if ((k == LILAC_PART_IMAGE || k == LILAC_PART_VIDEO) && c->o->text_only)
            return lilac_fail(c->err, "content part %zu: image and video parts are not supported (text only)", i);
        if (k == LILAC_PART_IMAGE) {
            if (is_system) return tmpl_raise(c, "System message cannot contain images.");
            if (do_vision_count) c->image_count++;
            if (c->o->add_vision_id) {
                char b[48];
                snprintf(b, sizeof b, "Picture %d: ", c->image_count);
                ts_lit(out, b);
            }
            ts_lit(out, "<|vision_start|><|image_pad|><|vision_end|>");
            continue;
        }
        if (k == LILAC_PART_VIDEO) {
            if (is_system) return tmpl_raise(c, "System message cannot contain videos.");
            if (do_vision_count) c->video_count++;
            if (c->o->add_vision_id) {
                char b[48];
                snprintf(b, sizeof b, "Video %d: ", c->video_count);
                ts_lit(out, b);
            }
            ts_lit(out, "<|vision_start|><|video_pad|><|vision_end|>");
            continue;
        }
        if (k == LILAC_PART_TEXT) {
            const json_t *v = json_is_object(item) ? json_object_get(item, "text") : NULL;
            if (v) py_str(out, v); /* a string part's .text is undefined: nothing */
            continue;
        }
        return tmpl_raise(c, "Unexpected item type in content.");
    }
    return 0;
}

static bool str_eq(const json_t *v, const char *s) {
    return v && json_is_string(v) && json_string_length(v) == strlen(s) && !strcmp(json_string_value(v), s);
}

static const json_t *role_of(const json_t *m) { return json_object_get(m, "role"); }

/* One assistant tool call: `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...` */
static int render_tool_call(render_ctx *c, const json_t *tc, size_t mi, size_t ti, bool first, bool content_nonempty,
                            tstr *out) {
    if (json_is_object(tc) && json_object_get(tc, "function")) tc = json_object_get(tc, "function");
    const json_t *name = json_is_object(tc) ? json_object_get(tc, "name") : NULL;
    if (!name || !json_is_string(name))
        return lilac_fail(c->err, "messages[%zu].tool_calls[%zu]: the function name must be a string", mi, ti);
    if (first) ts_lit(out, content_nonempty ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
    else ts_lit(out, "\n<tool_call>\n<function=");
    ts_data(out, json_string_value(name), json_string_length(name));
    ts_lit(out, ">\n");
    const json_t *args = json_object_get(tc, "arguments");
    if (args) {
        json_t *parsed = NULL;
        if (json_is_string(args)) { /* OpenAI sends a JSON string: parse it, as servers do */
            json_error_t je;
            parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY | JSON_ALLOW_NUL,
                                &je);
            if (!parsed)
                return lilac_fail(c->err, "messages[%zu].tool_calls[%zu]: arguments are not valid JSON: %s", mi, ti,
                                  je.text);
            args = parsed;
        }
        if (!json_is_object(args)) {
            json_decref(parsed);
            return lilac_fail(c->err, "messages[%zu].tool_calls[%zu]: arguments must be a JSON object", mi, ti);
        }
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)args, k, v) {
            ts_lit(out, "<parameter=");
            ts_data(out, k, strlen(k));
            ts_lit(out, ">\n");
            if (json_is_string(v)) ts_data(out, json_string_value(v), json_string_length(v));
            else py_json(out, v);
            ts_lit(out, "\n</parameter>\n");
        }
        json_decref(parsed);
    }
    ts_lit(out, "</function>\n</tool_call>");
    return 0;
}

/* apply_chat_template's clean-up: drop null-valued keys; reasoning aliases. */
static json_t *normalize_message(const json_t *m) {
    json_t *c = json_object();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)m, k, v) {
        if (!json_is_null(v)) json_object_set(c, k, v);
    }
    static const char *const names[] = {"reasoning_content", "thinking", "reasoning"};
    for (int i = 0; i < 3; i++) {
        json_t *r = json_object_get(c, names[i]);
        if (r) {
            json_object_set(c, "reasoning_content", r);
            break;
        }
    }
    return c;
}

static int render(render_ctx *c, const json_t *messages, const json_t *tools, tstr *out) {
    const lilac_chat_opts *o = c->o;
    size_t n = json_array_size(messages);
    if (n == 0) return tmpl_raise(c, "No messages provided.");
    const json_t *m0 = json_array_get(messages, 0);
    bool sys0 = str_eq(role_of(m0), "system");

    /* tools / system header */
    if (tools && json_is_array(tools) && json_array_size(tools) > 0) {
        ts_lit(out, "<|im_start|>system\n");
        ts_lit(out, "# Tools\n\nYou have access to the following functions:\n\n<tools>");
        for (size_t i = 0; i < json_array_size(tools); i++) {
            ts_lit(out, "\n");
            py_json(out, json_array_get(tools, i));
        }
        ts_lit(out, "\n</tools>");
        ts_lit(out,
               "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
               "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
               "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
               "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
               "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> "
               "block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be "
               "specified\n- You may provide optional reasoning for your function call in natural language BEFORE "
               "the function call, but NOT after\n- If there is no function call available, answer the question "
               "like normal with your current knowledge and do not tell the user about function calls\n"
               "</IMPORTANT>");
        if (sys0) {
            tstr s;
            ts_init(&s);
            if (render_content(c, json_object_get(m0, "content"), false, true, &s)) {
                ts_free(&s);
                return -1;
            }
            ts_strip(&s);
            if (s.n) {
                ts_lit(out, "\n\n");
                ts_sub(out, &s, 0, s.n);
            }
            ts_free(&s);
        }
        ts_lit(out, "<|im_end|>\n");
    } else if (sys0) {
        tstr s;
        ts_init(&s);
        if (render_content(c, json_object_get(m0, "content"), false, true, &s)) {
            ts_free(&s);
            return -1;
        }
        ts_strip(&s);
        ts_lit(out, "<|im_start|>system\n");
        ts_sub(out, &s, 0, s.n);
        ts_lit(out, "<|im_end|>\n");
        ts_free(&s);
    }

    /* the last real user query (not a wrapped tool response) */
    bool multi_step_tool = true;
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0 && multi_step_tool;) {
        const json_t *m = json_array_get(messages, k);
        if (!str_eq(role_of(m), "user")) continue;
        tstr s;
        ts_init(&s);
        if (render_content(c, json_object_get(m, "content"), false, false, &s)) {
            ts_free(&s);
            return -1;
        }
        ts_strip(&s);
        static const char a[] = "<tool_response>", b[] = "</tool_response>";
        bool wrapped = s.n >= sizeof a - 1 && !memcmp(s.s, a, sizeof a - 1) && s.n >= sizeof b - 1 &&
                       !memcmp(s.s + s.n - (sizeof b - 1), b, sizeof b - 1);
        ts_free(&s);
        if (!wrapped) {
            multi_step_tool = false;
            last_query = k;
        }
    }
    if (multi_step_tool) return tmpl_raise(c, "No user query found in messages.");

    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(messages, i);
        const json_t *role = role_of(m);
        tstr content;
        ts_init(&content);
        int rc = render_content(c, json_object_get(m, "content"), true, false, &content);
        if (rc) {
            ts_free(&content);
            return -1;
        }
        ts_strip(&content);
        if (str_eq(role, "system")) {
            if (i != 0) rc = tmpl_raise(c, "System message must be at the beginning.");
        } else if (str_eq(role, "user")) {
            ts_lit(out, "<|im_start|>user\n");
            ts_sub(out, &content, 0, content.n);
            ts_lit(out, "<|im_end|>\n");
        } else if (str_eq(role, "assistant")) {
            tstr reasoning;
            ts_init(&reasoning);
            const json_t *rcj = json_object_get(m, "reasoning_content");
            if (rcj && json_is_string(rcj)) {
                ts_data(&reasoning, json_string_value(rcj), json_string_length(rcj));
            } else if (find(&content, "</think>")) {
                /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                const char *end = find(&content, "</think>");
                tstr r;
                ts_init(&r);
                ts_sub(&r, &content, 0, (size_t)(end - content.s));
                while (r.n && r.s[r.n - 1] == '\n') r.n--;
                r.s[r.n] = 0;
                const char *st = find_last(&r, "<think>");
                size_t off = st ? (size_t)(st - r.s) + 7 : 0;
                while (off < r.n && r.s[off] == '\n') off++;
                ts_sub(&reasoning, &r, off, r.n - off);
                ts_free(&r);
                /* content.split('</think>')[-1].lstrip('\n') */
                const char *last = find_last(&content, "</think>");
                size_t co = (size_t)(last - content.s) + 8;
                while (co < content.n && content.s[co] == '\n') co++;
                ts_slice(&content, co, content.n - co);
            }
            ts_strip(&reasoning);
            if (o->preserve_thinking || i > last_query) {
                ts_lit(out, "<|im_start|>assistant\n<think>\n");
                ts_sub(out, &reasoning, 0, reasoning.n);
                ts_lit(out, "\n</think>\n\n");
                ts_sub(out, &content, 0, content.n);
            } else {
                ts_lit(out, "<|im_start|>assistant\n");
                ts_sub(out, &content, 0, content.n);
            }
            ts_free(&reasoning);
            const json_t *calls = json_object_get(m, "tool_calls");
            if (calls && json_is_string(calls) && json_string_length(calls) > 0)
                rc = lilac_fail(c->err, "messages[%zu].tool_calls must be a list", i);
            else if (calls && json_is_array(calls) && json_array_size(calls) > 0) {
                tstr ct;
                ts_init(&ct);
                ts_sub(&ct, &content, 0, content.n);
                ts_strip(&ct);
                bool nonempty = ct.n > 0;
                ts_free(&ct);
                for (size_t k = 0; k < json_array_size(calls) && !rc; k++)
                    rc = render_tool_call(c, json_array_get(calls, k), i, k, k == 0, nonempty, out);
            }
            if (!rc) ts_lit(out, "<|im_end|>\n");
        } else if (str_eq(role, "tool")) {
            const json_t *prev = i > 0 ? json_array_get(messages, i - 1) : NULL;
            if (prev && json_object_size(prev) > 0 && !str_eq(role_of(prev), "tool")) ts_lit(out, "<|im_start|>user");
            ts_lit(out, "\n<tool_response>\n");
            ts_sub(out, &content, 0, content.n);
            ts_lit(out, "\n</tool_response>");
            if (i + 1 < n && !str_eq(role_of(json_array_get(messages, i + 1)), "tool")) ts_lit(out, "<|im_end|>\n");
            else if (i + 1 == n) ts_lit(out, "<|im_end|>\n");
        } else {
            rc = tmpl_raise(c, "Unexpected message role.");
        }
        ts_free(&content);
        if (rc) return -1;
    }
    if (o->add_generation_prompt) {
        ts_lit(out, "<|im_start|>assistant\n");
        ts_lit(out, o->enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n");
    }
    return 0;
}

void lilac_chat_opts_default(lilac_chat_opts *o) {
    memset(o, 0, sizeof *o);
    o->add_generation_prompt = true;
    o->enable_thinking = true;
}

void lilac_prompt_free(lilac_prompt *p) {
    free(p->text);
    free(p->data);
    memset(p, 0, sizeof *p);
}

int lilac_chat_render(const json_t *messages, const json_t *tools, const lilac_chat_opts *o, lilac_prompt *out,
                      lilac_err *err) {
    memset(out, 0, sizeof *out);
    lilac_chat_opts def;
    if (!o) {
        lilac_chat_opts_default(&def);
        o = &def;
    }
    if (!json_is_array(messages)) return lilac_fail(err, "messages must be a JSON array of message objects");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) return lilac_fail(err, "tools must be a JSON array");
    json_t *norm = json_array();
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *m = json_array_get(messages, i);
        if (!json_is_object(m)) {
            json_decref(norm);
            return lilac_fail(err, "messages[%zu] is not an object", i);
        }
        json_array_append_new(norm, normalize_message(m));
    }
    render_ctx c = {.o = o, .err = err};
    tstr t;
    ts_init(&t);
    int rc = render(&c, norm, tools, &t);
    json_decref(norm);
    if (rc) {
        ts_free(&t);
        return -1;
    }
    /* the caller's ranges, from the per-byte marks */
    size_t cap = 16, nd = 0;
    lilac_span *d = xmalloc(cap * sizeof *d);
    for (size_t i = 0; i < t.n;) {
        if (!t.m[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < t.n && t.m[j]) j++;
        if (nd == cap) d = xrealloc(d, (cap *= 2) * sizeof *d);
        d[nd].off = i;
        d[nd].len = j - i;
        nd++;
        i = j;
    }
    out->text = t.s;
    out->len = t.n;
    out->data = d;
    out->n_data = nd;
    free(t.m);
    return 0;
}

int lilac_chat_render_json(const char *messages_json, size_t len, const char *tools_json, size_t tools_len,
                           const lilac_chat_opts *o, lilac_prompt *out, lilac_err *err) {
    json_error_t je;
    memset(out, 0, sizeof *out);
    json_t *m = json_loadb(messages_json, len, JSON_ALLOW_NUL, &je);
    if (!m) return lilac_fail(err, "messages: invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    json_t *msgs = m, *tools = NULL;
    if (json_is_object(m)) {
        msgs = json_object_get(m, "messages");
        tools = json_object_get(m, "tools");
        if (!msgs) {
            json_decref(m);
            return lilac_fail(err, "messages: an object must have a \"messages\" list");
        }
    }
    json_t *t2 = NULL;
    if (tools_json) {
        t2 = json_loadb(tools_json, tools_len, JSON_ALLOW_NUL, &je);
        if (!t2) {
            json_decref(m);
            return lilac_fail(err, "tools: invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
        }
        tools = t2;
    }
    int rc = lilac_chat_render(msgs, tools, o, out, err);
    json_decref(t2);
    json_decref(m);
    return rc;
}

int lilac_prompt_encode(const lilac_tokenizer *t, const lilac_prompt *p, bool specials_in_content, lilac_ids *out,
                        lilac_err *err) {
    if (specials_in_content) return lilac_tok_encode(t, p->text, p->len, LILAC_TOK_SPECIAL, out, err);
    return lilac_tok_encode_masked(t, p->text, p->len, p->data, p->n_data, out, err);
}

/* ------------------------------------------------------------------------- */
/* SHA-256 (FIPS 180-4), for recognising the template file.                  */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

static void sha256_hex(const void *data, size_t n, char hex[65]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const uint8_t *p = data;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) sha256_block(h, p + i);
    uint8_t last[128] = {0};
    size_t r = n - i;
    memcpy(last, p + i, r);
    last[r] = 0x80;
    size_t tot = r + 1 + 8 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int k = 0; k < 8; k++) last[tot - 1 - k] = (uint8_t)(bits >> (8 * k));
    sha256_block(h, last);
    if (tot == 128) sha256_block(h, last + 64);
    for (int k = 0; k < 8; k++) snprintf(hex + 8 * k, 9, "%08x", h[k]);
}

int lilac_chat_check_template(const char *model_dir, lilac_err *warn) {
    size_t plen = strlen(model_dir) + 40;
    char *path = xmalloc(plen);
    snprintf(path, plen, "%s/chat_template.jinja", model_dir);
    size_t len;
    lilac_err e;
    char *text = lilac_read_file(path, &len, &e);
    char *tmpl = NULL;
    size_t tlen = 0;
    const char *where = path;
    if (text) {
        tmpl = text;
        tlen = len;
    } else {
        snprintf(path, plen, "%s/tokenizer_config.json", model_dir);
        text = lilac_read_file(path, &len, &e);
        json_t *j = text ? json_loadb(text, len, 0, NULL) : NULL;
        json_t *ct = j ? json_object_get(j, "chat_template") : NULL;
        if (ct && json_is_array(ct)) { /* [{"name": "default", "template": "..."}] */
            json_t *x, *pick = NULL;
            size_t i;
            json_array_foreach(ct, i, x) {
                if (str_eq(json_object_get(x, "name"), "default")) pick = json_object_get(x, "template");
            }
            ct = pick;
        }
        if (ct && json_is_string(ct)) {
            tlen = json_string_length(ct);
            tmpl = xmalloc(tlen + 1);
            memcpy(tmpl, json_string_value(ct), tlen + 1);
        }
        json_decref(j);
        free(text);
    }
    if (!tmpl) {
        lilac_fail(warn, "no chat template in %s (chat_template.jinja or tokenizer_config.json); using lilac's "
                         "built-in Qwen3.6 template", model_dir);
        free(path);
        return 1;
    }
    char hex[65];
    sha256_hex(tmpl, tlen, hex);
    free(tmpl);
    int rc = 0;
    if (strcmp(hex, LILAC_QWEN36_TEMPLATE_SHA256)) {
        lilac_fail(warn, "%s is not the official Qwen3.6 chat template (sha256 %.16s…); rendering with lilac's "
                         "built-in Qwen3.6 logic anyway", where, hex);
        rc = 1;
    }
    free(path);
    return rc;
}
