#!/usr/bin/env python3
"""Random checkpoints in the official Qwen3.6-35B-A3B bf16 layout (spec §2.1), for
`lilac convert` tests and its benchmark.

Layout: ``model.language_model.*`` names, fused ``mlp.experts.gate_up_proj [E,2I,H]`` and
``mlp.experts.down_proj [E,H,I]`` (no ``.weight``), conv1d ``[C,1,K]``, zero-centred norms,
top-level ``lm_head.weight``, a vision and an MTP tensor to be skipped, shards + index,
config.json as transformers writes it (``rope_parameters.rope_type``), generation_config.json
and small tokenizer/template files to be copied. Values: N(0, 1/fan_in)·gain rounded to bf16,
not on any quantization grid. Tensors are generated and written one at a time (bounded
memory at any size).

Usage: make_hf.py OUT_DIR [--geometry tiny|real] [--layers N] [--seed S] [--shard-gb G]
"""
import argparse
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

TINY = dict(hidden_size=128, num_hidden_layers=4, full_attention_interval=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4, num_experts=16,
            num_experts_per_tok=4, moe_intermediate_size=64, shared_expert_intermediate_size=64,
            vocab_size=512, mrope_section=[3, 3, 2])
REAL = dict(hidden_size=2048, num_hidden_layers=40, full_attention_interval=4, num_attention_heads=16,
            num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
            linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=256,
            num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
            vocab_size=248320, mrope_section=[11, 11, 10])


def bf16_bits(x):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def config(g):
    lt = ["full_attention" if (i + 1) % g["full_attention_interval"] == 0 else "linear_attention"
          for i in range(g["num_hidden_layers"])]
    tc = {k: v for k, v in g.items() if k != "mrope_section"}
    tc.update({
        "model_type": "qwen3_5_moe_text", "attention_bias": False, "attn_output_gate": True, "dtype": "bfloat16",
        "eos_token_id": 248044, "hidden_act": "silu", "initializer_range": 0.02, "layer_types": lt,
        "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144, "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False, "output_router_logits": False, "pad_token_id": None,
        "rms_norm_eps": 1e-06, "router_aux_loss_coef": 0.001, "use_cache": True,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": list(g["mrope_section"]),
                            "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    })
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "image_token_id": 248056,
            "model_type": "qwen3_5_moe", "text_config": tc, "tie_word_embeddings": False,
            "transformers_version": "4.57.1", "video_token_id": 248057,
            "vision_config": {"depth": 1, "hidden_size": 64, "model_type": "qwen3_5_moe", "num_heads": 2},
            "vision_end_token_id": 248054, "vision_start_token_id": 248053}


def tensor_specs(g, extras=True):
    """(name, shape, kind) in the official checkpoint's order."""
    H, V, E = g["hidden_size"], g["vocab_size"], g["num_experts"]
    I, SI = g["moe_intermediate_size"], g["shared_expert_intermediate_size"]
    KD = g["linear_num_key_heads"] * g["linear_key_head_dim"]
    VD = g["linear_num_value_heads"] * g["linear_value_head_dim"]
    CD, Hv, hd, K = 2 * KD + VD, g["linear_num_value_heads"], g["head_dim"], g["linear_conv_kernel_dim"]
    P = "model.language_model."
    s = [(P + "embed_tokens.weight", (V, H), "embed")]
    for l in range(g["num_hidden_layers"]):
        p = f"{P}layers.{l}."
        s += [(p + "input_layernorm.weight", (H,), "norm"), (p + "post_attention_layernorm.weight", (H,), "norm")]
        if (l + 1) % g["full_attention_interval"]:
            a = p + "linear_attn."
            s += [(a + "in_proj_qkv.weight", (CD, H), "mat"), (a + "in_proj_z.weight", (VD, H), "mat"),
                  (a + "in_proj_b.weight", (Hv, H), "mat"), (a + "in_proj_a.weight", (Hv, H), "mat"),
                  (a + "conv1d.weight", (CD, 1, K), "conv"), (a + "A_log", (Hv,), "alog"),
                  (a + "dt_bias", (Hv,), "dtbias"), (a + "norm.weight", (g["linear_value_head_dim"],), "gnorm"),
                  (a + "out_proj.weight", (H, VD), "mat")]
        else:
            a = p + "self_attn."
            nh, kv = g["num_attention_heads"], g["num_key_value_heads"]
            s += [(a + "q_proj.weight", (2 * nh * hd, H), "mat"), (a + "k_proj.weight", (kv * hd, H), "mat"),
                  (a + "v_proj.weight", (kv * hd, H), "mat"), (a + "o_proj.weight", (H, nh * hd), "mat"),
                  (a + "q_norm.weight", (hd,), "norm"), (a + "k_norm.weight", (hd,), "norm")]
        m = p + "mlp."
        s += [(m + "gate.weight", (E, H), "mat"), (m + "experts.gate_up_proj", (E, 2 * I, H), "mat"),
              (m + "experts.down_proj", (E, H, I), "mat"), (m + "shared_expert.gate_proj.weight", (SI, H), "mat"),
              (m + "shared_expert.up_proj.weight", (SI, H), "mat"),
              (m + "shared_expert.down_proj.weight", (H, SI), "mat"), (m + "shared_expert_gate.weight", (1, H), "mat")]
    s += [(P + "norm.weight", (H,), "norm"), ("lm_head.weight", (V, H), "mat")]
    if extras:
        s += [("model.visual.blocks.0.attn.qkv.weight", (192, 64), "mat"), ("mtp.fc.weight", (H, 2 * H), "mat"),
              ("mtp.norm.weight", (H,), "norm")]
    return s


def value(name, shape, kind, rng):
    if kind == "embed":
        x = rng.standard_normal(shape, dtype=np.float32)
    elif kind == "mat":
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape[-1]))
    elif kind == "norm":
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)  # zero-centred gain
    elif kind == "gnorm":
        x = 1.0 + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
    elif kind == "conv":
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
    elif kind == "alog":
        x = np.log(rng.uniform(1, 16, shape)).astype(np.float32)
    elif kind == "dtbias":
        x = rng.uniform(-4, 0.5, shape).astype(np.float32)
    else:
        raise ValueError(kind)
    return x


