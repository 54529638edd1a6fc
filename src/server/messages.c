/* messages.c — see messages.h. */
#include "messages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/common.h"

/* ---- request -> chat body ------------------------------------------------------ */

/* Text of a tool_result's or system's content: a string or text blocks. */
static char *blocks_text(const json_t *c, const char *param, srv_error *e) {
    if (!c || json_is_null(c)) return xstrdup("");
    if (json_is_string(c)) return xstrdup(json_string_value(c));
    if (!json_is_array(c)) {
        srv_bad(e, param, "'%s' must be a string or an array of text blocks", param);
        return NULL;
    }
    sbuf b = {0};
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *blk = json_array_get(c, i);
        const char *type = json_string_value(json_object_get(blk, "type"));
        const json_t *t = json_object_get(blk, "text");
        if (!type || strcmp(type, "text") || !json_is_string(t)) {
            sb_free(&b);
            if (type && (!strcmp(type, "image") || !strcmp(type, "document")))
                srv_bad(e, param, "'%s[%zu]' is an %s block: this server is text-only", param, i, type);
            else srv_bad(e, param, "'%s[%zu]' must be {\"type\": \"text\", \"text\": ...}", param, i);
            return NULL;
        }
        if (b.n) sb_putc(&b, '\n');
        sb_put(&b, json_string_value(t), json_string_length(t));
    }
    char *s = xstrdup(b.p ? b.p : "");
    sb_free(&b);
    return s;
}

/* One Anthropic message -> chat messages appended to msgs. */
static int one_message(const json_t *m, size_t mi, json_t *msgs, srv_error *e) {
    char p[40];
    snprintf(p, sizeof p, "messages[%zu]", mi);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return srv_bad(e, "messages", "'%s' must be an object with role \"user\" or \"assistant\"", p);
    bool user = !strcmp(role, "user");
    const json_t *c = json_object_get(m, "content");
    if (json_is_string(c)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", c));
        return 0;
    }
    if (!json_is_array(c)) return srv_bad(e, "messages", "'%s.content' must be a string or an array of blocks", p);
    sbuf text = {0}, thinking = {0};
    json_t *calls = json_array();
    int rc = 0;
    for (size_t i = 0; i < json_array_size(c) && !rc; i++) {
        const json_t *blk = json_array_get(c, i);
        const char *type = json_string_value(json_object_get(blk, "type"));
        char bp[96];
        snprintf(bp, sizeof bp, "%s.content[%zu]", p, i);
        if (!json_is_object(blk) || !type) {
            rc = srv_bad(e, "messages", "'%s' must be an object with a string 'type'", bp);
        } else if (!strcmp(type, "text")) {
            const json_t *t = json_object_get(blk, "text");
            if (!json_is_string(t)) rc = srv_bad(e, "messages", "'%s.text' must be a string", bp);
            else sb_put(&text, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "tool_use") && !user) {
            const json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
            const json_t *input = json_object_get(blk, "input");
            if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input)))
                rc = srv_bad(e, "messages", "'%s' (tool_use) needs string 'id' and 'name' and an object 'input'", bp);
            else
                json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:o}}", "id", id, "type", "function", "function",
                                                       "name", name, "arguments",
                                                       input ? json_deep_copy(input) : json_object()));
        } else if (!strcmp(type, "tool_result") && user) {
            const json_t *id = json_object_get(blk, "tool_use_id");
            char cp[128];
            snprintf(cp, sizeof cp, "%s.content", bp);
            char *out = json_is_string(id) ? blocks_text(json_object_get(blk, "content"), cp, e) : NULL;
            if (!out) {
                if (!json_is_string(id)) srv_bad(e, "messages", "'%s' (tool_result) needs a string 'tool_use_id'", bp);
                rc = -1;
            } else {
                if (json_is_true(json_object_get(blk, "is_error"))) {
                    char *x = xmalloc(strlen(out) + 8);
                    sprintf(x, "Error: %s", out);
                    free(out);
                    out = x;
                }
                json_array_append_new(msgs, json_pack("{s:s, s:O, s:s}", "role", "tool", "tool_call_id", id, "content", out));
                free(out);
            }
        } else if (!strcmp(type, "thinking") && !user) {
            const json_t *t = json_object_get(blk, "thinking");
            if (json_is_string(t)) sb_put(&thinking, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "redacted_thinking") && !user) {
            /* opaque: nothing to render */
        } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
            rc = srv_bad(e, "messages", "'%s' is an %s block: this server is text-only", bp, type);
        } else {
            rc = srv_bad(e, "messages", "'%s' has type '%.40s', which a %s message cannot hold here", bp, type, role);
        }
    }
    if (!rc && (text.n || json_array_size(calls) || thinking.n || !user)) {
        json_t *msg = json_pack("{s:s}", "role", role);
        if (text.n || !json_array_size(calls)) json_object_set_new(msg, "content", json_stringn(text.p ? text.p : "", text.n));
        else json_object_set_new(msg, "content", json_null());
        if (thinking.n) json_object_set_new(msg, "reasoning_content", json_stringn(thinking.p, thinking.n));
        if (json_array_size(calls)) json_object_set(msg, "tool_calls", calls);
        json_array_append_new(msgs, msg);
    }
    sb_free(&text);
    sb_free(&thinking);
    json_decref(calls);
    return rc;
}

