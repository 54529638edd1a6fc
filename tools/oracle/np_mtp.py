#!/usr/bin/env python3
"""A float64 NumPy transcription of the Qwen3.6 MTP head (shared/spec/mtp.md §2).

Written from the spec, not from lilac: one draft step maps the target's hidden
state h_p after its final norm and the token x_{p+1} to logits for x_{p+2}:
    e = E[x];  u = W_fc · concat(rmsnorm(e)·(1+w_emb), rmsnorm(h)·(1+w_hid))   (embedding first)
    u = u + attn(rmsnorm(u)·(1+w_in))        the main model's full gated-attention layer
    u = u + moe(rmsnorm(u)·(1+w_post))        its MoE with the shared expert
    y = rmsnorm(u)·(1+w_norm);  logits = lm_head · y   (embedding and lm_head shared)
Row p sits at RoPE position p in the head's own KV cache; a chained draft feeds
the previous step's y and its argmax token as the next row. The decoder layer's
attention and MoE are np_ref's transcriptions of model.md §3.4/§3.5 (the head's
layer is that layer, spec §2.2); attention is causal, so a chained row is the
last row of the whole sequence recomputed.

Reads the head in either official form (norms stored as w; experts fused
[E, 2I, H] as Qwen3.6 or one tensor per expert as Qwen3.5) or as `lilac
convert` writes mtp.safetensors (MLX affine, norms stored as 1+w, bits and
group read off the shapes).
"""

import glob
from pathlib import Path

import numpy as np

import np_ref


# The seven zero-centred norms of the head (spec §1.4): "norm" is mid-name in two of them.
NORMS = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
         "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight",
         "mtp.layers.0.self_attn.q_norm.weight", "mtp.layers.0.self_attn.k_norm.weight")


def load_head(d, tc):
    """The head's weights (float64), named for np_ref.attention / np_ref.moe under 'mtp.layers.0.'."""
    raw = {}
    for f in sorted(glob.glob(str(Path(d) / "*.safetensors"))):
        raw.update({k: v for k, v in np_ref.read_safetensors(f).items() if k.startswith("mtp.")})
    E, I = tc["num_experts"], tc["moe_intermediate_size"]
    W = {}
    if "mtp.fc.scales" in raw:  # lilac convert's form
        for k in [k for k in raw if k.endswith(".scales")]:
            m = k[: -len(".scales")]
            wq, s, b = raw[m + ".weight"], raw[m + ".scales"], raw[m + ".biases"]
            # lilac convert writes group 64; bits from the packed width: cols * bits = 32 * packed
            gs = 64
            bits = wq.shape[-1] * 32 // (gs * s.shape[-1])
            w = np_ref.dequant(wq, s, b, gs, bits)
            W[m.replace(".switch_mlp.", ".experts.") + ".weight"] = w
        W.update({k: raw[k].astype(np.float64) for k in NORMS})
    else:  # official bf16: norms stored zero-centred
        for k, v in raw.items():
            v = v.astype(np.float64)
            if k in NORMS:
                v = v + 1.0
            if k.endswith("experts.gate_up_proj"):
                W["mtp.layers.0.mlp.experts.gate_proj.weight"] = v[:, :I]
                W["mtp.layers.0.mlp.experts.up_proj.weight"] = v[:, I:]
            elif k.endswith("experts.down_proj"):
                W["mtp.layers.0.mlp.experts.down_proj.weight"] = v
            elif ".mlp.experts." in k:  # per expert: mtp.layers.0.mlp.experts.{e}.{leaf}.weight
                continue
            else:
                W[k] = v
        if "mtp.layers.0.mlp.experts.0.gate_proj.weight" in raw:
            for leaf in ("gate_proj", "up_proj", "down_proj"):
                W[f"mtp.layers.0.mlp.experts.{leaf}.weight"] = np.stack(
                    [raw[f"mtp.layers.0.mlp.experts.{e}.{leaf}.weight"].astype(np.float64) for e in range(E)])
    return W


def target_hidden(tc, Wm, ids):
    """The target's hidden states after its final norm: np_ref.forward with lm_head = I."""
    W2 = dict(Wm)
    W2["lm_head.weight"] = np.eye(tc["hidden_size"])
    return np_ref.forward(tc, W2, ids)


def head_rows(tc, Wm, Wh, hidden, toks):
    """y for rows (hidden[p], toks[p]) at positions 0..R-1."""
    eps = tc["rms_norm_eps"]
    e = Wm["model.embed_tokens.weight"][np.asarray(toks)]
    x = np.concatenate([np_ref.rmsnorm(e, Wh["mtp.pre_fc_norm_embedding.weight"], eps),
                        np_ref.rmsnorm(hidden, Wh["mtp.pre_fc_norm_hidden.weight"], eps)], -1)
    u = x @ Wh["mtp.fc.weight"].T
    p = "mtp.layers.0."
    u = u + np_ref.attention(np_ref.rmsnorm(u, Wh[p + "input_layernorm.weight"], eps), Wh, p + "self_attn.", tc)
    u = u + np_ref.moe(np_ref.rmsnorm(u, Wh[p + "post_attention_layernorm.weight"], eps), Wh, p + "mlp.", tc)
    return np_ref.rmsnorm(u, Wh["mtp.norm.weight"], eps)


def mtp_logits(main_dir, head_dir, ids, k):
    """[len(ids) + k - 1, vocab]: the shifted pass over ids (the last row's token is the target's greedy
    next token), then k-1 chained greedy drafts. Also returns the target's logits."""
    tc, Wm = np_ref.load_dir(main_dir)
    Wh = load_head(head_dir, tc)
    ids = [int(i) for i in ids]
    main = np_ref.forward(tc, Wm, ids)
    hid = target_hidden(tc, Wm, ids)
    toks = ids[1:] + [int(main[-1].argmax())]
    head = Wm["lm_head.weight"]
    y = head_rows(tc, Wm, Wh, hid, toks)
    out = list(y @ head.T)
    for _ in range(k - 1):
        hid = np.concatenate([hid, y[-1:]], 0)
        toks = toks + [int(out[-1].argmax())]
        y = head_rows(tc, Wm, Wh, hid, toks)
        out.append(y[-1] @ head.T)
    return np.array(out), main
