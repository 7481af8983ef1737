"""The retrieval service and its client: request validation, micro-batching, a loopback load test on the real
demo KB (real MiniLM + FAISS + BM25 over 300 real Wikipedia paragraphs), retries and config selection."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from retrievers.config import KBConfig
from retrievers.remote import RemoteRetriever, remote_kb_from_config
from retrievers.service import RequestError, ServiceConfig, create_app, main, parse_search_request, serve_in_thread
from retrievers.types import Doc, Hit, Query, as_queries

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
QUESTIONS = [json.loads(line)["question"] for line in (DEMO / "questions.jsonl").open()]


class EchoRetriever:
    """A fake KB: one hit per query whose text is the query; records the size of every search call."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.delay = delay
        self.fail = fail

    def search(self, queries, k=None):
        self.calls.append(len(queries))
        if self.fail:
            raise RuntimeError("index file is corrupt")
        time.sleep(self.delay)
        return [[Hit(Doc(id=q.text, text=q.text, kb="echo"), 1.0, 0, "echo")] * k for q in as_queries(queries)]


def same_hits(got: list[Hit], want: list[Hit]) -> bool:
    """Same documents in the same order; scores equal up to float noise from batch composition."""
    return [h.doc.id for h in got] == [h.doc.id for h in want] and np.allclose(
        [h.score for h in got], [h.score for h in want], rtol=1e-5, atol=1e-6
    )


CFG = ServiceConfig(max_queries=8, max_k=20, max_text_chars=200, max_body_bytes=4096)
KBS = {"echo": EchoRetriever()}


@pytest.mark.parametrize(
    "body,status,match",
    [
        (b"{not json", 400, "not valid JSON"),  # malformed JSON
        (b'{"queries": []}', 422, "empty"),  # no queries
        (b'{"q": []}', 422, "expected"),  # wrong top-level shape
        (b'{"queries": [], "extra": 1}', 422, "unknown top-level"),  # unknown top-level key
        (json.dumps({"queries": [{"kb": "echo", "text": "x"}] * 9}).encode(), 422, "at most 8"),  # too many
        (b'{"queries": ["just a string"]}', 422, "expected an object"),  # query not an object
        (b'{"queries": [{"kb": "nope", "text": "x"}]}', 404, "unknown KB 'nope'"),  # unknown KB, lists served
        (b'{"queries": [{"kb": 3, "text": "x"}]}', 422, "kb: expected a string"),  # KB name of wrong type
        (b'{"queries": [{"kb": "echo", "text": "   "}]}', 422, "text is empty"),  # blank query
        (b'{"queries": [{"kb": "echo", "text": ["x"]}]}', 422, "text: expected a string"),  # text wrong type
        (json.dumps({"queries": [{"kb": "echo", "text": "x" * 201}]}).encode(), 422, "at most 200"),  # too long
        (b'{"queries": [{"kb": "echo", "text": "x", "k": 21}]}', 422, r"\[1, 20\]"),  # k too large
        (b'{"queries": [{"kb": "echo", "text": "x", "k": 0}]}', 422, "k: expected"),  # k zero
        (b'{"queries": [{"kb": "echo", "text": "x", "k": "5"}]}', 422, "k: expected"),  # k as a string
        (b'{"queries": [{"kb": "echo", "text": "x", "k": true}]}', 422, "k: expected"),  # k as a bool
        (b'{"queries": [{"kb": "echo", "text": "x", "image": 1}]}', 422, "image"),  # image not a path
        (b'{"queries": [{"kb": "echo", "text": "x", "topk": 1}]}', 422, "unknown key"),  # misspelt key
    ],
)
def test_parse_rejects_bad_requests(body, status, match):
    with pytest.raises(RequestError, match=match) as e:
        parse_search_request(body, KBS, {"echo": 5}, CFG)
    assert e.value.status == status


def test_parse_fills_default_k_and_image():
    parsed = parse_search_request(
        b'{"queries": [{"kb": "echo", "text": "a"}, {"kb": "echo", "text": "b", "image": "x.jpg", "k": 2}]}',
        KBS,
        {"echo": 7},
        CFG,
    )
    assert parsed == [("echo", Query("a", None), 7), ("echo", Query("b", "x.jpg"), 2)]


