/* request.c — see request.h. */
#include "request.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../chat/content_part.h"
#include "../util/common.h"

#define MAX_STOPS 16
#define MAX_STOP_LEN 2000

int srv_err(srv_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...) {
    if (!e) return -1;
    memset(e, 0, sizeof *e);
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    if (param) snprintf(e->param, sizeof e->param, "%s", param);
    if (code) snprintf(e->code, sizeof e->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

size_t srv_json_max_values = SRV_JSON_MAX_VALUES;

size_t srv_json_count_values(const char *p, size_t n, size_t stop) {
    size_t count = 0;
    for (size_t i = 0; i < n && count <= stop; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"') { /* a string is one value (or a key); skip to its closing quote */
            count++;
            for (i++; i < n && p[i] != '"'; i++)
                if (p[i] == '\\') i++;
        } else if (ch == '{' || ch == '[' || ch == '-' || (ch >= '0' && ch <= '9') || ch == 't' || ch == 'f' || ch == 'n') {
            count++;
            if (ch != '{' && ch != '[') /* skip the rest of the literal */
                while (i + 1 < n && p[i + 1] != ',' && p[i + 1] != ']' && p[i + 1] != '}' && p[i + 1] != ' ' &&
                       p[i + 1] != '\n' && p[i + 1] != '"')
                    i++;
        }
    }
    return count;
}

json_t *srv_parse_object(const char *body, size_t len, srv_error *e) {
    if (!body || len == 0) {
        srv_bad(e, NULL, "the request body is empty; expected a JSON object");
        return NULL;
    }
    /* jansson holds every value as its own allocation (tens of bytes each): bound the count before parsing */
    if (srv_json_count_values(body, len, srv_json_max_values) > srv_json_max_values) {
        srv_err(e, 413, "invalid_request_error", NULL, "request_too_large",
                "the request body holds more than %zu JSON values (--max-json-values)", srv_json_max_values);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        srv_bad(e, NULL, "invalid JSON in the request body: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        srv_bad(e, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ---- typed getters: absent or null -> 0 (not given), 1 given, -1 error ---- */

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int get_bool(const json_t *o, const char *k, bool *out, srv_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return srv_bad(e, k, "'%s' must be a boolean, not %s", k, type_name(v));
    *out = json_is_true(v);
    return 1;
}

static int get_num(const json_t *o, const char *k, double lo, double hi, double *out, srv_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return srv_bad(e, k, "'%s' must be a number, not %s", k, type_name(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return srv_bad(e, k, "'%s' must be between %g and %g, got %g", k, lo, hi, x);
    *out = x;
    return 1;
}

static int get_int(const json_t *o, const char *k, long long lo, long long hi, long long *out, srv_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else return srv_bad(e, k, "'%s' must be an integer, not %s", k, type_name(v));
    if (x < lo && hi == INT64_MAX) return srv_bad(e, k, "'%s' must be at least %lld, got %lld", k, lo, x);
    if (x < lo || x > hi) return srv_bad(e, k, "'%s' must be between %lld and %lld, got %lld", k, lo, hi, x);
    *out = x;
    return 1;
}

/* ---- pieces ---------------------------------------------------------------- */

static int parse_stop(srv_request *r, const json_t *v, srv_error *e) {
    if (!v || json_is_null(v)) return 0;
    const json_t *one[1] = {v};
    size_t n;
    if (json_is_string(v)) n = 1;
    else if (json_is_array(v)) n = json_array_size(v);
    else return srv_bad(e, "stop", "'stop' must be a string or an array of strings, not %s", type_name(v));
    if (n > MAX_STOPS) return srv_bad(e, "stop", "'stop' has %zu strings; at most %d are allowed", n, MAX_STOPS);
    r->stops = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_array(v) ? json_array_get(v, i) : one[0];
        if (!json_is_string(s)) return srv_bad(e, "stop", "'stop[%zu]' must be a string, not %s", i, type_name(s));
        size_t len = json_string_length(s);
        if (len > MAX_STOP_LEN) return srv_bad(e, "stop", "'stop[%zu]' is longer than %d bytes", i, MAX_STOP_LEN);
        if (len == 0 || memchr(json_string_value(s), 0, len)) continue; /* empty: ignored */
        r->stops[r->n_stops++] = xstrdup(json_string_value(s));
    }
    return 0;
}

/* Content: a string, null, or text parts. Each part is classified as the
 * renderer classifies it (content_part.h), so a part that names itself "text"
 * but carries an image or video key is refused, not rendered as vision tokens. */
static int check_content(const json_t *c, size_t mi, srv_error *e) {
    char p[48];
    snprintf(p, sizeof p, "messages[%zu].content", mi);
    if (!c || json_is_null(c) || json_is_string(c)) return 0;
    if (!json_is_array(c)) return srv_bad(e, p, "'%s' must be a string, an array of content parts or null", p);
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *part = json_array_get(c, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !type)
            return srv_bad(e, p, "'%s[%zu]' must be an object with a string 'type'", p, i);
        lilac_part_kind k = lilac_content_part_kind(part);
        if (k == LILAC_PART_IMAGE || k == LILAC_PART_VIDEO || !strcmp(type, "image_url") || !strcmp(type, "input_image") ||
            !strcmp(type, "video_url") || !strcmp(type, "input_audio"))
            return srv_bad(e, p, "'%s[%zu]' is an %s part (type '%.40s'): this server is text-only", p, i,
                           k == LILAC_PART_VIDEO ? "video" : strcmp(type, "input_audio") ? "image" : "audio", type);
        if (strcmp(type, "text")) return srv_bad(e, p, "unknown content part type '%.40s' in '%s[%zu]'", type, p, i);
        if (k != LILAC_PART_TEXT || !json_is_string(json_object_get(part, "text")))
            return srv_bad(e, p, "'%s[%zu].text' must be a string", p, i);
    }
    return 0;
}

static int parse_messages(srv_request *r, const json_t *msgs, srv_error *e) {
    if (!msgs) return srv_bad(e, "messages", "'messages' is required");
    if (!json_is_array(msgs)) return srv_bad(e, "messages", "'messages' must be an array, not %s", type_name(msgs));
    if (json_array_size(msgs) == 0) return srv_bad(e, "messages", "'messages' must not be empty");
    r->messages = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        char p[48];
        snprintf(p, sizeof p, "messages[%zu]", i);
        if (!json_is_object(m)) return srv_bad(e, p, "'%s' must be an object, not %s", p, type_name(m));
        const json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) return srv_bad(e, p, "'%s.role' must be a string", p);
        const char *rs = json_string_value(role);
        if (strcmp(rs, "system") && strcmp(rs, "developer") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
            strcmp(rs, "tool"))
            return srv_bad(e, p, "'%s.role' must be one of system, developer, user, assistant, tool; got '%.40s'", p,
                           rs);
        if (check_content(json_object_get(m, "content"), i, e) < 0) return -1;
        const json_t *tc = json_object_get(m, "tool_calls");
        if (tc && !json_is_null(tc)) {
            if (!json_is_array(tc)) return srv_bad(e, p, "'%s.tool_calls' must be an array", p);
            for (size_t k = 0; k < json_array_size(tc); k++) {
                const json_t *c = json_array_get(tc, k);
                const json_t *f = json_object_get(c, "function");
                const json_t *args = json_object_get(f, "arguments");
                if (!json_is_object(c) || !json_is_object(f) || !json_is_string(json_object_get(f, "name")))
                    return srv_bad(e, p, "'%s.tool_calls[%zu]' must be {\"function\": {\"name\": ..., \"arguments\": ...}}", p, k);
                if (args && !json_is_string(args) && !json_is_object(args) && !json_is_null(args))
                    return srv_bad(e, p, "'%s.tool_calls[%zu].function.arguments' must be a JSON string or an object", p, k);
                if (json_is_string(args)) {
                    json_t *a = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
                    bool ok = a && json_is_object(a);
                    json_decref(a);
                    if (!ok)
                        return srv_bad(e, p, "'%s.tool_calls[%zu].function.arguments' is not a JSON object", p, k);
                }
            }
        }
        for (const char *const *k = (const char *const[]){"reasoning_content", "reasoning", "tool_call_id", "name", NULL}; *k; k++) {
            const json_t *v = json_object_get(m, *k);
            if (v && !json_is_null(v) && !json_is_string(v))
                return srv_bad(e, p, "'%s.%s' must be a string", p, *k);
        }
        json_t *copy = json_deep_copy(m);
        if (!strcmp(rs, "developer")) json_object_set_new(copy, "role", json_string("system"));
        json_array_append_new(r->messages, copy);
    }
    return 0;
}

static int parse_tools(srv_request *r, srv_error *e) {
    const json_t *tools = json_object_get(r->root, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return srv_bad(e, "tools", "'tools' must be an array");
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            const json_t *f = json_object_get(t, "function");
            const json_t *type = json_object_get(t, "type");
            if (!json_is_object(t) || !json_is_object(f) || !json_is_string(json_object_get(f, "name")))
                return srv_bad(e, "tools", "'tools[%zu]' must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
            if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function")))
                return srv_bad(e, "tools", "'tools[%zu].type' must be \"function\"", i);
            const json_t *params = json_object_get(f, "parameters");
            if (params && !json_is_null(params) && !json_is_object(params))
                return srv_bad(e, "tools", "'tools[%zu].function.parameters' must be an object", i);
        }
        if (json_array_size(tools)) r->tools = tools;
    }
    r->tool_choice = r->tools ? TOOLS_AUTO : TOOLS_NONE;
    const json_t *tc = json_object_get(r->root, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) r->tool_choice = TOOLS_NONE;
            else if (!strcmp(s, "auto")) r->tool_choice = r->tools ? TOOLS_AUTO : TOOLS_NONE;
            else if (!strcmp(s, "required")) {
                if (!r->tools) return srv_bad(e, "tool_choice", "tool_choice \"required\" needs 'tools'");
                r->tool_choice = TOOLS_REQUIRED;
            } else return srv_bad(e, "tool_choice", "'tool_choice' must be none, auto, required or an object");
        } else if (json_is_object(tc)) {
            const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!name) return srv_bad(e, "tool_choice", "'tool_choice' object needs function.name");
            bool found = false;
            for (size_t i = 0; r->tools && i < json_array_size(r->tools); i++)
                found |= !strcmp(json_string_value(json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "name")), name);
            if (!found) return srv_bad(e, "tool_choice", "tool_choice names '%.60s', which is not in 'tools'", name);
            r->tool_choice = TOOLS_NAMED;
        } else return srv_bad(e, "tool_choice", "'tool_choice' must be a string or an object");
    }
    if (r->tool_choice == TOOLS_NONE) r->tools = NULL;
    return 0;
}

