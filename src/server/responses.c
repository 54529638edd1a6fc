/* responses.c — see responses.h. */
#include "responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/common.h"

/* ---- request -> chat body ------------------------------------------------------ */

/* Text of a content value: a string, or parts of type input_text / output_text /
 * text / refusal, joined. NULL + e for anything else (media parts). */
static char *content_text(const json_t *c, const char *param, srv_error *e) {
    if (json_is_string(c)) return xstrdup(json_string_value(c));
    if (!json_is_array(c)) {
        srv_bad(e, "input", "'%s' must be a string or an array of content parts", param);
        return NULL;
    }
    sbuf b = {0};
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *part = json_array_get(c, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (!strcmp(type ? type : "", "refusal")) text = json_object_get(part, "refusal");
        if (type && (!strcmp(type, "input_text") || !strcmp(type, "output_text") || !strcmp(type, "text") ||
                     !strcmp(type, "refusal")) && json_is_string(text)) {
            sb_put(&b, json_string_value(text), json_string_length(text));
            continue;
        }
        sb_free(&b);
        if (type && (!strcmp(type, "input_image") || !strcmp(type, "input_file") || !strcmp(type, "input_audio")))
            srv_bad(e, "input", "'%s[%zu]' is an %.20s part: this server is text-only", param, i, type);
        else srv_bad(e, "input", "'%s[%zu]' must be {\"type\": \"input_text\", \"text\": ...}", param, i);
        return NULL;
    }
    char *s = xstrdup(b.p ? b.p : "");
    sb_free(&b);
    return s;
}

/* The last message when it is an assistant message that may take tool calls
 * (or the reasoning before them), else a new one appended. */
static json_t *assistant_msg(json_t *msgs) {
    size_t n = json_array_size(msgs);
    json_t *last = n ? json_array_get(msgs, n - 1) : NULL;
    const char *role = json_string_value(json_object_get(last, "role"));
    if (last && role && !strcmp(role, "assistant")) return last;
    json_t *m = json_pack("{s:s, s:n}", "role", "assistant", "content");
    json_array_append_new(msgs, m);
    return m;
}

