"""HF transformers on a lilac checkpoint of the full geometry: correctness oracle and speed peer.

Loads a checkpoint directory that lilac reads -- the mlx-community 4-bit layout (what
`lilac synth` writes: affine, group 64, bf16 scales/biases, router and shared_expert_gate
8-bit) or the official HF bf16 layout -- straight into transformers' own
`Qwen3_5MoeForCausalLM` (the text model of `qwen3_5_moe`) on the GPU, without writing a
converted checkpoint: the model is built on the meta device and every parameter is
dequantised on the device and assigned in place, so peak GPU memory is the model plus one
tensor's temporaries.

The MLX -> HF mapping (the inverse of `lilac convert`, src/tools/convert.c, and of
tools/oracle/make_case.py's HF twin; the checkpoint layouts of both formats):
  language_model.model.X            -> model.X           (language_model.lm_head -> lm_head)
  quantized module M (M.weight u32 codes, M.scales, M.biases bf16) -> M.weight = s*q + b
      per group of 64 inputs, codes little-endian in uint32 words, LSB first; bits per
      module from the config's overrides (8 for mlp.gate / mlp.shared_expert_gate)
  mlp.switch_mlp.{gate,up}_proj [E,I,H] -> mlp.experts.gate_up_proj [E,2I,H] (gate rows first)
  mlp.switch_mlp.down_proj [E,H,I]      -> mlp.experts.down_proj [E,H,I]
  linear_attn.conv1d.weight [C,K,1]     -> [C,1,K]
  input_layernorm, post_attention_layernorm, model.norm, q_norm, k_norm: MLX stores the gain
      bf16(1+w), HF the zero-centred w: w = stored - 1 (in f32: HF's (1 + w) gives back the
      stored gain exactly). linear_attn.norm (gated norm), A_log, dt_bias: as stored.
  anything outside language_model. (vision_tower, mtp) is skipped.

--check: correctness against lilac
----------------------------------
Token sequence (N positions, default 256): P = 32 prompt ids as `lilac bench` makes them,
((i*2654435761) mod 2^32) mod vocab, continued by lilac's own greedy generation (`lilac
generate --ignore-eos`) to N ids (--seq hash: N hash ids instead). Why: on the generated
part each target token is lilac's argmax, so an HF top-1 disagreement there is exactly a
token where HF's greedy decoding would have diverged, and the perplexity is that of a
sequence the model itself finds likely (rather than log(vocab)-flat noise); the hash prompt
keeps the start identical to what `lilac bench` feeds. Both sequences are deterministic.

Teacher-forced logits of the whole sequence from HF (one forward, no cache) and from
`lilac logits --backend cuda` (run before the model is loaded, so the two never share the
GPU) are compared: top-1 agreement (>= 99% to pass), perplexity exp(mean NLL of ids[t+1]
under logits[t], t = 0..N-2) under each (relative difference <= 1% to pass), max and median
over positions of max|dlogit| / max|logit|, plus HF router near-ties (token-layers whose
k-th and (k+1)-th router logits are closer than 1e-3, where a rounding difference can pick a
different expert). Prints one PASS/FAIL line; exit status 1 on FAIL.

Routing replay (default; --no-replay turns it off): `lilac logits --routes` also writes the
experts lilac picked for every token and layer, and HF runs a second forward with each MoE
layer routed to those experts, weighted by HF's own router probabilities (renormalised over
the picks). The pass/fail figures are this forward's, and every pick must be within a regret
of 1e-2 of HF's own k-th best probability: a real routing error still fails, a near-tie that
f32 rounding broke the other way (random synth routers have gaps of 1e-5) does not send the
rest of the sequence elsewhere. The own-routing figures are printed beside them.

The faithful configuration (default, --dtype float32): every non-expert parameter in f32,
dequantised exactly (s*q is exact in f32, one rounding when b is added: the same value lilac
computes), activations f32 with TF32 disabled -- lilac's CPU reference numerics. The routed
experts (32.2 G of the 34.7 G parameters: 129 GB in f32, which with the rest does not fit
next to anything in 141 GB) stay on the GPU in their packed 4-bit form (18 GB) and the
experts' `gate_up_proj` / `down_proj` become views whose `[e]` dequantises expert e to f32
on use; transformers' own eager experts forward (`experts_implementation="eager"`, which
reads exactly `self.gate_up_proj[expert_idx]`) then runs unchanged. (For an HF bf16
checkpoint the views upcast the bf16 expert, exactly.) GPU memory: ~10 GB f32 weights +
18 GB packed experts + < 2 GB activations/logits.
--dtype bfloat16 checks the stack a user would reach for instead (all weights dequantised
and rounded to bf16, experts fused, default grouped_mm experts, ~70 GB). bf16 activations
against lilac's f32 flip near-tied router choices and top-2 logits, so expect it to miss
the 99% bar on random weights; it is informative, not the oracle.

--bench: the speed peer
-----------------------
HF as a user runs it: bf16 weights (dequantised from the checkpoint, 69.3 GB), experts
fused (transformers' default experts implementation, grouped_mm), sdpa attention, Gated
DeltaNet through whatever transformers binds (flash-linear-attention / causal-conv1d when
importable, else its PyTorch reference path; the path is printed and put in the JSON).
Per prompt length: the prompt of `lilac bench` (same ids), an exact-shape warm-up, then per
round a fresh cache, one prefill (`logits_to_keep=1`, as generate does) and --decode-steps
greedy steps (`model(next, position_ids=p, past_key_values=cache, use_cache=True)`, the
positions passed as generate() passes them, argmax on the device, no host sync inside the
loop), timed with torch.cuda.synchronize around each phase; median over --rounds; the
FNV-1a digest of the decoded ids exactly as `lilac bench` computes its digest (equal
digests = identical greedy tokens; with --dtype float32 on the CPU they matched lilac's on
a 4-layer synth, so the loop decodes the same tokens lilac does; in bf16 they will differ).
Prints a table shaped like `lilac bench` and optionally JSON (--json; lilac bench's schema,
backend "hf-transformers", without the roofline fields). Needs at least one
full-attention layer (transformers 5.17's hybrid cache takes its length from one).

Usage
-----
    python3 tools/device/hf_full.py DIR --check [--n 256] [--seq gen|hash] [--prompt-len 32]
        [--dtype float32|bfloat16] [--lilac build/lilac] [--backend cuda] [--json OUT] [--save DIR]
    python3 tools/device/hf_full.py DIR --bench [--prompt-lens 256,1024,4096] [--decode-steps 64]
        [--rounds 3] [--dtype bfloat16] [--json OUT]
    (--device cpu runs either on the CPU, for testing on small checkpoints)

How tools/device/run.sh should call them (after `synth-full` made /tmp/full; python3 with
torch + transformers >= 5 on the device; no network needed):
    step hf-full-check python3 tools/device/hf_full.py /tmp/full --check --lilac build/lilac \\
        --backend cuda --n 256 --json "$OUT/hf_check_full.json"
    step hf-full-bench python3 tools/device/hf_full.py /tmp/full --bench --prompt-lens ${LENS:-256,1024,4096} \\
        --decode-steps 64 --rounds ${ROUNDS:-2} --json "$OUT/hf_bench.json"
and copy their logs to $OUT. Expected on one H200 (estimates, not measured: no GPU here):
check ~2-4 min (lilac generate + lilac logits ~1 min incl. loading 19.5 GB twice; HF load
~1 min; the f32 forward of 256 tokens with eager experts < 1 min), peak ~30 GB for HF
(lilac's own ~20 GB before it); bench ~3-6 min (load ~1 min; the PyTorch-reference GDN and
the per-step Python dispatch dominate decode), peak ~75 GB. The small geometries work too
(.devdata/tiny, .devdata/tiny-hf, `lilac synth --layers 4 --vocab 8192`).
The check's last line is "1 passed, 0 failed" / "0 passed, 1 failed" like hf_check.py, so
run.sh's summary grep picks it up; --bench exits 0 unless something breaks.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from safetensors import safe_open

import transformers
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as M
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

NORM_SUFFIXES = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                 ".q_norm.weight", ".k_norm.weight")
CHUNK_ELEMS = 1 << 26  # dequantise at most this many weights at a time (temporaries ~1 GB)


def log(*a):
    print("[hf_full]", *a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Checkpoint access


class Checkpoint:
    """The safetensors files of a directory, tensors by name; MLX 4-bit or HF bf16 layout."""

    def __init__(self, d):
        self.dir = d
        self.cfg = json.load(open(os.path.join(d, "config.json")))
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
        if not files:
            sys.exit(f"hf_full: no .safetensors files in {d}")
        self.handles = {f: safe_open(os.path.join(d, f), framework="pt", device="cpu") for f in files}
        self.where = {}
        for f, h in self.handles.items():
            for k in h.keys():
                self.where[k] = f
        if any(k.startswith("language_model.") for k in self.where):
            self.layout = "mlx"
        elif any(k.startswith("model.language_model.") for k in self.where):
            self.layout = "hf"
        else:
            sys.exit(f"hf_full: {d}: neither language_model.* (MLX) nor model.language_model.* (HF) tensors")
        q = self.cfg.get("quantization") or self.cfg.get("quantization_config") or {}
        self.quant = q
        self.group = int(q.get("group_size", 64))
        self.used = set()

    def has(self, k):
        return k in self.where

    def get(self, k, device):
        self.used.add(k)
        t = self.handles[self.where[k]].get_tensor(k)
        if t.dtype == torch.uint32:
            t = t.view(torch.int32)
        return t.to(device)

    def qparams(self, mod, codes_cols, scales_cols):
        """(bits, group) of quantized module `mod`: the config's override, checked against the shapes."""
        ov = self.quant.get(mod)
        gs = int(ov.get("group_size", self.group)) if isinstance(ov, dict) else self.group
        n_in = scales_cols * gs
        bits = codes_cols * 32 // n_in
        if codes_cols * 32 != n_in * bits or bits not in (2, 4, 8):
            sys.exit(f"hf_full: {mod}: codes {codes_cols} cols / scales {scales_cols} cols do not fit group {gs}")
        if isinstance(ov, dict) and "bits" in ov and int(ov["bits"]) != bits:
            sys.exit(f"hf_full: {mod}: config says {ov['bits']} bits, shapes say {bits}")
        return bits, gs


