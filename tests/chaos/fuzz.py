"""Seeded fuzzing of `kbrouter serve` and `kbrouter serve-retrieval` on loopback, bad requests mixed with valid ones.

Each generated request carries what it must get: `valid` (200, and the same result as calling the policy or the
KB in-process), `reject` (a 4xx: the issue's probes and every value that is plainly out of type or range), `no5xx`
(bad-looking but possibly acceptable input: anything but a 5xx) or `fault` (a request the fake backend breaks on:
a 5xx for it alone). The requests go out concurrently, so bad and valid ones share micro-batches.
`run_fuzz` returns the figures `benchmarks/fuzz_servers.py` prints and `tests/chaos/test_fuzz.py` checks.
"""

from __future__ import annotations

import base64
import collections
import io
import json
import random
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agent.backends.base import Completion

WORDS = "paris capital france river seine tower museum king queen war treaty year city born wrote novel film".split()


@dataclass
class Case:
    """One request: `body` (JSON-able, or raw bytes), what it must get, and the value a valid one must return."""

    kind: str
    body: object
    expect: str  # valid | reject | no5xx | fault
    want: object = None


@dataclass
class Tally:
    sent: int = 0
    by_status: collections.Counter = field(default_factory=collections.Counter)
    by_expect: collections.Counter = field(default_factory=collections.Counter)
    bad_input_5xx: list = field(default_factory=list)  # (kind, status, text) of bad requests answered 5xx
    not_rejected: list = field(default_factory=list)  # `reject` cases that were not a 4xx
    valid_failed: list = field(default_factory=list)  # valid cases that were not a 200
    valid_differs: list = field(default_factory=list)  # valid 200s whose result differs from in-process
    faults_not_5xx: list = field(default_factory=list)
    hung: int = 0


# ---------------------------------------------------------------- a deterministic fake policy (the server is under test)


def fake_reply(text: str, max_tokens: int, temperature: float, seed: int | None, stop: tuple[str, ...]) -> str:
    """What `FuzzPolicy` answers: a pure function of the inputs, so a wrong field on the way shows in the reply."""
    return f"{text.upper()}|{max_tokens}|{temperature:g}|{seed}|{','.join(stop)}"


class FuzzPolicy:
    """Replies `fake_reply(...)`; a conversation mentioning `poison` breaks the whole batched call (as a CUDA error
    would), so the batcher must retry its neighbours alone. Counts calls and their sizes."""

    name = "fuzz"

    def __init__(self, delay_s: float = 0.005) -> None:
        self.calls: list[int] = []
        self.delay_s = delay_s  # per call, so concurrent requests queue up and share batches
        self._lock = threading.Lock()

    def generate(self, conversations, params):  # noqa: ANN001, ANN201
        with self._lock:
            self.calls.append(len(conversations))
        time.sleep(self.delay_s)
        outs = []
        for conv in conversations:
            content = conv[-1]["content"]
            text = content if isinstance(content, str) else " ".join(p["text"] for p in content if p["type"] == "text")
            if "poison" in text:
                raise RuntimeError("CUDA error: device-side assert triggered")
            reply = fake_reply(text, params.max_new_tokens, params.temperature, params.seed, params.stop)
            outs.append(Completion(text=reply, prompt_tokens=1, completion_tokens=1))
        return outs


# ---------------------------------------------------------------- shared bad values and images

# values of the wrong type or range for any field; some happen to be fine for some fields (`no5xx` there)
ODD_VALUES = [None, True, False, "1", "", "\ud800", [1], [[1]], {"a": 1}, -1, 0, 1e9, 10**12, -1e-9, 1.5, "x" * 5000]


def png_bytes(size: tuple[int, int], mode: str = "L") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


@dataclass
class Images:
    """The image files and data URLs the cases use, made once (a 10000x10000 PNG is ~12 KB of zeros)."""

    folder: Path
    bomb_path: Path = None  # type: ignore[assignment]
    small_path: Path = None  # type: ignore[assignment]
    bomb_url: str = ""
    small_url: str = ""

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        bomb, small = png_bytes((10000, 10000)), png_bytes((8, 8), "RGB")
        self.bomb_path, self.small_path = self.folder / "bomb.png", self.folder / "small.png"
        self.bomb_path.write_bytes(bomb)
        self.small_path.write_bytes(small)
        self.bomb_url = "data:image/png;base64," + base64.b64encode(bomb).decode()
        self.small_url = "data:image/png;base64," + base64.b64encode(small).decode()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))


