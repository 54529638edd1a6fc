/* demo_model.h — the `lilac demo` model: a small random-weight checkpoint of
 * the Qwen3.6-35B-A3B architecture (every structural feature: Gated DeltaNet
 * and gated-attention layers, routed + shared experts) in the real
 * mlx-community 4-bit format, with a small byte-level BPE tokenizer.json
 * (vocabulary trained on an embedded text; the Qwen special tokens as added
 * tokens), tokenizer_config.json, generation_config.json and the official
 * chat_template.jinja. Its text is gibberish: it exists so the whole API can
 * be tried and tested offline without the 19 GB download. */
#ifndef LILAC_DEMO_MODEL_H
#define LILAC_DEMO_MODEL_H

#include <stddef.h>

#include "../util/common.h"

#define LILAC_DEMO_VERSION 2
#define LILAC_DEMO_VOCAB 1024

/* The cache directory: $XDG_CACHE_HOME/lilac/demo-vN or ~/.cache/lilac/demo-vN. */
int lilac_demo_dir(char *out, size_t n, lilac_err *err);
/* Build the model into `dir` unless it is there already (atomic: built in a
 * temporary directory, then renamed). 0, or -1 + err. */
int lilac_demo_ensure(const char *dir, lilac_err *err);
/* Build into `dir` (created; files overwritten). */
int lilac_demo_build(const char *dir, lilac_err *err);

#endif
