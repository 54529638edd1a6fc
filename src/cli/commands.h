/* commands.h — every `lilac <command>` entry point, and the small option
 * parser they share. Each command lives in its own cmd_*.c file. */
#ifndef LILAC_COMMANDS_H
#define LILAC_COMMANDS_H

#include <stdbool.h>
#include <stdint.h>

#include "../util/common.h" /* lilac_err */

/* Returns the process exit code. argv[0] is the command name. */
int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_render(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_convert(int argc, char **argv);

/* `lilac <cmd> --help` text (help.c); NULL for a command that prints its own. */
const char *cli_help(const char *cmd);

/* Option parsing: at argv[*i], if the word is `name` (or one of its aliases,
 * opt_alias), consume its value (--name V or --name=V) into *out and return
 * true. Dies on a missing value. */
bool opt_str(int argc, char **argv, int *i, const char *name, const char **out);
bool opt_int(int argc, char **argv, int *i, const char *name, long *out);
/* The same, dying with the range unless the value is an integer in lo..hi (a
 * number in lo..hi for opt_real): flags are checked before any cast. */
bool opt_range(int argc, char **argv, int *i, const char *name, long lo, long hi, long *out);
bool opt_real(int argc, char **argv, int *i, const char *name, double lo, double hi, double *out);
/* Most threads any command accepts (--threads). */
#define OPT_MAX_THREADS 1024
bool opt_flag(int argc, char **argv, int *i, const char *name, bool *out);
/* The k-th alias of a flag (llama.cpp's or vLLM's spelling: "-m" for
 * "--model"), NULL past the last. */
const char *opt_alias(const char *name, int k);
/* --attn-precision's value (NULL: the default): f32 -> 0, bf16 -> 1; anything else, or bf16 where the
 * backend has no such choice (set_attn_bf16 NULL), -1 + err naming the command. */
int opt_attn_bf16(const char *cmd, const char *value, bool backend_can, lilac_err *err);
/* Dies with "unknown option" naming the command. */
_Noreturn void opt_unknown(const char *cmd, const char *word);

#endif