static int tools_in(const json_t *body, json_t *chat, srv_error *e) {
    const json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return srv_bad(e, "tools", "'tools' must be an array");
        json_t *out = json_array();
        json_object_set_new(chat, "tools", out);
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            const char *type = json_string_value(json_object_get(t, "type"));
            const json_t *name = json_object_get(t, "name");
            if (type && strcmp(type, "custom"))
                return srv_bad(e, "tools", "'tools[%zu]': server tools ('%.40s') are not supported; only custom tools with "
                                           "an input_schema", i, type);
            if (!json_is_string(name)) return srv_bad(e, "tools", "'tools[%zu].name' must be a string", i);
            const json_t *schema = json_object_get(t, "input_schema");
            if (!json_is_object(schema)) return srv_bad(e, "tools", "'tools[%zu].input_schema' must be an object", i);
            json_t *f = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
            const json_t *d = json_object_get(t, "description");
            if (json_is_string(d)) json_object_set(f, "description", (json_t *)d);
            json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f));
        }
    }
    const json_t *tc = json_object_get(body, "tool_choice");
    if (tc && !json_is_null(tc)) {
        const char *type = json_string_value(json_object_get(tc, "type"));
        if (!type) return srv_bad(e, "tool_choice", "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
        if (!strcmp(type, "auto")) json_object_set_new(chat, "tool_choice", json_string("auto"));
        else if (!strcmp(type, "any")) json_object_set_new(chat, "tool_choice", json_string("required"));
        else if (!strcmp(type, "none")) json_object_set_new(chat, "tool_choice", json_string("none"));
        else if (!strcmp(type, "tool") && json_is_string(json_object_get(tc, "name")))
            json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
                                                               json_object_get(tc, "name")));
        else return srv_bad(e, "tool_choice", "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    }
    return 0;
}