def test_micro_batching_merges_concurrent_requests_and_keeps_order():
    echo = EchoRetriever(delay=0.05)
    app = create_app({"echo": echo}, ServiceConfig(max_wait_ms=20, max_batch=64))
    texts = [f"query {i}" for i in range(24)]
    results: dict[str, list[Hit]] = {}
    with serve_in_thread(app) as url:

        def ask(text: str) -> None:
            results[text] = RemoteRetriever(url, "echo").search([text], k=2)[0]

        threads = [threading.Thread(target=ask, args=(t,)) for t in texts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        metrics = httpx.get(url + "/metrics").json()
    # every query got its own answer, with the k it asked for
    assert all([h.doc.id for h in results[t]] == [t, t] for t in texts)
    # 24 concurrent one-query requests were answered by fewer search calls, some holding several queries
    assert sum(echo.calls) == 24 and len(echo.calls) < 24 and max(echo.calls) > 1
    assert metrics["kbs"]["echo"]["queries"] == 24 and metrics["kbs"]["echo"]["batch_size_max"] == max(echo.calls)


def test_failing_kb_gives_500_and_service_keeps_serving():
    app = create_app({"bad": EchoRetriever(fail=True), "echo": EchoRetriever()})
    with serve_in_thread(app) as url:
        r = httpx.post(url + "/search", json={"queries": [{"kb": "bad", "text": "x"}]})
        assert r.status_code == 500 and "index file is corrupt" in r.json()["error"]
        assert RemoteRetriever(url, "echo").search(["still here"], 1)[0][0].doc.id == "still here"
        assert httpx.get(url + "/health").json()["status"] == "ok"
        # the client reports a 4xx answer as the service's message, without retrying (retries=5: still one try)
        with pytest.raises(ValueError, match="unknown KB 'nope'"):
            RemoteRetriever(url, "nope", retries=5, backoff=30).search(["x"], 1)
        # a 500 is retried (retrievers.retry: 5xx may recover), then reported with the service's message
        with pytest.raises(RuntimeError, match=r"failed \(500\) after 2 attempts: .*index file is corrupt"):
            RemoteRetriever(url, "bad", retries=1, backoff=0.01).search(["x"], 1)


class StrictRetriever(EchoRetriever):
    """Encodes every query text as UTF-8, as a tokenizer does: one lone surrogate breaks the whole call. A query
    containing `poison` breaks it too (a KB bug that only some inputs reach)."""

    def search(self, queries, k=None):
        self.calls.append(len(queries))
        for q in as_queries(queries):
            q.text.encode("utf-8")
            if "poison" in q.text:
                raise RuntimeError("segfault-ish: the index broke on this query")
        return [[Hit(Doc(id=q.text, text=q.text, kb="echo"), 1.0, 0, "echo")] * k for q in as_queries(queries)]


def post_together(url: str, bodies: list[bytes]) -> list[httpx.Response]:
    """POST all bodies at once, so the service batches their queries together."""
    out: list = [None] * len(bodies)

    def one(i: int) -> None:
        out[i] = httpx.post(url + "/search", content=bodies[i], headers={"content-type": "application/json"})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def one_query(text: str, **extra) -> bytes:
    return json.dumps({"queries": [{"kb": "echo", "text": text, **extra}]}).encode()


def test_lone_surrogate_is_a_422_and_the_queries_batched_with_it_succeed():
    kb = StrictRetriever()
    with serve_in_thread(create_app({"echo": kb}, ServiceConfig(max_wait_ms=200))) as url:
        *good, bad = post_together(url, [one_query(f"q{i}") for i in range(3)] + [one_query("\ud800")])
    assert [r.status_code for r in good] == [200] * 3
    assert bad.status_code == 422 and "queries[0].text: not valid Unicode" in bad.json()["error"]
    assert sorted(r.json()["results"][0][0]["doc"]["id"] for r in good) == ["q0", "q1", "q2"]


def test_a_query_that_breaks_the_kb_fails_alone():
    kb = StrictRetriever()
    with serve_in_thread(create_app({"echo": kb}, ServiceConfig(max_wait_ms=200))) as url:
        *good, bad = post_together(url, [one_query(f"q{i}") for i in range(3)] + [one_query("poison")])
        metrics = httpx.get(url + "/metrics").json()["kbs"]["echo"]
    assert [r.status_code for r in good] == [200] * 3
    assert bad.status_code == 500 and "queries[0]: search failed on KB 'echo'" in bad.json()["error"]
    assert kb.calls[0] == 4 and kb.calls[1:] == [1, 1, 1, 1]  # batched once, then retried one by one
    assert metrics["queries"] == 3 and metrics["errors"] == 1


def test_a_decompression_bomb_image_is_a_422_before_any_kb_decodes_it(tmp_path):
    from PIL import Image

    bomb = tmp_path / "bomb.png"
    Image.new("1", (10000, 10000)).save(bomb)  # ~12 KB on disk, 100 megapixels declared
    assert bomb.stat().st_size < 100_000
    ok = tmp_path / "ok.png"
    Image.new("RGB", (8, 8)).save(ok)
    kb = StrictRetriever()
    with serve_in_thread(create_app({"echo": kb}, ServiceConfig(max_wait_ms=200))) as url:
        good, bad = post_together(url, [one_query("q", image=str(ok)), one_query("q", image=str(bomb))])
    assert (
        bad.status_code == 422 and "queries[0].image" in bad.json()["error"] and "10000x10000" in bad.json()["error"]
    )
    assert good.status_code == 200


# Run in a fresh process, so its peak RSS is this request's alone: a service whose KB decodes query images the
# way the image KB does (`load_image`, falling back to text on a MediaError), sent a small image, then the bomb.
BOMB_RSS_SCRIPT = """
import json, resource, sys
import httpx
from retrievers.media import MediaError, load_image
from retrievers.service import create_app, serve_in_thread
from retrievers.types import Doc, Hit, as_queries

class DecodingRetriever:
    def search(self, queries, k=None):
        for q in as_queries(queries):
            if q.image:
                try:
                    load_image(q.image)
                except MediaError:
                    pass
        return [[Hit(Doc(id="d", text="d", kb="img"), 1.0, 0, "img")] * k for q in as_queries(queries)]

small, bomb = sys.argv[1:3]
def ask(image):
    body = {"queries": [{"kb": "img", "text": "a photo", "image": image}]}
    return httpx.post(url + "/search", json=body, timeout=60).status_code

with serve_in_thread(create_app({"img": DecodingRetriever()})) as url:
    warm = ask(small)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    status = ask(bomb)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"warm": warm, "status": status, "added_mb": (after - before) / 1024}))
"""


def test_a_12_kb_png_of_10000x10000_pixels_costs_the_service_no_decoded_memory(tmp_path):
    import subprocess
    import sys

    from PIL import Image

    bomb, small = tmp_path / "bomb.png", tmp_path / "small.png"
    Image.new("1", (10000, 10000)).save(bomb)  # ~12 KB on disk; decoded to RGB it is 300+ MB
    Image.new("RGB", (64, 64)).save(small)
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", BOMB_RSS_SCRIPT, str(small), str(bomb)],
        capture_output=True, text=True, timeout=300, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["warm"] == 200 and figures["status"] == 422
    assert figures["added_mb"] < 64, figures  # the issue measured +586 MB for this one query


def test_load_image_refuses_more_pixels_than_the_cap(tmp_path, monkeypatch):
    from PIL import Image

    import retrievers.media
    from retrievers.media import ImageTooLarge, load_image

    path = tmp_path / "big.png"
    Image.new("RGB", (40, 30)).save(path)
    assert load_image(path).size == (40, 30)
    monkeypatch.setattr(retrievers.media, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ImageTooLarge, match="40x30 = 1200 pixels; at most 1000"):
        load_image(path)


def test_health_is_503_while_a_batcher_is_down_and_it_comes_back(monkeypatch):
    import retrievers.batching

    monkeypatch.setattr(retrievers.batching, "RESTART_DELAY_S", 0.5)
    app = create_app({"echo": EchoRetriever()})
    with serve_in_thread(app) as url:
        assert httpx.get(url + "/health").json()["batchers_down"] == []
        task = app.state.batchers["echo"]._task
        task.get_loop().call_soon_threadsafe(task.cancel)  # the loop dies unexpectedly
        time.sleep(0.05)
        down = httpx.get(url + "/health")
        time.sleep(1.0)
        up = httpx.get(url + "/health")
        after = httpx.post(url + "/search", content=one_query("after"))
    assert down.status_code == 503 and down.json()["batchers_down"] == ["echo"]
    assert up.status_code == 200 and up.json()["batcher_restarts"] == 1
    assert after.status_code == 200


def test_client_retries_then_names_url_and_fix():
    url = "http://127.0.0.1:9"  # discard port: nothing listens on loopback
    client = RemoteRetriever(url, "text", timeout=1, retries=2, backoff=0.05)
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"127\.0\.0\.1:9 did not answer after 3 attempts.*serve-retrieval"):
        client.search(["who?"], 3)
    assert time.perf_counter() - start >= 0.05 + 0.1  # back-off doubled between the three attempts


