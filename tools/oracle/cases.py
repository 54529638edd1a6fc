"""Oracle test cases: every parameter of every generated checkpoint lives here.

A case is a text_config geometry (the keys of Qwen3.6-35B-A3B's text_config,
see shared/spec/model.md §1.1) plus generation parameters: the seed, the number
T of teacher-forced token ids, the greedy prompt length P, the number of greedy
tokens, whether to write the HF bf16 twin, and the init gains.

Fixtures are cached under tests/fixtures/gen/<case>-<hash>/, the hash covering
this file, make_case.py, the case dict and the mlx / mlx-lm versions.
"""

import copy

# Scales of the random init (make_case.py: init_param). Matrices are
# N(0, 1/fan_in) * gain; norm gains 1 + norm_noise * N(0,1).
DEFAULT_INIT = {
    "embed_std": 1.0,
    "lm_head_gain": 3.0,  # logit std per row ~ 3
    "linear_gain": 1.0,  # attention / GDN / expert projections
    "router_gain": 2.0,  # router logits std ~ 2: top-k well separated
    "shared_gate_gain": 1.0,
    "norm_noise": 0.1,  # RMSNorm gains 1 + 0.1 N(0,1), zero-centred twin: 0.1 N(0,1)
    "gated_norm_noise": 0.1,
    "conv_std": 0.5,
    "A_range": [1.0, 16.0],  # A_log = log(U(A_range))
    # dt_bias ~ U(dt_bias_range). Negative values give slow decays (alpha up
    # to ~0.98), so the GDN state carries information over tens of tokens and
    # the 300-token sequences test the recurrence, not just the last few steps.
    "dt_bias_range": [-4.0, 0.5],
    "in_proj_a_gain": 0.5,
}

_TINY_TEXT = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "vocab_size": 512,
    "rope_theta": 10000000,
    "partial_rotary_factor": 0.25,
    "mrope_section": [3, 3, 2],  # sums to rotary_dim/2 = 8
}

_REAL_LAYER_TEXT = {
    "hidden_size": 2048,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "vocab_size": 2048,
    "rope_theta": 10000000,
    "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10],
}

CASES = {
    # (a) every structural feature at a tiny size; (c) T >= 300 + greedy
    # continuation of the whole prefilled sequence; (d) HF bf16 twin.
    "tiny": {
        "text": _TINY_TEXT,
        "seed": 1234,
        "T": 320,
        "P": 320,
        "n_greedy": 64,
        "hf_twin": True,
        "init": DEFAULT_INIT,
    },
    # (b) one [lin, lin, lin, full] block at the real per-layer dimensions,
    # reduced vocab. No HF twin by default (make_case.py --hf adds it).
    "real_layer": {
        "text": _REAL_LAYER_TEXT,
        "seed": 4321,
        "T": 300,
        "P": 300,
        "n_greedy": 64,
        "hf_twin": False,
        "init": DEFAULT_INIT,
    },
}


def get_case(name, hf_twin=None):
    """The parameter dict of a case; hf_twin=True/False overrides the default."""
    if name not in CASES:
        raise KeyError(f"unknown oracle case {name!r}; known: {sorted(CASES)}")
    c = copy.deepcopy(CASES[name])
    c["name"] = name
    if hf_twin is not None:
        c["hf_twin"] = bool(hf_twin)
    return c