int msgs_to_chat(const json_t *body, bool count_only, json_t **chat_out, srv_error *e) {
    *chat_out = NULL;
    const json_t *v, *mt = json_object_get(body, "max_tokens");
    if (!count_only) {
        if (!mt || json_is_null(mt)) return srv_bad(e, "max_tokens", "max_tokens: Field required");
        if (!json_is_integer(mt) || json_integer_value(mt) < 1)
            return srv_bad(e, "max_tokens", "max_tokens: must be an integer of at least 1");
    }
    const json_t *msgs_in = json_object_get(body, "messages");
    if (!json_is_array(msgs_in)) return srv_bad(e, "messages", "messages: Field required (an array of messages)");
    json_t *chat = json_object(), *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    int rc = 0;
    if ((v = json_object_get(body, "system")) && !json_is_null(v)) {
        char *sys = blocks_text(v, "system", e);
        if (!sys) rc = -1;
        else json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", sys));
        free(sys);
    }
    for (size_t i = 0; i < json_array_size(msgs_in) && !rc; i++) rc = one_message(json_array_get(msgs_in, i), i, msgs, e);
    if (!rc) rc = tools_in(body, chat, e);
    bool thinking = false;
    if (!rc && (v = json_object_get(body, "thinking")) && !json_is_null(v)) {
        const char *t = json_string_value(json_object_get(v, "type"));
        const json_t *budget = json_object_get(v, "budget_tokens");
        if (!t || (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive")))
            rc = srv_bad(e, "thinking", "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
        else if (!strcmp(t, "enabled") && budget && (!json_is_integer(budget) || json_integer_value(budget) < 1))
            rc = srv_bad(e, "thinking", "thinking.budget_tokens must be a positive integer");
        else thinking = strcmp(t, "disabled") != 0;
    }
    if (!rc && (v = json_object_get(body, "stop_sequences")) && !json_is_null(v)) {
        if (!json_is_array(v)) rc = srv_bad(e, "stop_sequences", "'stop_sequences' must be an array of strings");
        else json_object_set(chat, "stop", (json_t *)v);
    }
    if (rc) {
        json_decref(chat);
        return -1;
    }
    json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", thinking));
    if (mt && !count_only) json_object_set(chat, "max_tokens", (json_t *)mt);
    static const char *const pass[] = {"model", "stream", "temperature", "top_p", "top_k", "seed", "ignore_eos",
                                       "cache_prompt", "lilac_forced_output", NULL};
    for (const char *const *k = pass; *k; k++)
        if ((v = json_object_get(body, *k))) json_object_set(chat, *k, (json_t *)v);
    *chat_out = chat;
    return 0;
}

/* ---- output ----------------------------------------------------------------------- */

static const char *stop_reason(const api_result *r, int n_calls) {
    if (n_calls) return "tool_use";
    if (r->length) return "max_tokens";
    return r->stop_seq ? "stop_sequence" : "end_turn";
}

/* toolu_ ids for Anthropic clients; the parser's call_ ids otherwise */
static void tool_id(char *out, size_t n, const char *id) {
    snprintf(out, n, "toolu_%s", strncmp(id, "call_", 5) ? id : id + 5);
}

static json_t *usage_object(const api_result *r, bool start) {
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", r->n_prompt - r->n_cached, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", r->n_cached, "output_tokens", start ? 0 : r->n_gen);
}

void msgs_write(sbuf *b, const api_result *r, const api_parts *p) {
    json_t *content = json_array();
    if (p->reasoning.n)
        json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", p->reasoning.p,
                                                 p->reasoning.n, "signature", ""));
    if (p->content.n) json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text", p->content.p, p->content.n));
    for (int i = 0; i < p->n_calls; i++) {
        char id[64];
        tool_id(id, sizeof id, p->calls[i].id);
        json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name",
                                                 p->calls[i].name,
                                                 "input", api_args_object(p->calls[i].args.p, p->calls[i].args.n)));
    }
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s}", "id", r->id, "type", "message", "role", "assistant", "model",
                          r->model, "content", content, "stop_reason", stop_reason(r, p->n_calls));
    json_object_set_new(o, "stop_sequence", r->stop_seq && !p->n_calls ? json_string(r->stop_seq) : json_null());
    json_object_set_new(o, "usage", usage_object(r, false));
    api_put_json(b, o);
}

static const char *anthropic_type(const srv_error *e) {
    switch (e->status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 408: return "timeout_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return e->status >= 500 ? "api_error" : "invalid_request_error";
    }
}

void msgs_error_json(sbuf *b, const srv_error *e) {
    api_put_json(b, json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", anthropic_type(e), "message",
                              e->message));
}

