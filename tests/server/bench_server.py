"""Benchmark of `lilac serve` on the demo model (not a test): requests/s and p50/p99
time to first token with 1, 8 and 32 concurrent streaming clients, and the HTTP
layer's per-request overhead. Usage: python tests/server/bench_server.py [--parallel 1,8]
(one server per --parallel value; LILAC_SERVE_BIN / LILAC pick the binary, as in
conftest.py). Every request has its own user message (the prefix cache only shares
the template's head); "rows/step" is tokens decoded per batched forward step."""

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from conftest import Server, _finish  # noqa: E402

USER = [{"role": "user", "content": "Tell me about the weather in Paris today."}]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def metric(url, name):
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def stream_one(url, max_tokens, ttfts, seed):
    t0 = time.perf_counter()
    first = None
    msgs = [{"role": "user", "content": f"Request {seed}. " + USER[0]["content"]}]
    with httpx.Client(timeout=300) as c, c.stream("POST", url + "/v1/chat/completions", json={
            "messages": msgs, "max_tokens": max_tokens, "stream": True, "seed": seed, "ignore_eos": True}) as r:
        for line in r.iter_lines():
            if first is None and ('"reasoning_content"' in line or '"content":"' in line.replace('"content":""', "")):
                first = time.perf_counter() - t0
    ttfts.append(first if first is not None else time.perf_counter() - t0)


def bench(parallel, a):
    s = Server("--parallel", str(parallel), "--queue", "256", "--threads", a.threads)
    try:
        with httpx.Client(base_url=s.url) as c:
            for _ in range(20):
                c.get("/health")
            n = 500
            t0 = time.perf_counter()
            for _ in range(n):
                c.get("/health")
            health_us = (time.perf_counter() - t0) / n * 1e6
            t0 = time.perf_counter()
            for _ in range(n):
                c.post("/tokenize", json={"content": "Hello, world!"})
            tok_us = (time.perf_counter() - t0) / n * 1e6
            # overhead of a generation request beyond the engine's own time
            over = []
            for i in range(30):
                t0 = time.perf_counter()
                r = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1, "cache_prompt": False}).json()
                e2e = (time.perf_counter() - t0) * 1e3
                over.append((e2e - r["timings"]["prompt_ms"] - r["timings"]["predicted_ms"]) * 1e3)
        print(f"\nserver: demo model, CPU backend, --parallel {parallel}, --threads {a.threads}, "
              f"{a.max_tokens} tokens per request")
        print(f"HTTP round trip GET /health: {health_us:.0f} us; POST /tokenize (13 bytes): {tok_us:.0f} us; "
              f"generation request overhead beyond prefill+decode: median {statistics.median(over):.0f} us")
        print("| --parallel | clients | requests | wall s | requests/s | tokens/s | TTFT p50 ms | TTFT p99 ms | rows/step "
              "| engine us/token |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for clients in (1, 8, 32):
            reqs = max(clients * 2, 8)
            ttfts = []
            sem = threading.Semaphore(clients)

            def run(i):
                with sem:
                    stream_one(s.url, a.max_tokens, ttfts, i)

            d0, b0 = metric(s.url, "llamacpp:n_decode_total"), metric(s.url, "lilac:batch_steps_total")
            e0 = metric(s.url, "llamacpp:tokens_predicted_seconds_total")
            t0 = time.perf_counter()
            ts = [threading.Thread(target=run, args=(i,)) for i in range(reqs)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            wall = time.perf_counter() - t0
            d1, b1 = metric(s.url, "llamacpp:n_decode_total"), metric(s.url, "lilac:batch_steps_total")
            e1 = metric(s.url, "llamacpp:tokens_predicted_seconds_total")
            print(f"| {parallel} | {clients} | {reqs} | {wall:.2f} | {reqs / wall:.2f} | {reqs * a.max_tokens / wall:.0f} | "
                  f"{pct(ttfts, 50) * 1e3:.1f} | {pct(ttfts, 99) * 1e3:.1f} | {(d1 - d0) / max(b1 - b0, 1):.2f} | "
                  f"{(e1 - e0) / max(d1 - d0, 1) * 1e6:.0f} |")
    finally:
        _finish(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", default="1,8", help="comma-separated --parallel values, one server each")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", default="1")
    a = ap.parse_args()
    for p in a.parallel.split(","):
        bench(int(p), a)


if __name__ == "__main__":
    main()
