/* fuzz_config.c — libFuzzer target for lilac_config_parse on arbitrary bytes.
 * On success the parsed config's invariants are checked, the quantization
 * lookup and the diff against the real model are exercised, and everything is
 * freed. Any crash, leak, UB or broken invariant aborts. */
#include <stdio.h>
#include <stdlib.h>

#include "model/config.h"

#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s\n", #c); abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lilac_config c;
    lilac_err err;
    err.msg[0] = 0;
    if (lilac_config_parse(&c, (const char *)data, size, "fuzz/config.json", &err) != 0) {
        REQUIRE(err.msg[0] != 0 && strchr(err.msg, '\n') == NULL);
        REQUIRE(c.overrides == NULL && c.n_overrides == 0);
        return 0;
    }
    REQUIRE(c.n_layers >= 1 && c.n_layers <= LILAC_MAX_LAYERS);
    REQUIRE(c.hidden > 0 && c.vocab > 0 && c.head_dim > 0 && c.n_heads > 0 && c.n_kv_heads > 0);
    REQUIRE(c.n_heads % c.n_kv_heads == 0 && c.lin_v_heads % c.lin_k_heads == 0);
    REQUIRE(c.top_k >= 1 && c.top_k <= c.n_experts);
    REQUIRE(c.rotary_dim >= 2 && c.rotary_dim % 2 == 0 && c.rotary_dim <= c.head_dim);
    REQUIRE(c.rms_eps > 0 && c.rope_theta > 0 && c.max_pos > 0);
    REQUIRE(cfg_conv_dim(&c) > 0);
    REQUIRE(c.quantized || c.n_overrides == 0);
    for (int i = 0; i < c.n_overrides; i++) {
        int b = -1, g = -1;
        lilac_config_quant_for(&c, c.overrides[i].module, &b, &g);
        REQUIRE(b == c.overrides[i].bits && g == c.overrides[i].group_size);
    }
    int b = -1, g = -1;
    lilac_config_quant_for(&c, "language_model.model.layers.0.mlp.gate", &b, &g);
    lilac_config_quant_for(&c, NULL, &b, &g);
    REQUIRE(b == c.q_bits && g == c.q_group);
    REQUIRE(lilac_config_diff_real(&c, NULL) >= 0);
    lilac_config_free(&c);
    return 0;
}