/* ---- streaming ------------------------------------------------------------------------ */

enum { BLK_NONE, BLK_THINKING, BLK_TEXT, BLK_TOOL };

typedef struct {
    sbuf *out;
    api_result r;
    char id[48], *model;
    int kind, index; /* the open block and its index (next index when none is open) */
    int n_calls;
} mstream;

static void close_block(mstream *s) {
    if (s->kind == BLK_NONE) return;
    if (s->kind == BLK_THINKING)
        api_sse(s->out, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                                                          s->index, "delta", "type", "signature_delta", "signature", ""));
    api_sse(s->out, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", s->index));
    s->kind = BLK_NONE;
    s->index++;
}

static void open_block(mstream *s, int kind, json_t *block) {
    close_block(s);
    s->kind = kind;
    api_sse(s->out, "content_block_start",
            json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", s->index, "content_block", block));
}

static void delta(mstream *s, const char *dtype, const char *field, const char *t, size_t n) {
    api_sse(s->out, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta", "index",
                                                      s->index, "delta", "type", dtype, field, t, n));
}

static void m_reasoning(void *ud, const char *t, size_t n) {
    mstream *s = ud;
    if (!n) return;
    if (s->kind != BLK_THINKING)
        open_block(s, BLK_THINKING, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", ""));
    delta(s, "thinking_delta", "thinking", t, n);
}

static void m_content(void *ud, const char *t, size_t n) {
    mstream *s = ud;
    if (!n) return;
    if (s->kind != BLK_TEXT) open_block(s, BLK_TEXT, json_pack("{s:s, s:s}", "type", "text", "text", ""));
    delta(s, "text_delta", "text", t, n);
}

static void m_open(void *ud, int index, const char *id, const char *name) {
    mstream *s = ud;
    (void)index;
    char tid[64];
    tool_id(tid, sizeof tid, id);
    s->n_calls++;
    open_block(s, BLK_TOOL, json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", tid, "name", name, "input"));
}

static void m_args(void *ud, int index, const char *t, size_t n) {
    mstream *s = ud;
    (void)index;
    if (s->kind == BLK_TOOL && n) delta(s, "input_json_delta", "partial_json", t, n);
}

static const op_sink ms_sink = {m_reasoning, m_content, m_open, m_args};

void *msgs_stream_new(sbuf *out, const api_result *r) {
    mstream *s = xcalloc(1, sizeof *s);
    s->out = out;
    s->r = *r;
    snprintf(s->id, sizeof s->id, "%s", r->id);
    s->model = xstrdup(r->model);
    s->r.id = s->id;
    s->r.model = s->model;
    s->r.req = NULL;
    return s;
}

static void ms_begin(void *st) {
    mstream *s = st;
    json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}", "id", s->id, "type", "message", "role",
                            "assistant", "model", s->model, "content", "stop_reason", "stop_sequence", "usage",
                            usage_object(&s->r, true));
    api_sse(s->out, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", msg));
}

static void ms_end(void *st, const api_result *r) {
    mstream *s = st;
    close_block(s);
    json_t *d = json_pack("{s:s}", "stop_reason", stop_reason(r, s->n_calls));
    json_object_set_new(d, "stop_sequence", r->stop_seq && !s->n_calls ? json_string(r->stop_seq) : json_null());
    api_sse(s->out, "message_delta", json_pack("{s:s, s:o, s:o}", "type", "message_delta", "delta", d, "usage",
                                                usage_object(r, false)));
    api_sse(s->out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static void ms_error(void *st, int status, const char *message) {
    mstream *s = st;
    srv_error e;
    srv_err(&e, status, "", NULL, NULL, "%s", message);
    api_sse(s->out, "error", json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", anthropic_type(&e),
                                        "message", message));
}

static void ms_free(void *st) {
    mstream *s = st;
    free(s->model);
    free(s);
}

const api_stream_ops msgs_stream_ops = {&ms_sink, ms_begin, ms_end, ms_error, ms_free};
