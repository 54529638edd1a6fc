/* outparse.c — see outparse.h. */
#include "outparse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/common.h"
#include "../util/sbuf.h"

enum { S_THINK_START, S_THINK, S_CONTENT_START, S_CONTENT, S_TOOL, S_PARAMS, S_TOOL_END };

struct op_parser {
    int state;
    const json_t *tools;
    sbuf buf;      /* text not yet decided */
    sbuf ws;       /* content whitespace held back */
    int n_tools;
    int n_params;  /* parameters emitted in the open call */
    bool open;     /* a tool call is open (name emitted) */
    bool incomplete;
    char name[256];
    unsigned seq;
};

static const char T_THINK[] = "<think>", T_ETHINK[] = "</think>", T_CALL[] = "<tool_call>", T_ECALL[] = "</tool_call>",
                  T_FUNC[] = "<function=", T_EFUNC[] = "</function>", T_PARAM[] = "<parameter=", T_EPARAM[] = "</parameter>";

op_parser *op_new(bool thinking, const json_t *tools) {
    op_parser *p = xcalloc(1, sizeof *p);
    p->state = thinking ? S_THINK_START : S_CONTENT;
    p->tools = tools;
    static unsigned counter;
    p->seq = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 2654435761u ^ (unsigned)(lilac_now() * 1e6);
    sb_put(&p->buf, "", 0);
    return p;
}

void op_free(op_parser *p) {
    if (!p) return;
    sb_free(&p->buf);
    sb_free(&p->ws);
    free(p);
}

int op_n_tools(const op_parser *p) { return p->n_tools; }
bool op_incomplete_tool(const op_parser *p) { return p->incomplete; }

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_suffix(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t k = t - 1 < n ? t - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *tag) { return memmem(s, n, tag, strlen(tag)); }

/* Does s[0..n) start with tag (1), a proper prefix of it (0: undecided), or neither (-1)? */
static int starts(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    if (n >= t) return memcmp(s, tag, t) ? -1 : 1;
    return memcmp(s, tag, n) ? -1 : 0;
}

static size_t skip_ws(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
    return i;
}

static void emit_content(op_parser *p, const char *s, size_t n, const op_sink *k, void *ud) {
    /* hold trailing whitespace back; release held whitespace before new text */
    size_t end = n;
    while (end > 0 && (s[end - 1] == ' ' || s[end - 1] == '\n' || s[end - 1] == '\r' || s[end - 1] == '\t')) end--;
    if (end > 0) {
        if (p->ws.n) {
            k->content(ud, p->ws.p, p->ws.n);
            sb_clear(&p->ws);
        }
        k->content(ud, s, end);
    }
    sb_put(&p->ws, s + end, n - end);
}

/* The schema type of parameter `key` of tool `name` ("" if unknown). */
static const char *param_type(const op_parser *p, const char *key) {
    for (size_t i = 0; p->tools && i < json_array_size(p->tools); i++) {
        const json_t *f = json_object_get(json_array_get(p->tools, i), "function");
        const char *nm = json_string_value(json_object_get(f, "name"));
        if (!nm || strcmp(nm, p->name)) continue;
        const json_t *prop = json_object_get(json_object_get(json_object_get(f, "parameters"), "properties"), key);
        const json_t *t = json_object_get(prop, "type");
        if (json_is_string(t)) return json_string_value(t);
        if (json_is_array(t)) /* ["integer", "null"]: the first non-null */
            for (size_t j = 0; j < json_array_size(t); j++) {
                const char *s = json_string_value(json_array_get(t, j));
                if (s && strcmp(s, "null")) return s;
            }
        if (json_object_get(prop, "enum") || json_object_get(prop, "anyOf")) return "any";
        return "";
    }
    return "";
}

