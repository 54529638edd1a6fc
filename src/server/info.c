/* info.c — see info.h. */
#include "info.h"

#include <string.h>
#include <sys/stat.h>

#include "../chat/chat.h"

#ifdef __clang__
#define COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define COMPILER "gcc " __VERSION__
#else
#define COMPILER "unknown"
#endif

void info_version(sbuf *b) {
    sb_puts(b, "{\"version\":\"" LILAC_VERSION "\",\"build_info\":");
    sb_json_str(b, "lilac " LILAC_VERSION, strlen("lilac " LILAC_VERSION));
    sb_puts(b, ",\"compiler\":");
    sb_json_str(b, COMPILER, strlen(COMPILER));
    sb_puts(b, "}");
}

void info_props(sbuf *b, const srv_options *o, const srv_backend *bk, int n_slots) {
    const lilac_sampling *d = &bk->defaults;
    sb_puts(b, "{\"model_path\":");
    sb_json_str(b, bk->model_dir ? bk->model_dir : "", bk->model_dir ? strlen(bk->model_dir) : 0);
    sb_puts(b, ",\"model_alias\":");
    sb_json_str(b, o->alias, strlen(o->alias));
    sb_printf(b, ",\"n_ctx\":%lld,\"n_ctx_train\":%lld,\"n_vocab\":%lld,\"total_slots\":%d", (long long)bk->max_seq,
              (long long)bk->model->cfg.max_pos, (long long)bk->model->cfg.vocab, n_slots);
    sb_puts(b, ",\"default_generation_settings\":{\"n_ctx\":");
    sb_printf(b, "%lld,\"params\":{\"temperature\":", (long long)bk->max_seq);
    sb_json_num(b, d->temperature);
    sb_puts(b, ",\"top_p\":");
    sb_json_num(b, d->top_p);
    sb_printf(b, ",\"top_k\":%d,\"min_p\":", d->top_k);
    sb_json_num(b, d->min_p);
    sb_puts(b, ",\"repeat_penalty\":");
    sb_json_num(b, d->repetition_penalty);
    sb_puts(b, ",\"presence_penalty\":");
    sb_json_num(b, d->presence_penalty);
    sb_puts(b, "}}");
    /* the template is rendered in C (src/chat/); the model directory's own file is compared with the official one */
    lilac_err warn = {{0}};
    int official = bk->model_dir ? lilac_chat_check_template(bk->model_dir, &warn) : 1;
    char path[4200];
    struct stat sst;
    snprintf(path, sizeof path, "%s/chat_template.jinja", bk->model_dir ? bk->model_dir : ".");
    bool file = bk->model_dir && stat(path, &sst) == 0;
    sb_printf(b, ",\"chat_template\":{\"renderer\":\"built-in Qwen3.6 (C)\",\"file\":%s,\"official\":%s}",
              file ? "true" : "false", official == 0 ? "true" : "false");
    sb_puts(b, ",\"modalities\":{\"vision\":false,\"audio\":false},\"build_info\":");
    sb_json_str(b, "lilac " LILAC_VERSION, strlen("lilac " LILAC_VERSION));
    sb_puts(b, ",\"version\":\"" LILAC_VERSION "\"}");
}