/* One prompt: text or token ids. */
static int parse_one_prompt(srv_prompt *pr, const json_t *p, const char *param, srv_error *e) {
    if (json_is_string(p)) {
        pr->text = json_string_value(p);
        pr->len = json_string_length(p);
        if (!pr->len) return srv_bad(e, "prompt", "'%s' must not be empty", param);
        return 0;
    }
    if (!json_is_array(p)) return srv_bad(e, "prompt", "'%s' must be a string or an array of token ids", param);
    size_t n = json_array_size(p);
    if (n == 0) return srv_bad(e, "prompt", "'%s' must not be empty", param);
    pr->ids = xmalloc(sizeof(int32_t) * n);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(p, i);
        if (!json_is_integer(v)) return srv_bad(e, "prompt", "'%s[%zu]' must be a token id, not %s", param, i, type_name(v));
        json_int_t x = json_integer_value(v);
        if (x < 0 || x > INT32_MAX) return srv_bad(e, "prompt", "'%s[%zu]' is not a valid token id", param, i);
        pr->ids[pr->n_ids++] = (int32_t)x;
    }
    return 0;
}

/* 'prompt': a string, an array of token ids, or an array of prompts (strings
 * or arrays of token ids), one choice set each. */
static int parse_prompt(srv_request *r, srv_error *e) {
    const json_t *p = json_object_get(r->root, "prompt");
    if (!p || json_is_null(p)) return srv_bad(e, "prompt", "'prompt' is required");
    bool list = json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0));
    size_t n = list ? json_array_size(p) : 1;
    if (n > SRV_MAX_PROMPTS) return srv_bad(e, "prompt", "'prompt' holds %zu prompts; at most %d are allowed", n, SRV_MAX_PROMPTS);
    r->prompts = xcalloc(n, sizeof(srv_prompt));
    for (size_t i = 0; i < n; i++) {
        char param[32];
        snprintf(param, sizeof param, list ? "prompt[%zu]" : "prompt", i);
        if (parse_one_prompt(&r->prompts[r->n_prompts++], list ? json_array_get(p, i) : p, param, e) < 0) return -1;
    }
    if ((long)n * r->best_of > SRV_MAX_JOBS)
        return srv_bad(e, "prompt", "%zu prompts x %d choices (best_of) exceed the %d sequences one request may ask for", n,
                       r->best_of, SRV_MAX_JOBS);
    return 0;
}