static int input_items(const json_t *input, json_t *msgs, srv_error *e) {
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
        return 0;
    }
    if (!json_is_array(input)) return srv_bad(e, "input", "'input' must be a string or an array of input items");
    char *pending_reasoning = NULL; /* a reasoning item belongs to the assistant turn after it */
    int rc = 0;
    for (size_t i = 0; i < json_array_size(input) && !rc; i++) {
        const json_t *it = json_array_get(input, i);
        char p[40];
        snprintf(p, sizeof p, "input[%zu]", i);
        if (!json_is_object(it)) {
            rc = srv_bad(e, "input", "'%s' must be an object", p);
            break;
        }
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if (role && (!type || !strcmp(type, "message"))) {
            if (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "assistant")) {
                rc = srv_bad(e, "input", "'%s.role' must be user, system, developer or assistant", p);
                break;
            }
            char cp[48];
            snprintf(cp, sizeof cp, "%s.content", p);
            char *text = content_text(json_object_get(it, "content"), cp, e);
            if (!text) {
                rc = -1;
                break;
            }
            json_t *m = json_pack("{s:s, s:s}", "role", !strcmp(role, "developer") ? "system" : role, "content", text);
            free(text);
            if (!strcmp(role, "assistant") && pending_reasoning) {
                json_object_set_new(m, "reasoning_content", json_string(pending_reasoning));
                free(pending_reasoning);
                pending_reasoning = NULL;
            }
            json_array_append_new(msgs, m);
        } else if (type && !strcmp(type, "function_call")) {
            const json_t *name = json_object_get(it, "name"), *args = json_object_get(it, "arguments");
            const json_t *cid = json_object_get(it, "call_id");
            if (!json_is_string(name) || !json_is_string(args) || !json_is_string(cid)) {
                rc = srv_bad(e, "input", "'%s' (function_call) needs string 'call_id', 'name' and 'arguments'", p);
                break;
            }
            json_t *m = assistant_msg(msgs);
            if (pending_reasoning) {
                json_object_set_new(m, "reasoning_content", json_string(pending_reasoning));
                free(pending_reasoning);
                pending_reasoning = NULL;
            }
            json_t *calls = json_object_get(m, "tool_calls");
            if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", cid, "type", "function", "function",
                                                   "name", name, "arguments", args));
        } else if (type && !strcmp(type, "function_call_output")) {
            const json_t *cid = json_object_get(it, "call_id");
            char op[48];
            snprintf(op, sizeof op, "%s.output", p);
            char *out = json_is_string(cid) ? content_text(json_object_get(it, "output"), op, e) : NULL;
            if (!out) {
                if (!json_is_string(cid)) srv_bad(e, "input", "'%s' (function_call_output) needs a string 'call_id'", p);
                rc = -1;
                break;
            }
            json_array_append_new(msgs, json_pack("{s:s, s:O, s:s}", "role", "tool", "tool_call_id", cid, "content", out));
            free(out);
        } else if (type && !strcmp(type, "reasoning")) {
            sbuf b = {0};
            const json_t *parts = json_object_get(it, "content");
            if (!json_is_array(parts) || !json_array_size(parts)) parts = json_object_get(it, "summary");
            for (size_t k = 0; k < json_array_size(parts); k++) {
                const json_t *t = json_object_get(json_array_get(parts, k), "text");
                if (json_is_string(t)) sb_put(&b, json_string_value(t), json_string_length(t));
            }
            free(pending_reasoning);
            pending_reasoning = xstrdup(b.p ? b.p : "");
            sb_free(&b);
        } else if (type && !strcmp(type, "item_reference")) {
            rc = srv_err(e, 400, "invalid_request_error", "input", "unsupported_value",
                         "'%s' is an item_reference: this server stores no items; send the items themselves", p);
        } else {
            rc = srv_bad(e, "input", "'%s' has an unsupported type '%.40s' (messages, function_call, function_call_output "
                                     "and reasoning items are accepted)", p, type ? type : "(none)");
        }
    }
    free(pending_reasoning);
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
            if (!type || strcmp(type, "function"))
                return srv_err(e, 400, "invalid_request_error", "tools", "unsupported_value",
                               "'tools[%zu]': only function tools are supported, not '%.40s'", i, type ? type : "(none)");
            if (!json_is_string(name)) return srv_bad(e, "tools", "'tools[%zu].name' must be a string", i);
            json_t *f = json_pack("{s:O}", "name", name);
            const json_t *v;
            if ((v = json_object_get(t, "description")) && json_is_string(v)) json_object_set(f, "description", (json_t *)v);
            if ((v = json_object_get(t, "parameters")) && !json_is_null(v)) json_object_set(f, "parameters", (json_t *)v);
            json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f));
        }
    }
    const json_t *tc = json_object_get(body, "tool_choice");
    if (json_is_string(tc)) json_object_set(chat, "tool_choice", (json_t *)tc);
    else if (json_is_object(tc)) {
        const char *type = json_string_value(json_object_get(tc, "type"));
        const json_t *name = json_object_get(tc, "name");
        if (!type || strcmp(type, "function") || !json_is_string(name))
            return srv_bad(e, "tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}");
        json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    } else if (tc && !json_is_null(tc)) return srv_bad(e, "tool_choice", "'tool_choice' must be a string or an object");
    return 0;
}