# ---------------------------------------------------------------- `kbrouter serve` cases


def chat_valid(rng: random.Random) -> Case:
    text = sentence(rng)
    body: dict = {"model": "fuzz", "messages": [{"role": "user", "content": text}]}
    max_tokens, temperature, seed, stop = rng.randint(1, 64), rng.choice([0.0, 0.5, 1.0]), None, ()
    if rng.random() < 0.7:
        body["max_tokens"] = max_tokens
    else:
        max_tokens = 256  # the server's default
    if temperature != 1.0 or rng.random() < 0.5:
        body["temperature"] = temperature
    if rng.random() < 0.5:
        seed = body["seed"] = rng.randint(0, 2**31)
    if rng.random() < 0.3:
        stop = tuple(rng.sample(["</answer>", "\n\n", "END"], rng.randint(1, 2)))
        body["stop"] = list(stop)
    if rng.random() < 0.2:  # a system turn and content parts
        body["messages"] = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ]
    return Case("valid", body, "valid", fake_reply(text, max_tokens, temperature, seed, stop))


def chat_probes(images: Images) -> list[Case]:
    """The issue's probes of `kbrouter serve`, each a case that must be a 4xx."""
    msg = [{"role": "user", "content": "hi"}]
    return [
        Case("probe: seed [1]", {"messages": msg, "seed": [1]}, "reject"),
        Case("probe: stop [['x']]", {"messages": msg, "stop": [["x"]]}, "reject"),
        Case("probe: max_tokens 1e9", {"messages": msg, "max_tokens": 1e9}, "reject"),
        Case("probe: max_tokens 10**9", {"messages": msg, "max_tokens": 10**9}, "reject"),
        Case("probe: lone surrogate", {"messages": [{"role": "user", "content": "a\ud800b"}]}, "reject"),
        Case(
            "probe: malformed text part",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": ["not", "a", "string"]}]}]},
            "reject",
        ),
        Case(
            "probe: decompression-bomb image",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": images.bomb_url}},
                            {"type": "text", "text": "what?"},
                        ],
                    }
                ]
            },
            "reject",
        ),  # fmt: skip
    ]


