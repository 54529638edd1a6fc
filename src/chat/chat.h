/* chat.h — the Qwen3.6-35B-A3B chat template, rendered in C.
 *
 * lilac_chat_render() produces, byte for byte, what the official
 * chat_template.jinja renders under transformers' apply_chat_template (jinja2
 * with trim_blocks/lstrip_blocks, its own tojson = json.dumps(ensure_ascii=False)),
 * after the two input clean-ups apply_chat_template does first: message keys
 * whose value is null are dropped, and reasoning given as "thinking" or
 * "reasoning" counts as "reasoning_content". One addition, as OpenAI-compatible
 * servers do: tool-call "arguments" given as a JSON string are parsed into an
 * object (the template can only render objects).
 *
 * Supported: system (first message only), user, assistant with
 * reasoning_content or <think>…</think> inside content, older turns' thinking
 * dropped (kept with preserve_thinking), enable_thinking=false, tools (the XML
 * calling convention and the tool list), assistant tool_calls, grouped tool
 * results, content as a string or a list of text/image/video parts. The
 * template's own errors are reported with its messages ("No user query found
 * in messages.", "System message must be at the beginning.", "Unexpected
 * message role.", …).
 *
 * Safety: the prompt also records which byte ranges came from the caller
 * (message content, reasoning, tool names, arguments, tool JSON). Tokenised with
 * lilac_prompt_encode(), the template's own structure becomes real special
 * tokens while those ranges are plain text: a user typing "<|im_end|>" cannot
 * close their turn. For prompts whose content holds no added-token string the
 * ids equal HF's apply_chat_template(tokenize=True). */
#ifndef LILAC_CHAT_H
#define LILAC_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "../tokenizer/tokenizer.h"
#include "../util/common.h"
#include "content_part.h"

typedef struct {
    bool add_generation_prompt; /* default true: end with "<|im_start|>assistant\n<think>\n" */
    bool enable_thinking;       /* default true; false: "<think>\n\n</think>\n\n" after the header */
    bool preserve_thinking;     /* default false; true: keep every assistant turn's thinking */
    bool add_vision_id;         /* default false; "Picture N: " / "Video N: " before media */
    bool text_only;             /* default false; true: an image or video part is an error (the server) */
} lilac_chat_opts;

void lilac_chat_opts_default(lilac_chat_opts *o);

/* A rendered prompt: UTF-8 text plus the byte ranges that came from the caller. */
typedef struct {
    char *text;
    size_t len;
    lilac_span *data;
    size_t n_data;
} lilac_prompt;

void lilac_prompt_free(lilac_prompt *p);

/* messages: a JSON array of message objects; tools: a JSON array or NULL.
 * Returns 0, or -1 with err set (the template's error text where it has one). */
int lilac_chat_render(const json_t *messages, const json_t *tools, const lilac_chat_opts *o, lilac_prompt *out,
                      lilac_err *err);

/* The same from JSON text (tools_json may be NULL). messages_json may also be an
 * object {"messages": [...], "tools": [...]} (an OpenAI-style request body). */
int lilac_chat_render_json(const char *messages_json, size_t len, const char *tools_json, size_t tools_len,
                           const lilac_chat_opts *o, lilac_prompt *out, lilac_err *err);

/* Tokenise a rendered prompt. specials_in_content=false (the safe default):
 * added tokens are matched only in the template's structure; true: everywhere,
 * as HF does. */
int lilac_prompt_encode(const lilac_tokenizer *t, const lilac_prompt *p, bool specials_in_content, lilac_ids *out,
                        lilac_err *err);

/* Look for the model directory's chat template (DIR/chat_template.jinja, else
 * "chat_template" in DIR/tokenizer_config.json) and compare its SHA-256 with the
 * official Qwen3.6 one. Returns 0 when it is that template; 1 when it differs or
 * is missing, with a one-line warning in `warn` (lilac renders with its built-in
 * Qwen3.6 logic either way). */
int lilac_chat_check_template(const char *model_dir, lilac_err *warn);

#define LILAC_QWEN36_TEMPLATE_SHA256 "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259"

#endif