int resp_to_chat(const json_t *body, json_t **chat_out, srv_error *e) {
    *chat_out = NULL;
    const json_t *v;
    if ((v = json_object_get(body, "previous_response_id")) && !json_is_null(v))
        return srv_err(e, 400, "invalid_request_error", "previous_response_id", "unsupported_value",
                       "previous_response_id is not supported: this server stores no responses; send the whole "
                       "conversation in 'input'");
    if ((v = json_object_get(body, "conversation")) && !json_is_null(v))
        return srv_err(e, 400, "invalid_request_error", "conversation", "unsupported_value",
                       "conversation is not supported: this server stores no conversations");
    if (json_is_true(json_object_get(body, "background")))
        return srv_err(e, 400, "invalid_request_error", "background", "unsupported_value",
                       "background responses are not supported");
    const json_t *fmt = json_object_get(json_object_get(body, "text"), "format");
    const char *ft = json_string_value(json_object_get(fmt, "type"));
    if (ft && strcmp(ft, "text"))
        return srv_err(e, 400, "invalid_request_error", "text.format", "unsupported_value",
                       "text.format \"%.40s\" is not supported (no constrained decoding yet); only \"text\"", ft);
    const json_t *input = json_object_get(body, "input");
    if (!input || json_is_null(input)) return srv_bad(e, "input", "'input' is required");
    json_t *chat = json_object(), *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    int rc = 0;
    if ((v = json_object_get(body, "instructions")) && !json_is_null(v)) {
        if (!json_is_string(v)) rc = srv_bad(e, "instructions", "'instructions' must be a string");
        else json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", v));
    }
    if (!rc) rc = input_items(input, msgs, e);
    if (!rc) rc = tools_in(body, chat, e);
    if (rc) {
        json_decref(chat);
        return -1;
    }
    /* the sampling fields and lilac's extensions keep their chat meaning */
    static const char *const pass[] = {"model", "stream", "temperature", "top_p", "top_k", "min_p", "seed",
                                       "presence_penalty", "frequency_penalty", "repetition_penalty", "parallel_tool_calls",
                                       "ignore_eos", "cache_prompt", "chat_template_kwargs", "lilac_forced_output", NULL};
    for (const char *const *k = pass; *k; k++)
        if ((v = json_object_get(body, *k))) json_object_set(chat, *k, (json_t *)v);
    if ((v = json_object_get(body, "max_output_tokens"))) json_object_set(chat, "max_tokens", (json_t *)v);
    if ((v = json_object_get(body, "reasoning")) && !json_is_null(v)) {
        if (!json_is_object(v)) {
            json_decref(chat);
            return srv_bad(e, "reasoning", "'reasoning' must be an object");
        }
        json_object_set(chat, "reasoning", (json_t *)v); /* effort "none" turns thinking off */
    }
    *chat_out = chat;
    return 0;
}

/* ---- output items ----------------------------------------------------------------- */

static json_t *reasoning_item(const char *id, const char *text, size_t n, const char *status) {
    json_t *content = json_array();
    if (text) json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "reasoning_text", "text", text, n));
    return json_pack("{s:s, s:s, s:[], s:o, s:s}", "type", "reasoning", "id", id, "summary", "content", content, "status",
                     status);
}

static json_t *text_part(const char *text, size_t n) {
    return json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", text ? text : "", n, "annotations",
                     "logprobs");
}

static json_t *message_item(const char *id, const char *text, size_t n, const char *status) {
    json_t *content = json_array();
    if (text) json_array_append_new(content, text_part(text, n));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", id, "status", status, "role", "assistant",
                     "content", content);
}

static json_t *call_item(const char *id, const char *call_id, const char *name, const char *args, size_t n,
                         const char *status) {
    return json_pack("{s:s, s:s, s:s, s:s, s:s%, s:s}", "type", "function_call", "id", id, "call_id", call_id, "name",
                     name, "arguments", args ? args : "", n, "status", status);
}

/* The response object; output and usage are taken over (usage may be NULL). */
static json_t *response_object(const api_result *r, const char *status, json_t *output, json_t *usage) {
    const json_t *q = r->req;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:n}", "id", r->id, "object", "response", "created_at",
                          (json_int_t)r->created, "status", status, "error");
    json_object_set_new(o, "incomplete_details",
                        !strcmp(status, "incomplete") ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
#define ECHO(key, dflt)                                                       \
    do {                                                                      \
        const json_t *x_ = json_object_get(q, key);                           \
        json_object_set_new(o, key, x_ ? json_deep_copy(x_) : (dflt));        \
    } while (0)
    ECHO("instructions", json_null());
    ECHO("max_output_tokens", json_null());
    json_object_set_new(o, "model", json_string(r->model));
    json_object_set_new(o, "output", output);
    ECHO("parallel_tool_calls", json_true());
    json_object_set_new(o, "previous_response_id", json_null());
    ECHO("reasoning", json_pack("{s:n, s:n}", "effort", "summary"));
    json_object_set_new(o, "store", json_false());
    ECHO("temperature", json_null());
    json_object_set_new(o, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    ECHO("tool_choice", json_string("auto"));
    ECHO("tools", json_array());
    ECHO("top_p", json_null());
    json_object_set_new(o, "truncation", json_string("disabled"));
    json_object_set_new(o, "usage", usage ? usage : json_null());
    ECHO("user", json_null());
    ECHO("metadata", json_object());
#undef ECHO
    return o;
}

static json_t *usage_object(const api_result *r) {
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", r->n_prompt, "input_tokens_details",
                     "cached_tokens", r->n_cached, "output_tokens", r->n_gen, "output_tokens_details", "reasoning_tokens",
                     r->n_reasoning, "total_tokens", r->n_prompt + r->n_gen);
}

