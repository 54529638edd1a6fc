#!/usr/bin/env python3
"""The outside oracle: random Qwen3.6-35B-A3B-architecture checkpoints + MLX-LM references.

For a case of tools/oracle/cases.py this script

1. builds the model through mlx-lm's own ``qwen3_5_moe`` Model class from an
   HF-style config (``model_type: qwen3_5_moe`` with a ``text_config``), fills
   every parameter with seeded random values of realistic scale, casts them to
   bf16 (what ``mlx_lm.convert --dtype bfloat16`` does), quantizes through
   ``mlx_lm.utils.quantize_model`` (affine, group 64, 4 bits; the model's own
   ``quant_predicate`` makes ``mlp.gate`` and ``mlp.shared_expert_gate`` 8-bit)
   and saves with ``mlx_lm.utils.save_model`` / ``save_config`` into ``mlx/``;
2. optionally writes the same weights in the official HF bf16 layout into
   ``hf/`` (dequantized from the saved MLX bytes, rounded to bf16 once; fused
   ``experts.gate_up_proj`` / ``experts.down_proj``, conv1d ``[C,1,4]``,
   zero-centred norms, ``model.language_model.*`` names, a top-level
   ``lm_head.weight``, a vision and an MTP tensor to be skipped, two shards
   plus ``model.safetensors.index.json``);
3. loads each directory back through ``mlx_lm.utils.load_model`` (so from the
   exact saved bytes, through mlx-lm's sanitize), casts every floating
   parameter (incl. quantization scales and biases; the casts are exact) to
   float32 and writes float32 teacher-forced logits, mlx-lm's greedy
   continuation (``generate_step`` with an argmax sampler) and diagnostics.

Outputs in the case directory: ``mlx/``, ``hf/`` (if enabled), ``ids.npy``
(int32 [T]), ``ref_logits.npy`` (float32 [T, vocab]), ``ref_logits_hf.npy``,
``greedy.npy`` (int32 [n_greedy], continuing ids[:P]), ``meta.json``.

Usage: make_case.py CASE [--hf | --no-hf] [--root DIR] [--force]
Prints the case directory. Fixtures are cached by a hash of this file,
cases.py, the case parameters and the mlx / mlx-lm versions.
"""

import argparse
import contextlib
import copy
import fcntl
import gc
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_ROOT = REPO / "tests" / "fixtures" / "gen"
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import cases as cases_mod  # noqa: E402

FORMAT_VERSION = 1  # bump to invalidate every cached fixture


