"""/metrics: valid Prometheus text (read back with the prometheus_client parser from PyPI), lilac's
own names beside vLLM's and llama.cpp's, and values that follow what the clients saw."""
import math
import re
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import Server, _finish

VLLM = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:e2e_request_latency_seconds",
        "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
        "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:request_success", "vllm:prompt_tokens",
        "vllm:generation_tokens", "vllm:request_prompt_tokens", "vllm:request_generation_tokens"]
LLAMACPP = ["llamacpp:kv_cache_usage_ratio", "llamacpp:kv_cache_tokens", "llamacpp:requests_processing",
            "llamacpp:requests_deferred", "llamacpp:prompt_tokens", "llamacpp:tokens_predicted"]
LILAC = ["lilac:queue_depth", "lilac:time_to_first_token_seconds", "lilac:prefix_cache_bytes"]


def scrape(url, **kw):
    r = httpx.get(url + "/metrics", **kw)
    assert r.status_code == 200, r.text
    text = r.text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return text, fams


def value(fams, family, sample=None, **labels):
    f = fams[family]
    for s in f.samples:
        if (sample is None or s.name == sample) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{family} {sample} {labels}")


def check_structure(text, fams):
    """What the parser lets through: one TYPE per family before its samples, valid names,
    histogram buckets cumulative with +Inf equal to _count."""
    types, seen = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert name not in types, f"two TYPE lines for {name}"
            types[name] = kind
        elif line and not line.startswith("#"):
            name = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)", line).group(1)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in types or base in types, f"sample {name} has no TYPE"
            seen.add(base if base in types else name)
    for f in fams.values():
        if f.type != "histogram":
            continue
        by_labels = {}
        for s in f.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            by_labels.setdefault(key, []).append(s)
        for ss in by_labels.values():
            buckets = [(float(s.labels["le"]), s.value) for s in ss if s.name.endswith("_bucket")]
            assert buckets == sorted(buckets) and buckets[-1][0] == math.inf, f.name
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), f"{f.name} buckets are not cumulative"
            count = [s.value for s in ss if s.name.endswith("_count")][0]
            assert counts[-1] == count, f.name


@pytest.fixture(scope="module")
def msrv():
    s = Server("--max-seq", "16384", "--alias", 'odd"name')
    yield s
    _finish(s)


def test_names_and_format(msrv):
    text, fams = scrape(msrv.url)
    for name in VLLM + LLAMACPP + LILAC:
        assert name in fams, f"{name} missing from /metrics"
    check_structure(text, fams)
    assert value(fams, "vllm:num_requests_running", model_name='odd"name') == 0


def test_values_follow_the_requests(msrv):
    _, f0 = scrape(msrv.url)
    usages = []
    for n in (3, 5, 1):
        r = httpx.post(msrv.url + "/v1/completions", json={"prompt": "hello there", "max_tokens": n, "ignore_eos": True},
                       timeout=60)
        assert r.status_code == 200
        usages.append(r.json()["usage"])
    text, f1 = scrape(msrv.url)
    check_structure(text, f1)

    def d(*a, **kw):
        return value(f1, *a, **kw) - value(f0, *a, **kw)

    gen = sum(u["completion_tokens"] for u in usages)
    prompt = sum(u["prompt_tokens"] for u in usages)
    assert d("vllm:request_success", "vllm:request_success_total", finished_reason="length") == 3
    assert d("vllm:generation_tokens", "vllm:generation_tokens_total") == gen
    assert d("vllm:prompt_tokens", "vllm:prompt_tokens_total") == prompt
    assert d("llamacpp:tokens_predicted", "llamacpp:tokens_predicted_total") == gen
    assert d("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") == 3
    assert d("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == 3
    # one inter-token gap per token after a request's first
    assert d("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == sum(
        u["completion_tokens"] - 1 for u in usages)
    assert d("vllm:request_generation_tokens", "vllm:request_generation_tokens_sum") == gen


def test_running_request_and_kv_usage(msrv):
    got = {}

    def long_stream():
        with httpx.stream("POST", msrv.url + "/v1/completions", timeout=120,
                          json={"prompt": "a b c d", "max_tokens": 16000, "ignore_eos": True, "stream": True}) as r:
            for _ in r.iter_lines():
                _, got["fams"] = scrape(msrv.url)
                return  # closing the stream cancels the request

    t = threading.Thread(target=long_stream)
    t.start()
    t.join(timeout=120)
    fams = got["fams"]
    assert value(fams, "vllm:num_requests_running") == 1 == value(fams, "llamacpp:requests_processing")
    ratio = value(fams, "llamacpp:kv_cache_usage_ratio")
    assert 0 < ratio <= 1 and value(fams, "vllm:kv_cache_usage_perc") == ratio
    slots = value(fams, "lilac:slots")
    assert ratio == pytest.approx(value(fams, "llamacpp:kv_cache_tokens") / (slots * 16384), abs=1e-6)


def test_metrics_need_the_key_unless_public(keyed_server):
    assert httpx.get(keyed_server.url + "/metrics").status_code == 401
    scrape(keyed_server.url, headers={"Authorization": "Bearer sekret-key"})
    s = Server("--api-key", "k1", "--metrics-public")
    try:
        scrape(s.url)
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "x"}).status_code == 401
    finally:
        _finish(s)
