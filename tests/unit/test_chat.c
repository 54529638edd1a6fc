/* test_chat.c — unit tests of src/chat: rendering, the caller-data ranges that
 * keep typed special tokens plain, errors, the template hash. (Byte-exactness
 * against jinja2 is tests/tokenizer/test_chat_template.py.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "check.h"

static int render(const char *msgs, const char *tools, const lilac_chat_opts *o, lilac_prompt *p, lilac_err *e) {
    return lilac_chat_render_json(msgs, strlen(msgs), tools, tools ? strlen(tools) : 0, o, p, e);
}

/* Is [a, b) wholly inside one data range? */
static bool in_data(const lilac_prompt *p, size_t a, size_t b) {
    for (size_t i = 0; i < p->n_data; i++)
        if (p->data[i].off <= a && b <= p->data[i].off + p->data[i].len) return true;
    return false;
}

static bool overlaps_data(const lilac_prompt *p, size_t a, size_t b) {
    for (size_t i = 0; i < p->n_data; i++)
        if (p->data[i].off < b && a < p->data[i].off + p->data[i].len) return true;
    return false;
}

static void test_basic(void) {
    lilac_prompt p;
    lilac_err e = {{0}};
    CHECK(render("[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, NULL, &p, &e) == 0);
    CHECK(!strcmp(p.text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
    CHECK(p.n_data == 1 && p.data[0].off == 17 && p.data[0].len == 2);
    lilac_prompt_free(&p);
    lilac_chat_opts o;
    lilac_chat_opts_default(&o);
    o.enable_thinking = false;
    CHECK(render("{\"messages\":[{\"role\":\"system\",\"content\":\" S \"},{\"role\":\"user\",\"content\":\"Q\"}]}", NULL,
                 &o, &p, &e) == 0);
    CHECK(!strcmp(p.text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                          "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    lilac_prompt_free(&p);
}

static void test_data_ranges(void) {
    const char *m = "[{\"role\":\"user\",\"content\":\"say <|im_end|> now\"},"
                    "{\"role\":\"assistant\",\"content\":\"ok\",\"reasoning_content\":\"<think>r\",\"tool_calls\":"
                    "[{\"function\":{\"name\":\"f<|im_start|>\",\"arguments\":\"{\\\"k<x>\\\": [1.5, \\\"v\\\"]}\"}}]},"
                    "{\"role\":\"tool\",\"content\":\"</tool_response>\"}]";
    const char *tools = "[{\"name\":\"f\",\"description\":\"<|im_end|>\"}]";
    lilac_prompt p;
    lilac_err e = {{0}};
    CHECK(render(m, tools, NULL, &p, &e) == 0);
    if (!p.text) return;
    /* every caller-supplied string lies in a data range */
    const char *typed[] = {"say <|im_end|> now", "<think>r", "f<|im_start|>", "k<x>", "</tool_response>",
                           "\"description\": \"<|im_end|>\"", "1.5"};
    for (size_t i = 0; i < sizeof typed / sizeof typed[0]; i++) {
        const char *q = strstr(p.text, typed[i]);
        CHECKF(q && in_data(&p, (size_t)(q - p.text), (size_t)(q - p.text) + strlen(typed[i])), "%s", typed[i]);
    }
    /* and the template's own markers never do */
    const char *own[] = {"<|im_start|>user\n", "<|im_start|>assistant\n<think>\n", "<tool_call>\n<function=",
                         "<parameter=", "<tool_response>\n", "<tools>"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        const char *q = strstr(p.text, own[i]);
        CHECKF(q && !overlaps_data(&p, (size_t)(q - p.text), (size_t)(q - p.text) + strlen(own[i])), "%s", own[i]);
    }
    lilac_prompt_free(&p);
}

static void test_errors(void) {
    struct {
        const char *m, *msg;
    } cases[] = {
        {"[]", "No messages provided."},
        {"[{\"role\":\"assistant\",\"content\":\"a\"}]", "No user query found in messages."},
        {"[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"s\"}]",
         "System message must be at the beginning."},
        {"[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\",\"content\":\"a\"}]", "Unexpected message role."},
        {"[{\"role\":\"user\",\"content\":7}]", "Unexpected content type."},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"}]}]", "Unexpected item type in content."},
        {"[1]", "messages[0] is not an object"},
        {"{\"role\":\"user\"}", "\"messages\" list"},
        {"[{\"role\":\"user\",\"content\":\"a\"", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lilac_prompt p;
        lilac_err e = {{0}};
        CHECKF(render(cases[i].m, NULL, NULL, &p, &e) == -1 && strstr(e.msg, cases[i].msg), "case %zu: %s", i, e.msg);
        CHECK(p.text == NULL);
    }
}

static void test_safe_encode(void) {
    lilac_err e = {{0}};
    lilac_tokenizer *t = lilac_tok_load("tests/data/tokenizers/qwen3/tokenizer.json", &e);
    CHECKF(t, "%s", e.msg);
    if (!t) return;
    lilac_prompt p;
    CHECK(render("[{\"role\":\"user\",\"content\":\"a<|im_end|>b\"}]", NULL, NULL, &p, &e) == 0);
    lilac_ids safe = {0}, hf = {0};
    CHECK(lilac_prompt_encode(t, &p, false, &safe, &e) == 0);
    CHECK(lilac_prompt_encode(t, &p, true, &hf, &e) == 0);
    int n_end_safe = 0, n_end_hf = 0;
    for (size_t i = 0; i < safe.n; i++) n_end_safe += safe.ids[i] == 151645;
    for (size_t i = 0; i < hf.n; i++) n_end_hf += hf.ids[i] == 151645;
    CHECK(n_end_safe == 1 && n_end_hf == 2);
    CHECK(safe.ids[0] == 151644 && safe.ids[safe.n - 2] == 151667); /* <|im_start|> ... <think> \n */
    lilac_ids_free(&safe);
    lilac_ids_free(&hf);
    lilac_prompt_free(&p);
    lilac_tok_free(t);
}

static void test_template_hash(void) {
    lilac_err w = {{0}};
    CHECK(lilac_chat_check_template("tests/data/templates/qwen3.6", &w) == 0);
    CHECK(lilac_chat_check_template("/nonexistent-dir", &w) == 1 && strstr(w.msg, "no chat template"));
}

/* Content parts: the template classifies by keys before "type" (a "text" part
 * with an "image" key renders as an image, as under jinja); with text_only
 * (the server) any media part is an error, so no vision token comes from input. */
static void test_content_parts(void) {
    json_t *p = json_loads("{\"type\":\"text\",\"text\":\"w\",\"image\":\"x\"}", 0, NULL);
    CHECK(lilac_content_part_kind(p) == LILAC_PART_IMAGE);
    json_decref(p);
    p = json_loads("{\"type\":\"text\",\"text\":\"w\",\"video\":1}", 0, NULL);
    CHECK(lilac_content_part_kind(p) == LILAC_PART_VIDEO);
    json_decref(p);
    p = json_loads("{\"type\":\"text\",\"text\":\"w\"}", 0, NULL);
    CHECK(lilac_content_part_kind(p) == LILAC_PART_TEXT);
    json_decref(p);
    p = json_loads("{\"type\":\"audio\"}", 0, NULL);
    CHECK(lilac_content_part_kind(p) == LILAC_PART_OTHER);
    json_decref(p);
    p = json_integer(3);
    CHECK(lilac_content_part_kind(p) == LILAC_PART_INVALID);
    json_decref(p);
    const char *m = "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"mine\",\"image_url\":{}}]}]";
    lilac_prompt pr;
    lilac_err e = {{0}};
    CHECK(render(m, NULL, NULL, &pr, &e) == 0 && strstr(pr.text, "<|image_pad|>") && !strstr(pr.text, "mine"));
    lilac_prompt_free(&pr);
    lilac_chat_opts o;
    lilac_chat_opts_default(&o);
    o.text_only = true;
    memset(&pr, 0, sizeof pr);
    CHECK(render(m, NULL, &o, &pr, &e) != 0 && strstr(e.msg, "text only"));
    lilac_prompt_free(&pr);
}

int main(void) {
    TEST(test_basic);
    TEST(test_data_ranges);
    TEST(test_errors);
    TEST(test_safe_encode);
    TEST(test_template_hash);
    TEST(test_content_parts);
    return check_summary();
}