def dequant(codes, scales, biases, bits, gs):
    """MLX affine dequantisation on the tensors' device: w = s*q + b per group, f32 [..., out, in]."""
    shifts = torch.arange(0, 32, bits, device=codes.device, dtype=torch.int32)
    q = (codes.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # arithmetic shift; the mask keeps the field
    lead = codes.shape[:-1]
    q = q.reshape(*lead, -1, gs).to(torch.float32)
    w = q * scales.to(torch.float32).unsqueeze(-1) + biases.to(torch.float32).unsqueeze(-1)
    return w.reshape(*lead, -1)


class QuantTensor:
    """A quantized MLX module resident on the device in packed form: codes, scales, biases."""

    def __init__(self, ck, mod, device):
        self.codes = ck.get(mod + ".weight", device)
        self.scales = ck.get(mod + ".scales", device)
        self.biases = ck.get(mod + ".biases", device)
        self.bits, self.gs = ck.qparams(mod, self.codes.shape[-1], self.scales.shape[-1])
        self.shape = (*self.codes.shape[:-1], self.scales.shape[-1] * self.gs)

    def rows(self, sl):
        """Dequantised f32 of index/slice `sl` along the first axis."""
        return dequant(self.codes[sl], self.scales[sl], self.biases[sl], self.bits, self.gs)

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.biases))

    def into(self, out, axis1=None):
        """Dequantise into `out` (any dtype) chunk by chunk along axis 0 (optionally into out[:, axis1])."""
        n0 = self.shape[0]
        per = max(1, CHUNK_ELEMS // max(1, int(np.prod(self.shape[1:]))))
        for a in range(0, n0, per):
            w = self.rows(slice(a, min(n0, a + per)))
            if axis1 is None:
                out[a:a + w.shape[0]].copy_(w)
            else:
                out[a:a + w.shape[0], axis1].copy_(w)
            del w


class ExpertView:
    """Stands in for experts.gate_up_proj / down_proj: `view[e]` is expert e in f32, made on use.

    Sources: packed MLX tensors (gate+up concatenated along the rows, gate first) or a dense
    HF tensor kept in its own dtype (bf16 -> f32 is exact)."""

    def __init__(self, parts=None, dense=None):
        self.parts, self.dense = parts, dense
        if dense is not None:
            self.shape = tuple(dense.shape)
        else:
            s = parts[0].shape
            self.shape = (s[0], sum(p.shape[1] for p in parts), s[2])
        self.dtype = torch.float32

    def __getitem__(self, e):
        e = int(e)
        if self.dense is not None:
            return self.dense[e].to(torch.float32)
        ws = [p.rows(e) for p in self.parts]
        return ws[0] if len(ws) == 1 else torch.cat(ws, dim=0)

    def nbytes(self):
        if self.dense is not None:
            return self.dense.numel() * self.dense.element_size()
        return sum(p.nbytes() for p in self.parts)


# --------------------------------------------------------------------------
# The HF model


def text_config(ck):
    cfg = dict(ck.cfg.get("text_config", ck.cfg))
    for k in ("quantization", "quantization_config"):
        cfg.pop(k, None)
    tie = ck.cfg.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    cfg["tie_word_embeddings"] = bool(tie)
    V = int(cfg["vocab_size"])
    for k in ("eos_token_id", "bos_token_id", "pad_token_id"):  # tiny vocabularies: keep the config valid
        v = cfg.get(k)
        if isinstance(v, int) and v >= V:
            cfg[k] = None
    return Qwen3_5MoeTextConfig(**cfg)


def mlx_source(ck, hf_name):
    """(kind, names) of the MLX tensors that make HF parameter hf_name."""
    if hf_name == "lm_head.weight":
        base = "language_model.lm_head"
    elif hf_name.startswith("model."):
        base = "language_model.model." + hf_name[len("model."):]
        if base.endswith(".weight"):
            base = base[: -len(".weight")]
    else:
        sys.exit(f"hf_full: no MLX source rule for {hf_name}")
    m = re.match(r"(.*\.mlp)\.experts\.(gate_up_proj|down_proj)$", base)
    if m:
        sw = m.group(1) + ".switch_mlp."
        mods = [sw + "gate_proj", sw + "up_proj"] if m.group(2) == "gate_up_proj" else [sw + "down_proj"]
        return ("experts", mods)
    if ck.has(base + ".scales"):
        return ("quant", [base])
    name = base + ".weight" if ck.has(base + ".weight") else base
    if not ck.has(name):
        sys.exit(f"hf_full: {hf_name}: no tensor {name} in the checkpoint")
    return ("plain", [name])


def hf_source(ck, hf_name):
    name = hf_name if hf_name == "lm_head.weight" else "model.language_model." + hf_name[len("model."):]
    if not ck.has(name):
        sys.exit(f"hf_full: {hf_name}: no tensor {name} in the checkpoint")
    return ("plain", [name])


def set_param(model, name, value):
    mod_name, _, leaf = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    if isinstance(value, torch.Tensor):
        mod._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)
    else:  # an ExpertView replaces the parameter by a plain attribute
        del mod._parameters[leaf]
        object.__setattr__(mod, leaf, value)


