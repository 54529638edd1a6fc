/* constrain.h — constrained decoding: grammars over bytes, matchers that follow
 * the generated text, and the set of token ids allowed at each step.
 *
 * A lilac_grammar is a context-free grammar over bytes, compiled from GBNF
 * (llama.cpp's format), a JSON Schema, a regex (the ECMAScript subset of JSON
 * Schema `pattern` and vLLM's guided_regex) or a list of choices. It is
 * immutable once compiled and may be shared by many matchers and threads
 * (reference counted). A lilac_cvocab holds every token's byte string and an
 * index over them; one per tokenizer. A lilac_matcher is the state of one
 * sequence (one row of a batch): it advances by tokens, answers "may the text
 * end here", yields the allowed-token bitset, and can be cloned or rolled back
 * a few tokens (speculative drafts). A matcher is used by one thread at a time.
 *
 * Errors are one line naming the construct and where it is: a JSON path for
 * schemas ("$.properties.age.minimum"), a line:column for GBNF, an offset for
 * regexes. Inputs that would compile to a pathological size are refused. */
#ifndef LILAC_CONSTRAIN_H
#define LILAC_CONSTRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../util/common.h"

typedef struct lilac_tokenizer lilac_tokenizer;
typedef struct lilac_grammar lilac_grammar;
typedef struct lilac_cvocab lilac_cvocab;
typedef struct lilac_matcher lilac_matcher;

/* ---- Grammars ---------------------------------------------------------------- */

enum {
    LILAC_GRAMMAR_GBNF = 0,   /* llama.cpp GBNF; the start rule is `root` */
    LILAC_GRAMMAR_SCHEMA = 1, /* a JSON Schema (text of a JSON document) */
    LILAC_GRAMMAR_REGEX = 2,  /* a regex the whole output must match */
    LILAC_GRAMMAR_CHOICE = 3, /* a JSON array of strings: the output is one of them */
};

typedef struct {
    /* Whitespace allowed between JSON tokens: at most this many bytes of
     * [ \t\n\r] in one place (bounded so a model cannot loop on spaces). */
    int max_ws;
} lilac_schema_opts;
void lilac_schema_opts_default(lilac_schema_opts *o); /* max_ws = 24 */

lilac_grammar *lilac_grammar_from_gbnf(const char *text, size_t len, lilac_err *err);
lilac_grammar *lilac_grammar_from_schema(const char *json, size_t len, const lilac_schema_opts *o, lilac_err *err);
/* Texts `prefix JSON suffix` for any one of n alternatives, the JSON valid
 * against that alternative's schema. A forced tool call in Qwen's syntax is
 * prefix "<tool_call>\n{\"name\": \"NAME\", \"arguments\": ", the tool's
 * parameter schema, suffix "}\n</tool_call>"; one alternative per tool for
 * tool_choice "required". Messages name the alternative ("schema 2 $.…"). */
typedef struct {
    const char *prefix; /* literal text before the JSON (NULL: none) */
    const char *schema; /* the JSON Schema's text */
    size_t schema_len;
    const char *suffix; /* literal text after it (NULL: none) */
} lilac_schema_alt;
lilac_grammar *lilac_grammar_from_schema_alts(const lilac_schema_alt *alts, size_t n, const lilac_schema_opts *o,
                                              lilac_err *err);
lilac_grammar *lilac_grammar_from_regex(const char *re, size_t len, lilac_err *err);
lilac_grammar *lilac_grammar_from_choices(const char *const *choices, const size_t *lens, size_t n, lilac_err *err);
/* Compile by kind (LILAC_GRAMMAR_*); CHOICE takes a JSON array of strings. */
lilac_grammar *lilac_grammar_compile(int kind, const char *text, size_t len, const lilac_schema_opts *o,
                                     lilac_err *err);