def write_safetensors(path, items):
    """items: list of (name, dtype str, shape, bytes-producing callable), written one at a time."""
    hdr, off = {}, 0
    for name, dt, shape, nbytes, _ in items:
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, _, make in items:
            for chunk in make():
                f.write(chunk)


def write_hf(out, g, seed=0, n_shards=2, extras=True, f32=(), override=None, files=True, drop=()):
    """Write a checkpoint. f32: name suffixes stored as F32 (Qwen3.5 style); override:
    {name: float32 array} replacing random values; drop: names left out."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specs = [s for s in tensor_specs(g, extras) if s[0] not in drop]
    override = override or {}
    sizes = []
    for name, shape, kind in specs:
        f = any(name.endswith(x) for x in f32)
        sizes.append((2 if not f else 4) * int(np.prod(shape)))
    total = sum(sizes)
    per = total / n_shards
    shard_of, acc = [], 0
    for sz in sizes:
        shard_of.append(min(n_shards - 1, int(acc // per)) if per else 0)
        acc += sz
    wmap = {}
    for sh in range(n_shards):
        fname = f"model-{sh + 1:05d}-of-{n_shards:05d}.safetensors"
        items = []
        for i, (name, shape, kind) in enumerate(specs):
            if shard_of[i] != sh:
                continue
            f = any(name.endswith(x) for x in f32)

            def make(name=name, shape=shape, kind=kind, f=f, i=i):
                rng = np.random.default_rng([seed, i])
                if name in override:
                    parts = [np.asarray(override[name], dtype=np.float32).reshape(shape)]
                elif len(shape) == 3:  # one expert at a time: bounded memory
                    parts = (value(name, shape[1:], kind, rng) for _ in range(shape[0]))
                else:
                    step = max(1, (1 << 24) // int(np.prod(shape[1:])))
                    parts = (value(name, (min(step, shape[0] - r),) + tuple(shape[1:]), kind, rng)
                             for r in range(0, shape[0], step))
                for x in parts:
                    yield x.tobytes() if f else bf16_bits(x).tobytes()

            items.append((name, "F32" if f else "BF16", shape, sizes[i], make))
            wmap[name] = fname
        write_safetensors(out / fname, items)
    with open(out / "model.safetensors.index.json", "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))}, fh, indent=2)
    with open(out / "config.json", "w") as fh:
        json.dump(config(g), fh, indent=2)
    if files:
        (out / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": 248044, "do_sample": True, "eos_token_id": [248046, 248044], "pad_token_id": 248044,
             "temperature": 1.0, "top_k": 20, "top_p": 0.95, "transformers_version": "4.57.1"}, indent=2))
        (out / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}\n')
        (out / "tokenizer_config.json").write_text('{"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>"}\n')
        (out / "chat_template.jinja").write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
        (out / "vocab.json").write_text("{}\n")
        (out / "merges.txt").write_text("#version: 0.2\n")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--geometry", choices=["tiny", "real"], default="tiny")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=None, help="number of shards (default: ~4 GB each)")
    a = ap.parse_args()
    g = dict(TINY if a.geometry == "tiny" else REAL)
    if a.layers:
        g["num_hidden_layers"] = a.layers
    if a.vocab:
        g["vocab_size"] = a.vocab
    n = a.shards
    if n is None:
        total = sum(2 * int(np.prod(s)) for _, s, _ in tensor_specs(g))
        n = max(1, round(total / 4e9))
    write_hf(a.out, g, seed=a.seed, n_shards=n)
    print(a.out)


if __name__ == "__main__":
    sys.exit(main())