def load_model(d, device, dtype, packed_experts):
    """transformers' Qwen3_5MoeForCausalLM with the weights of checkpoint d, on `device`.

    dtype: parameter dtype. packed_experts: experts become ExpertViews (f32 on use) and the
    eager experts forward is selected; else they are dense `dtype` tensors (default impl)."""
    t0 = time.time()
    ck = Checkpoint(d)
    tc = text_config(ck)
    with torch.device("meta"):
        model = M.Qwen3_5MoeForCausalLM(tc)
    model.eval()
    stats = {"layout": ck.layout, "norm_not_exact_bf16": 0, "expert_bytes": 0}
    names = [n for n, _ in model.named_parameters()]
    for i, name in enumerate(names):
        shape = tuple(model.get_parameter(name).shape)
        kind, src = mlx_source(ck, name) if ck.layout == "mlx" else hf_source(ck, name)
        if kind == "experts" or (ck.layout == "hf" and ".mlp.experts." in name):
            if ck.layout == "mlx":
                parts = [QuantTensor(ck, m, device) if ck.has(m + ".scales") else None for m in src]
                if any(p is None for p in parts):  # unquantized stacked experts: dense, as stored
                    dense = torch.cat([ck.get(m + ".weight", device) for m in src], dim=1)
                    view = ExpertView(dense=dense)
                else:
                    view = ExpertView(parts=parts)
            else:
                view = ExpertView(dense=ck.get(src[0], device))
            if view.shape != shape:
                sys.exit(f"hf_full: {name}: checkpoint shape {view.shape}, model expects {shape}")
            if packed_experts:
                stats["expert_bytes"] += view.nbytes()
                set_param(model, name, view)
                continue
            out = torch.empty(shape, dtype=dtype, device=device)
            if view.dense is not None:
                out.copy_(view.dense)
            else:
                off = 0
                for p in view.parts:
                    p.into(out, axis1=slice(off, off + p.shape[1]))
                    off += p.shape[1]
            del view
            stats["expert_bytes"] += out.numel() * out.element_size()
            set_param(model, name, out)
            continue
        if kind == "quant":
            qt = QuantTensor(ck, src[0], device)
            if qt.shape != shape:
                sys.exit(f"hf_full: {name}: dequantised shape {qt.shape}, model expects {shape}")
            out = torch.empty(shape, dtype=dtype, device=device)
            qt.into(out)
            del qt
        else:
            t = ck.get(src[0], device)
            if ck.layout == "mlx":
                if name.endswith("conv1d.weight"):
                    t = t.transpose(1, 2)  # MLX [C,K,1] -> HF [C,1,K]
                if name.endswith(NORM_SUFFIXES):
                    z = t.to(torch.float32) - 1.0  # stored bf16(1+w) -> zero-centred w (exact in f32)
                    if dtype != torch.float32:
                        stats["norm_not_exact_bf16"] += int((z.to(dtype).to(torch.float32) != z).sum())
                    t = z
            if tuple(t.shape) != shape:
                sys.exit(f"hf_full: {name}: checkpoint shape {tuple(t.shape)}, model expects {shape}")
            out = t.to(dtype).contiguous()
        set_param(model, name, out)
        if (i + 1) % 200 == 0:
            log(f"loaded {i + 1}/{len(names)} parameters ({time.time() - t0:.0f}s)")
    # The rotary embedding's buffers were made on the meta device: make them for real.
    model.model.rotary_emb = M.Qwen3_5MoeTextRotaryEmbedding(config=tc).to(device)
    left = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.device.type == "meta"]
    if left:
        sys.exit(f"hf_full: parameters left on the meta device: {left[:5]}")
    skipped = [k for k in ck.where if k not in ck.used and "mtp." not in k
               and not k.startswith(("vision_tower", "model.visual", "visual."))]
    if skipped:
        sys.exit(f"hf_full: checkpoint tensors that map to no HF parameter: {skipped[:5]}")
    if packed_experts:
        model.set_experts_implementation("eager")  # the forward that reads gate_up_proj[expert_idx]
    stats["load_s"] = time.time() - t0
    stats["weight_bytes"] = stats["expert_bytes"] + sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                                                        if ".experts." not in n)
    stats["experts_implementation"] = model.config._experts_implementation
    stats["attn_implementation"] = model.config._attn_implementation
    if stats["norm_not_exact_bf16"]:
        log(f"warning: {stats['norm_not_exact_bf16']} zero-centred norm weights are not exact in {dtype}")
    return model, tc, stats


