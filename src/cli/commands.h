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

/* Option parsing: at argv[*i], if the word is `name`, consume its value
 * (--name V or --name=V) into *out and return true. Dies on a missing value. */
bool opt_str(int argc, char **argv, int *i, const char *name, const char **out);
bool opt_int(int argc, char **argv, int *i, const char *name, long *out);
bool opt_flag(int argc, char **argv, int *i, const char *name, bool *out);
/* --attn-precision's value (NULL: the default): f32 -> 0, bf16 -> 1; anything else, or bf16 where the
 * backend has no such choice (set_attn_bf16 NULL), -1 + err naming the command. */
int opt_attn_bf16(const char *cmd, const char *value, bool backend_can, lilac_err *err);
/* Dies with "unknown option" naming the command. */
_Noreturn void opt_unknown(const char *cmd, const char *word);

#endif