lilac_grammar *lilac_grammar_ref(lilac_grammar *g); /* one more owner; returns g */
void lilac_grammar_free(lilac_grammar *g);          /* drops one owner */
/* Rules and byte-automaton nodes, for limits and diagnostics. */
size_t lilac_grammar_n_rules(const lilac_grammar *g);
size_t lilac_grammar_n_nodes(const lilac_grammar *g);

/* A cache of compiled grammars keyed by (kind, options, a 64-bit hash of the
 * text), the text compared in full on a hit. Thread-safe. Returns a new
 * reference (free it with lilac_grammar_free). */
typedef struct lilac_gcache lilac_gcache;
lilac_gcache *lilac_gcache_new(size_t capacity);
void lilac_gcache_free(lilac_gcache *c);
lilac_grammar *lilac_gcache_get(lilac_gcache *c, int kind, const char *text, size_t len, const lilac_schema_opts *o,
                                lilac_err *err);
uint64_t lilac_constrain_hash(const void *p, size_t n, uint64_t seed);

/* ---- Vocabulary ---------------------------------------------------------------- */

/* The byte strings of every id of `t`. Tokens marked special are never allowed
 * except the end tokens `eos` (allowed only where the grammar may end); other
 * added tokens are their text. */
lilac_cvocab *lilac_cvocab_new(const lilac_tokenizer *t, const int32_t *eos, size_t n_eos, lilac_err *err);
/* The same from raw byte strings (bytes[i] of lens[i]; lens[i] == 0: never allowed). */
lilac_cvocab *lilac_cvocab_new_raw(int32_t n_vocab, const uint8_t *const *bytes, const size_t *lens,
                                   const int32_t *eos, size_t n_eos, lilac_err *err);
void lilac_cvocab_free(lilac_cvocab *v);
int32_t lilac_cvocab_size(const lilac_cvocab *v);
/* uint64_t words in a mask: bit i of word i/64 is token i. */
size_t lilac_cvocab_mask_words(const lilac_cvocab *v);

/* ---- Matchers -------------------------------------------------------------------- */

/* Start at the beginning of the grammar. The vocabulary must outlive the
 * matcher; a grammar works with one vocabulary (its token index is built for
 * the first one used, lazily, position by position). NULL + err on misuse. */
lilac_matcher *lilac_matcher_new(lilac_grammar *g, const lilac_cvocab *v, lilac_err *err);
lilac_matcher *lilac_matcher_clone(const lilac_matcher *m);
void lilac_matcher_free(lilac_matcher *m);
void lilac_matcher_reset(lilac_matcher *m);

/* Advance by a token. Returns 0, or -1 when the grammar does not allow it,
 * or -2 when the grammar is too ambiguous to follow further (over 1024
 * parses alive at once: the request should end with an error);
 * the state is then unchanged. A token in the mask never gets -1. An end
 * token is allowed where the grammar may end; after it the matcher is done
 * and allows nothing. */
int lilac_matcher_accept(lilac_matcher *m, int32_t token);
/* Advance by raw bytes (not tokens); same contract. */
int lilac_matcher_accept_bytes(lilac_matcher *m, const uint8_t *p, size_t n);
/* Undo the last n accepted tokens (n <= LILAC_MATCHER_MAX_ROLLBACK). Returns
 * 0, or -1 when fewer than n are remembered (the state is then unchanged). */
enum { LILAC_MATCHER_MAX_ROLLBACK = 32 };
int lilac_matcher_rollback(lilac_matcher *m, int n);
/* May the text end here (an end token allowed)? */
bool lilac_matcher_can_end(const lilac_matcher *m);
/* An end token was accepted, or the grammar allows nothing more but the end. */
bool lilac_matcher_is_done(const lilac_matcher *m);

/* The allowed tokens now: `mask` gets lilac_cvocab_mask_words(v) words. */
void lilac_matcher_fill_mask(lilac_matcher *m, uint64_t *mask);

/* Set logits of disallowed tokens to -INFINITY (a host-side apply). */
void lilac_mask_apply(const uint64_t *mask, float *logits, int32_t n_vocab);

#endif