def gdn_paths():
    """Which implementation transformers bound for the Gated DeltaNet functions (closure of its wrapper)."""
    out = {}
    for fn in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
               "causal_conv1d_update"):
        f = getattr(M, fn, None)
        cells = dict(zip(f.__code__.co_freevars, f.__closure__ or [])) if f is not None and hasattr(f, "__code__") else {}
        impl = cells["implementation"].cell_contents if "implementation" in cells else f
        mod = getattr(impl, "__module__", "?") or "?"
        out[fn] = "torch reference (transformers)" if mod.startswith("transformers.") else f"{mod}.{impl.__name__}"
    return out


def synth_ids(n, V):
    return [((i * 2654435761) % (1 << 32)) % V for i in range(n)]


def fnv1a(ids):
    h = 0xcbf29ce484222325
    for t in ids:
        t &= 0xFFFFFFFF
        for b in range(4):
            h ^= (t >> (8 * b)) & 0xFF
            h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def mem_stats(device):
    if device.startswith("cuda"):
        return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(), "peak_reserved_bytes": torch.cuda.max_memory_reserved()}
    return {}


def setup_numerics():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


# --------------------------------------------------------------------------
# --check


def run_lilac(args, what):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"hf_full: lilac {what} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def nll(logits, ids):
    """Per-position NLL (f64) of ids[t+1] under logits[t], t = 0..N-2."""
    x = logits[:-1].astype(np.float64)
    m = x.max(1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(1))
    return lse - x[np.arange(len(ids) - 1), ids[1:]]