def test_remote_kb_is_one_line_of_config():
    # `options: {remote: URL}` selects the client; a bad URL is refused with the expected form
    cfg = KBConfig(
        name="text",
        kind="text",
        corpus=DEMO / "passages.jsonl",
        options={"remote": "http://127.0.0.1:8765", "remote_retries": 1},
    )
    client = remote_kb_from_config(cfg)
    assert type(client) is RemoteRetriever and client.url == "http://127.0.0.1:8765" and client.retries == 1
    with pytest.raises(ValueError, match="options.remote"):
        remote_kb_from_config(
            KBConfig(name="t", kind="text", corpus=DEMO / "passages.jsonl", options={"remote": "127.0.0.1:8765"})
        )


def test_cli_help_exits_zero():
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0


def _invalid_requests(huge: bytes) -> list[tuple[str, bytes]]:
    return [
        ("empty query", b'{"queries": [{"kb": "text", "text": ""}]}'),
        ("unknown KB", b'{"queries": [{"kb": "video", "text": "who?"}]}'),
        ("huge k", b'{"queries": [{"kb": "text", "text": "who?", "k": 1000000}]}'),
        ("wrong types", b'{"queries": [{"kb": "text", "text": 42, "k": "ten"}]}'),
        ("oversized body", huge),
        ("not JSON", b"queries=who"),
    ]


