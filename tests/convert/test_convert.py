"""`lilac convert` against mlx-lm's own conversion (the outside oracle: MLX from PyPI).

Random checkpoints in the official bf16 layout (make_hf.py) are converted twice — by
`lilac convert` and by mlx-lm (mlx_convert.py: load_model with sanitize, cast, quantize_model
with the model's quant_predicate, save_model, save_config) — and compared:
config.json and model.safetensors.index.json byte for byte, every tensor's name, dtype,
shape and bytes, the shard split, the header entries. Edge groups (all-equal, all-zero,
all-negative, huge, tiny, subnormal, exact half-way ties) and non-default bits/group sizes
go through the same comparison; non-finite weights, missing shards, unexpected tensors,
dtype/shape mismatches, a full disk and an existing output are refused; an interrupted
run leaves no valid-looking checkpoint and a re-run completes. The converted checkpoint's
logits from `lilac logits` equal those of the mlx-lm-converted one.

LILAC_CONVERT_REAL=0 skips the case at the real per-layer dimensions (2 layers, ~3.3 GB).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import make_hf  # noqa: E402

LILAC = os.environ.get("LILAC", str(REPO / "build" / "lilac"))
if not os.path.isabs(LILAC):
    LILAC = str(REPO / LILAC)


def lilac_convert(src, dst, *args, env=None, check=True):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([LILAC, "convert", "--from", str(src), "--to", str(dst), *args], capture_output=True, text=True,
                       env=e)
    if check and r.returncode != 0:
        raise AssertionError(f"lilac convert failed ({r.returncode}):\n{r.stderr}")
    return r


def mlx_convert(src, dst, bits=4, group=64):
    """mlx-lm's conversion, in a child process (frees MLX's memory)."""
    r = subprocess.run([sys.executable, str(HERE / "mlx_convert.py"), str(src), str(dst), "--bits", str(bits),
                        "--group-size", str(group)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return dst


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return h, 8 + n


def tensors(d):
    """name -> (file, dtype, shape, offset, nbytes) over every shard of directory d."""
    out = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        h, base = read_header(f)
        for k, v in h.items():
            if k == "__metadata__":
                continue
            b, e = v["data_offsets"]
            out[k] = (f.name, v["dtype"], tuple(v["shape"]), base + b, e - b)
    return out


def read_bytes(d, t):
    with open(Path(d) / t[0], "rb") as f:
        f.seek(t[3])
        return f.read(t[4])


def assert_same_checkpoint(ours, ref):
    """Everything mlx-lm wrote, identical; returns the number of tensors compared."""
    for name in ("config.json", "model.safetensors.index.json"):
        a, b = (Path(ours) / name).read_bytes(), (Path(ref) / name).read_bytes()
        assert a == b, f"{name} differs:\n--- lilac\n{a[:2000].decode()}\n--- mlx-lm\n{b[:2000].decode()}"
    ref_files = sorted(p.name for p in Path(ref).glob("*.safetensors"))
    assert sorted(p.name for p in Path(ours).glob("*.safetensors")) == ref_files
    for f in ref_files:
        ha, _ = read_header(Path(ours) / f)
        hb, _ = read_header(Path(ref) / f)
        assert ha["__metadata__"] == hb["__metadata__"]
        strip = lambda h: {k: (v["dtype"], v["shape"]) for k, v in h.items() if k != "__metadata__"}  # noqa: E731
        assert strip(ha) == strip(hb), f"{f}: header entries differ"
    ta, tb = tensors(ours), tensors(ref)
    assert set(ta) == set(tb), f"names differ: only lilac {sorted(set(ta) - set(tb))[:5]}, only mlx {sorted(set(tb) - set(ta))[:5]}"
    bad = []
    for k in sorted(tb):
        a, b = ta[k], tb[k]
        if a[:3] != b[:3] or read_bytes(ours, a) != read_bytes(ref, b):
            bad.append(k)
    if bad:
        k = bad[0]
        a, b = ta[k], tb[k]
        dt = np.uint32 if b[1] == "U32" else (np.float32 if b[1] == "F32" else np.uint16)
        x, y = np.frombuffer(read_bytes(ours, a), dt), np.frombuffer(read_bytes(ref, b), dt)
        diff = np.nonzero(x != y)[0] if x.shape == y.shape else []
        raise AssertionError(f"{len(bad)} tensors differ, first {k} {a[:3]} vs {b[:3]}: "
                             f"{len(diff)} elements, first at {diff[:5]}: {x[diff[:5]]} vs {y[diff[:5]]}")
    return len(tb)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("convert")


@pytest.fixture(scope="module")
def tiny(work):
    hf = make_hf.write_hf(work / "tiny-hf", make_hf.TINY, seed=1)
    return hf, mlx_convert(hf, work / "tiny-mlx")


def test_tiny_identical(tiny, work):
    hf, ref = tiny
    out = work / "tiny-lilac"
    lilac_convert(hf, out)
    n = assert_same_checkpoint(out, ref)
    assert n > 100
    # tokenizer and template files copied verbatim
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "vocab.json", "merges.txt",
              "generation_config.json"):
        assert (out / f).read_bytes() == (hf / f).read_bytes(), f
    assert not any(p.name.endswith(".lilac-partial") for p in work.iterdir())
    names = set(tensors(out))
    assert not any("mtp" in k or "visual" in k for k in names)
    cfg = json.loads((out / "config.json").read_text())
    assert "vision_config" not in cfg and cfg["quantization"]["bits"] == 4
    assert cfg["quantization"]["language_model.model.layers.0.mlp.gate"] == {"group_size": 64, "bits": 8}


def test_threads_and_shards_do_not_change_bytes(tiny, work):
    hf, ref = tiny
    out1, out2 = work / "t1", work / "t3"
    lilac_convert(hf, out1, "--threads", "1")
    lilac_convert(hf, out2, "--threads", "3")
    assert_same_checkpoint(out1, ref)
    assert_same_checkpoint(out2, ref)


def test_logits_equal(tiny, work):
    hf, ref = tiny
    out = work / "tiny-lilac-logits"
    lilac_convert(hf, out)
    ids = "1,17,300,5,511,42,7,99,128,256,3,0"
    la, lb = work / "la.npy", work / "lb.npy"
    for d, f in ((out, la), (ref, lb)):
        r = subprocess.run([LILAC, "logits", "--model", str(d), "--ids", ids, "--out", str(f)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
    a, b = np.load(la), np.load(lb)
    assert a.shape == (12, 512) and np.isfinite(a).all()
    assert np.array_equal(a, b)


def edge_rows(n_rows, width, rng):
    """Rows made of special groups of 64: each row one kind, scaled."""
    kinds = []
    rows = np.zeros((n_rows, width), np.float32)
    for r in range(n_rows):
        k = r % 12
        g = rng.standard_normal(width).astype(np.float32)
        if k == 0:
            g[:] = np.float32(0.3721)  # all equal, positive
        elif k == 1:
            g[:] = 0.0  # all zero
        elif k == 2:
            g = -np.abs(g) - 0.01  # all negative
        elif k == 3:
            g = g * np.float32(1e37)  # huge (range overflows to inf in some groups)
        elif k == 4:
            g = g * np.float32(1e-30)  # tiny: range below eps
        elif k == 5:
            g = g * np.float32(1e-39)  # subnormal bf16 values
        elif k == 6:
            g = np.tile(np.arange(16, dtype=np.float32), width // 16)[:width]  # on the grid: 0..15
            g[1::4] += 0.5  # exact half-way ties -> round half to even
        elif k == 7:
            g[:] = np.float32(-2.5)  # all equal, negative
        elif k == 8:
            g = np.abs(g)  # all positive
        elif k == 9:
            g[::2] = np.float32(3.0e38)
            g[1::2] = np.float32(-3.0e38)  # max magnitudes: range overflows
        elif k == 10:
            g[:] = 0.0
            g[5] = np.float32(1e-3)  # a single nonzero
        else:
            g = g * np.float32(10.0 ** rng.integers(-20, 20))
        rows[r] = g
        kinds.append(k)
    return rows


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32), (2, 128)])
def test_edge_groups(work, bits, group):
    g = make_hf.TINY
    rng = np.random.default_rng(7)
    P = "model.language_model."
    ov = {
        P + "embed_tokens.weight": edge_rows(g["vocab_size"], g["hidden_size"], rng),
        P + "layers.0.mlp.gate.weight": edge_rows(g["num_experts"], g["hidden_size"], rng),  # 8-bit
        P + "layers.0.mlp.experts.gate_up_proj": edge_rows(16 * 128, 128, rng).reshape(16, 128, 128),
        "lm_head.weight": edge_rows(g["vocab_size"], g["hidden_size"], rng)[::-1],
        P + "layers.0.input_layernorm.weight": np.array([0, -1, 1, 0.5, -0.5, 1e-3, -1e-3, 2.0] * 16, np.float32),
    }
    hf = make_hf.write_hf(work / f"edge-hf-{bits}-{group}", g, seed=2, override=ov)
    ref = mlx_convert(hf, work / f"edge-mlx-{bits}-{group}", bits, group)
    out = work / f"edge-lilac-{bits}-{group}"
    lilac_convert(hf, out, "--bits", str(bits), "--group-size", str(group))
    assert_same_checkpoint(out, ref)


def test_f32_small_tensors(work):
    """Qwen3.5 stores A_log and the gated norm in F32: A_log stays F32 (cast_predicate), the rest is cast."""
    hf = make_hf.write_hf(work / "f32-hf", make_hf.TINY, seed=3, f32=("A_log", "linear_attn.norm.weight",
                                                                       "post_attention_layernorm.weight",
                                                                       "shared_expert.up_proj.weight"))
    ref = mlx_convert(hf, work / "f32-mlx")
    out = work / "f32-lilac"
    lilac_convert(hf, out)
    assert_same_checkpoint(out, ref)
    t = tensors(out)
    assert t["language_model.model.layers.0.linear_attn.A_log"][1] == "F32"


@pytest.mark.parametrize("what,value", [("nan", np.nan), ("inf", np.inf), ("-inf", -np.inf)])
def test_nonfinite_refused(work, what, value):
    g = make_hf.TINY
    P = "model.language_model."
    name = P + "layers.1.mlp.experts.down_proj"
    x = np.zeros((16, 128, 64), np.float32) + 0.01
    x[3, 17, 40] = value
    hf = make_hf.write_hf(work / f"nf-hf-{what}", g, seed=4, override={name: x})
    out = work / f"nf-out-{what}"
    r = lilac_convert(hf, out, check=False)
    assert r.returncode != 0
    assert name in r.stderr and "[3,17,40]" in r.stderr, r.stderr
    assert not out.exists() and not Path(str(out) + ".lilac-partial").exists()


def test_nonfinite_norm_refused(work):
    P = "model.language_model."
    x = np.zeros(128, np.float32)
    x[9] = np.nan
    hf = make_hf.write_hf(work / "nfn-hf", make_hf.TINY, seed=4, override={P + "norm.weight": x})
    r = lilac_convert(hf, work / "nfn-out", check=False)
    assert r.returncode != 0 and P + "norm.weight[9]" in r.stderr and "not finite" in r.stderr, r.stderr


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite_tensor(d, name, dtype=None, shape=None):
    """Rewrite one shard with tensor `name` given another dtype/shape header entry (data re-laid out)."""
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    f = d / idx["weight_map"][name]
    h, base = read_header(f)
    data = f.read_bytes()
    items = []
    for k, v in sorted(((k, v) for k, v in h.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]):
        b = data[base + v["data_offsets"][0]: base + v["data_offsets"][1]]
        dt, sh = v["dtype"], v["shape"]
        if k == name:
            dt = dtype or dt
            sh = shape or sh
            n = int(np.prod(sh)) * (4 if dt == "F32" else 2)
            b = (b * (n // max(1, len(b)) + 1))[:n]
        items.append((k, dt, sh, len(b), (lambda b=b: iter([b]))))
    make_hf.write_safetensors(f, items)


def test_refusals(tiny, work):
    hf, _ = tiny
    P = "model.language_model."
    # missing shard
    d = _copy(hf, work / "r-missing")
    (d / "model-00002-of-00002.safetensors").unlink()
    r = lilac_convert(d, work / "r-missing-out", check=False)
    assert r.returncode != 0 and "model-00002-of-00002.safetensors" in r.stderr, r.stderr
    # unexpected tensor
    d = work / "r-unexpected"
    make_hf.write_hf(d, make_hf.TINY, seed=1)
    _rewrite_tensor(d, P + "layers.0.input_layernorm.weight")
    h, _ = read_header(d / "model-00001-of-00002.safetensors")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    # add a stray tensor to shard 1
    f = d / "model-00001-of-00002.safetensors"
    h, base = read_header(f)
    data = f.read_bytes()
    items = [(k, v["dtype"], v["shape"], v["data_offsets"][1] - v["data_offsets"][0],
              (lambda b=data[base + v["data_offsets"][0]: base + v["data_offsets"][1]]: iter([b])))
             for k, v in h.items() if k != "__metadata__"]
    items.sort(key=lambda it: it[0])
    items.append((P + "layers.0.mlp.bogus.weight", "BF16", [4], 8, lambda: iter([b"\0" * 8])))
    make_hf.write_safetensors(f, items)
    idx["weight_map"][P + "layers.0.mlp.bogus.weight"] = f.name
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    r = lilac_convert(d, work / "r-unexpected-out", check=False)
    assert r.returncode != 0 and "unexpected tensor" in r.stderr and "bogus" in r.stderr, r.stderr
    # dtype mismatch
    d = _copy(hf, work / "r-dtype")
    _rewrite_tensor(d, P + "layers.0.linear_attn.in_proj_z.weight", dtype="F16")
    r = lilac_convert(d, work / "r-dtype-out", check=False)
    assert r.returncode != 0 and "in_proj_z.weight" in r.stderr and "F16" in r.stderr, r.stderr
    # shape mismatch
    d = _copy(hf, work / "r-shape")
    _rewrite_tensor(d, P + "layers.2.mlp.experts.down_proj", shape=[16, 128, 32])
    r = lilac_convert(d, work / "r-shape-out", check=False)
    assert r.returncode != 0 and "down_proj" in r.stderr and "[16,128,64]" in r.stderr, r.stderr
    # missing tensor
    d = work / "r-missing-t"
    make_hf.write_hf(d, make_hf.TINY, seed=1, drop=(P + "layers.3.self_attn.k_norm.weight",))
    r = lilac_convert(d, work / "r-missing-t-out", check=False)
    assert r.returncode != 0 and "k_norm.weight is missing" in r.stderr, r.stderr
    # not enough disk
    r = lilac_convert(hf, work / "r-disk-out", env={"LILAC_CONVERT_FREE_BYTES": "100000"}, check=False)
    assert r.returncode != 0 and "not enough free disk space" in r.stderr, r.stderr
    assert not (work / "r-disk-out").exists() and not (work / "r-disk-out.lilac-partial").exists()
    # existing output
    (work / "r-exists").mkdir()
    (work / "r-exists" / "x").write_text("x")
    r = lilac_convert(hf, work / "r-exists", check=False)
    assert r.returncode != 0 and "already exists" in r.stderr, r.stderr
    # already quantized input
    r = lilac_convert(work / "tiny-mlx", work / "r-q-out", check=False)
    assert r.returncode != 0 and "already quantized" in r.stderr, r.stderr
    # bad options
    r = lilac_convert(hf, work / "r-bits-out", "--bits", "3", check=False)
    assert r.returncode != 0 and "--bits 3" in r.stderr, r.stderr


def test_interrupted_then_rerun(tiny, work):
    hf, ref = tiny
    out = work / "int-out"
    r = lilac_convert(hf, out, "--threads", "1", env={"LILAC_CONVERT_DIE_AFTER": "20"}, check=False)
    assert r.returncode == 3
    assert not out.exists()  # nothing that looks like a checkpoint
    partial = Path(str(out) + ".lilac-partial")
    assert partial.exists() and not (partial / "config.json").exists()
    r = lilac_convert(hf, out)
    assert "interrupted run" in r.stderr
    assert not partial.exists()
    assert_same_checkpoint(out, ref)


def test_stray_mtp_dropped(tiny, work):
    """A stray mtp.* tensor or two is no MTP head: dropped, as mlx-lm drops it, with or without
    --no-mtp (a whole head's sidecar: tests/oracle/test_mtp.py)."""
    hf, ref = tiny
    for flag in ((), ("--no-mtp",)):
        out = work / ("mtp-out" + "".join(flag))
        lilac_convert(hf, out, *flag)
        assert_same_checkpoint(out, ref)
        assert not (out / "mtp.safetensors").exists()


@pytest.mark.skipif(os.environ.get("LILAC_CONVERT_REAL", "1") == "0", reason="LILAC_CONVERT_REAL=0")
def test_real_dimensions(work):
    """One linear-attention and one full-attention layer at the real dimensions (256 experts,
    hidden 2048), reduced vocabulary; every tensor identical to mlx-lm's."""
    g = dict(make_hf.REAL, num_hidden_layers=2, full_attention_interval=2, vocab_size=4096)
    hf = make_hf.write_hf(work / "real-hf", g, seed=5, n_shards=3)
    out = work / "real-lilac"
    lilac_convert(hf, out)
    ref = mlx_convert(hf, work / "real-mlx")
    shutil.rmtree(hf)
    n = assert_same_checkpoint(out, ref)
    assert n > 50
    shutil.rmtree(out)
    shutil.rmtree(ref)