void resp_write(sbuf *b, const api_result *r, const api_parts *p) {
    const char *st = r->length ? "incomplete" : "completed";
    json_t *out = json_array();
    char id[48];
    if (p->reasoning.n) {
        api_make_id(id, sizeof id, "rs_");
        json_array_append_new(out, reasoning_item(id, p->reasoning.p, p->reasoning.n, st));
    }
    if (p->content.n || !p->n_calls) {
        api_make_id(id, sizeof id, "msg_");
        json_array_append_new(out, message_item(id, p->content.p ? p->content.p : "", p->content.n, st));
    }
    for (int i = 0; i < p->n_calls; i++) {
        const api_call *c = &p->calls[i];
        api_make_id(id, sizeof id, "fc_");
        json_array_append_new(out, call_item(id, c->id, c->name, c->args.p ? c->args.p : "{}", c->args.p ? c->args.n : 2,
                                             "completed"));
    }
    api_put_json(b, response_object(r, st, out, usage_object(r)));
}

/* ---- streaming ------------------------------------------------------------------------ */

enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

typedef struct {
    sbuf *out;
    api_result r; /* id, model, created, req (a reference), n_prompt */
    char id[48], *model;
    int seq;
    int kind, index; /* the open item and its output index (next index when none is open) */
    char item_id[48], call_id[40];
    char *call_name;
    sbuf text; /* the open item's text or arguments so far */
    json_t *items; /* finished items */
} rstream;

static void ev(rstream *s, const char *type, json_t *o) {
    json_t *e = json_pack("{s:s, s:i}", "type", type, "sequence_number", s->seq++);
    json_object_update(e, o);
    json_decref(o);
    api_sse(s->out, type, e);
}

static void close_item(rstream *s, const char *status) {
    if (s->kind == ITEM_NONE) return;
    const char *t = s->text.p ? s->text.p : "";
    json_t *item = NULL;
    if (s->kind == ITEM_REASONING) {
        ev(s, "response.reasoning_text.done", json_pack("{s:s, s:i, s:i, s:s%}", "item_id", s->item_id, "output_index",
                                                        s->index, "content_index", 0, "text", t, s->text.n));
        ev(s, "response.content_part.done",
           json_pack("{s:s, s:i, s:i, s:{s:s, s:s%}}", "item_id", s->item_id, "output_index", s->index, "content_index", 0,
                     "part", "type", "reasoning_text", "text", t, s->text.n));
        item = reasoning_item(s->item_id, t, s->text.n, status);
    } else if (s->kind == ITEM_MESSAGE) {
        ev(s, "response.output_text.done", json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", s->item_id, "output_index",
                                                     s->index, "content_index", 0, "text", t, s->text.n, "logprobs"));
        ev(s, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", s->item_id, "output_index",
                                                      s->index, "content_index", 0, "part", text_part(t, s->text.n)));
        item = message_item(s->item_id, t, s->text.n, status);
    } else {
        if (!s->text.n) sb_puts(&s->text, "{}");
        ev(s, "response.function_call_arguments.done",
           json_pack("{s:s, s:i, s:s, s:s%}", "item_id", s->item_id, "output_index", s->index, "name", s->call_name,
                     "arguments", s->text.p, s->text.n));
        item = call_item(s->item_id, s->call_id, s->call_name, s->text.p, s->text.n, "completed");
    }
    ev(s, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", s->index, "item", item));
    json_array_append_new(s->items, item);
    free(s->call_name);
    s->call_name = NULL;
    sb_clear(&s->text);
    s->kind = ITEM_NONE;
    s->index++;
}

