/* help.c — `lilac <command> --help`: every flag each command takes, with its
 * default and its llama.cpp / vLLM spellings. Printing help has no other effect. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

#define MODEL_FLAGS                                                                                        \
    "  --model DIR, -m DIR       the checkpoint directory (default: $LILAC_MODEL)\n"                       \
    "  --backend cpu|cuda|auto   compute backend (default auto: cuda where a usable GPU is, else cpu)\n"   \
    "  --threads N, -t N         CPU threads, 1..1024 (default: all cores)\n"                              \
    "  --attn-precision P        f32|bf16: the CUDA prefill attention f32-faithful, or on bf16 operands as\n"  \
    "                            FlashAttention, faster at long prompts (default f32)\n"

#define ENGINE_FLAGS                                                                                                 \
    MODEL_FLAGS                                                                                                      \
    "  --max-seq N               context length per slot, 1..the model's max_position_embeddings (default: the\n"   \
    "                            model's, unless the KV/state memory of all slots does not fit: then the most\n"    \
    "                            that fits, said at start-up); also -c N, --ctx-size N, --max-model-len N\n"        \
    "  --parallel N              sequence slots served at once, 1..64 (default 1); also -np N, --max-num-seqs N\n"  \
    "  --queue N                 requests waiting beyond the slots before 503, 1..2^20 (default 64)\n"             \
    "  --prefill-chunk N         prompt tokens per engine step, 1..2^20 (default 128)\n"                          \
    "  --cache-mb MB             prefix-cache snapshot memory, MiB (default 2048; 0: no snapshots)\n"              \
    "  --snapshot-every N        snapshot boundary in prompt tokens (default 256; 0: prompt and turn ends only)\n"

#define SERVE_FLAGS                                                                                                       \
    ENGINE_FLAGS                                                                                                          \
    "  --host ADDR               address or name to listen on: IPv4, IPv6 (::1 or [::1]; :: also takes IPv4),\n"        \
    "                            or a name such as localhost (default 127.0.0.1)\n"                                     \
    "  --port N                  0..65535 (default 8000; 0: any free port, printed)\n"                                 \
    "  --api-key K1,K2           required Bearer / x-api-key keys (default: $LILAC_API_KEY, else none)\n"             \
    "  --metrics-public          /metrics without the API key (default: the key is required when one is set)\n"       \
    "  --cors-origin ORIGIN|*    answer CORS for this origin (default: no CORS headers)\n"                            \
    "  --allowed-hosts H1,H2|*   accepted Host headers (default: loopback names when bound to loopback, else any)\n" \
    "  --alias NAME              model id in /v1/models and replies (default qwen3.6-35b-a3b);\n"                     \
    "                            also --served-model-name NAME\n"                                                     \
    "  --strict-model            404 for a request naming another model (default: any name accepted)\n"              \
    "  --reasoning-field F       reasoning_content|reasoning|both (default reasoning_content)\n"                     \
    "  --max-body BYTES          request body limit, 1024..2^30 (default 33554432)\n"                                \
    "  --max-json-values N       JSON values in one body, 1024..2^30 (default 1048576)\n"                             \
    "  --max-tokenize N          tokens /tokenize answers with, 1..2^30 (default: the context length)\n"            \
    "  --timeout S               idle connection timeout, 1..86400 (default 60)\n"                                   \
    "  --header-timeout S        headers deadline, 1..3600 (default 10)\n"                                           \
    "  --body-timeout S          body deadline, 1..86400 (default 60)\n"                                             \
    "  --ping S                  SSE keepalive while waiting, 0..3600 (default 5; 0: off)\n"                         \
    "  --max-conns N             connections in all, 1..2^20 (default 1024)\n"                                       \
    "  --max-conns-per-client N  connections from one address, 1..2^20 (default 128)\n"                             \
    "  --log-level L             error|warn|info|debug (default info: one line per request)\n"                       \
    "  --log-prompts             also log each request's body (default: never any prompt text)\n"                    \
    "  --quiet                   --log-level error\n"                                                                \
    "  --no-disconnect-check     do not probe the client socket while a request waits (default: probe)\n"           \
    "  --test-hooks              honour \"lilac_forced_output\" in requests (tests only; default off)\n"             \
    "  --help, -h                this text\n"

typedef struct {
    const char *name, *text;
} help_entry;

static const help_entry HELP[] = {
    {"info", "usage: lilac info --model DIR\n\nFormat, geometry and bytes per component of a checkpoint.\n\n" MODEL_FLAGS
             "  --quantize                quantize an HF bf16 checkpoint at load, as `lilac convert` would (default off)\n"
             "  --help, -h                this text\n"},
    {"logits", "usage: lilac logits --model DIR --ids 1,2,3 --out F.npy [--routes R.npy] [--mtp M.npy [--drafts K]]\n\n"
               "Teacher-forced logits [T, vocab] (f32 .npy) of the ids.\n\n" MODEL_FLAGS
               "  --quantize                quantize an HF bf16 checkpoint at load (default off)\n"
               "  --ids 1,2,3               the token ids (required)\n"
               "  --out F.npy               where the logits go (required)\n"
               "  --routes R.npy            also the experts each layer picked, [layers, T, top_k] int32 (default: not written)\n"
               "  --mtp M.npy               also the MTP head's logits [T + K - 1, vocab]: the shifted pass over the ids\n"
               "                            (the last row's token: the greedy next token), then K-1 chained drafts\n"
               "                            (default: not written)\n"
               "  --drafts K                1..64 (default 1)\n"
               "  --help, -h                this text\n"},
    {"generate", "usage: lilac generate --model DIR (--ids 1,2,3 | --prompt TEXT [--chat [--no-thinking]]) [--max-tokens N]\n\n"
                 "Greedy generation: ids in, ids out; or text in, text out.\n\n" MODEL_FLAGS
                 "  --quantize                quantize an HF bf16 checkpoint at load (default off)\n"
                 "  --ids 1,2,3               the prompt as token ids\n"
                 "  --prompt TEXT             the prompt as text (special tokens parsed)\n"
                 "  --chat                    TEXT as a user message through the chat template (default off)\n"
                 "  --no-thinking             with --chat: thinking off (also --no-think)\n"
                 "  --max-tokens N            tokens to generate, 0..2^24 (default 64)\n"
                 "  --ignore-eos              go on past end-of-sequence (default: stop there)\n"
                 "  --timing                  prefill and decode speed on stderr (default off)\n"
                 "  --help, -h                this text\n"},
    {"bench", "usage: lilac bench --model DIR [--prompt-lens 256,...] [--decode-steps 64] [--rounds 3] [--json F]\n\n"
              "Prefill and decode speed at each prompt length.\n\n"
              "  --model DIR               the checkpoint directory (required)\n"
              "  --backend cpu|cuda|auto   compute backend (default auto)\n"
              "  --threads N               CPU threads (default: all cores)\n"
              "  --prompt-lens L1,L2,...   prompt lengths (default 256,512,1024,2048,4096)\n"
              "  --decode-steps N          decoded tokens per round (default 64)\n"
              "  --rounds N                rounds per length; the best counts (default 3)\n"
              "  --json F                  also write the rows as JSON to F (default: not written)\n"
              "  --help, -h                this text\n"},
    {"tokenize", "usage: lilac tokenize --tokenizer PATH|--model DIR [--file F] [--special] [--jsonl]\n\n"
                 "Token ids of UTF-8 text (stdin, or --file).\n\n"
                 "  --tokenizer PATH          tokenizer.json, or a directory holding it\n"
                 "  --model DIR, -m DIR       take the tokenizer from the model (default: $LILAC_MODEL)\n"
                 "  --file F                  read F (default: stdin)\n"
                 "  --special                 parse special tokens in the text (default: plain text)\n"
                 "  --jsonl                   each input line a JSON string; one line of ids each (default off)\n"
                 "  --time                    load and encode time on stderr (default off)\n"
                 "  --help, -h                this text\n"},
    {"detokenize", "usage: lilac detokenize --tokenizer PATH|--model DIR [--ids 1,2,3|--file F] [--skip-special]\n\n"
                   "Text of token ids.\n\n"
                   "  --tokenizer PATH          tokenizer.json, or a directory holding it\n"
                   "  --model DIR, -m DIR       take the tokenizer from the model (default: $LILAC_MODEL)\n"
                   "  --ids 1,2,3               the ids (default: read from --file or stdin)\n"
                   "  --file F                  read ids from F (default: stdin)\n"
                   "  --skip-special            leave special tokens out (default: kept)\n"
                   "  --jsonl                   each input line a list of ids; one JSON string each (default off)\n"
                   "  --help, -h                this text\n"},
    {"render", "usage: lilac render --model DIR --messages F.json [--tools F.json] [--no-thinking] [--ids]\n\n"
               "The chat prompt the Qwen3.6 template makes of a JSON list of messages.\n\n"
               "  --model DIR, -m DIR       check the model's template and take its tokenizer (default: $LILAC_MODEL;\n"
               "                            none: the built-in template, unchecked)\n"
               "  --messages F.json         the messages (required; - for stdin)\n"
               "  --tools F.json            tool definitions (default: none)\n"
               "  --tokenizer PATH          tokenizer for --ids (default: the model's)\n"
               "  --no-thinking             enable_thinking=false (also --no-think)\n"
               "  --preserve-thinking       keep earlier turns' reasoning (default off)\n"
               "  --no-generation-prompt    leave out the assistant turn's opening (default: added)\n"
               "  --add-vision-id           number images and videos (default off)\n"
               "  --ids                     print token ids instead of text (default off)\n"
               "  --special-in-content      with --ids: parse special tokens inside message content (default off)\n"
               "  --help, -h                this text\n"},
    {"serve", "usage: lilac serve --model DIR [options]\n\n"
              "The OpenAI-compatible HTTP server (docs/server.md).\n\n" SERVE_FLAGS},
    {"demo", "usage: lilac demo [--rebuild] [--build-only] [--out DIR] [serve options]\n\n"
             "Build (once, into $XDG_CACHE_HOME/lilac) a small random-weight model and serve it.\n\n"
             "  --rebuild                 build the model again (default: reuse the cached one)\n"
             "  --build-only              build, print its directory, do not serve (default: serve)\n"
             "  --out DIR                 build into DIR (always rebuilt; default: the cache)\n"
             "and every `lilac serve` option but --model:\n" SERVE_FLAGS},
    {"chat", "usage: lilac chat --model DIR [options]\n\n"
             "An interactive terminal chat: line editing and history, /help for the commands.\n\n" ENGINE_FLAGS
             "  --system TEXT             a system message (default: none)\n"
             "  --max-tokens N            tokens per reply, 1..2^30 (default 4096)\n"
             "  --temperature T           0..100 (default: the model's generation_config.json)\n"
             "  --no-think                thinking off (also --no-thinking; /think and /nothink switch it)\n"
             "  --help, -h                this text\n"},
    {"convert", "usage: lilac convert --from HF_DIR --to OUT_DIR [--bits 4] [--group-size 64]\n\n"
                "The official bf16 checkpoint to the mlx-community affine format.\n\n"
                "  --from HF_DIR             the bf16 checkpoint (required)\n"
                "  --to OUT_DIR              the output directory, new (required)\n"
                "  --bits N                  2, 4 or 8 (default 4)\n"
                "  --group-size N            32, 64 or 128 (default 64)\n"
                "  --threads N               0..4096 (default 0: all cores)\n"
                "  --shard-mb MB             output shard size (default 0: the converter's own)\n"
                "  --no-mtp                  drop the multi-token-prediction head (default: kept, quantized,\n"
                "                            in OUT_DIR/mtp.safetensors outside the index)\n"
                "  --mtp-only                write only OUT_DIR/mtp.safetensors into an existing checkpoint of\n"
                "                            the same model (e.g. an mlx-community download)\n"
                "  --quiet                   no progress lines (default off)\n"
                "  --help, -h                this text\n"},
};

const char *cli_help(const char *cmd) {
    for (size_t i = 0; i < sizeof HELP / sizeof HELP[0]; i++)
        if (!strcmp(HELP[i].name, cmd)) return HELP[i].text;
    return NULL;
}
