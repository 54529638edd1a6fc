/* cmd_render.c — `lilac render`: the Qwen3.6 chat template, printed exactly
 * (or, with --ids, tokenised the safe way). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../chat/chat.h"
#include "../util/common.h"
#include "commands.h"

static char *read_all(const char *path, size_t *len) {
    lilac_err err = {{0}};
    if (strcmp(path, "-")) {
        char *b = lilac_read_file(path, len, &err);
        if (!b) lilac_die("render: %s", err.msg);
        return b;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = xmalloc(cap);
    size_t r;
    while ((r = fread(b + n, 1, cap - n - 1, stdin)) > 0)
        if ((n += r) + 1 >= cap) b = xrealloc(b, cap *= 2);
    b[n] = 0;
    *len = n;
    return b;
}

int cmd_render(int argc, char **argv) {
    const char *model = NULL, *messages = NULL, *tools = NULL, *tok = NULL;
    bool no_thinking = false, preserve = false, no_gen = false, vision_id = false, ids = false, special = false;
    for (int i = 1; i < argc; i++)
        if (!opt_str(argc, argv, &i, "--model", &model) && !opt_str(argc, argv, &i, "--messages", &messages) &&
            !opt_str(argc, argv, &i, "--tools", &tools) && !opt_str(argc, argv, &i, "--tokenizer", &tok) &&
            !opt_flag(argc, argv, &i, "--no-thinking", &no_thinking) &&
            !opt_flag(argc, argv, &i, "--preserve-thinking", &preserve) &&
            !opt_flag(argc, argv, &i, "--no-generation-prompt", &no_gen) &&
            !opt_flag(argc, argv, &i, "--add-vision-id", &vision_id) && !opt_flag(argc, argv, &i, "--ids", &ids) &&
            !opt_flag(argc, argv, &i, "--special-in-content", &special))
            opt_unknown("render", argv[i]);
    if (!messages) lilac_die("render: pass --messages FILE.json (a JSON list of messages; - for stdin)");
    if (!model) model = getenv("LILAC_MODEL");
    lilac_err warn = {{0}};
    if (!model)
        fprintf(stderr, "lilac: render: no --model DIR: using the built-in Qwen3.6 template unchecked\n");
    else if (lilac_chat_check_template(model, &warn))
        fprintf(stderr, "lilac: warning: %s\n", warn.msg);

    lilac_chat_opts o;
    lilac_chat_opts_default(&o);
    o.enable_thinking = !no_thinking;
    o.preserve_thinking = preserve;
    o.add_generation_prompt = !no_gen;
    o.add_vision_id = vision_id;

    size_t mlen, tlen = 0;
    char *mtext = read_all(messages, &mlen);
    char *ttext = tools ? read_all(tools, &tlen) : NULL;
    lilac_prompt p;
    lilac_err err = {{0}};
    if (lilac_chat_render_json(mtext, mlen, ttext, tlen, &o, &p, &err)) lilac_die("render: %s", err.msg);
    if (!ids) {
        fwrite(p.text, 1, p.len, stdout);
    } else {
        const char *path = tok ? tok : model;
        if (!path) lilac_die("render --ids: pass --tokenizer PATH or --model DIR");
        lilac_tokenizer *t = lilac_tok_load(path, &err);
        if (!t) lilac_die("%s", err.msg);
        lilac_ids v = {0};
        if (lilac_prompt_encode(t, &p, special, &v, &err)) lilac_die("render: %s", err.msg);
        for (size_t i = 0; i < v.n; i++) printf(i ? " %d" : "%d", (int)v.ids[i]);
        putchar('\n');
        lilac_ids_free(&v);
        lilac_tok_free(t);
    }
    lilac_prompt_free(&p);
    free(mtext);
    free(ttext);
    return 0;
}