/* Append a JSON value for v[0..n) typed by `type`. */
static void typed_value(sbuf *o, const char *type, const char *v, size_t n) {
    char *tmp = xmalloc(n + 1);
    memcpy(tmp, v, n);
    tmp[n] = 0;
    bool done = false;
    if (!strcmp(type, "integer") && n && n < 40) {
        char *end;
        errno = 0;
        long long x = strtoll(tmp, &end, 10);
        if (!*end && !errno && !isspace((unsigned char)tmp[0])) sb_printf(o, "%lld", x), done = true;
    } else if (!strcmp(type, "number") && n && n < 64) {
        char *end;
        errno = 0;
        double x = strtod(tmp, &end);
        if (!*end && !errno && isfinite(x) && !isspace((unsigned char)tmp[0])) {
            json_t *j = json_loads(tmp, JSON_DECODE_ANY, NULL); /* keep the model's spelling when it is JSON */
            if (j && json_is_number(j)) sb_put(o, tmp, n);
            else sb_printf(o, "%.17g", x);
            json_decref(j);
            done = true;
        }
    } else if (!strcmp(type, "boolean")) {
        if (!strcasecmp(tmp, "true")) sb_puts(o, "true"), done = true;
        else if (!strcasecmp(tmp, "false")) sb_puts(o, "false"), done = true;
    } else if (!strcmp(type, "null")) {
        if (!strcasecmp(tmp, "null") || !strcasecmp(tmp, "none")) sb_puts(o, "null"), done = true;
    } else if (!strcmp(type, "object") || !strcmp(type, "array") || !strcmp(type, "any")) {
        json_t *j = json_loads(tmp, JSON_DECODE_ANY, NULL);
        if (j && (!strcmp(type, "any") || (!strcmp(type, "object") ? json_is_object(j) : json_is_array(j)))) {
            char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
            if (s) {
                sb_puts(o, s);
                free(s);
                done = true;
            }
        }
        json_decref(j);
    }
    if (!done) sb_json_str(o, v, n);
    free(tmp);
}

static void open_tool(op_parser *p, const char *name, size_t n, const op_sink *k, void *ud) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    if (n >= sizeof p->name) n = sizeof p->name - 1;
    memcpy(p->name, name, n);
    p->name[n] = 0;
    char id[32] = "call_";
    uint64_t x = (uint64_t)p->seq * 0x9e3779b97f4a7c15ull + (uint64_t)p->n_tools * 0xbf58476d1ce4e5b9ull;
    for (int i = 0; i < 24; i++) {
        x ^= x >> 29;
        x *= 0x94d049bb133111ebull;
        x ^= x >> 32;
        id[5 + i] = al[x % 62];
    }
    id[29] = 0;
    p->open = true;
    p->n_params = 0;
    k->tool_open(ud, p->n_tools, id, p->name);
}

static void close_tool(op_parser *p, const op_sink *k, void *ud) {
    k->tool_args(ud, p->n_tools, p->n_params ? "}" : "{}", p->n_params ? 1 : 2);
    p->open = false;
    p->n_tools++;
}

