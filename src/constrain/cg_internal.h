/* cg_internal.h — what the constraint engine's files share: the grammar AST the
 * front ends build, the compiled byte automata, and the matcher's stack sets. */
#ifndef LILAC_CG_INTERNAL_H
#define LILAC_CG_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "constrain.h"

/* Limits that keep compilation bounded in time and memory. */
enum {
    CG_MAX_RULES = 1 << 16,
    CG_MAX_AST = 1 << 20,     /* AST nodes per grammar */
    CG_MAX_TNODES = 1 << 19,  /* automaton nodes before epsilon removal */
    CG_MAX_REPEAT = 10000,    /* the largest {m,n} bound */
    CG_MAX_DEPTH = 4096,      /* stack depth of a matcher */
    CG_MAX_STACKS = 1024,     /* stacks alive in one state */
    CG_MAX_WORDS = 1 << 17,   /* words of all stacks of one state */
    CG_MAX_VISITS = 1 << 14,  /* stacks closed in one step */
};

/* ---- AST ------------------------------------------------------------------- */
enum { A_EMPTY, A_CLASS, A_BYTES, A_SEQ, A_ALT, A_REP, A_REF };
typedef struct cg_ast {
    int kind;
    int n;               /* kids, ranges (pairs) or bytes */
    struct cg_ast **kids; /* SEQ, ALT: n kids; REP: kids[0] */
    uint32_t *ranges;    /* CLASS: n sorted disjoint codepoint ranges [lo, hi] */
    uint8_t *bytes;      /* BYTES */
    int min, max;        /* REP; max < 0: unbounded */
    int rule;            /* REF */
    int mark;            /* visit mark of a compile pass */
} cg_ast;

typedef struct cg_block cg_block;
typedef struct {
    cg_block *blocks;    /* arena */
    size_t n_ast;
    char **names;
    cg_ast **bodies;
    int *defined_at;     /* a front end's position of the definition (diagnostics) */
    int n_rules, cap_rules;
    bool failed;
    lilac_err *err;
} cg_builder;