def test_load_test_on_loopback(demo_text_kb):
    """8 clients x 12 requests (about 1/3 invalid) against the real demo KB; bounded to 90 s."""
    cfg, kb = demo_text_kb
    pool = [(q, k) for q in QUESTIONS for k in (1, 3, 5)]
    expected = {(q, k): kb.search([q], k)[0] for q, k in pool}  # in-process, one query at a time
    service_cfg = ServiceConfig(max_body_bytes=64 * 1024)
    invalid = _invalid_requests(json.dumps({"queries": [{"kb": "text", "text": "x" * 70_000}]}).encode())
    n_clients, per_client, deadline = 8, 12, time.monotonic() + 90
    records: list[tuple[str, int, float, bool]] = []  # (kind, status, seconds, hits correct)
    lock = threading.Lock()

    with serve_in_thread(create_app({"text": kb}, service_cfg, {"text": {"k": cfg.k}})) as url:

        def client(seed: int) -> None:
            rng = random.Random(seed)
            with httpx.Client(base_url=url, timeout=60) as http:
                for _ in range(per_client):
                    if time.monotonic() > deadline:
                        return
                    if rng.random() < 0.35:
                        name, body = rng.choice(invalid)
                        t0 = time.perf_counter()
                        r = http.post("/search", content=body, headers={"content-type": "application/json"})
                        rec = (name, r.status_code, time.perf_counter() - t0, "error" in r.json())
                    else:
                        batch = rng.sample(pool, rng.randint(1, 3))
                        t0 = time.perf_counter()
                        r = http.post(
                            "/search", json={"queries": [{"kb": "text", "text": q, "k": k} for q, k in batch]}
                        )
                        ok = r.status_code == 200 and all(
                            same_hits([Hit.from_dict(h) for h in got], expected[key])
                            for key, got in zip(batch, r.json()["results"], strict=True)
                        )
                        rec = ("valid", r.status_code, time.perf_counter() - t0, ok)
                    with lock:
                        records.append(rec)

        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        elapsed = time.perf_counter() - start
        health = httpx.get(url + "/health")
        metrics = httpx.get(url + "/metrics").json()
        after = RemoteRetriever(url, "text").search([QUESTIONS[0]], 3)[0]

    valid = [r for r in records if r[0] == "valid"]
    bad = [r for r in records if r[0] != "valid"]
    lat = np.asarray([r[2] for r in valid]) * 1000
    print(
        f"\nload test: {len(records)} requests ({len(valid)} valid, {len(bad)} invalid) from {n_clients} clients "
        f"in {elapsed:.1f}s = {len(records) / elapsed:.1f} req/s; valid p50 {np.percentile(lat, 50):.0f} ms, "
        f"p99 {np.percentile(lat, 99):.0f} ms; mean batch {metrics['kbs']['text']['batch_size_mean']}"
    )
    assert len(records) >= n_clients * per_client // 2, "the load test ran out of time"
    # every valid request: 200 with the same hits as in-process search
    assert valid and all(status == 200 and ok for _, status, _, ok in valid), [r for r in valid if not r[3]]
    # every invalid request: a 4xx with an error message, never a 5xx
    assert bad and all(400 <= status < 500 and ok for _, status, _, ok in bad), bad
    assert {r[0] for r in bad} >= {"empty query", "unknown KB", "huge k", "wrong types"}
    # the service is healthy afterwards, still answers correctly and counted what it saw
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert same_hits(after, expected[(QUESTIONS[0], 3)])
    assert metrics["requests"]["200"] == len(valid)
    assert sum(n for code, n in metrics["requests"].items() if code.startswith("4")) == len(bad)
