/* outparse.h — splits generated text into reasoning, content and tool calls,
 * incrementally (text arrives in pieces; nothing is emitted that could still
 * turn out to be part of a tag).
 *
 * Reasoning (Qwen3.x; the rules of vLLM's qwen3 reasoning parser): with
 * thinking on, the output starts inside <think> (the prompt opened it); a
 * stray generated "<think>" is dropped; the first "</think>" ends the
 * reasoning; "<tool_call>" followed by "<function=" inside reasoning also ends
 * it. With no "</think>" everything is reasoning (thinking on) or content
 * (thinking off). Content after "</think>" loses its leading whitespace, and
 * trailing whitespace before a tool call or at the end is dropped.
 *
 * Tool calls (Qwen3.6 XML, when the request has tools):
 *   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
 * become OpenAI tool calls whose `arguments` is a JSON object text, each value
 * typed from the tool's JSON schema (string, integer, number, boolean, object,
 * array; a value that does not parse as its type stays a string). Arguments
 * are emitted incrementally, one parameter at a time: `{"k": v`, `, "k2": v2`,
 * `}`. */
#ifndef LILAC_OUTPARSE_H
#define LILAC_OUTPARSE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    void (*reasoning)(void *ud, const char *s, size_t n);
    void (*content)(void *ud, const char *s, size_t n);
    void (*tool_open)(void *ud, int index, const char *id, const char *name);
    void (*tool_args)(void *ud, int index, const char *s, size_t n);
} op_sink;

typedef struct op_parser op_parser;

/* thinking: the output starts in reasoning. tools: the request's tools array
 * (NULL: tool calls are not parsed, "<tool_call>" is plain content). */
op_parser *op_new(bool thinking, const json_t *tools);
void op_free(op_parser *p);
void op_feed(op_parser *p, const char *s, size_t n, const op_sink *k, void *ud);
/* End of output: flush what was held back; an unterminated tool call is
 * closed (its arguments so far) and reported by op_incomplete_tool. */
void op_finish(op_parser *p, const op_sink *k, void *ud);
int op_n_tools(const op_parser *p);
bool op_incomplete_tool(const op_parser *p);

#endif
