"""Load test of `kbrouter serve-agent` on loopback: N concurrent streaming chat clients, invalid requests mixed in.

Each client sends `--requests` requests; about `--invalid` of them are bad on purpose (unknown model, empty message,
a non-image upload, an oversized body, too many messages, a wrong key when `--api-key` is set). Bounded in count and
in time (`--deadline`). Prints p50/p99 of the time to the first streamed step (the first `kbrouter` event) and to the
final answer, the answers by HTTP status (no 5xx may come from bad input), and the server's /health at the end.

    python benchmarks/agent_server_load.py                        # fake policy (no model), 16 clients x 8 requests
    python benchmarks/agent_server_load.py --clients 32 --requests 16 --policy-delay 0.05
    python benchmarks/agent_server_load.py --real --kb configs/kb/demo.yaml      # SmolLM2 + the demo KB (minutes)

The fake policy (tests/fakes.py StepPolicy, `--policy-delay` seconds per generate call) over in-memory KBs
measures the server itself: streaming, micro-batching across requests and the limits.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUSY = Path("/tmp/kbrouter_busy")
QUESTIONS = [
    "Where was Marie Curie born?",
    "Which nation tops the medal table?",
    "Which image shows horses?",
    "In which clip does Popeye sing?",
    "Who wrote Hamlet?",
]


def invalid_bodies(model: str) -> list[tuple[str, dict | bytes]]:
    """(kind, body) of requests the server must refuse with a 4xx."""
    user = [{"role": "user", "content": "hi"}]
    fake_png = "data:image/png;base64," + base64.b64encode(b"not an image at all").decode()
    return [
        ("unknown model", {"model": "nope", "messages": user, "stream": True}),
        ("empty message", {"model": model, "messages": [{"role": "user", "content": " "}], "stream": True}),
        ("no messages", {"model": model, "messages": [], "stream": True}),
        ("non-image upload", {"model": model, "stream": True, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": fake_png}}]}]}),
        ("too many messages", {"model": model, "messages": user * 500, "stream": True}),
        ("oversized body", {"model": model, "messages": [{"role": "user", "content": "x" * (17 << 20)}]}),
        ("malformed JSON", b'{"model": '),
        ("n=2", {"model": model, "messages": user, "n": 2, "stream": True}),
    ]  # fmt: skip


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def one_stream(http, model: str, question: str, key: str | None) -> tuple[int, float | None, float | None]:  # noqa: ANN001
    """(status, seconds to the first step event, seconds to the final answer) of one streamed request."""
    t0 = time.perf_counter()
    first = final = None
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": question}]}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, None, None
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return 500, first, None
            if chunk.get("kbrouter") and first is None:
                first = time.perf_counter() - t0
            if chunk.get("kbrouter", {}).get("event") == "final":
                final = time.perf_counter() - t0
    return 200, first, final


def build_app(args: argparse.Namespace, tmp: Path):  # noqa: ANN201
    from agent.agent_server import AgentServerLimits, AgentSetup, create_agent_app

    limits = AgentServerLimits(max_concurrent=args.max_concurrent)
    if args.real:
        from agent.backends.factory import PolicyConfig, make_policy
        from agent.cli import DEFAULT_MODEL
        from agent.kbs import load_knowledge_bases
        from agent.loop import AgentConfig

        kbs = load_knowledge_bases(args.kb)
        policy = make_policy(PolicyConfig(model=DEFAULT_MODEL))
        setup = AgentSetup("kbrouter-demo", policy, kbs, AgentConfig(max_steps=args.max_steps, min_steps=1))
        return create_agent_app([setup], api_keys=tuple(args.api_key or ()), limits=limits), setup.name
    sys.path.insert(0, str(REPO))
    from tests.agent.agent_setups import make_setups
    from tests.fakes import StepPolicy

    setups, media = make_setups(tmp, StepPolicy(delay=args.policy_delay), max_steps=args.max_steps)
    app = create_agent_app(setups, api_keys=tuple(args.api_key or ()), limits=limits, media_roots=[media])
    return app, setups[0].name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=8, help="requests per client")
    ap.add_argument("--invalid", type=float, default=0.3, help="share of invalid requests")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds before clients stop sending")
    ap.add_argument("--policy-delay", type=float, default=0.02, help="fake policy: seconds per generate call")
    ap.add_argument("--max-steps", type=int, default=2)
    ap.add_argument("--max-concurrent", type=int, default=64, help="the server's limit (429 above)")
    ap.add_argument("--api-key", action="append", help="start the server with this key (wrong-key requests added)")
    ap.add_argument("--real", action="store_true", help="SmolLM2 (the shipped router) over --kb instead of the fake")
    ap.add_argument("--kb", default=str(REPO / "configs" / "kb" / "demo.yaml"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.real and BUSY.exists():
        print(f"{BUSY} exists: the machine is busy; not loading a real model (run without --real)")
        return 1

    import httpx

    from retrievers.service import serve_in_thread

    tmp = Path(tempfile.mkdtemp(prefix="agent-load-"))
    app, model = build_app(args, tmp)
    key = (args.api_key or [None])[0]
    bad = invalid_bodies(model)
    if key:
        bad.append(("wrong key", {"model": model, "messages": [{"role": "user", "content": "hi"}], "_key": "wrong"}))
    statuses: collections.Counter[tuple[str, int]] = collections.Counter()
    ttfs: list[float] = []
    ttfa: list[float] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + args.deadline

    with serve_in_thread(app) as url:

        def client(i: int) -> None:
            rng = random.Random(args.seed * 1000 + i)
            with httpx.Client(base_url=url, timeout=max(30.0, args.deadline)) as http:
                for _ in range(args.requests):
                    if time.monotonic() > stop_at:
                        return
                    if rng.random() < args.invalid:
                        kind, body = rng.choice(bad)
                        headers = {"authorization": f"Bearer {key}"} if key else {}
                        if isinstance(body, dict) and body.get("_key"):
                            headers = {"authorization": "Bearer wrong-key-000"}
                            body = {k: v for k, v in body.items() if k != "_key"}
                        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
                        try:
                            status = http.post("/v1/chat/completions", headers=headers, **kw).status_code
                        except httpx.HTTPError:
                            status = -1  # the server closed the connection
                        with lock:
                            statuses[(f"invalid: {kind}", status)] += 1
                        continue
                    try:
                        status, first, final = one_stream(http, model, rng.choice(QUESTIONS), key)
                    except httpx.HTTPError:
                        status, first, final = -1, None, None
                    with lock:
                        statuses[("valid", status)] += 1
                        if first is not None:
                            ttfs.append(first)
                        if final is not None:
                            ttfa.append(final)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.deadline + 60)
        wall = time.perf_counter() - t0
        health = httpx.get(url + "/health", headers={"authorization": f"Bearer {key}"} if key else {}, timeout=10)

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 1000:.0f} ms"

    policy = "SmolLM2 (shipped router) + " + args.kb if args.real else f"fake StepPolicy ({args.policy_delay}s/call)"
    print(f"agent server load test: {args.clients} clients x {args.requests} requests, {policy}, {wall:.1f} s")
    print(
        f"  time to first streamed step: p50 {ms(percentile(ttfs, 50))}, p99 {ms(percentile(ttfs, 99))} (n={len(ttfs)})"
    )
    print(f"  time to final answer:        p50 {ms(percentile(ttfa, 50))}, p99 {ms(percentile(ttfa, 99))} (n={len(ttfa)})")  # fmt: skip
    print("  answers by status:")
    for (kind, status), n in sorted(statuses.items()):
        print(f"    {kind:<32} {status:>4}  x{n}")
    bad_5xx = sum(n for (kind, status), n in statuses.items() if kind.startswith("invalid") and status >= 500)
    print(f"  5xx from bad input: {bad_5xx}")
    print(f"  /health at the end: {health.status_code} {health.json()}")
    return 0 if bad_5xx == 0 and health.status_code == 200 else 1


if __name__ == "__main__":
    raise SystemExit(main())
