/* cmd_tools.c — `lilac synth`, `lilac convert` and `lilac bench`: their options,
 * parsed here and handed to the library (model/synth.h, tools/convert.h,
 * tools/bench.h). */
#include <dirent.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/small_tokenizer.h"
#include "../model/synth.h"
#include "../tools/bench.h"
#include "../tools/convert.h"
#include "../util/common.h"
#include "commands.h"

static const char synth_help[] =
    "usage: lilac synth --out DIR [--seed S] [--layers N] [--vocab V] [--hidden H] [--experts E]\n"
    "                   [--inter I] [--router MODE] [--force] [--quiet]\n"
    "\n"
    "A random-weight checkpoint of the real Qwen3.6-35B-A3B geometry (or its first N\n"
    "layers, or a smaller vocabulary) in the mlx-community 4-bit format, deterministic by seed,\n"
    "with a small byte-level BPE tokenizer (the Qwen special tokens at the real ids when the\n"
    "vocabulary reaches them) and the official chat template, so generate --chat runs on it.\n"
    "\n"
    "  --out DIR       the checkpoint directory (created; an existing non-empty one only with --force)\n"
    "  --force         overwrite the files of an existing non-empty --out DIR\n"
    "  --quiet         no progress lines on stderr\n"
    "  --seed S        default 0\n"
    "  --layers N      1..40 (default 40); layers 4, 8, ... are full attention, the others\n"
    "                  linear; at 2 or 3 layers the last one is full attention\n"
    "  --vocab V       a positive multiple of 64 (default 248320); below 512 no tokenizer is written\n"
    "  --hidden H      hidden size, a positive multiple of 64 (default 2048)\n"
    "  --experts E     routed experts, 8..256 (default 256; the router modes other than\n"
    "                  random need all 256)\n"
    "  --inter I       routed and shared experts' width, a positive multiple of 64 (default 512)\n"
    "                  (smaller checkpoints for tests that run the whole model slowly, e.g. on\n"
    "                  the CUDA emulator; attention and linear-attention heads keep their shape)\n"
    "  --router MODE   how the routers spread tokens over the 256 experts (default random);\n"
    "                  each mode is what the 8-bit affine router format can express:\n"
    "    random  every router row random: tokens spread evenly (the default)\n"
    "    ties    every router row identical: every token's router logits tie exactly, so the\n"
    "            lowest-index rule routes every token to experts 0..7 (weight 1/8 each) and the\n"
    "            other 248 experts are empty, in every layer\n"
    "    one     expert 131 dominates: every token picks it first (its logit raised by 10; the\n"
    "            others have sd ~1); the other experts stay random\n"
    "    skew    8 hot experts (5, 63, 64, 127, 128, 200, 254, 255; logits raised by 6 down to 1)\n"
    "            take 60-80% of the picks, the 187 cold ones (index not a multiple of 4; logits\n"
    "            lowered by 8) are never picked, the other 61 stay random: at 64 tokens ~200 of\n"
    "            the 256 experts are empty\n"
    "                  one and skew raise (lower) every group bias of a hot (cold) router row and give\n"
    "                  every embedding group's bias a shared offset of +0.5 (the entries have sd 1):\n"
    "                  the router has no bias term, so the hidden states need a common direction.\n"
    "                  The layers' outputs dilute it; the shifts grow with depth to match, so the\n"
    "                  skew holds through all 40 layers (measured on the CPU reference).\n";

/* 1 when path exists and is not an empty directory. */
static int dir_nonempty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return access(path, F_OK) == 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n > 0;
}