static int parse_fields(srv_request *r, srv_error *e) {
    const json_t *root = r->root;
    const json_t *v;
    r->model = "";
    if ((v = json_object_get(root, "model")) && !json_is_null(v)) {
        if (!json_is_string(v)) return srv_bad(e, "model", "'model' must be a string");
        r->model = json_string_value(v);
    }
    if (get_bool(root, "stream", &r->stream, e) < 0) return -1;
    if ((v = json_object_get(root, "stream_options")) && !json_is_null(v)) {
        if (!json_is_object(v)) return srv_bad(e, "stream_options", "'stream_options' must be an object");
        if (get_bool(v, "include_usage", &r->include_usage, e) < 0) return -1;
    }
    long long x;
    r->max_tokens = -1;
    static const char *const max_keys[] = {"max_tokens", "max_completion_tokens", "n_predict"};
    for (int i = 0; i < 3; i++) {
        /* no upper bound here: the context check states the real limit */
        int g = get_int(root, max_keys[i], i == 2 ? -1 : 1, INT64_MAX, &x, e);
        if (g < 0) return -1;
        if (g > 0 && x > 0) r->max_tokens = (long)x;
    }
    double d;
    int g;
    if ((g = get_num(root, "temperature", 0, 100, &d, e)) < 0) return -1;
    if (g) r->samp.temperature = (float)d, r->set |= SET_TEMP;
    if ((g = get_num(root, "top_p", 0, 1, &d, e)) < 0) return -1;
    if (g) {
        if (d <= 0) return srv_bad(e, "top_p", "'top_p' must be in (0, 1], got %g", d);
        r->samp.top_p = (float)d, r->set |= SET_TOP_P;
    }
    if ((g = get_int(root, "top_k", -1, 1 << 30, &x, e)) < 0) return -1;
    if (g) r->samp.top_k = (int)x, r->set |= SET_TOP_K;
    if ((g = get_num(root, "min_p", 0, 1, &d, e)) < 0) return -1;
    if (g) r->samp.min_p = (float)d, r->set |= SET_MIN_P;
    if ((g = get_num(root, "presence_penalty", -2, 2, &d, e)) < 0) return -1;
    if (g) r->samp.presence_penalty = (float)d, r->set |= SET_PRES;
    if ((g = get_num(root, "frequency_penalty", -2, 2, &d, e)) < 0) return -1;
    if (g) r->samp.frequency_penalty = (float)d, r->set |= SET_FREQ;
    static const char *const rep_keys[] = {"repetition_penalty", "repeat_penalty"};
    for (int i = 0; i < 2; i++) {
        if ((g = get_num(root, rep_keys[i], 0, 10, &d, e)) < 0) return -1;
        if (g) {
            if (d <= 0) return srv_bad(e, rep_keys[i], "'%s' must be > 0, got %g", rep_keys[i], d);
            r->samp.repetition_penalty = (float)d, r->set |= SET_REP;
        }
    }
    if ((v = json_object_get(root, "seed")) && !json_is_null(v)) {
        if (!json_is_integer(v)) return srv_bad(e, "seed", "'seed' must be an integer, not %s", type_name(v));
        json_int_t s = json_integer_value(v);
        if (s != -1) r->samp.seed = (uint64_t)s, r->samp.has_seed = true;
    }
    if (parse_stop(r, json_object_get(root, "stop"), e) < 0) return -1;
    r->n = r->best_of = 1;
    if ((g = get_int(root, "n", 1, SRV_MAX_CHOICES, &x, e)) < 0) return -1;
    if (g) r->n = r->best_of = (int)x;
    if ((g = get_int(root, "best_of", 1, SRV_MAX_CHOICES, &x, e)) < 0) return -1;
    if (g) {
        if (x < r->n) return srv_bad(e, "best_of", "'best_of' (%lld) must be at least 'n' (%d)", x, r->n);
        r->best_of = (int)x;
    }
    if (r->best_of > r->n && r->stream)
        return srv_bad(e, "best_of", "'best_of' greater than 'n' cannot be streamed: the best choices are known only at the end");
    if ((v = json_object_get(root, "response_format")) && !json_is_null(v)) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!json_is_object(v) || !t) return srv_bad(e, "response_format", "'response_format' must be {\"type\": ...}");
        if (strcmp(t, "text"))
            return srv_err(e, 400, "invalid_request_error", "response_format", "unsupported_value",
                           "response_format \"%.40s\" is not supported (no constrained decoding yet); only \"text\"", t);
    }
    if (r->kind == REQ_CHAT) {
        if (get_bool(root, "logprobs", &r->logprobs, e) < 0) return -1;
        if ((g = get_int(root, "top_logprobs", 0, 20, &x, e)) < 0) return -1;
        if (g) {
            if (!r->logprobs && x > 0) return srv_bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            r->top_logprobs = (int)x;
        }
    } else {
        v = json_object_get(root, "logprobs");
        if (json_is_boolean(v)) r->logprobs = json_is_true(v);
        else if ((g = get_int(root, "logprobs", 0, 20, &x, e)) < 0) return -1;
        else if (g) r->logprobs = true, r->top_logprobs = (int)x;
        if (get_bool(root, "echo", &r->echo, e) < 0) return -1;
        if (r->echo && r->logprobs)
            return srv_err(e, 400, "invalid_request_error", "echo", "unsupported_value",
                           "'echo' with 'logprobs' is not supported: the prompt tokens' logprobs are not computed");
        v = json_object_get(root, "suffix");
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return srv_err(e, 400, "invalid_request_error", "suffix", "unsupported_value", "suffix is not supported");
    }
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e) < 0) return -1;
    if (get_bool(root, "cache_prompt", &r->cache_prompt, e) < 0) return -1;
    /* thinking */
    if ((v = json_object_get(root, "chat_template_kwargs")) && !json_is_null(v)) {
        if (!json_is_object(v)) return srv_bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        if (get_bool(v, "enable_thinking", &r->enable_thinking, e) < 0) return -1;
        if (get_bool(v, "preserve_thinking", &r->preserve_thinking, e) < 0) return -1;
    }
    if ((v = json_object_get(root, "reasoning_effort")) && !json_is_null(v)) {
        if (!json_is_string(v)) return srv_bad(e, "reasoning_effort", "'reasoning_effort' must be a string");
        if (!strcmp(json_string_value(v), "none")) r->enable_thinking = false;
    }
    if ((v = json_object_get(root, "reasoning")) && json_is_object(v)) {
        const char *eff = json_string_value(json_object_get(v, "effort"));
        if (eff && !strcmp(eff, "none")) r->enable_thinking = false;
    }
    if ((v = json_object_get(root, "lilac_forced_output")) && !json_is_null(v)) {
        if (!json_is_string(v)) return srv_bad(e, "lilac_forced_output", "'lilac_forced_output' must be a string");
        r->forced = json_string_value(v);
        r->forced_len = json_string_length(v);
    }
    return 0;
}

