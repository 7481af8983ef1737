"""Fuzz `kbrouter serve` and `kbrouter serve-retrieval` on loopback: seeded bad requests mixed with valid ones.

    python benchmarks/fuzz_servers.py                         # 1500 requests per server, 2/3 of them bad
    python benchmarks/fuzz_servers.py --requests 3000 --seed 7 --concurrency 32

The policy server runs over a deterministic fake policy (the server is under test: `tests/chaos/fuzz.py`
FuzzPolicy, whose reply is a pure function of the text and sampling fields, and which breaks a whole batched call on
`poison`); the retrieval service over the real demo text KB (MiniLM + FAISS + BM25, 300 Wikipedia paragraphs).
Every probe the issue lists is among the requests. Prints, per server: requests sent, responses by status, 5xx
caused by bad input (must be 0), `reject` cases not answered 4xx, valid requests that failed or whose result differs
from calling the policy / KB in-process (must be 0), requests that hung, /health at the end and the peak RSS.
Exit status 1 when any of those figures is not 0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def fuzz_policy_server(n: int, seed: int, concurrency: int, images) -> dict:  # noqa: ANN001
    from agent.server import create_app
    from retrievers.service import serve_in_thread
    from tests.chaos import fuzz

    rng = random.Random(seed)
    cases = fuzz.mixed_cases(
        rng, n, 2 / 3, lambda: fuzz.chat_valid(rng), lambda: fuzz.chat_bad(rng, images), fuzz.chat_probes(images)
    )
    policy = fuzz.FuzzPolicy()
    with serve_in_thread(create_app(policy, max_tokens_limit=4096)) as url:
        rss0, t0 = fuzz.rss_mb(), time.perf_counter()
        tally = fuzz.run_fuzz(url, "/v1/chat/completions", cases, fuzz.chat_result, concurrency)
        dt = time.perf_counter() - t0
        health, rss1 = fuzz.wait_healthy(url), fuzz.rss_mb()
    return figures("kbrouter serve (fake policy)", tally, dt, health, (rss0, rss1), batches=policy.calls)


def fuzz_retrieval_service(n: int, seed: int, concurrency: int, images) -> dict:  # noqa: ANN001
    from retrievers.config import load_kb_configs
    from retrievers.kb import build_kb, load_kb
    from retrievers.service import create_app, serve_in_thread
    from tests.chaos import fuzz

    (cfg,) = [c for c in load_kb_configs(REPO / "configs" / "kb" / "demo.yaml") if c.name == "text"]
    build_kb(cfg, progress=False)  # reused when up to date
    kb = load_kb(cfg)
    rng = random.Random(seed + 1)
    cases = fuzz.mixed_cases(
        rng, n, 2 / 3, lambda: fuzz.search_valid(rng, "text"), lambda: fuzz.search_bad(rng, "text", images),
        fuzz.search_probes("text", images),
    )  # fmt: skip
    fuzz.fill_search_wants(cases, kb, cfg.k)
    app = create_app({"text": kb}, kb_info={"text": {"k": cfg.k}}, image_roots=[images.folder])
    with serve_in_thread(app) as url:
        rss0, t0 = fuzz.rss_mb(), time.perf_counter()
        tally = fuzz.run_fuzz(url, "/search", cases, fuzz.hits_of, concurrency, same=fuzz.same_hits)
        dt = time.perf_counter() - t0
        health, rss1 = fuzz.wait_healthy(url), fuzz.rss_mb()
    return figures("kbrouter serve-retrieval (demo text KB)", tally, dt, health, (rss0, rss1))


def figures(
    server: str, tally, seconds: float, health, rss: tuple[float, float], batches: list[int] | None = None
) -> dict:  # noqa: ANN001
    from tests.chaos.fuzz import peak_rss_mb

    out = {
        "server": server,
        "sent": tally.sent,
        "bad_requests": tally.sent - tally.by_expect["valid"] - tally.by_expect["fault"],
        "valid_requests": tally.by_expect["valid"],
        "fault_requests": tally.by_expect["fault"],
        "by_status": dict(sorted(tally.by_status.items())),
        "bad_input_5xx": len(tally.bad_input_5xx),
        "reject_not_4xx": len(tally.not_rejected),
        "valid_failed": len(tally.valid_failed),
        "valid_differs": len(tally.valid_differs),
        "faults_not_5xx": len(tally.faults_not_5xx),
        "hung": tally.hung,
        "seconds": round(seconds, 1),
        "health_at_end": f"{health.status_code} {health.json().get('status')}",
        "rss_mb_before_after": f"{rss[0]:.0f} -> {rss[1]:.0f}",
        "peak_rss_mb": round(peak_rss_mb()),
        "examples": (tally.bad_input_5xx + tally.not_rejected + tally.valid_failed + tally.valid_differs)[:5],
    }
    if batches:
        out["largest_batch"] = max(batches)
    return out


def failed(fig: dict) -> bool:
    keys = ("bad_input_5xx", "reject_not_4xx", "valid_failed", "valid_differs", "faults_not_5xx", "hung")
    return any(fig[k] for k in keys) or not fig["health_at_end"].startswith("200")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1500, help="requests per server")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--only", choices=["policy", "retrieval"], help="fuzz one server")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    from tests.chaos.fuzz import Images, peak_rss_mb

    rss0 = peak_rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        images = Images(Path(tmp) / "images")
        results = []
        if args.only in (None, "policy"):
            results.append(fuzz_policy_server(args.requests, args.seed, args.concurrency, images))
        if args.only in (None, "retrieval"):
            results.append(fuzz_retrieval_service(args.requests, args.seed, args.concurrency, images))
    print(f"peak RSS before fuzzing (models and KB not yet loaded): {rss0:.0f} MB")
    for fig in results:
        print(f"\n== {fig['server']}: {fig['sent']} requests in {fig['seconds']} s "
              f"({fig['bad_requests']} bad, {fig['valid_requests']} valid, {fig['fault_requests']} backend faults)")  # fmt: skip
        for key in ("by_status", "bad_input_5xx", "reject_not_4xx", "valid_failed", "valid_differs",
                    "faults_not_5xx", "hung", "health_at_end", "rss_mb_before_after", "peak_rss_mb", "largest_batch"):  # fmt: skip
            if key in fig:
                print(f"  {key:<16} {fig[key]}")
        for example in fig["examples"]:
            print(f"  e.g. {example}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 1 if any(failed(f) for f in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