int cmd_synth(int argc, char **argv) {
    const char *out = NULL, *router = "random";
    long seed = 0, layers = 40, vocab = 0, hidden = 0, experts = 0, inter = 0;
    bool force = false, quiet = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(synth_help, stdout);
            return 0;
        }
        if (!opt_str(argc, argv, &i, "--out", &out) && !opt_int(argc, argv, &i, "--seed", &seed) &&
            !opt_int(argc, argv, &i, "--layers", &layers) && !opt_int(argc, argv, &i, "--vocab", &vocab) &&
            !opt_int(argc, argv, &i, "--hidden", &hidden) && !opt_int(argc, argv, &i, "--experts", &experts) &&
            !opt_int(argc, argv, &i, "--inter", &inter) &&
            !opt_str(argc, argv, &i, "--router", &router) && !opt_flag(argc, argv, &i, "--force", &force) &&
            !opt_flag(argc, argv, &i, "--quiet", &quiet))
            opt_unknown("synth", argv[i]);
    }
    if (!out) lilac_die("usage: lilac synth --out DIR [--seed S] [--layers N] [--vocab V] [--router MODE] (see lilac synth --help)");
    if (!force && dir_nonempty(out)) lilac_die("synth: %s exists and is not empty; pass --force to overwrite it", out);
    const int mode = lilac_synth_router_parse(router);
    if (mode < 0) lilac_die("--router must be random, ties, one or skew (got \"%s\")", router);
    lilac_config c;
    lilac_config_real(&c);
    if (layers < 1 || layers > c.n_layers) lilac_die("--layers must be in 1..%d", c.n_layers);
    c.n_layers = (int)layers;
    lilac_synth_ensure_attention(&c);
    if (vocab) {
        if (vocab < 64 || vocab % 64) lilac_die("--vocab must be a positive multiple of 64");
        c.vocab = vocab;
    }
    if (hidden) {
        if (hidden < 64 || hidden % 64 || hidden > 2048) lilac_die("--hidden must be a positive multiple of 64, at most 2048");
        c.hidden = hidden;
    }
    if (inter) {
        if (inter < 64 || inter % 64 || inter > 512) lilac_die("--inter must be a positive multiple of 64, at most 512");
        c.moe_inter = c.shared_inter = inter;
    }
    if (experts) {
        if (experts < c.top_k || experts > c.n_experts) lilac_die("--experts must be in %d..%d", c.top_k, c.n_experts);
        if (mode != 0 && experts != c.n_experts) lilac_die("--router %s needs all %d experts", router, c.n_experts);
        c.n_experts = (int)experts;
    }
    char note[64];
    snprintf(note, sizeof note, "lilac synth --router %s", router);
    lilac_synth_opts o = {.seed = (uint64_t)seed, .shard_bytes = 5000000000ull, .router = (lilac_synth_router)mode,
                          .config_note = mode ? note : NULL, .quiet = quiet};
    lilac_err err = {{0}};
    if (lilac_synth_write(out, &c, &o, &err) < 0) lilac_die("%s", err.msg);
    int eos = 0;
    if (c.vocab >= LILAC_SMALL_TOKENIZER_MIN_VOCAB) {
        if (lilac_small_tokenizer_write(out, c.vocab, &eos, &err) < 0) lilac_die("synth: %s", err.msg);
    } else if (!quiet)
        fprintf(stderr, "synth: no tokenizer written (--vocab %ld is below the %d a byte-level tokenizer needs)\n",
                vocab, LILAC_SMALL_TOKENIZER_MIN_VOCAB);
    lilac_config_free(&c);
    return 0;
}

int cmd_convert(int argc, char **argv) {
    const char *from = NULL, *to = NULL;
    long bits = 4, group = 64, threads = 0, shard_mb = 0;
    bool no_mtp = false, mtp_only = false, quiet = false;
    for (int i = 1; i < argc; i++)
        if (!opt_str(argc, argv, &i, "--from", &from) && !opt_str(argc, argv, &i, "--to", &to) &&
            !opt_int(argc, argv, &i, "--bits", &bits) && !opt_int(argc, argv, &i, "--group-size", &group) &&
            !opt_int(argc, argv, &i, "--threads", &threads) && !opt_int(argc, argv, &i, "--shard-mb", &shard_mb) &&
            !opt_flag(argc, argv, &i, "--no-mtp", &no_mtp) &&
            !opt_flag(argc, argv, &i, "--mtp-only", &mtp_only) && !opt_flag(argc, argv, &i, "--quiet", &quiet))
            opt_unknown("convert", argv[i]);
    if (!from || !to)
        lilac_die("usage: lilac convert --from HF_DIR --to OUT_DIR [--bits 4] [--group-size 64] [--no-mtp | --mtp-only] [--threads N] [--quiet]");
    if (no_mtp && mtp_only) lilac_die("convert: --no-mtp and --mtp-only exclude each other");
    if (threads < 0 || threads > 4096) lilac_die("--threads must be in 0..4096");
    if (shard_mb < 0) lilac_die("--shard-mb must be positive");
    lilac_convert_opts o = {.bits = (int)bits, .group = (int)group, .no_mtp = no_mtp, .mtp_only = mtp_only, .quiet = quiet,
                            .threads = (int)threads, .shard_bytes = (size_t)shard_mb << 20};
    lilac_err err = {{0}};
    if (lilac_convert(from, to, &o, &err) < 0) lilac_die("%s", err.msg);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    lilac_bench_opts o = {.prompt_lens = "256,512,1024,2048,4096", .decode_steps = 64, .rounds = 3};
    for (int i = 1; i < argc; i++)
        if (!opt_str(argc, argv, &i, "--model", &o.model) && !opt_str(argc, argv, &i, "--backend", &o.backend) &&
            !opt_str(argc, argv, &i, "--prompt-lens", &o.prompt_lens) && !opt_str(argc, argv, &i, "--json", &o.json) &&
            !opt_int(argc, argv, &i, "--decode-steps", &o.decode_steps) && !opt_int(argc, argv, &i, "--rounds", &o.rounds) &&
            !opt_int(argc, argv, &i, "--threads", &o.threads))
            opt_unknown("bench", argv[i]);
    if (!o.model) o.model = getenv("LILAC_MODEL");
    if (!o.model) lilac_die("usage: lilac bench --model DIR [--prompt-lens 256,512,...] [--decode-steps 64] [--rounds 3] [--json F]");
    return lilac_bench(&o);
}