/* Process as much of buf as can be decided; `final`: no more text comes. */
static void run(op_parser *p, const op_sink *k, void *ud, bool final) {
    for (;;) {
        const char *s = p->buf.p;
        size_t n = p->buf.n;
        switch (p->state) {
        case S_THINK_START: { /* drop a stray "<think>" (and the newline after it) */
            size_t w = skip_ws(s, n);
            int st = starts(s + w, n - w, T_THINK);
            if (st == 0 && !final) return;
            if (st == 1) sb_consume(&p->buf, w + strlen(T_THINK));
            p->state = S_THINK;
            continue;
        }
        case S_THINK: {
            const char *e = find(s, n, T_ETHINK);
            const char *c = p->tools ? find(s, n, T_CALL) : NULL;
            if (c && (!e || c < e)) { /* <tool_call> then <function= ends the reasoning */
                size_t at = (size_t)(c - s), after = at + strlen(T_CALL);
                size_t w = skip_ws(s + after, n - after);
                int st = starts(s + after + w, n - after - w, T_FUNC);
                if (st == 1 || (st == 0 && final)) {
                    if (at) k->reasoning(ud, s, at);
                    sb_consume(&p->buf, at);
                    p->state = S_CONTENT;
                    continue;
                }
                if (st == 0) { /* undecided: emit up to the tag */
                    if (at) k->reasoning(ud, s, at);
                    sb_consume(&p->buf, at);
                    return;
                }
                /* not a call: treat "<tool_call>" as reasoning text */
                if (!e) {
                    k->reasoning(ud, s, after);
                    sb_consume(&p->buf, after);
                    continue;
                }
            }
            if (e) {
                size_t at = (size_t)(e - s);
                if (at) k->reasoning(ud, s, at);
                sb_consume(&p->buf, at + strlen(T_ETHINK));
                p->state = S_CONTENT_START;
                continue;
            }
            size_t hold = final ? 0 : partial_suffix(s, n, T_ETHINK);
            if (p->tools && !final) {
                size_t h2 = partial_suffix(s, n, T_CALL);
                if (h2 > hold) hold = h2;
            }
            if (n - hold) k->reasoning(ud, s, n - hold);
            sb_consume(&p->buf, n - hold);
            return;
        }
        case S_CONTENT_START: {
            size_t w = skip_ws(s, n);
            sb_consume(&p->buf, w);
            if (!p->buf.n) return;
            p->state = S_CONTENT;
            continue;
        }
        case S_CONTENT: {
            const char *c = p->tools ? find(s, n, T_CALL) : NULL;
            if (c) {
                size_t at = (size_t)(c - s);
                emit_content(p, s, at, k, ud);
                sb_clear(&p->ws); /* whitespace before a tool call is dropped */
                sb_consume(&p->buf, at + strlen(T_CALL));
                p->state = S_TOOL;
                continue;
            }
            size_t hold = (p->tools && !final) ? partial_suffix(s, n, T_CALL) : 0;
            emit_content(p, s, n - hold, k, ud);
            sb_consume(&p->buf, n - hold);
            return;
        }
        case S_TOOL: {
            size_t w = skip_ws(s, n);
            int st = starts(s + w, n - w, T_FUNC);
            if (st == 1) {
                const char *gt = memchr(s + w, '>', n - w);
                const char *nl = memchr(s + w, '\n', n - w);
                if (gt && (!nl || gt < nl)) {
                    const char *name = s + w + strlen(T_FUNC);
                    open_tool(p, name, (size_t)(gt - name), k, ud);
                    sb_consume(&p->buf, (size_t)(gt - s) + 1);
                    p->state = S_PARAMS;
                    continue;
                }
                if (!nl && !final && n - w < 300) return;
            } else if (st == 0 && !final) return;
            /* not a function: the text was content after all */
            emit_content(p, T_CALL, strlen(T_CALL), k, ud);
            p->state = S_CONTENT;
            continue;
        }
        case S_PARAMS: {
            size_t w = skip_ws(s, n);
            const char *t = s + w;
            size_t tn = n - w;
            if (starts(t, tn, T_PARAM) == 1) {
                const char *gt = memchr(t, '>', tn);
                const char *end = find(t, tn, T_EPARAM);
                if (gt && end && gt < end) {
                    const char *key = t + strlen(T_PARAM);
                    size_t key_n = (size_t)(gt - key);
                    const char *v = gt + 1;
                    size_t vn = (size_t)(end - v);
                    if (vn && v[0] == '\n') v++, vn--;
                    if (vn && v[vn - 1] == '\n') vn--;
                    char kz[256];
                    snprintf(kz, sizeof kz, "%.*s", (int)(key_n < 255 ? key_n : 255), key);
                    sbuf a = {0};
                    sb_puts(&a, p->n_params ? ", " : "{");
                    sb_json_str(&a, key, key_n);
                    sb_puts(&a, ": ");
                    typed_value(&a, param_type(p, kz), v, vn);
                    k->tool_args(ud, p->n_tools, a.p, a.n);
                    sb_free(&a);
                    p->n_params++;
                    sb_consume(&p->buf, (size_t)(end - s) + strlen(T_EPARAM));
                    continue;
                }
                if (!final) return;
            } else if (starts(t, tn, T_EFUNC) == 1) {
                close_tool(p, k, ud);
                sb_consume(&p->buf, w + strlen(T_EFUNC));
                p->state = S_TOOL_END;
                continue;
            } else if (!final && (tn == 0 || starts(t, tn, T_PARAM) == 0 || starts(t, tn, T_EFUNC) == 0)) {
                return;
            } else if (!final) { /* stray text inside a call: skip it */
                sb_consume(&p->buf, w + 1);
                continue;
            }
            /* final, inside an unterminated call */
            close_tool(p, k, ud);
            p->incomplete = true;
            sb_clear(&p->buf);
            p->state = S_CONTENT;
            return;
        }
        case S_TOOL_END: {
            size_t w = skip_ws(s, n);
            int st = starts(s + w, n - w, T_ECALL);
            if (st == 1) {
                sb_consume(&p->buf, w + strlen(T_ECALL));
                p->state = S_CONTENT_START;
                continue;
            }
            if (st == 0 && !final) return;
            p->state = S_CONTENT_START;
            continue;
        }
        }
    }
}

void op_feed(op_parser *p, const char *s, size_t n, const op_sink *k, void *ud) {
    if (!n) return;
    sb_put(&p->buf, s, n);
    run(p, k, ud, false);
}

void op_finish(op_parser *p, const op_sink *k, void *ud) {
    run(p, k, ud, true);
    if (p->buf.n) { /* whatever is left (a partial tag) is text */
        if (p->state == S_THINK || p->state == S_THINK_START) k->reasoning(ud, p->buf.p, p->buf.n);
        else emit_content(p, p->buf.p, p->buf.n, k, ud);
        sb_clear(&p->buf);
    }
    sb_clear(&p->ws);
}