def chat_bad(rng: random.Random, images: Images) -> Case:
    base = chat_valid(rng).body
    assert isinstance(base, dict)
    pick = rng.randrange(10)
    if pick == 0:  # a sampling field of the wrong type or range
        key = rng.choice(["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
                          "stream"])  # fmt: skip
        value = rng.choice(ODD_VALUES)
        return Case(f"field {key}={str(value)[:12]!r}", {**base, key: value}, "no5xx")
    if pick == 1:  # plainly out of range
        key, value = rng.choice([("max_tokens", 0), ("max_tokens", 10**6), ("temperature", -1), ("temperature", 9),
                                 ("top_p", 0), ("top_p", 2), ("n", 3), ("stream", True), ("seed", "7"),
                                 ("top_k", -3), ("stop", ["s"] * 50), ("messages", [])])  # fmt: skip
        return Case(f"range {key}", {**base, key: value}, "reject")
    if pick == 2:  # a broken message
        message = rng.choice([
            {"role": "wizard", "content": "hi"},
            {"role": "user"},
            {"role": "user", "content": None},
            {"role": "user", "content": 42},
            {"role": "user", "content": [{"type": "audio", "data": "x"}]},
            {"role": "user", "content": [{"type": "text"}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": 7}]},
            {"content": "no role"},
            "just a string",
        ])  # fmt: skip
        return Case("message", {**base, "messages": [message]}, "reject")
    if pick == 3:  # bad images: a bomb, not an image, broken base64, a path, a URL
        url = rng.choice([
            images.bomb_url,
            "data:image/png;base64," + base64.b64encode(b"not an image at all").decode(),
            "data:image/png;base64,!!!notbase64",
            str(images.small_path),
            "file:///etc/passwd",
            "http://127.0.0.1:9/x.png",
        ])  # fmt: skip
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what?"}]
        return Case("image", {**base, "messages": [{"role": "user", "content": content}]}, "reject")
    if pick == 4:  # a lone surrogate somewhere
        where = rng.choice(["content", "stop"])
        body = {**base, "stop": ["\udfff"]} if where == "stop" else {**base, "messages": [{"role": "user",
                                                                                           "content": "\ud83d"}]}  # fmt: skip
        return Case(f"surrogate in {where}", body, "reject")
    if pick == 5:  # not a JSON object at all
        raw = rng.choice([b"", b"{", b"[1, 2]", b"null", b'"text"', b"\xff\xfe\x00", b'{"messages": ' + b"[" * 5000,
                          b"NaN", json.dumps({**base, "temperature": float("nan")}).encode()])  # fmt: skip
        return Case("raw body", raw, "reject")
    if pick == 6:  # too many messages, too big a body
        if rng.random() < 0.5:
            return Case("300 messages", {**base, "messages": [{"role": "user", "content": "x"}] * 300}, "reject")
        return Case("oversized body", {**base, "messages": [{"role": "user", "content": "y" * (2 << 20)}]}, "reject")
    if pick == 7:  # grammar fields the fake policy does not support, or malformed
        key, value = rng.choice([("grammar", "root ::= 'a'"), ("ebnf", 5), ("structured_outputs", "x"),
                                 ("structured_outputs", {"json": {}})])  # fmt: skip
        return Case(f"grammar {key}", {**base, key: value}, "reject")
    if pick == 8:  # unknown extra fields: ignored, as OpenAI clients send many
        return Case("extra field", {**base, "user": "u", "logprobs": rng.choice(ODD_VALUES)}, "no5xx")
    return Case("fault: poison", {**base, "messages": [{"role": "user", "content": "poison " + sentence(rng)}]},
                "fault")  # fmt: skip


def chat_result(response: httpx.Response) -> object:
    return response.json()["choices"][0]["message"]["content"]


# ---------------------------------------------------------------- `kbrouter serve-retrieval` cases


def search_valid(rng: random.Random, kb: str) -> Case:
    """A valid search; its `want` is filled by `fill_search_wants` (one in-process batch for all cases)."""
    queries = [{"kb": kb, "text": sentence(rng), "k": rng.randint(1, 10)} for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.3:
        del queries[0]["k"]  # the KB's default k
    return Case("valid", {"queries": queries}, "valid")


def fill_search_wants(cases: list[Case], retriever, default_k: int) -> None:  # noqa: ANN001
    """Each valid case's hits, searched in-process: all queries with the same k in one `search` call."""
    from retrievers.types import Query

    wanted = [(c, i, q["text"], q.get("k", default_k)) for c in cases if c.expect == "valid"
              for i, q in enumerate(c.body["queries"])]  # fmt: skip
    for c in cases:
        if c.expect == "valid":
            c.want = [None] * len(c.body["queries"])
    for k in {w[3] for w in wanted}:
        group = [w for w in wanted if w[3] == k]
        hits = retriever.search([Query(text=w[2]) for w in group], k)
        for (c, i, _, _), hs in zip(group, hits, strict=True):
            c.want[i] = [(h.doc.id, h.score) for h in hs]


def same_hits(got: object, want: object) -> bool:
    """Same documents in the same order, scores equal up to float noise from batch composition."""
    return len(got) == len(want) and all(
        [d for d, _ in g] == [d for d, _ in w] and all(abs(a - b) <= 1e-4 for (_, a), (_, b) in zip(g, w, strict=True))
        for g, w in zip(got, want, strict=True)
    )


def search_probes(kb: str, images: Images) -> list[Case]:
    return [
        Case("probe: lone surrogate", {"queries": [{"kb": kb, "text": "a\ud800b"}]}, "reject"),
        Case(
            "probe: decompression-bomb image (10000x10000 PNG)",
            {"queries": [{"kb": kb, "text": "a photo", "image": str(images.bomb_path)}]},
            "reject",
        ),
    ]


def search_bad(rng: random.Random, kb: str, images: Images) -> Case:
    good = {"kb": kb, "text": sentence(rng), "k": 3}
    pick = rng.randrange(7)
    if pick == 0:
        key = rng.choice(["kb", "text", "k", "image"])
        value = rng.choice(ODD_VALUES)
        return Case(f"field {key}={str(value)[:12]!r}", {"queries": [good, {**good, key: value}]}, "no5xx")
    if pick == 1:
        key, value = rng.choice([("kb", "nope"), ("text", ""), ("text", "   "), ("text", "z" * 5000), ("k", 0),
                                 ("k", 101), ("k", True), ("k", "5"), ("k", 2.5), ("image", 3),
                                 ("image", "/etc/passwd"), ("image", str(images.bomb_path)), ("extra", 1)])  # fmt: skip
        return Case(f"range {key}", {"queries": [good, {**good, key: value}]}, "reject")
    if pick == 2:
        return Case("surrogate", {"queries": [good, {**good, "text": "q\udc00"}]}, "reject")
    if pick == 3:
        raw = rng.choice([b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"queries": ' + b"[" * 5000, b'{"queries": {}}',
                          b'{"queries": []}', b'{"queries": [1]}', b'{"queries": [], "x": 1}'])  # fmt: skip
        return Case("raw body", raw, "reject")
    if pick == 4:
        return Case("too many queries", {"queries": [good] * 600}, "reject")
    if pick == 5:
        return Case("oversized body", {"queries": [{**good, "text": "w " * (1 << 20)}]}, "reject")
    return Case("image inside a root", {"queries": [{**good, "image": str(images.small_path)}]}, "no5xx")


def hits_of(response: httpx.Response) -> object:
    return [[(h["doc"]["id"], h["score"]) for h in hits] for hits in response.json()["results"]]


# ---------------------------------------------------------------- the runner


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (servers, models and clients together)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident memory now."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def run_fuzz(
    url: str, path: str, cases: list[Case], result: Callable[[httpx.Response], object], concurrency: int = 16,
    timeout_s: float = 60.0, same: Callable[[object, object], bool] | None = None,
) -> Tally:  # fmt: skip
    """POST every case to `url + path` from `concurrency` threads at once; tally statuses against expectations."""
    tally = Tally()
    lock = threading.Lock()
    same = same or (lambda a, b: a == b)

    def send(case: Case) -> None:
        raw = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
        try:
            r = client.post(url + path, content=raw, headers={"content-type": "application/json"})
        except httpx.TimeoutException:
            with lock:
                tally.hung += 1
            return
        with lock:
            tally.sent += 1
            tally.by_status[r.status_code] += 1
            tally.by_expect[case.expect] += 1
            if case.expect == "valid":
                if r.status_code != 200:
                    tally.valid_failed.append((case.kind, r.status_code, r.text[:200]))
                elif not same(result(r), case.want):
                    tally.valid_differs.append((case.kind, result(r), case.want))
            elif case.expect == "fault":
                if r.status_code < 500:
                    tally.faults_not_5xx.append((case.kind, r.status_code))
            else:
                if r.status_code >= 500:
                    tally.bad_input_5xx.append((case.kind, r.status_code, r.text[:200]))
                if case.expect == "reject" and not 400 <= r.status_code < 500:
                    tally.not_rejected.append((case.kind, r.status_code, r.text[:200]))

    with httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=concurrency)) as client:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(send, cases))
    return tally


def mixed_cases(
    rng: random.Random, n: int, bad_share: float, valid: Callable[[], Case], bad: Callable[[], Case],
    probes: list[Case],
) -> list[Case]:  # fmt: skip
    """`n` cases, about `bad_share` of them bad, every probe among them, shuffled."""
    cases = list(probes) + [bad() if rng.random() < bad_share else valid() for _ in range(max(0, n - len(probes)))]
    rng.shuffle(cases)
    return cases


def wait_healthy(url: str, timeout_s: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(url + "/health", timeout=10)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)