# The largest regret a replayed pick may have. Measured on the full-size synth (run 66): 3.7e-3 (lilac's KV cache
# is bf16, HF's here f32); a deliberately wrong pick per token: 0.99.
REGRET_MAX = 1e-2


def compare(got, ref, ids_np):
    """lilac's logits against HF's: top-1 agreement, perplexity of ids under each, max |dlogit|/max|logit|."""
    rel = np.abs(got - ref).max(1) / np.abs(ref).max(1)
    ppl_hf, ppl_li = float(np.exp(nll(ref, ids_np).mean())), float(np.exp(nll(got, ids_np).mean()))
    return {"ref": ref, "top1": float((got.argmax(1) == ref.argmax(1)).mean()), "rel": rel, "max_rel": float(rel.max()),
            "ppl_hf": ppl_hf, "ppl_li": ppl_li, "ppl_rel": abs(ppl_hf / ppl_li - 1),
            "dis": np.nonzero(got.argmax(1) != ref.argmax(1))[0]}


def check(a):
    setup_numerics()
    ck_cfg = json.load(open(os.path.join(a.model, "config.json")))
    V = int(ck_cfg.get("text_config", ck_cfg)["vocab_size"])
    P = min(a.prompt_len, a.n)
    t0 = time.time()
    if a.seq == "hash" or P >= a.n:
        ids = synth_ids(a.n, V)
    else:
        prompt = synth_ids(P, V)
        out = run_lilac([a.lilac, "generate", "--model", a.model, "--backend", a.backend, "--ids",
                         ",".join(map(str, prompt)), "--max-tokens", str(a.n - P), "--ignore-eos"], "generate")
        gen = [int(x) for x in out.split()]
        if len(gen) != a.n - P:
            sys.exit(f"hf_full: lilac generate gave {len(gen)} ids, expected {a.n - P}")
        ids = prompt + gen
    t1 = time.time()
    with tempfile.TemporaryDirectory() as td:
        f, fr = os.path.join(td, "lilac_logits.npy"), os.path.join(td, "lilac_routes.npy")
        run_lilac([a.lilac, "logits", "--model", a.model, "--backend", a.backend, "--ids", ",".join(map(str, ids)),
                   "--out", f] + (["--routes", fr] if a.replay else []), "logits")
        got = np.load(f)
        routes = np.load(fr) if a.replay else None  # [layer][token][k] experts lilac picked, -1: not recorded
    t2 = time.time()
    log(f"lilac ({a.backend}): sequence {t1 - t0:.1f}s, logits {t2 - t1:.1f}s")

    dtype = getattr(torch, a.dtype)
    model, tc, st = load_model(a.model, a.device, dtype, packed_experts=(dtype == torch.float32))
    log(f"HF model loaded in {st['load_s']:.1f}s ({st['layout']} layout, {a.dtype}, experts "
        f"{st['experts_implementation']}; weights {st['weight_bytes'] / 1e9:.2f} GB, of which experts "
        f"{st['expert_bytes'] / 1e9:.2f} GB)")
    gaps = []

    def router_hook(_mod, _inp, out):
        lg = out[0].float()
        k = tc.num_experts_per_tok
        s = torch.topk(lg, k + 1, dim=-1).values
        gaps.append((s[:, k - 1] - s[:, k]).cpu())

    hooks = [layer.mlp.gate.register_forward_hook(router_hook) for layer in model.model.layers]
    t3 = time.time()
    with torch.inference_mode():
        ref = model(torch.tensor([ids], device=a.device), use_cache=False).logits[0].float().cpu().numpy()
    sync(a.device)
    t4 = time.time()
    for h in hooks:
        h.remove()
    log(f"HF forward of {a.n} tokens: {t4 - t3:.1f}s")
    ids_np = np.array(ids)
    own = compare(got, ref, ids_np)

    # Routing replay: HF runs again with each MoE layer routed to the experts lilac picked, weighted by HF's own
    # router probabilities there (renormalised over the picks, as HF does over its own top-k). Random synth
    # routers have near-ties (HF's k-th and (k+1)-th probability equal to 1e-5 and closer) that rounding breaks
    # either way; one flipped expert then moves every later position through the recurrent state, so the
    # own-routing figures measure coin flips as much as arithmetic. Replayed, the check compares the
    # arithmetic; the regret (p(HF's own k-th) - min p(lilac's picks)) / p(HF's own k-th), by HF's numbers,
    # says whether lilac's picks were near-ties rather than routing mistakes.
    rep = None
    if routes is not None:
        k = tc.num_experts_per_tok
        st_rep = {"rows": 0, "differ": 0, "regret": 0.0}

        def replay_hook(li):
            def hook(_mod, _inp, out):
                lg, wts, idx = out[0], out[1], out[2]  # HF's router: (logits, top-k weights, top-k ids)
                r = torch.as_tensor(routes[li], device=lg.device, dtype=torch.long)
                have = (r[:, 0] >= 0)
                if r.shape[0] != lg.shape[0] or not bool(have.any()):
                    return out
                p = torch.softmax(lg.float(), dim=-1)  # as HF's router: softmax in f32, top-k, renormalise
                new_idx = torch.where(have[:, None], r.clamp(min=0), idx.long())
                picked = p.gather(1, new_idx)
                kth = torch.topk(p, k, dim=-1).values[:, -1]
                reg = torch.clamp((kth - picked.min(1).values) / kth, min=0)[have]
                same = (torch.sort(new_idx, 1).values == torch.sort(idx.long(), 1).values).all(1)
                st_rep["rows"] += int(have.sum())
                st_rep["differ"] += int((~same & have).sum())
                st_rep["regret"] = max(st_rep["regret"], float(reg.max()) if reg.numel() else 0.0)
                w = (picked / picked.sum(-1, keepdim=True)).to(wts.dtype)
                return (lg, w, new_idx.to(idx.dtype))
            return hook

        hooks = [layer.mlp.gate.register_forward_hook(replay_hook(li)) for li, layer in enumerate(model.model.layers)]
        t5 = time.time()
        with torch.inference_mode():
            ref_rep = model(torch.tensor([ids], device=a.device), use_cache=False).logits[0].float().cpu().numpy()
        sync(a.device)
        for h in hooks:
            h.remove()
        log(f"HF forward of {a.n} tokens with lilac's routing replayed: {time.time() - t5:.1f}s")
        rep = compare(got, ref_rep, ids_np)
        rep.update({"routed_rows": st_rep["rows"], "rows_not_hf_top_k": st_rep["differ"],
                    "worst_regret": st_rep["regret"]})
    main_ = rep if rep is not None else own
    top1, rel, ppl_hf, ppl_li, ppl_rel, dis = (main_[x] for x in ("top1", "rel", "ppl_hf", "ppl_li", "ppl_rel", "dis"))
    ref = main_["ref"]
    g = torch.cat(gaps).numpy() if gaps else np.zeros(0)
    gen_from = P - 1 if a.seq == "gen" and P < a.n else a.n
    greedy_lilac = float((got[gen_from:-1].argmax(1) == ids_np[gen_from + 1:]).mean()) if gen_from < a.n - 1 else None
    greedy_hf = float((ref[gen_from:-1].argmax(1) == ids_np[gen_from + 1:]).mean()) if gen_from < a.n - 1 else None
    ok = top1 >= 0.99 and ppl_rel <= 0.01 and bool(np.isfinite(ref).all())
    if rep is not None:
        # every row lilac recorded must have been replayed (the CUDA backend does not record a one-token last
        # chunk of a long prompt: those rows keep HF's own routing)
        recorded = int((routes[:, :, 0] >= 0).sum())
        rep["unrecorded_rows"] = int(routes[:, :, 0].size) - recorded
        ok = ok and recorded > 0 and rep["routed_rows"] == recorded and rep["worst_regret"] <= REGRET_MAX

    def gap2(row):
        top = np.partition(row, -2)[-2:]
        return float(top[1] - top[0])

    for t in dis[:8]:
        log(f"  top-1 differs at position {t}: HF {ref[t].argmax()} (top-2 gap {gap2(ref[t]):.3g}), "
            f"lilac {got[t].argmax()} (gap {gap2(got[t]):.3g})")
    res = {
        "model": a.model, "positions": a.n, "sequence": a.seq, "prompt_len": P if a.seq == "gen" else a.n,
        "hf_dtype": a.dtype, "hf_device": a.device, "lilac_backend": a.backend,
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "experts_implementation": st["experts_implementation"], "attn_implementation": st["attn_implementation"],
        "gdn_paths": gdn_paths(),
        "top1_agreement": top1, "top1_disagreements": [int(x) for x in dis[:32]],
        "ppl_hf": ppl_hf, "ppl_lilac": ppl_li, "ppl_rel_diff": ppl_rel,
        "max_rel_logit_err": float(rel.max()), "max_rel_logit_err_pos": int(rel.argmax()),
        "median_rel_logit_err": float(np.median(rel)),
        "greedy_agreement_lilac": greedy_lilac, "greedy_agreement_hf": greedy_hf,
        "routing": "replayed (lilac's experts, HF's weights)" if rep is not None else "own",
        "own_routing": {x: own[x] for x in ("top1", "ppl_rel", "max_rel")},
        "replay": {x: rep[x] for x in ("routed_rows", "unrecorded_rows", "rows_not_hf_top_k", "worst_regret")} if rep is not None else None,
        "router_token_layers": int(g.size), "router_kth_gap_min": float(g.min()) if g.size else None,
        "router_kth_gap_lt_1e-3": int((g < 1e-3).sum()), "router_kth_gap_lt_1e-2": int((g < 1e-2).sum()),
        "hf_weight_bytes": st["weight_bytes"],
        "times_s": {"lilac_sequence": t1 - t0, "lilac_logits": t2 - t1, "hf_load": st["load_s"], "hf_forward": t4 - t3},
        **mem_stats(a.device), "pass": ok,
    }
    if a.save:
        os.makedirs(a.save, exist_ok=True)
        np.save(os.path.join(a.save, "ids.npy"), ids_np.astype(np.int32))
        np.save(os.path.join(a.save, "hf_logits.npy"), ref)
        np.save(os.path.join(a.save, "lilac_logits.npy"), got)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    mem = f", HF peak {res['peak_allocated_bytes'] / 1e9:.1f} GB" if "peak_allocated_bytes" in res else ""
    print(f"hf_full check {a.model}: {a.n} positions ({a.seq}), HF transformers {transformers.__version__} "
          f"({a.device}, {a.dtype}, experts {st['experts_implementation']}) vs lilac --backend {a.backend}{mem}")
    print(f"  HF with its own routing: top-1 {own['top1']:.4f}, perplexity {own['ppl_rel']:.2e} apart, max |dlogit|/max|logit| "
          f"{own['max_rel']:.2e}")
    if rep is not None:
        print(f"  HF with lilac's routing replayed ({rep['routed_rows']} token-layers"
              + (f"; {rep['unrecorded_rows']} that lilac did not record keep HF's own" if rep["unrecorded_rows"] else "")
              + f"): {rep['rows_not_hf_top_k']} not HF's own "
              f"top-{tc.num_experts_per_tok}, worst regret {rep['worst_regret']:.2e} (<= {REGRET_MAX:g}); the figures below")
    print(f"  top-1 agreement {top1:.4f} ({len(dis)} of {a.n} differ)"
          + (f"; lilac's greedy tokens are HF's argmax at {greedy_hf:.4f} of generated positions" if greedy_hf is not None else ""))
    print(f"  perplexity HF {ppl_hf:.4f}, lilac {ppl_li:.4f}, relative difference {ppl_rel:.2e}")
    print(f"  max |dlogit|/max|logit| {rel.max():.2e} (position {rel.argmax()}), median {np.median(rel):.2e}")
    print(f"  HF router: {res['router_kth_gap_lt_1e-3']} of {g.size} token-layers with the k-th/(k+1)-th logit gap "
          f"< 1e-3 (min {res['router_kth_gap_min']:.2e})" if g.size else "  HF router: no MoE layers")
    print(f"{'PASS' if ok else 'FAIL'}: top-1 {top1:.4f} (>= 0.99), perplexity within {ppl_rel:.2%} (<= 1%)"
          + (f", routing regret {rep['worst_regret']:.2e} (<= {REGRET_MAX:g})" if rep is not None else ""))
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    return 0 if ok else 1


