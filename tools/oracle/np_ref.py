#!/usr/bin/env python3
"""An independent float64 NumPy transcription of the Qwen3.6 text forward (spec §3).

It does not import mlx: it parses safetensors itself, unpacks the MLX affine
4/8-bit codes itself (spec §4), reads either layout (MLX 4-bit or HF bf16)
and runs the forward pass exactly as shared/spec/model.md §3 writes it, with
the GDN recurrence in its sequential form. Used to check the oracle (mlx-lm)
against the spec on the small cases: the two must agree to ~1e-5, so a
disagreement between lilac and the oracle can be blamed on the right side.

Usage: np_ref.py MODEL_DIR IDS.npy OUT.npy
"""

import glob
import json
import re
import struct
import sys
from pathlib import Path

import numpy as np

_DT = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "U32": "<u4", "I32": "<i4", "U8": "u1", "I8": "i1", "I64": "<i8", "U16": "<u2"}


def read_safetensors(path):
    """name -> numpy array (bf16 widened to float32 exactly)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a : base + b]
        shape = info["shape"]
        if info["dtype"] == "BF16":
            u = np.frombuffer(buf, "<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(buf, _DT[info["dtype"]])
        out[name] = arr.reshape(shape)
    return out


def dequant(wq, scales, biases, group_size, bits):
    """MLX affine dequantization w = s*q + b (spec §4), in float64."""
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits).astype(np.uint32)
    q = (wq[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    q = q.reshape(*wq.shape[:-1], wq.shape[-1] * per).astype(np.float64)
    g = q.reshape(*q.shape[:-1], q.shape[-1] // group_size, group_size)
    w = g * scales.astype(np.float64)[..., None] + biases.astype(np.float64)[..., None]
    return w.reshape(q.shape)


class LazyExperts:
    """Stacked expert weights [E, out, in], dequantized / widened one expert at a time."""

    def __init__(self, get):
        self.get = get

    def __getitem__(self, e):
        return self.get(e)


NORM_SUFFIXES = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight", ".k_norm.weight")


def load_dir(d):
    """Returns (text_config, weights) with canonical names 'model.…', 'lm_head.weight',
    norms as gains (1+w), conv1d as [C, K], experts split as experts.{gate,up,down}_proj [E, out, in]."""
    d = Path(d)
    cfg = json.loads((d / "config.json").read_text())
    tc = cfg.get("text_config", cfg)
    raw = {}
    for f in sorted(glob.glob(str(d / "*.safetensors"))):
        raw.update(read_safetensors(f))
    W = {}
    if "quantization" in cfg:  # MLX layout
        q = cfg["quantization"]
        for k in list(raw):
            if k.endswith(".scales"):
                m = k[: -len(".scales")]
                ov = q.get(m) if isinstance(q.get(m), dict) else {}
                gs, bits = ov.get("group_size", q["group_size"]), ov.get("bits", q["bits"])
                args = (raw.pop(m + ".weight"), raw.pop(m + ".scales"), raw.pop(m + ".biases"), gs, bits)
                if ".switch_mlp." in m:
                    W[m + ".weight"] = LazyExperts(lambda e, a=args: dequant(a[0][e], a[1][e], a[2][e], a[3], a[4]))
                else:
                    W[m + ".weight"] = dequant(*args)
        W.update({k: v.astype(np.float64) for k, v in raw.items()})
        W = {re.sub(r"^language_model\.", "", k): v for k, v in W.items()}
        W = {k.replace(".switch_mlp.", ".experts."): v for k, v in W.items()}
        for k in list(W):
            if k.endswith("conv1d.weight"):
                W[k] = W[k][:, :, 0]  # [C, K, 1] -> [C, K]
    else:  # HF layout
        for k, v in raw.items():
            if k.startswith("model.visual") or k.startswith("mtp."):
                continue
            k2 = k.replace("model.language_model.", "model.")
            if k2.endswith("experts.gate_up_proj"):
                half = v.shape[1] // 2
                W[k2.replace("gate_up_proj", "gate_proj.weight")] = LazyExperts(lambda e, v=v, h=half: v[e, :h].astype(np.float64))
                W[k2.replace("gate_up_proj", "up_proj.weight")] = LazyExperts(lambda e, v=v, h=half: v[e, h:].astype(np.float64))
                continue
            if k2.endswith("experts.down_proj"):
                W[k2 + ".weight"] = LazyExperts(lambda e, v=v: v[e].astype(np.float64))
                continue
            v = v.astype(np.float64)
            if k2.endswith("conv1d.weight"):
                v = v[:, 0, :]  # [C, 1, K] -> [C, K]
            if any(k2.endswith(s) for s in NORM_SUFFIXES):
                v = v + 1.0
            W[k2] = v
    return tc, W


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def gdn(x, W, p, tc):
    T = x.shape[0]
    Hk, Hv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    Dk, Dv = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    K = tc["linear_conv_kernel_dim"]
    eps = tc["rms_norm_eps"]
    m = x @ W[p + "in_proj_qkv.weight"].T  # [T, C]
    z = (x @ W[p + "in_proj_z.weight"].T).reshape(T, Hv, Dv)
    b = x @ W[p + "in_proj_b.weight"].T
    a = x @ W[p + "in_proj_a.weight"].T
    cw = W[p + "conv1d.weight"]  # [C, K]; tap K-1 multiplies the current token
    mp = np.concatenate([np.zeros((K - 1, m.shape[1])), m], 0)
    c = sum(cw[:, k] * mp[k : k + T] for k in range(K))
    c = silu(c)
    kd = Hk * Dk
    q = c[:, :kd].reshape(T, Hk, Dk)
    k = c[:, kd : 2 * kd].reshape(T, Hk, Dk)
    v = c[:, 2 * kd :].reshape(T, Hv, Dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * Dk**-0.5
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    rep = Hv // Hk
    q = np.repeat(q, rep, axis=1)  # v-head j reads k-head j // rep
    k = np.repeat(k, rep, axis=1)
    beta = sigmoid(b)
    g = -np.exp(W[p + "A_log"]) * softplus(a + W[p + "dt_bias"])
    alpha = np.exp(g)
    S = np.zeros((Hv, Dk, Dv))  # S[key i][value m]
    o = np.zeros((T, Hv, Dv))
    for t in range(T):
        S *= alpha[t][:, None, None]
        r = np.einsum("hij,hi->hj", S, k[t])
        delta = beta[t][:, None] * (v[t] - r)
        S += k[t][:, :, None] * delta[:, None, :]
        o[t] = np.einsum("hij,hi->hj", S, q[t])
    y = rmsnorm(o, W[p + "norm.weight"], eps) * silu(z)
    return y.reshape(T, Hv * Dv) @ W[p + "out_proj.weight"].T


def rope(x, pos, rot, theta):
    half = rot // 2
    inv = theta ** (-np.arange(half) * 2.0 / rot)
    ang = pos[:, None] * inv[None, :]  # [T, half]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x = x.copy()
    x1, x2 = x[..., :half].copy(), x[..., half:rot].copy()
    x[..., :half] = x1 * cos - x2 * sin
    x[..., half:rot] = x2 * cos + x1 * sin
    return x


def rope_params(tc):
    rp = tc.get("rope_parameters") or {}
    theta = rp.get("rope_theta", tc.get("rope_theta"))
    prf = rp.get("partial_rotary_factor", tc.get("partial_rotary_factor"))
    return float(theta), float(prf)


def attention(x, W, p, tc):
    T = x.shape[0]
    H, Hkv, D = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    eps = tc["rms_norm_eps"]
    theta, prf = rope_params(tc)
    rot = int(D * prf)
    qg = (x @ W[p + "q_proj.weight"].T).reshape(T, H, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(T, H * D)
    k = (x @ W[p + "k_proj.weight"].T).reshape(T, Hkv, D)
    v = (x @ W[p + "v_proj.weight"].T).reshape(T, Hkv, D)
    q = rmsnorm(q, W[p + "q_norm.weight"], eps)
    k = rmsnorm(k, W[p + "k_norm.weight"], eps)
    pos = np.arange(T, dtype=np.float64)
    q, k = rope(q, pos, rot, theta), rope(k, pos, rot, theta)
    grp = H // Hkv
    o = np.zeros((T, H, D))
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for h in range(H):
        s = q[:, h] @ k[:, h // grp].T / np.sqrt(D) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o[:, h] = s @ v[:, h // grp]
    o = o.reshape(T, H * D) * sigmoid(gate)
    return o @ W[p + "o_proj.weight"].T


def moe(x, W, p, tc):
    E, k = tc["num_experts"], tc["num_experts_per_tok"]
    lg = x @ W[p + "gate.weight"].T
    pr = np.exp(lg - lg.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    top = np.argsort(-pr, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(pr, top, -1)
    w /= w.sum(-1, keepdims=True)
    y = np.zeros_like(x)
    G, U, Dn = W[p + "experts.gate_proj.weight"], W[p + "experts.up_proj.weight"], W[p + "experts.down_proj.weight"]
    for e in range(E):
        rows, slot = np.nonzero(top == e)
        if len(rows) == 0:
            continue
        xe = x[rows]
        ye = (silu(xe @ G[e].T) * (xe @ U[e].T)) @ Dn[e].T
        y[rows] += w[rows, slot][:, None] * ye
    s = (silu(x @ W[p + "shared_expert.gate_proj.weight"].T) * (x @ W[p + "shared_expert.up_proj.weight"].T)) @ W[p + "shared_expert.down_proj.weight"].T
    sg = sigmoid(x @ W[p + "shared_expert_gate.weight"].T)
    return y + sg * s


def forward(tc, W, ids):
    eps = tc["rms_norm_eps"]
    h = W["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(tc["num_hidden_layers"]):
        p = f"model.layers.{i}."
        xn = rmsnorm(h, W[p + "input_layernorm.weight"], eps)
        if (i + 1) % tc["full_attention_interval"] != 0:
            h = h + gdn(xn, W, p + "linear_attn.", tc)
        else:
            h = h + attention(xn, W, p + "self_attn.", tc)
        h = h + moe(rmsnorm(h, W[p + "post_attention_layernorm.weight"], eps), W, p + "mlp.", tc)
    h = rmsnorm(h, W["model.norm.weight"], eps)
    return h @ W["lm_head.weight"].T


def logits(model_dir, ids):
    tc, W = load_dir(model_dir)
    return forward(tc, W, ids)


if __name__ == "__main__":
    d, idf, outf = sys.argv[1:4]
    np.save(outf, logits(d, np.load(idf)).astype(np.float32))
