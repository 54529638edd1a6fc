"""HF transformers as an outside oracle for lilac's CUDA backend (run on the device).

Loads an HF bf16 checkpoint (the official layout: model.language_model.*, fused experts) with
transformers' own Qwen3.5-MoE text model in float32, computes teacher-forced logits for the
given ids, and compares them with `lilac logits --backend cuda` on the same directory:
top-1 agreement and max |dlogit| / max |logit| per position.

    python3 tools/device/hf_check.py HF_DIR [--lilac build/lilac] [--n 64] [--device cuda|cpu]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as M
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig


def load_hf_text_model(d, device):
    cfg = json.load(open(os.path.join(d, "config.json")))
    tc = Qwen3_5MoeTextConfig(**cfg.get("text_config", cfg))
    model = M.Qwen3_5MoeForCausalLM(tc).to(torch.float32)
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    sd = {}
    for f in files:
        for k, v in load_file(os.path.join(d, f)).items():
            if k.startswith("model.language_model."):
                sd["model." + k[len("model.language_model."):]] = v.float()
            elif k == "lm_head.weight":
                sd[k] = v.float()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    if missing or unexpected:
        sys.exit(f"hf_check: state dict mismatch: missing {missing[:5]} unexpected {unexpected[:5]}")
    return model.to(device).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--lilac", default="build/lilac")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    model = load_hf_text_model(a.hf_dir, a.device)
    V = model.config.vocab_size
    ids = [(i * 2654435761 >> 7) % V for i in range(a.n)]
    with torch.no_grad():
        ref = model(torch.tensor([ids], device=a.device)).logits[0].float().cpu().numpy()
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "l.npy")
        p = subprocess.run([a.lilac, "logits", "--model", a.hf_dir, "--backend", a.backend, "--ids",
                            ",".join(map(str, ids)), "--out", out], capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"hf_check: lilac failed: {p.stderr}")
        got = np.load(out)
    rel = np.abs(got - ref).max(1) / np.abs(ref).max(1)
    top1 = float((got.argmax(1) == ref.argmax(1)).mean())
    ok = top1 >= 0.99 and rel.max() <= 2e-2
    print(f"hf_check {a.hf_dir}: {a.n} positions, top-1 agreement {top1:.4f}, max rel err {rel.max():.2e} "
          f"(median {np.median(rel):.2e}) vs HF transformers {__import__('transformers').__version__} ({a.device}, f32)")
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
