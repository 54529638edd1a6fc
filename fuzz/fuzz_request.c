/* fuzz_request.c — libFuzzer target for the server's request parser and
 * validator (src/server/request.c) and the output parser that splits generated
 * text into reasoning, content and tool calls (src/server/outparse.c).
 *
 * The first byte picks the target: even -> chat request, odd -> completion
 * request (both must accept or reject with a filled error, never crash; the
 * content parts go through the classifier the chat renderer shares); with bit 4
 * set (and bit 1 clear), the checks made from the headers: the JSON value
 * counter (an upper bound on what jansson builds), the Host allowlist and the
 * Content-Type test, on the rest as text; with
 * bit 1 set, the rest is fed to the output parser in pieces whose sizes come
 * from the following bytes, with thinking and tools switched by bits 2 and 3.
 * The sources are included directly: the Makefile's fuzz rule links only
 * src/model, src/util and the content-part classifier (src/chat/content_part.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/outparse.c"
#include "server/request.c"

/* Values in a parsed JSON tree: each scalar, array and object, and each object key. */
static size_t json_tree_count(const json_t *j) {
    size_t n = 1;
    if (json_is_array(j))
        for (size_t i = 0; i < json_array_size(j); i++) n += json_tree_count(json_array_get(j, i));
    else if (json_is_object(j)) {
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)j, k, v) n += 1 + json_tree_count(v);
    }
    return n;
}

static void nop_text(void *ud, const char *s, size_t n) {
    size_t *total = ud;
    for (size_t i = 0; i < n; i++) *total += (unsigned char)s[i] != 0; /* touch every byte */
}
static void nop_open(void *ud, int index, const char *id, const char *name) {
    (void)index;
    *(size_t *)ud += strlen(id) + strlen(name);
}
static void nop_args(void *ud, int index, const char *s, size_t n) {
    (void)index;
    nop_text(ud, s, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t mode = data[0];
    data++, size--;
    if (!(mode & 2) && (mode & 16)) {
        size_t count = srv_json_count_values((const char *)data, size, (size_t)-1);
        json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
        if (j && count < json_tree_count(j)) abort(); /* the bound is an upper bound */
        json_decref(j);
        char *text = malloc(size + 1);
        memcpy(text, data, size);
        text[size] = 0;
        char *comma = memchr(text, '|', size); /* "host|allowed" */
        if (comma) {
            *comma = 0;
            bool ok = srv_host_allowed(text, comma + 1);
            if (ok && !strchr(comma + 1, '*') && !text[0]) abort(); /* an empty Host is never allowed */
        }
        (void)srv_ctype_json(text);
        free(text);
        return 0;
    }
    if (!(mode & 2)) {
        srv_request r;
        srv_error e;
        if (srv_parse_request((const char *)data, size, (mode & 1) ? REQ_COMPLETION : REQ_CHAT, &r, &e) == 0)
            srv_request_free(&r);
        else if (!e.message[0] || e.status < 400)
            abort(); /* every rejection says why */
        return 0;
    }
    json_t *tools = NULL;
    if (mode & 8)
        tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":"
                           "{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"object\"},\"c\":{\"type\":\"number\"},"
                           "\"d\":{\"type\":[\"boolean\",\"null\"]},\"e\":{\"type\":\"array\"}}}}}]",
                           0, NULL);
    op_parser *p = op_new((mode & 4) != 0, tools);
    size_t total = 0;
    const op_sink k = {nop_text, nop_text, nop_open, nop_args};
    size_t i = 0;
    while (i < size) {
        size_t n = 1 + (data[i] % 16);
        i++;
        if (n > size - i) n = size - i;
        op_feed(p, (const char *)data + i, n, &k, &total);
        i += n;
    }
    op_finish(p, &k, &total);
    op_free(p);
    json_decref(tools);
    return 0;
}
