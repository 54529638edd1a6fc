"""The MTP head (spec mtp.md) against an outside reference, and its loader.

- lilac's CPU MTP logits (`lilac logits --mtp`: the shifted pass over the prompt and
  chained greedy drafts) against tools/oracle/np_mtp.py, a float64 transcription of
  spec §2, on the tiny oracle case with a random head written here in the official
  forms: Qwen3.6's fused experts and Qwen3.5's per-expert tensors (same numbers, so
  both must match the same reference). Bar: per row max|got - ref| / max|ref| <= 1e-4.
- the loader against the real names and shapes (spec §1.2 / §1.3, written out here)
  at the real geometry: sparse zero-filled sidecars beside a `lilac synth` model;
  `lilac info` must report the head and its bf16 bytes (1,689,281,536 for 3.6).
"""

import json
import shutil
import struct

import numpy as np
import pytest

from lilac_oracle import describe, get_case, run_lilac

import np_mtp

REL_TOL = 1e-4
K = 4  # chained drafts


def bf16(a):
    """float -> bf16 bits (round to nearest even) as uint16."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_st(path, tensors, sparse=False):
    """A safetensors file; tensors: name -> (dtype, shape, uint16 array or None for zeros)."""
    hdr, off = {}, 0
    for name, (dt, shape, _) in tensors.items():
        n = 2 * int(np.prod(shape))
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        if sparse:
            f.truncate(8 + len(h) + off)
            return
        for _, (_, _, a) in tensors.items():
            f.write(np.ascontiguousarray(a).tobytes())


def head_tensors(tc, rng, per_expert):
    """A random head in the official bf16 form (norms stored as w)."""
    H, E, I, SI = tc["hidden_size"], tc["num_experts"], tc["moe_intermediate_size"], tc["shared_expert_intermediate_size"]
    nh, nkv, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]

    def mat(shape, gain=1.0):
        return bf16(rng.standard_normal(shape) * gain / np.sqrt(shape[-1]))

    def norm(n, mean=0.0):
        return bf16(mean + 0.1 * rng.standard_normal(n))

    p = "mtp.layers.0."
    t = {
        "mtp.fc.weight": mat((H, 2 * H)),
        "mtp.pre_fc_norm_embedding.weight": norm(H, -0.7),  # gains ~0.3 / ~0.5, as the real head's (spec §1.4)
        "mtp.pre_fc_norm_hidden.weight": norm(H, -0.5),
        "mtp.norm.weight": norm(H, 0.9),
        p + "input_layernorm.weight": norm(H),
        p + "post_attention_layernorm.weight": norm(H),
        p + "self_attn.q_proj.weight": mat((2 * nh * hd, H)),
        p + "self_attn.k_proj.weight": mat((nkv * hd, H)),
        p + "self_attn.v_proj.weight": mat((nkv * hd, H)),
        p + "self_attn.o_proj.weight": mat((H, nh * hd)),
        p + "self_attn.q_norm.weight": norm(hd),
        p + "self_attn.k_norm.weight": norm(hd),
        p + "mlp.gate.weight": mat((E, H), 2.0),
        p + "mlp.shared_expert.gate_proj.weight": mat((SI, H)),
        p + "mlp.shared_expert.up_proj.weight": mat((SI, H)),
        p + "mlp.shared_expert.down_proj.weight": mat((H, SI)),
        p + "mlp.shared_expert_gate.weight": mat((1, H)),
    }
    gate_up, down = mat((E, 2 * I, H)), mat((E, H, I))
    if per_expert:
        for e in range(E):
            t[p + f"mlp.experts.{e}.gate_proj.weight"] = gate_up[e, :I]
            t[p + f"mlp.experts.{e}.up_proj.weight"] = gate_up[e, I:]
            t[p + f"mlp.experts.{e}.down_proj.weight"] = down[e]
    else:
        t[p + "mlp.experts.gate_up_proj"] = gate_up
        t[p + "mlp.experts.down_proj"] = down
    return {k: ("BF16", v.shape, v) for k, v in t.items()}


@pytest.fixture(scope="module")
def tiny():
    return get_case("tiny")


def model_with_head(tiny, tmp, per_expert):
    d = tmp / ("per-expert" if per_expert else "fused")
    shutil.copytree(tiny.mlx_dir, d)
    tc = json.loads((d / "config.json").read_text())["text_config"]
    write_st(d / "mtp.safetensors", head_tensors(tc, np.random.default_rng(50), per_expert))
    return d


def lilac_mtp(model, ids, tmp):
    out, mout = tmp / "logits.npy", tmp / "mtp.npy"
    proc = run_lilac(["logits", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out, "--mtp", mout,
                      "--drafts", K])
    assert proc.returncode == 0, describe(proc)
    return np.load(mout), np.load(out)


def rel(got, ref):
    return np.abs(got.astype(np.float64) - ref).max(1) / np.abs(ref).max(1)


@pytest.mark.parametrize("per_expert", [False, True], ids=["fused-3.6", "per-expert-3.5"])
def test_mtp_logits_vs_numpy(tiny, tmp_path, monkeypatch, per_expert):
    monkeypatch.setenv("LILAC_CPU_KERNELS", "ref")  # the f32 reference products
    d = model_with_head(tiny, tmp_path, per_expert)
    ids = [int(i) for i in tiny.ids[:48]]
    got, main = lilac_mtp(d, ids, tmp_path)
    ref, ref_main = np_mtp.mtp_logits(tiny.mlx_dir, d, ids, K)
    assert got.shape == ref.shape == (len(ids) + K - 1, ref_main.shape[1])
    assert rel(main, ref_main).max() <= REL_TOL
    assert main[-1].argmax() == ref_main[-1].argmax()
    r = rel(got, ref)
    assert r.max() <= REL_TOL, f"MTP logits: max rel err {r.max():.3e} at row {int(r.argmax())} (bar {REL_TOL:g})"
    # the chained rows used lilac's own drafts: they must be the reference's
    assert (got.argmax(1)[len(ids) - 1:] == ref.argmax(1)[len(ids) - 1:]).all()


def test_mtp_reference_is_sensitive(tiny, tmp_path):
    """The bar can fail: the reference with the concat order or the norm offset wrong differs by far more."""
    d = model_with_head(tiny, tmp_path, False)
    ids = [int(i) for i in tiny.ids[:16]]
    ref, _ = np_mtp.mtp_logits(tiny.mlx_dir, d, ids, 1)
    orig = np_mtp.load_head

    def swapped(dd, tc):
        W = orig(dd, tc)
        W["mtp.pre_fc_norm_embedding.weight"], W["mtp.pre_fc_norm_hidden.weight"] = (
            W["mtp.pre_fc_norm_hidden.weight"], W["mtp.pre_fc_norm_embedding.weight"])
        return W

    np_mtp.load_head = swapped
    try:
        bad, _ = np_mtp.mtp_logits(tiny.mlx_dir, d, ids, 1)
    finally:
        np_mtp.load_head = orig
    assert rel(bad, ref).max() > 100 * REL_TOL


# ---- the loader at the real geometry ------------------------------------------------------------

REAL = dict(H=2048, E=256, I=512, SI=512, Q=8192, KV=512, O=4096, HD=256)


def real_head(per_expert):
    """spec §1.2 (Qwen3.6, 19 tensors) / §1.3 (Qwen3.5, 785): names and shapes, bf16."""
    H, E, I, SI = REAL["H"], REAL["E"], REAL["I"], REAL["SI"]
    p = "mtp.layers.0."
    s = {
        "mtp.pre_fc_norm_embedding.weight": (H,), "mtp.pre_fc_norm_hidden.weight": (H,), "mtp.fc.weight": (H, 2 * H),
        p + "input_layernorm.weight": (H,), p + "self_attn.q_proj.weight": (REAL["Q"], H),
        p + "self_attn.k_proj.weight": (REAL["KV"], H), p + "self_attn.v_proj.weight": (REAL["KV"], H),
        p + "self_attn.q_norm.weight": (REAL["HD"],), p + "self_attn.k_norm.weight": (REAL["HD"],),
        p + "self_attn.o_proj.weight": (H, REAL["O"]), p + "post_attention_layernorm.weight": (H,),
        p + "mlp.gate.weight": (E, H), p + "mlp.shared_expert.gate_proj.weight": (SI, H),
        p + "mlp.shared_expert.up_proj.weight": (SI, H), p + "mlp.shared_expert.down_proj.weight": (H, SI),
        p + "mlp.shared_expert_gate.weight": (1, H), "mtp.norm.weight": (H,),
    }
    if per_expert:
        for e in range(E):
            s[p + f"mlp.experts.{e}.gate_proj.weight"] = (I, H)
            s[p + f"mlp.experts.{e}.up_proj.weight"] = (I, H)
            s[p + f"mlp.experts.{e}.down_proj.weight"] = (H, I)
    else:
        s[p + "mlp.experts.gate_up_proj"] = (E, 2 * I, H)
        s[p + "mlp.experts.down_proj"] = (E, H, I)
    return {k: ("BF16", v, None) for k, v in s.items()}


@pytest.fixture(scope="module")
def real_synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp-real") / "synth"
    proc = run_lilac(["synth", "--out", d, "--layers", "1", "--vocab", "512"])
    assert proc.returncode == 0, describe(proc)
    return d


@pytest.mark.parametrize("per_expert", [False, True], ids=["fused-3.6", "per-expert-3.5"])
def test_mtp_loader_real_names(real_synth, per_expert):
    t = real_head(per_expert)
    assert len(t) == (785 if per_expert else 19)
    write_st(real_synth / "mtp.safetensors", t, sparse=True)
    try:
        proc = run_lilac(["info", "--model", real_synth])
    finally:
        (real_synth / "mtp.safetensors").unlink()
    assert proc.returncode == 0, describe(proc)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("mtp"))
    assert "1689.3 MB" in line, line  # 844,640,768 bf16 parameters (spec §1.2)
    assert ("per" if per_expert else "fused") in line.split(",")[-1], line


def test_mtp_loader_refuses_incomplete_head(real_synth):
    t = real_head(False)
    del t["mtp.layers.0.mlp.experts.down_proj"]
    write_st(real_synth / "mtp.safetensors", t, sparse=True)
    try:
        proc = run_lilac(["info", "--model", real_synth])
    finally:
        (real_synth / "mtp.safetensors").unlink()
    assert proc.returncode != 0 and "mtp.layers.0.mlp.experts.down_proj" in proc.stderr, describe(proc)


# ---- lilac convert: the head in mtp.safetensors --------------------------------------------------


def convert(args):
    proc = run_lilac(["convert", "--quiet"] + [str(a) for a in args])
    assert proc.returncode == 0, describe(proc)


def test_convert_mtp_sidecar(tiny, tmp_path, monkeypatch):
    """Default: the head goes to mtp.safetensors (4-bit, gates 8-bit, norms 1+w) and every other file is
    the --no-mtp conversion's, byte for byte; --mtp-only writes the same sidecar into that directory;
    lilac's MTP logits on the converted head match the reference reading the same file."""
    hf = tmp_path / "hf"
    shutil.copytree(tiny.hf_dir, hf)
    tc = json.loads((hf / "config.json").read_text())["text_config"]
    head = head_tensors(tc, np.random.default_rng(51), False)
    del head["mtp.fc.weight"]  # the twin's shards carry it already
    write_st(hf / "mtp.safetensors", head)
    full, plain = tmp_path / "full", tmp_path / "plain"
    convert(["--from", hf, "--to", full])
    convert(["--from", hf, "--to", plain, "--no-mtp"])
    files = sorted(p.name for p in plain.iterdir())
    assert sorted(p.name for p in full.iterdir()) == sorted(files + ["mtp.safetensors"])
    for f in files:
        assert (full / f).read_bytes() == (plain / f).read_bytes(), f
    shutil.copytree(plain, tmp_path / "main")  # the reference's main model: no sidecar for np_ref to read
    convert(["--from", hf, "--to", plain, "--mtp-only"])
    assert (plain / "mtp.safetensors").read_bytes() == (full / "mtp.safetensors").read_bytes()
    names = np_mtp.np_ref.read_safetensors(full / "mtp.safetensors")
    assert names["mtp.layers.0.mlp.gate.weight"].shape == (tc["num_experts"], tc["hidden_size"] // 4)  # 8-bit
    assert names["mtp.layers.0.mlp.switch_mlp.gate_proj.weight"].shape[-1] == tc["hidden_size"] // 8  # 4-bit
    monkeypatch.setenv("LILAC_CPU_KERNELS", "ref")
    ids = [int(i) for i in tiny.ids[:32]]
    got, _ = lilac_mtp(full, ids, tmp_path)
    ref, _ = np_mtp.mtp_logits(tmp_path / "main", full, ids, K)
    r = rel(got, ref)
    assert r.max() <= REL_TOL, f"converted MTP head: max rel err {r.max():.3e} at row {int(r.argmax())}"