int srv_parse_request_json(json_t *root, req_kind kind, srv_request *r, srv_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    lilac_sampling_default(&r->samp);
    r->enable_thinking = true;
    r->cache_prompt = true;
    r->n = r->best_of = 1;
    r->root = root;
    int rc = parse_fields(r, e);
    if (!rc && kind == REQ_CHAT) rc = parse_messages(r, json_object_get(r->root, "messages"), e);
    if (!rc && kind == REQ_CHAT) rc = parse_tools(r, e);
    if (!rc && kind == REQ_COMPLETION) rc = parse_prompt(r, e);
    if (rc) {
        srv_request_free(r);
        return -1;
    }
    return 0;
}

int srv_parse_request(const char *body, size_t len, req_kind kind, srv_request *r, srv_error *e) {
    memset(r, 0, sizeof *r);
    json_t *root = srv_parse_object(body, len, e);
    if (!root) return -1;
    return srv_parse_request_json(root, kind, r, e);
}

void srv_request_free(srv_request *r) {
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    for (int i = 0; i < r->n_prompts; i++) free(r->prompts[i].ids);
    free(r->prompts);
    json_decref(r->messages);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

/* ---- header checks ------------------------------------------------------------------ */

bool srv_host_allowed(const char *host, const char *allowed) {
    if (!host || !allowed) return false;
    size_t hn = strlen(host);
    if (host[0] == '[') { /* [v6]:port */
        const char *end = strchr(host, ']');
        if (!end) return false;
        hn = (size_t)(end - host) + 1;
    } else {
        const char *colon = strchr(host, ':');
        if (colon) hn = (size_t)(colon - host);
    }
    if (hn > 0 && host[hn - 1] == '.') hn--; /* "localhost." */
    for (const char *a = allowed; *a;) {
        const char *end = strchr(a, ',');
        size_t an = end ? (size_t)(end - a) : strlen(a);
        if (an == 1 && a[0] == '*') return true;
        if (an == hn && hn > 0 && !strncasecmp(a, host, hn)) return true;
        if (!end) break;
        a = end + 1;
    }
    return false;
}

bool srv_ctype_json(const char *ctype) {
    if (!ctype) return false;
    while (*ctype == ' ' || *ctype == '\t') ctype++;
    static const char J[] = "application/json";
    if (strncasecmp(ctype, J, sizeof J - 1)) return false;
    char c = ctype[sizeof J - 1];
    return c == 0 || c == ';' || c == ' ' || c == '\t';
}