# --------------------------------------------------------------------------
# --bench


def bench(a):
    dtype = getattr(torch, a.dtype)
    lens = [int(x) for x in a.prompt_lens.split(",") if x]
    if "full_attention" not in text_config(Checkpoint(a.model)).layer_types:
        # transformers' hybrid cache takes the sequence length from an attention layer
        sys.exit("hf_full: --bench needs at least one full-attention layer (transformers' cache has no "
                 "length without one); use lilac synth --layers >= 4")
    model, tc, st = load_model(a.model, a.device, dtype, packed_experts=False)
    paths = gdn_paths()
    V = tc.vocab_size
    dev = a.device
    log(f"HF model loaded in {st['load_s']:.1f}s ({a.dtype}, experts {st['experts_implementation']}, "
        f"attention {st['attn_implementation']}, weights {st['weight_bytes'] / 1e9:.2f} GB)")
    print(f"backend hf-transformers {transformers.__version__} (torch {torch.__version__}, {dev}, {a.dtype}, experts "
          f"{st['experts_implementation']}, attention {st['attn_implementation']}), {a.rounds} rounds, "
          f"{a.decode_steps} decode steps")
    print("Gated DeltaNet path: " + ", ".join(f"{k} = {v}" for k, v in paths.items()))
    print("%8s %11s %7s %9s %11s %7s %18s" % ("context", "prefill/s", "spread", "TTFT ms", "decode/s", "spread", "digest"))
    results = []
    for L in lens:
        ids = torch.tensor([synth_ids(L, V)], device=dev)
        pos_prefill = torch.arange(L, device=dev)[None]  # explicit positions, as generate() passes them
        pre, dec, digests = [], [], []
        for r in range(-1, a.rounds):  # r = -1: the exact-shape warm-up
            steps = min(a.decode_steps, 4) if r < 0 else a.decode_steps
            with torch.inference_mode():
                sync(dev)
                t0 = time.perf_counter()
                out = model(input_ids=ids, position_ids=pos_prefill, use_cache=True, logits_to_keep=1)
                cache = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1)
                sync(dev)
                t1 = time.perf_counter()
                toks = []
                pos = pos_prefill[:, -1:]
                for _ in range(steps):
                    pos = pos + 1
                    out = model(input_ids=nxt[:, None], position_ids=pos, past_key_values=cache, use_cache=True)
                    nxt = out.logits[:, -1].argmax(-1)
                    toks.append(nxt)
                sync(dev)
                t2 = time.perf_counter()
            del out, cache
            if r < 0:
                continue
            pre.append(L / (t1 - t0))
            dec.append(steps / (t2 - t1))
            digests.append(fnv1a([int(x) for x in torch.cat(toks).tolist()]))

        def spread(v):
            return (max(v) - min(v)) / (sum(v) / len(v)) if v else 0.0

        mp, md = statistics.median(pre), statistics.median(dec)
        stable = len(set(digests)) == 1
        print("%8d %11.1f %6.1f%% %9.2f %11.2f %6.1f%% %016x%s" % (L, mp, 100 * spread(pre), 1e3 * L / mp, md,
                                                                  100 * spread(dec), digests[-1],
                                                                  "" if stable else " (UNSTABLE)"), flush=True)
        results.append({"prompt_len": L, "prefill_tok_s": round(mp, 2), "prefill_spread": round(spread(pre), 4),
                        "ttft_ms": round(1e3 * L / mp, 3),
                        "decode_tok_s": round(md, 3), "decode_spread": round(spread(dec), 4),
                        "token_digest": "%016x" % digests[-1], "digest_stable": stable})
    ms = mem_stats(dev)
    if ms:
        print(f"device memory: peak allocated {ms['peak_allocated_bytes'] / 1e9:.2f} GB, "
              f"peak reserved {ms['peak_reserved_bytes'] / 1e9:.2f} GB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"schema_version": 1, "backend": "hf-transformers", "model": a.model, "device": dev,
                       "dtype": a.dtype, "transformers_version": transformers.__version__,
                       "torch_version": torch.__version__, "experts_implementation": st["experts_implementation"],
                       "attn_implementation": st["attn_implementation"], "gdn_paths": paths,
                       "load_s": round(st["load_s"], 1), "weight_bytes": st["weight_bytes"], "decode_steps": a.decode_steps, "rounds": a.rounds,
                       "results": results, "device_memory_bytes": ms.get("peak_allocated_bytes", 0), **ms}, f, indent=2)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="checkpoint directory (MLX 4-bit or HF bf16 layout)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="teacher-forced logits vs lilac logits")
    mode.add_argument("--bench", action="store_true", help="prefill/decode throughput of HF")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                    help="HF parameter/activation dtype (default: float32 for --check, bfloat16 for --bench)")
    ap.add_argument("--json", help="write the results as JSON here")
    # --check
    ap.add_argument("--lilac", default="build/lilac")
    ap.add_argument("--backend", default="cuda", help="lilac backend for --check")
    ap.add_argument("--n", type=int, default=256, help="positions of the checked sequence")
    ap.add_argument("--seq", choices=["gen", "hash"], default="gen")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--save", help="--check: also save ids and both logits (.npy) in this directory")
    ap.add_argument("--no-replay", dest="replay", action="store_false",
                    help="--check: judge HF with its own routing only (default: also with lilac's routing replayed, "
                         "which decides)")
    # --bench
    ap.add_argument("--prompt-lens", default="256,1024,4096")
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.dtype is None:
        a.dtype = "float32" if a.check else "bfloat16"
    if a.n < 2 or a.decode_steps < 1 or a.rounds < 1:
        sys.exit("hf_full: --n must be >= 2, --decode-steps and --rounds >= 1")
    sys.exit(check(a) if a.check else bench(a))


if __name__ == "__main__":
    main()
