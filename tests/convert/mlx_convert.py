#!/usr/bin/env python3
"""The oracle for `lilac convert`: mlx-lm's own conversion of an HF checkpoint.

Does exactly what ``mlx_lm.convert(hf_path, mlx_path, quantize=True, q_bits, q_group_size)``
does (mlx_lm/convert.py), minus loading and saving the tokenizer (the random test
checkpoints have none) and the model card: ``load_model`` (lazy, with the model's
``sanitize``), the dtype cast from the config (``cast_predicate`` keeps ``A_log``),
``quantize_model`` (the model's ``quant_predicate``: 8-bit ``mlp.gate`` and
``shared_expert_gate``), ``save_model`` and ``save_config``, then copies ``*.py`` and
``generation_config.json`` as ``mlx_lm.utils.save`` does.

Usage: mlx_convert.py HF_DIR OUT_DIR [--bits 4] [--group-size 64]
"""
import argparse
import contextlib
import glob
import shutil
import sys
from pathlib import Path


def convert(hf, out, bits=4, group_size=64):
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.convert import MODEL_CONVERSION_DTYPES
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    hf, out = Path(hf), Path(out)
    model, config = load_model(hf, lazy=True)
    dtype = config.get("torch_dtype", None)
    if dtype is None and (tc := config.get("text_config", None)):
        dtype = tc.get("dtype", None)
    if dtype in MODEL_CONVERSION_DTYPES:
        dt = getattr(mx, dtype)
        cast_predicate = getattr(model, "cast_predicate", lambda _: True)

        def set_dtype(k, v):
            if cast_predicate(k) and mx.issubdtype(v.dtype, mx.floating):
                return v.astype(dt)
            return v

        model.update(tree_map_with_path(set_dtype, model.parameters()))
    with contextlib.redirect_stdout(sys.stderr):
        model, config = quantize_model(model, config, group_size, bits, mode="affine")
    save_model(out, model, donate_model=True)
    save_config(config, config_path=out / "config.json", keep_vision_config="vision_tower" in getattr(model, "model", {}))
    for p in ["*.py", "generation_config.json"]:
        for f in glob.glob(str(hf / p)):
            shutil.copy(f, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf")
    ap.add_argument("out")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    a = ap.parse_args()
    convert(a.hf, a.out, a.bits, a.group_size)


if __name__ == "__main__":
    main()