def log(*a):
    print("[oracle]", *a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Cache key / directories


def case_hash(case):
    import mlx.core as mx
    import mlx_lm

    h = hashlib.sha256()
    h.update(f"v{FORMAT_VERSION}\n".encode())
    for f in (HERE / "make_case.py", HERE / "cases.py"):
        h.update(f.read_bytes())
    h.update(json.dumps(case, sort_keys=True).encode())
    h.update(f"mlx={mx.__version__} mlx_lm={mlx_lm.__version__}".encode())
    return h.hexdigest()[:12]


def ensure_case(name, root=None, hf_twin=None, force=False):
    """Return the directory of case `name`, generating it if not cached."""
    case = cases_mod.get_case(name, hf_twin=hf_twin)
    root = Path(root) if root else DEFAULT_ROOT
    root.mkdir(parents=True, exist_ok=True)
    key = case_hash(case)
    tag = "hf" if case["hf_twin"] else "nohf"
    final = root / f"{name}-{tag}-{key}"
    with open(root / f".{name}.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if (final / "DONE").exists() and not force:
            return final
        # A cached case with the HF twin serves a request without it.
        if not case["hf_twin"] and not force:
            other = root / f"{name}-hf-{case_hash(cases_mod.get_case(name, hf_twin=True))}"
            if (other / "DONE").exists():
                return other
        pat = re.compile(rf"^{re.escape(name)}-(hf|nohf)-[0-9a-f]{{12}}(\.tmp-\d+)?$")
        for d in root.iterdir():
            if d.is_dir() and pat.match(d.name) and d != final:
                log(f"removing stale fixture {d}")
                shutil.rmtree(d, ignore_errors=True)
        tmp = root / f"{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        t0 = time.time()
        build_case(case, tmp)
        (tmp / "DONE").write_text(f"{time.time() - t0:.1f}\n")
        os.rename(tmp, final)
        log(f"case {name} built in {time.time() - t0:.1f}s -> {final}")
        return final


# --------------------------------------------------------------------------
# Config


def layer_types(tc):
    n, k = tc["num_hidden_layers"], tc["full_attention_interval"]
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]


def hf_config(case):
    """config.json of the HF checkpoint (the multimodal wrapper), as transformers writes it."""
    t = case["text"]
    text_config = {
        "model_type": "qwen3_5_moe_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "eos_token_id": 248044,
        "full_attention_interval": t["full_attention_interval"],
        "head_dim": t["head_dim"],
        "hidden_act": "silu",
        "hidden_size": t["hidden_size"],
        "initializer_range": 0.02,
        "layer_types": layer_types(t),
        "linear_conv_kernel_dim": t["linear_conv_kernel_dim"],
        "linear_key_head_dim": t["linear_key_head_dim"],
        "linear_num_key_heads": t["linear_num_key_heads"],
        "linear_num_value_heads": t["linear_num_value_heads"],
        "linear_value_head_dim": t["linear_value_head_dim"],
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "moe_intermediate_size": t["moe_intermediate_size"],
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": t["num_attention_heads"],
        "num_experts": t["num_experts"],
        "num_experts_per_tok": t["num_experts_per_tok"],
        "num_hidden_layers": t["num_hidden_layers"],
        "num_key_value_heads": t["num_key_value_heads"],
        "output_router_logits": False,
        "pad_token_id": None,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": list(t["mrope_section"]),
            "partial_rotary_factor": t["partial_rotary_factor"],
            "rope_theta": t["rope_theta"],
            "rope_type": "default",
        },
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": t["shared_expert_intermediate_size"],
        "use_cache": True,
        "vocab_size": t["vocab_size"],
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "image_token_id": 248056,
        "model_type": "qwen3_5_moe",
        "text_config": text_config,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "video_token_id": 248057,
        "vision_config": {
            "deepstack_visual_indexes": [],
            "depth": 1,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 64,
            "in_channels": 3,
            "model_type": "qwen3_5_moe",
            "num_heads": 2,
            "out_hidden_size": t["hidden_size"],
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "vision_end_token_id": 248054,
        "vision_start_token_id": 248053,
    }


# --------------------------------------------------------------------------
# Random init


def _key(seed, name):
    import mlx.core as mx

    return mx.random.key((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62))


def init_param(name, shape, seed, ini):
    """Seeded random value (float32, lazy) for parameter `name` of the MLX model."""
    import mlx.core as mx

    k = _key(seed, name)

    def normal(std):
        return mx.random.normal(shape, key=k) * std

    def uniform(lo, hi):
        return mx.random.uniform(lo, hi, shape, key=k)

    if name.endswith("embed_tokens.weight"):
        return normal(ini["embed_std"])
    if name.endswith("A_log"):
        lo, hi = ini["A_range"]
        return mx.log(uniform(lo, hi))
    if name.endswith("dt_bias"):
        return uniform(*ini["dt_bias_range"])
    if name.endswith("conv1d.weight"):
        return normal(ini["conv_std"])
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + normal(ini["gated_norm_noise"])
    if name.endswith("norm.weight"):
        # RMSNorm gain (1+w). Clipped to [0.5, 1.98] so that gain-1 is exact
        # in bf16 and the zero-centred HF twin round-trips bit-exactly.
        return mx.clip(1.0 + normal(ini["norm_noise"]), 0.5, 1.98)
    if len(shape) >= 2:
        fan_in = shape[-1]
        gain = ini["linear_gain"]
        if name.endswith("lm_head.weight"):
            gain = ini["lm_head_gain"]
        elif name.endswith("mlp.gate.weight"):
            gain = ini["router_gain"]
        elif name.endswith("shared_expert_gate.weight"):
            gain = ini["shared_gate_gain"]
        elif name.endswith("in_proj_a.weight"):
            gain = ini["in_proj_a_gain"]
        return normal(gain / np.sqrt(fan_in))
    raise ValueError(f"no init rule for parameter {name} {shape}")


def _group_of(name):
    m = re.search(r"\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def fill_random(model, seed, ini):
    """Replace every parameter by its seeded random value in bf16, one tensor at a time."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    params = tree_flatten(model.parameters())
    for name, p in params:
        v = init_param(name, tuple(p.shape), seed, ini).astype(mx.bfloat16)
        mx.eval(v)
        model.load_weights([(name, v)], strict=False)
        del v
    return [n for n, _ in params]


# --------------------------------------------------------------------------
# Build


# Unquantized stacked expert weights (HF twin) bigger than this stay bf16 in
# memory: every op that reads them gets float32 activations and promotes them
# to float32 exactly, so the arithmetic is the same as with float32 copies,
# without holding 4 bytes per expert weight (case real_layer: 12.9 GB).
KEEP_BF16_ELEMS = 1 << 26


def _to_f32(model, keep_bf16_elems=KEEP_BF16_ELEMS):
    """Cast every floating parameter (incl. quantization scales/biases) to float32, exactly."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path

    def cast(path, p):
        if isinstance(p, mx.array) and mx.issubdtype(p.dtype, mx.floating):
            if ".switch_mlp." in path and p.ndim == 3 and p.size > keep_bf16_elems:
                return p
            return p.astype(mx.float32)
        return p

    model.update(tree_map_with_path(cast, model.parameters()))
    mx.eval(model.parameters())
    return model


def load_f32(path, keep_bf16_elems=KEEP_BF16_ELEMS):
    from mlx_lm.utils import load_model

    model, config = load_model(Path(path))
    return _to_f32(model, keep_bf16_elems), config


def forward_logits(model, ids):
    import mlx.core as mx

    out = model(mx.array(np.asarray(ids, dtype=np.int32))[None])
    mx.eval(out)
    if out.dtype != mx.float32:
        raise RuntimeError(f"reference logits dtype is {out.dtype}, expected float32")
    return np.array(out[0], copy=True)


def greedy_generate(model, prompt, n):
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    sampler = lambda logprobs: mx.argmax(logprobs, axis=-1)  # noqa: E731
    toks = []
    for tok, _ in generate_step(mx.array(np.asarray(prompt, dtype=np.int32)), model, max_tokens=n, sampler=sampler):
        toks.append(int(tok))
    return np.array(toks, dtype=np.int32)


def build_mlx_checkpoint(case, out):
    """Random model -> bf16 -> mlx-lm quantize_model -> save_model/save_config."""
    import mlx.core as mx
    from mlx_lm.models import qwen3_5_moe
    from mlx_lm.utils import quantize_model, save_config, save_model

    config = hf_config(case)
    hf_cfg = copy.deepcopy(config)
    # As mlx_lm.utils.load_model does: args from the config dict, then the model.
    # (TextModelArgs mutates text_config.rope_parameters in place, renaming
    # rope_type -> type; mlx-lm's conversion writes that mutated dict back.)
    args = qwen3_5_moe.ModelArgs.from_dict(config)
    model = qwen3_5_moe.Model(args)
    names = fill_random(model, case["seed"], case["init"])
    # mlx_lm.convert casts with the model's cast_predicate (A_log excluded); we
    # create every tensor in bf16 directly, as the Qwen3.6 HF checkpoint stores
    # everything (A_log included) in bf16.
    with contextlib.redirect_stdout(sys.stderr):  # it prints "[INFO] Quantized model with ..."
        model, qconfig = quantize_model(model, config, group_size=64, bits=4, mode="affine")
    for layer in model.layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(qconfig, config_path=Path(out) / "config.json")
    del model
    gc.collect()
    mx.clear_cache()
    return hf_cfg, qconfig, names


NORM_SUFFIXES = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def load_safetensors_dir(path):
    import mlx.core as mx

    w = {}
    for f in sorted(glob.glob(str(Path(path) / "*.safetensors"))):
        w.update(mx.load(f))
    return w


def write_hf_twin(mlx_dir, out, hf_cfg, qconfig, seed):
    """The same weights in the official HF bf16 layout (spec §2.1), from the saved MLX bytes."""
    import mlx.core as mx

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    w = load_safetensors_dir(mlx_dir)
    q = qconfig["quantization"]
    tc = hf_cfg["text_config"]
    mods = sorted(k[: -len(".scales")] for k in w if k.endswith(".scales"))

    def deq(m):
        ov = q.get(m, {})
        gs = ov.get("group_size", q["group_size"]) if isinstance(ov, dict) else q["group_size"]
        bits = ov.get("bits", q["bits"]) if isinstance(ov, dict) else q["bits"]
        d = mx.dequantize(
            w[m + ".weight"],
            w[m + ".scales"].astype(mx.float32),
            w[m + ".biases"].astype(mx.float32),
            group_size=gs,
            bits=bits,
            mode="affine",
        ).astype(mx.bfloat16)
        mx.eval(d)
        return d

    def hf_name(k):
        if k.startswith("language_model.model."):
            return "model.language_model." + k[len("language_model.model."):]
        if k == "language_model.lm_head.weight":
            return "lm_head.weight"
        raise ValueError(k)

    hf = {}
    done = set()
    for m in mods:
        if ".switch_mlp." in m:
            continue
        hf[hf_name(m + ".weight")] = deq(m)
        done.update({m + ".weight", m + ".scales", m + ".biases"})
    nl = tc["num_hidden_layers"]
    for i in range(nl):
        p = f"language_model.model.layers.{i}.mlp.switch_mlp"
        g, u, d = deq(p + ".gate_proj"), deq(p + ".up_proj"), deq(p + ".down_proj")
        gu = mx.concatenate([g, u], axis=1)  # [E, 2I, H], gate rows first
        mx.eval(gu)
        del g, u
        hp = f"model.language_model.layers.{i}.mlp.experts"
        hf[hp + ".gate_up_proj"] = gu
        hf[hp + ".down_proj"] = d
        for s in ("gate_proj", "up_proj", "down_proj"):
            done.update({f"{p}.{s}.{x}" for x in ("weight", "scales", "biases")})
    for k, v in w.items():
        if k in done:
            continue
        if k.endswith("conv1d.weight"):
            v = mx.contiguous(v.transpose(0, 2, 1))  # MLX [C,K,1] -> HF [C,1,K]
        elif any(k.endswith(s) for s in NORM_SUFFIXES):
            z = (v.astype(mx.float32) - 1.0).astype(mx.bfloat16)
            if not mx.array_equal(z + 1.0, v).item():
                raise RuntimeError(f"zero-centred norm {k} does not round-trip in bf16")
            v = z
        if v.dtype != mx.bfloat16:
            raise RuntimeError(f"unexpected dtype {v.dtype} for {k}")
        hf[hf_name(k)] = v
    # Tensors a real checkpoint carries and every loader must skip.
    H = tc["hidden_size"]
    hf["model.visual.blocks.0.attn.qkv.weight"] = (mx.random.normal((3 * 64, 64), key=_key(seed, "visual")) * 0.1).astype(mx.bfloat16)
    hf["mtp.fc.weight"] = (mx.random.normal((H, 2 * H), key=_key(seed, "mtp")) * 0.05).astype(mx.bfloat16)

    # Two shards + index, as the official repository is laid out.
    names = sorted(hf)
    half = nl // 2

    def shard_of(n):
        m = re.search(r"\.layers\.(\d+)\.", n)
        if n.startswith("model.visual") or "embed_tokens" in n:
            return 1
        if n.startswith("mtp.") or n == "lm_head.weight" or n.endswith("language_model.norm.weight"):
            return 2
        return 1 if (m and int(m.group(1)) < half) else 2

    files = {1: "model-00001-of-00002.safetensors", 2: "model-00002-of-00002.safetensors"}
    wmap = {}
    total = 0
    for s in (1, 2):
        part = {n: hf[n] for n in names if shard_of(n) == s}
        mx.save_safetensors(str(out / files[s]), part, metadata={"format": "pt"})
        for n in part:
            wmap[n] = files[s]
            total += part[n].nbytes
    with open(out / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))}, f, indent=2)
    cfg = copy.deepcopy(hf_cfg)
    with open(out / "config.json", "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    del w, hf
    gc.collect()
    mx.clear_cache()
    return sorted(wmap)


# --------------------------------------------------------------------------
# Diagnostics


def logit_stats(ref):
    amax = np.abs(ref).max(axis=1)
    srt = np.sort(ref, axis=1)
    gap = (srt[:, -1] - srt[:, -2]) / amax
    am = ref.argmax(axis=1)
    return {
        "row_std_mean": float(ref.std(axis=1).mean()),
        "row_std_min": float(ref.std(axis=1).min()),
        "row_std_max": float(ref.std(axis=1).max()),
        "row_absmax_min": float(amax.min()),
        "row_absmax_max": float(amax.max()),
        "distinct_argmax": int(len(np.unique(am))),
        "top2_gap_rel_min": float(gap.min()),
        "top2_gap_rel_min_pos": int(gap.argmin()),
        "near_ties_1e-3": int((gap < 1e-3).sum()),
        "near_ties_1e-4": int((gap < 1e-4).sum()),
        "finite": bool(np.isfinite(ref).all()),
    }


@contextlib.contextmanager
def router_probe(records):
    """Record, per MoE call, the router logit gap between the k-th and (k+1)-th expert."""
    import mlx.core as mx
    from mlx_lm.models.qwen3_next import Qwen3NextSparseMoeBlock as Blk

    orig = Blk.__call__

    def wrapped(self, x):
        lg = self.gate(x).astype(mx.float32)
        s = mx.sort(lg, axis=-1)
        gap = s[..., -self.top_k] - s[..., -self.top_k - 1]
        records.append(np.array(gap).reshape(-1))
        return orig(self, x)

    Blk.__call__ = wrapped
    try:
        yield
    finally:
        Blk.__call__ = orig


def router_stats(rec):
    g = np.stack(rec)  # [layers, T]
    return {
        "kth_gap_min": float(g.min()),
        "kth_gap_min_at": [int(i) for i in np.unravel_index(g.argmin(), g.shape)],
        "kth_gap_lt_1e-4": int((g < 1e-4).sum()),
        "kth_gap_lt_1e-3": int((g < 1e-3).sum()),
        "token_layers": int(g.size),
    }


def compare(a, b):
    den = np.abs(b).max(axis=1)
    rel = np.abs(a - b).max(axis=1) / den
    return {
        "max_rel": float(rel.max()),
        "max_rel_pos": int(rel.argmax()),
        "argmax_agree": float((a.argmax(1) == b.argmax(1)).mean()),
    }


# --------------------------------------------------------------------------


def build_case(case, out):
    import mlx.core as mx
    import mlx_lm

    out = Path(out)
    out.mkdir(parents=True)
    t = case["text"]
    timings = {}
    t0 = time.time()
    mx.random.seed(case["seed"])  # lazy default inits are discarded, but keep them deterministic
    hf_cfg, qconfig, names = build_mlx_checkpoint(case, out / "mlx")
    timings["build_quantize_save_mlx"] = time.time() - t0
    log(f"{case['name']}: mlx checkpoint written in {timings['build_quantize_save_mlx']:.1f}s")

    q = qconfig["quantization"]
    overrides = {k: v for k, v in q.items() if isinstance(v, dict)}
    want = set()
    for i in range(t["num_hidden_layers"]):
        want.add(f"language_model.model.layers.{i}.mlp.gate")
        want.add(f"language_model.model.layers.{i}.mlp.shared_expert_gate")
    if set(overrides) != want or any(v.get("bits") != 8 for v in overrides.values()):
        raise RuntimeError(f"unexpected quantization overrides: {overrides}")

    if case["hf_twin"]:
        t1 = time.time()
        write_hf_twin(out / "mlx", out / "hf", hf_cfg, qconfig, case["seed"])
        timings["write_hf_twin"] = time.time() - t1
        log(f"{case['name']}: hf twin written in {timings['write_hf_twin']:.1f}s")

    rng = np.random.default_rng(case["seed"])
    ids = rng.integers(0, t["vocab_size"], size=case["T"], dtype=np.int64).astype(np.int32)
    np.save(out / "ids.npy", ids)

    t1 = time.time()
    model, _ = load_f32(out / "mlx")
    ref = forward_logits(model, ids)
    timings["ref_forward"] = time.time() - t1
    np.save(out / "ref_logits.npy", ref.astype(np.float32))
    n = min(32, len(ids))  # bitwise run-to-run determinism, on a short prefix (cheap)
    deterministic = bool(np.array_equal(forward_logits(model, ids[:n]), forward_logits(model, ids[:n])))

    t1 = time.time()
    P = case["P"]
    greedy = greedy_generate(model, ids[:P], case["n_greedy"])
    timings["greedy"] = time.time() - t1
    np.save(out / "greedy.npy", greedy)

    # Cross-check the cached decode path against a teacher-forced pass over
    # prompt + greedy tokens, and measure near-ties along the greedy path.
    t1 = time.time()
    # One probed pass over prompt + greedy also gives the router gaps of ids[:P].
    path = np.concatenate([ids[:P], greedy[:-1]]).astype(np.int32)
    rec = []
    with router_probe(rec):
        tf_full = forward_logits(model, path)
    tf = tf_full[P - 1:]
    greedy_tf_agree = bool((tf.argmax(1) == greedy).all())
    greedy_path = logit_stats(tf)
    greedy_path["distinct_tokens"] = int(len(np.unique(greedy)))
    greedy_path["teacher_forced_argmax_equals_greedy"] = greedy_tf_agree
    # The same positions computed within a longer sequence (other matmul shapes).
    greedy_path["prompt_prefix_vs_ref"] = compare(tf_full[:P], ref[:P])
    rs_path = router_stats(rec)
    rs_ids = None
    if P < len(ids):
        rec = []
        with router_probe(rec):
            forward_logits(model, ids)
        rs_ids = router_stats(rec)
    timings["diagnostics"] = time.time() - t1
    del model
    gc.collect()
    mx.clear_cache()

    hf_info = None
    if case["hf_twin"]:
        t1 = time.time()
        hmodel, _ = load_f32(out / "hf")
        ref_hf = forward_logits(hmodel, ids)
        np.save(out / "ref_logits_hf.npy", ref_hf.astype(np.float32))
        timings["ref_forward_hf"] = time.time() - t1
        hf_info = compare(ref_hf, ref)
        hf_info["logits"] = logit_stats(ref_hf)
        del hmodel
        gc.collect()
        mx.clear_cache()

    mlx_files = sorted(p.name for p in (out / "mlx").iterdir())
    meta = {
        "case": case["name"],
        "params": case,
        "hash": case_hash(case),
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "T": int(case["T"]),
        "P": int(P),
        "n_greedy": int(case["n_greedy"]),
        "vocab_size": int(t["vocab_size"]),
        "mlx_dir": "mlx",
        "mlx_files": mlx_files,
        "hf_dir": "hf" if case["hf_twin"] else None,
        "quantization": q,
        "n_params_mlx_names": len(names),
        "checks": {
            "ref_dtype": "float32",
            "deterministic": deterministic,
            "logits": logit_stats(ref),
            "greedy_path": greedy_path,
            "router_ids": rs_ids,  # None when P == T (then the greedy path covers the ids)
            "router_greedy_path": rs_path,
            "hf_vs_mlx": hf_info,
        },
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
    }
    with open(out / "meta.json", "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", nargs="+", help=f"case name(s): {', '.join(cases_mod.CASES)}, or 'all'")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--hf", dest="hf", action="store_true", default=None, help="also write the HF bf16 twin")
    g.add_argument("--no-hf", dest="hf", action="store_false", help="do not write the HF twin")
    ap.add_argument("--root", default=None, help=f"fixture root (default {DEFAULT_ROOT})")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    a = ap.parse_args(argv)
    names = list(cases_mod.CASES) if a.case == ["all"] else a.case
    for n in names:
        d = ensure_case(n, root=a.root, hf_twin=a.hf, force=a.force)
        print(d)


if __name__ == "__main__":
    main()
