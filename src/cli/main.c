/* main.c — `lilac <command> [options]`: dispatch to the cmd_*.c files. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "../util/common.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} command;

static const command commands[] = {
    {"info", cmd_info, "info --model DIR                     format, geometry, bytes per component"},
    {"logits", cmd_logits, "logits --model DIR --ids 1,2,3 --out F.npy [--routes R.npy] [--mtp M.npy]   teacher-forced logits [T,vocab] f32 (and experts picked)"},
    {"generate", cmd_generate, "generate --model DIR (--ids 1,2,3 | --prompt TEXT [--chat]) --max-tokens N   greedy"},
    {"synth", cmd_synth, "synth --out DIR [--seed S] [--layers N] [--vocab V] [--router random|ties|one|skew]   random full-geometry 4-bit checkpoint (--help)"},
    {"bench", cmd_bench, "bench --model DIR [--prompt-lens 256,...] [--decode-steps 64] [--rounds 3] [--json F]"},
    {"tokenize", cmd_tokenize, "tokenize --tokenizer PATH|--model DIR [--file F] [--special] [--jsonl]   ids of UTF-8 text"},
    {"detokenize", cmd_detokenize, "detokenize --tokenizer PATH|--model DIR [--ids 1,2,3|--file F] [--skip-special]   text of ids"},
    {"render", cmd_render, "render --model DIR --messages F.json [--tools F.json] [--no-thinking] [--preserve-thinking] [--ids]   chat prompt"},
    {"serve", cmd_serve, "serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key K] [--max-seq N] [--parallel N] [--log-level info]   OpenAI-compatible server"},
    {"demo", cmd_demo, "demo [--rebuild] [--build-only] [serve options]   build (once) a small random model and serve it"},
    {"chat", cmd_chat, "chat --model DIR [--no-think] [--system S] [--max-tokens N]   interactive terminal chat"},
    {"convert", cmd_convert, "convert --from HF_DIR --to OUT_DIR [--bits 4] [--group-size 64] [--no-mtp | --mtp-only] [--threads N]   official bf16 -> MLX 4-bit"},
};

static void usage(FILE *f) {
    fprintf(f, "lilac — an inference engine for Qwen3.6-35B-A3B\n\nusage: lilac <command> [options]\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) fprintf(f, "  lilac %s\n", commands[i].usage);
    fprintf(f, "\ncommon options: --backend cpu|cuda   --threads N (default: all cores)\n"
               "               --quantize (an HF bf16 checkpoint is quantized at load, as `lilac convert` would)\n"
               "`lilac <command> --help` lists every flag of a command; `lilac --version` the version.\n");
}

static int version(void) {
    printf("lilac %s\n", LILAC_VERSION);
#ifdef LILAC_CUDA
    printf("backends: cpu, cuda\n");
#else
    printf("backends: cpu\n");
#endif
    printf("libmicrohttpd %s, built with %s\n", MHD_get_version(),
#ifdef __clang__
           "clang " __clang_version__
#else
           "gcc " __VERSION__
#endif
    );
    return 0;
}

/* `--help` or `-h` among a command's words: its help, and nothing else done. */
static bool wants_help(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        if (argc >= 3 && strcmp(argv[1], "--help") && strcmp(argv[1], "-h")) { /* lilac help CMD */
            const char *h = cli_help(argv[2]);
            if (h) {
                fputs(h, stdout);
                return 0;
            }
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
                char *av[] = {argv[2], (char *)"--help", NULL};
                if (!strcmp(argv[2], commands[i].name)) return commands[i].run(2, av);
            }
        }
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) return version();
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            const char *h = wants_help(argc, argv) ? cli_help(argv[1]) : NULL;
            if (h) {
                fputs(h, stdout);
                return 0;
            }
            return commands[i].run(argc - 1, argv + 1);
        }
    fprintf(stderr, "lilac: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
