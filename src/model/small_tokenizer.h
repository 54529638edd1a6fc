/* small_tokenizer.h — a small byte-level BPE tokenizer in the Qwen format, trained
 * on a built-in English and code corpus, with the Qwen special tokens and the
 * official chat template: what `lilac demo` and `lilac synth` put beside their
 * random weights so that generate, chat and serve run on them. */
#ifndef LILAC_SMALL_TOKENIZER_H
#define LILAC_SMALL_TOKENIZER_H

#include "../util/common.h"

/* 256 bytes + the 26 special tokens + some merges. */
#define LILAC_SMALL_TOKENIZER_MIN_VOCAB 512
/* At most this many trained tokens (bytes, merges and the specials that follow them). */
#define LILAC_SMALL_TOKENIZER_MAX_TRAINED 1024
/* <|endoftext|> in the real model; the other specials follow it in Qwen's order. */
#define LILAC_QWEN_ENDOFTEXT 248044

/* Writes DIR/tokenizer.json, tokenizer_config.json, generation_config.json and
 * chat_template.jinja for a model of `vocab` ids; *eos_out gets <|endoftext|>'s id.
 * The specials sit right after the trained tokens, or at the real model's ids
 * (248044...) when vocab reaches them. */
int lilac_small_tokenizer_write(const char *dir, int64_t vocab, int *eos_out, lilac_err *err);

#endif
