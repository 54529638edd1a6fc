/* fuzz_schema.c — libFuzzer target for the JSON Schema front end: the input is
 * a schema; the checks are fuzz_grammar.c's (mask against brute force, every
 * finished text parses as JSON, errors are one line). */
#define FUZZ_SCHEMA 1
#include "fuzz_grammar.c"