void cgb_init(cg_builder *b, lilac_err *err);
void cgb_free(cg_builder *b);
void *cgb_alloc(cg_builder *b, size_t n);
/* Failure helper: the first message wins. Returns NULL. */
void *cgb_fail(cg_builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Rule by name: found or created undefined. -1 on overflow. */
int cgb_rule(cg_builder *b, const char *name);
/* A fresh rule named from `base` (base, base-1, base-2, …). */
int cgb_new_rule(cg_builder *b, const char *base);
void cgb_define(cg_builder *b, int rule, cg_ast *body);

cg_ast *ast_empty(cg_builder *b);
cg_ast *ast_bytes(cg_builder *b, const void *p, size_t n);
cg_ast *ast_str(cg_builder *b, const char *s);
cg_ast *ast_class(cg_builder *b, const uint32_t *ranges, int n_pairs, bool negate);
cg_ast *ast_range(cg_builder *b, uint32_t lo, uint32_t hi);
cg_ast *ast_seq(cg_builder *b, cg_ast **kids, int n);
cg_ast *ast_alt(cg_builder *b, cg_ast **kids, int n);
cg_ast *ast_seq2(cg_builder *b, cg_ast *x, cg_ast *y);
cg_ast *ast_seq3(cg_builder *b, cg_ast *x, cg_ast *y, cg_ast *z);
cg_ast *ast_alt2(cg_builder *b, cg_ast *x, cg_ast *y);
cg_ast *ast_rep(cg_builder *b, cg_ast *x, int min, int max);
cg_ast *ast_ref(cg_builder *b, int rule);

/* A growable list of AST nodes for the front ends. */
typedef struct {
    cg_ast **v;
    int n, cap;
} cg_astv;
void astv_push(cg_astv *v, cg_ast *a);
void astv_free(cg_astv *v);

/* Sort and merge codepoint ranges (pairs) in place; returns the new pair count. */
int cg_ranges_normalize(uint32_t *r, int n_pairs);
/* Append the UTF-8 encoding of cp (<= 0x10FFFF); returns bytes written. */
int cg_utf8_put(uint8_t *out, uint32_t cp);
/* Decode one UTF-8 character at s[0..n); returns its length, 0 if invalid. */
int cg_utf8_get(const uint8_t *s, size_t n, uint32_t *cp);

/* Alternation of byte strings as a trie (sorts v): one live branch per prefix. */
typedef struct {
    const uint8_t *p;
    size_t n;
} cg_bstr;
cg_ast *cg_trie_ast(cg_builder *b, cg_bstr *v, size_t n);

/* Compile the builder's rules (root = `root`) into a grammar. */
lilac_grammar *cg_compile(cg_builder *b, int root);

/* Regex front end, also used by the schema front end for `pattern`:
 * an AST for the whole-match of `re`, or NULL with the builder failed. With
 * `json`, the AST matches the JSON string encoding of such texts (no raw
 * quotes, backslashes or control characters). */
cg_ast *cg_regex_ast(cg_builder *b, const char *re, size_t len, const char *where, bool json);

/* ---- Compiled grammar -------------------------------------------------------- */
typedef struct {
    uint8_t lo, hi;
    uint32_t to;
} cg_bedge;
typedef struct {
    uint32_t rule, to;
} cg_redge;
typedef struct {
    uint32_t rule;
    uint32_t be, nbe; /* byte edges */
    uint32_t re, nre; /* rule-reference edges */
    uint8_t accept;
    uint64_t first[4]; /* bytes with a byte edge */
} cg_node;

typedef struct cg_tables cg_tables;

struct lilac_grammar {
    int refs;
    pthread_mutex_t mu;
    uint32_t n_rules, n_nodes, root;
    uint32_t *rule_start;
    char **rule_names;
    cg_node *nodes;
    cg_bedge *bedges;
    cg_redge *redges;
    uint32_t *ret_off;  /* [n_rules + 1]: where each rule is called from */
    uint32_t *ret_node; /* the return node of each call site */
    cg_tables *tables;  /* token index per position, built for one vocabulary */
};

/* ---- Stack sets ---------------------------------------------------------------
 * A stack is [bottom, n1, ..., nk]: the bottom is CG_ROOT (the whole text) or
 * CG_CTX|rule (an unknown caller of `rule`, while indexing tokens); n1..nk are
 * nodes, nk the top, each below it a return node. In a state every top has
 * byte edges: a stack stands for "the next byte takes one of the top's byte
 * edges". Encoding in a word array: a header (k | CG_FLAG when the stack left
 * its starting rule into a guessed caller), the bottom, then the k nodes. */
#define CG_ROOT 0xffffffffu
#define CG_CTX 0x80000000u
#define CG_FLAG 0x80000000u

typedef struct {
    uint32_t *w;
    size_t n, cap;
    uint32_t n_stk;
    uint8_t end;      /* the text may end here (bottom CG_ROOT popped, or CG_CTX unflagged) */
    uint8_t end_flag; /* a guessed context may end here */
    uint8_t overflow; /* a limit above cut the state short: the grammar is too ambiguous here */
} cg_state;

/* Scratch for advancing (a visited set and work list). */
typedef struct {
    uint64_t *hkey;
    uint32_t *hval, *hgen;
    uint32_t hcap, gen, visits;
    uint32_t *store;
    size_t store_n, store_cap;
    uint32_t *work;
    size_t work_n, work_cap;
} cg_scratch;

void cg_state_clear(cg_state *s);
void cg_state_free(cg_state *s);
void cg_state_copy(cg_state *dst, const cg_state *src);
void cg_scratch_free(cg_scratch *x);
/* The state at the start: the closure of [bottom, start(rule)]. */
void cg_state_start(const lilac_grammar *g, cg_scratch *x, uint32_t bottom, uint32_t rule, cg_state *out);
/* out = the states after byte c; `out` must differ from `in`. */
void cg_advance(const lilac_grammar *g, cg_scratch *x, const cg_state *in, uint8_t c, cg_state *out);
/* A state of one stack (copied from `stk`, its header included). */
void cg_state_one(cg_state *s, const uint32_t *stk);
/* Nodes in a stack (k), its top, and its size in words (header, bottom, k nodes). */
static inline uint32_t cg_stk_len(const uint32_t *stk) { return stk[0] & ~CG_FLAG; }
static inline uint32_t cg_stk_top(const uint32_t *stk) { return stk[cg_stk_len(stk) + 1]; }
static inline uint32_t cg_stk_words(const uint32_t *stk) { return cg_stk_len(stk) + 2; }
uint64_t cg_state_hash(const cg_state *s);
bool cg_state_equal(const cg_state *a, const cg_state *b);

/* ---- Token tables (mask.c) --------------------------------------------------- */
void cg_tables_free(cg_tables *t, uint32_t n_nodes);
/* The mask computed from the token tables, bypassing the per-state cache
 * (benchmarks and tests). */
void cg_matcher_mask_uncached(lilac_matcher *m, uint64_t *mask);

#endif