static void open_item(rstream *s, int kind, const char *call_id, const char *name) {
    close_item(s, "completed");
    s->kind = kind;
    json_t *item;
    if (kind == ITEM_REASONING) {
        api_make_id(s->item_id, sizeof s->item_id, "rs_");
        item = reasoning_item(s->item_id, NULL, 0, "in_progress");
    } else if (kind == ITEM_MESSAGE) {
        api_make_id(s->item_id, sizeof s->item_id, "msg_");
        item = message_item(s->item_id, NULL, 0, "in_progress");
    } else {
        api_make_id(s->item_id, sizeof s->item_id, "fc_");
        snprintf(s->call_id, sizeof s->call_id, "%s", call_id);
        s->call_name = xstrdup(name);
        item = call_item(s->item_id, call_id, name, "", 0, "in_progress");
    }
    ev(s, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", s->index, "item", item));
    if (kind == ITEM_REASONING)
        ev(s, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", s->item_id,
                                                       "output_index", s->index, "content_index", 0, "part", "type",
                                                       "reasoning_text", "text", ""));
    else if (kind == ITEM_MESSAGE)
        ev(s, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:o}", "item_id", s->item_id, "output_index",
                                                       s->index, "content_index", 0, "part", text_part("", 0)));
}

static void s_reasoning(void *ud, const char *t, size_t n) {
    rstream *s = ud;
    if (!n) return;
    if (s->kind != ITEM_REASONING) open_item(s, ITEM_REASONING, NULL, NULL);
    sb_put(&s->text, t, n);
    ev(s, "response.reasoning_text.delta", json_pack("{s:s, s:i, s:i, s:s%}", "item_id", s->item_id, "output_index",
                                                     s->index, "content_index", 0, "delta", t, n));
}

static void s_content(void *ud, const char *t, size_t n) {
    rstream *s = ud;
    if (!n) return;
    if (s->kind != ITEM_MESSAGE) open_item(s, ITEM_MESSAGE, NULL, NULL);
    sb_put(&s->text, t, n);
    ev(s, "response.output_text.delta", json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", s->item_id, "output_index",
                                                  s->index, "content_index", 0, "delta", t, n, "logprobs"));
}

static void s_open(void *ud, int index, const char *id, const char *name) {
    (void)index;
    open_item(ud, ITEM_CALL, id, name);
}

static void s_args(void *ud, int index, const char *t, size_t n) {
    rstream *s = ud;
    (void)index;
    if (s->kind != ITEM_CALL || !n) return;
    sb_put(&s->text, t, n);
    ev(s, "response.function_call_arguments.delta",
       json_pack("{s:s, s:i, s:s%}", "item_id", s->item_id, "output_index", s->index, "delta", t, n));
}

static const op_sink rs_sink = {s_reasoning, s_content, s_open, s_args};

void *resp_stream_new(sbuf *out, const api_result *r) {
    rstream *s = xcalloc(1, sizeof *s);
    s->out = out;
    s->r = *r;
    snprintf(s->id, sizeof s->id, "%s", r->id);
    s->model = xstrdup(r->model);
    s->r.id = s->id;
    s->r.model = s->model;
    s->r.req = json_incref((json_t *)r->req);
    s->items = json_array();
    return s;
}

static void rs_begin(void *st) {
    rstream *s = st;
    ev(s, "response.created", json_pack("{s:o}", "response", response_object(&s->r, "in_progress", json_array(), NULL)));
    ev(s, "response.in_progress", json_pack("{s:o}", "response", response_object(&s->r, "in_progress", json_array(), NULL)));
}

static void rs_end(void *st, const api_result *r) {
    rstream *s = st;
    const char *status = r->length ? "incomplete" : "completed";
    if (s->kind == ITEM_NONE && s->index == 0) open_item(s, ITEM_MESSAGE, NULL, NULL); /* an empty answer is a message */
    close_item(s, status);
    api_result fin = *r;
    fin.id = s->id;
    fin.model = s->model;
    fin.created = s->r.created;
    fin.req = s->r.req;
    ev(s, r->length ? "response.incomplete" : "response.completed",
       json_pack("{s:o}", "response", response_object(&fin, status, json_incref(s->items), usage_object(&fin))));
}

static void rs_error(void *st, int status, const char *message) {
    rstream *s = st;
    const char *code = status == 503 ? "server_is_overloaded" : "server_error";
    ev(s, "error", json_pack("{s:s, s:s, s:n}", "code", code, "message", message, "param"));
}

static void rs_free(void *st) {
    rstream *s = st;
    json_decref((json_t *)s->r.req);
    json_decref(s->items);
    free(s->model);
    free(s->call_name);
    sb_free(&s->text);
    free(s);
}

const api_stream_ops resp_stream_ops = {&rs_sink, rs_begin, rs_end, rs_error, rs_free};
