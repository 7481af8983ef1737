"""`kbrouter serve` as a hostile client sees it: bad bodies get a 400 naming the field, one bad request never
fails the requests batched with it, the batcher never dies, and a client that leaves costs no generation.
Loopback HTTP over a fake policy (no model)."""

import json
import threading
import time

import httpx
import pytest

import agent.server
import retrievers.batching
from agent.backends.base import Completion
from agent.server import create_app
from retrievers.service import serve_in_thread


class EchoPolicy:
    """Replies with the last user text; a text part that is not a string breaks the whole call, as a chat template
    would; `poison` in a conversation breaks the batched call too. Records every call's conversations."""

    name = "echo"

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[list[str]] = []
        self.gate = gate

    def generate(self, conversations, params):
        texts = []
        for conv in conversations:
            content = conv[-1]["content"]
            texts.append(
                content if isinstance(content, str) else "".join(p["text"] for p in content if p["type"] == "text")
            )
        self.calls.append(texts)
        if self.gate is not None:
            self.gate.wait(10)
        if any("poison" in t for t in texts):
            raise RuntimeError("CUDA error: device-side assert triggered")
        return [Completion(text=t.upper(), prompt_tokens=3, completion_tokens=2) for t in texts]


def chat(text="hi", **extra) -> dict:
    return {"model": "echo", "messages": [{"role": "user", "content": text}], **extra}


def post_all(url: str, bodies: list[dict]) -> list[httpx.Response]:
    """POST all bodies at once, so the server batches them together."""
    out: list = [None] * len(bodies)

    def one(i: int) -> None:
        # json.dumps escapes a lone surrogate as "\ud800", as a careless client would send it
        body = json.dumps(bodies[i]).encode()
        out[i] = httpx.post(url + "/v1/chat/completions", content=body, timeout=10)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(agent.server, "GATHER_S", 0.2)  # wide window: concurrent test requests share a batch
    policy = EchoPolicy()
    with serve_in_thread(create_app(policy, max_tokens_limit=512)) as url:
        yield url, policy


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"seed": [1]}, "seed"),  # unhashable: used to kill the batching task
        ({"stop": [["x"]]}, "stop"),  # unhashable inside the tuple of stops
        ({"seed": "1"}, "seed"),
        ({"max_tokens": 1e9}, "max_tokens"),  # a float, and far too many tokens
        ({"max_tokens": 10**9}, "max_tokens: 1000000000 is over this server's limit of 512"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": 50}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 2}, "only n=1"),
        ({"stream": True}, "stream=true is not supported"),
        ({"stop": ["s"] * 100}, "stop"),
    ],
)
def test_bad_fields_get_400_naming_the_field_and_the_server_keeps_serving(server, extra, field):
    url, _ = server
    r = httpx.post(url + "/v1/chat/completions", json=chat(**extra), timeout=10)
    assert r.status_code == 400 and field in r.json()["detail"]
    ok = httpx.post(url + "/v1/chat/completions", json=chat("still here"), timeout=10)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "STILL HERE"
    assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"


@pytest.mark.parametrize(
    "message,field",
    [
        ({"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}, "messages.0.content.0.text"),
        ({"role": "user", "content": [{"type": "text"}]}, "messages.0.content.0.text"),
        ({"role": "user", "content": [{"type": "audio", "audio": "x"}]}, "messages.0.content.0"),
        ({"role": "user", "content": "\ud800"}, "not valid Unicode"),  # a lone surrogate
        ({"role": "robot", "content": "hi"}, "messages.0.role"),
        ({"role": "user", "content": 5}, "messages.0.content"),
    ],
)
def test_a_malformed_message_fails_alone_while_its_batch_succeeds(server, message, field):
    url, policy = server
    bad = {"model": "echo", "messages": [message]}
    *good, rejected = post_all(url, [chat(f"q{i}") for i in range(4)] + [bad])
    assert [r.status_code for r in good] == [200] * 4
    assert rejected.status_code == 400 and field in rejected.json()["detail"]
    assert sorted(r.json()["choices"][0]["message"]["content"] for r in good) == ["Q0", "Q1", "Q2", "Q3"]


def test_a_failing_generation_fails_only_its_own_request(server):
    url, policy = server
    *good, poisoned = post_all(url, [chat(f"q{i}") for i in range(3)] + [chat("poison")])
    assert [r.status_code for r in good] == [200] * 3
    assert poisoned.status_code == 500 and "device-side assert" in poisoned.json()["detail"]
    assert max(len(c) for c in policy.calls) == 4  # they were batched together, then retried one by one


def test_an_item_failed_in_place_by_the_backend_is_a_4xx_naming_its_cause():
    class BadImagePolicy:
        name = "vl"

        def generate(self, conversations, params):
            error = {"error": "cannot read image 'bomb.png': too many pixels", "bad_input": True}
            return [Completion(text="", finish_reason="error", metadata=error) for _ in conversations]

    with serve_in_thread(create_app(BadImagePolicy())) as url:
        r = httpx.post(url + "/v1/chat/completions", json=chat(), timeout=10)
    assert r.status_code == 422 and "bomb.png" in r.json()["detail"]


def test_a_client_that_leaves_costs_no_generation():
    gate = threading.Event()
    policy = EchoPolicy(gate)
    with serve_in_thread(create_app(policy)) as url:
        first = threading.Thread(
            target=lambda: httpx.post(url + "/v1/chat/completions", json=chat("first"), timeout=10)
        )
        first.start()
        time.sleep(0.3)  # "first" holds the model; "second" queues behind it, then its client gives up
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/v1/chat/completions", json=chat("second"), timeout=0.3)
        time.sleep(0.5)  # the server notices the disconnect
        gate.set()
        first.join(10)
        after = httpx.post(url + "/v1/chat/completions", json=chat("third"), timeout=10)
    assert after.status_code == 200
    assert ["second"] not in policy.calls and ["first"] in policy.calls


def test_health_reports_the_batcher_down_until_it_is_restarted(monkeypatch):
    monkeypatch.setattr(retrievers.batching, "RESTART_DELAY_S", 0.5)
    app = create_app(EchoPolicy())
    with serve_in_thread(app) as url:
        assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
        batcher = app.state.batcher
        batcher._task.get_loop().call_soon_threadsafe(batcher._task.cancel)  # the loop dies unexpectedly
        time.sleep(0.05)
        down = httpx.get(url + "/health", timeout=10)
        time.sleep(1.0)
        up = httpx.get(url + "/health", timeout=10)
        ok = httpx.post(url + "/v1/chat/completions", json=chat(), timeout=10)
    assert down.status_code == 503 and down.json()["status"] == "unhealthy"
    assert up.status_code == 200 and up.json()["batcher_restarts"] == 1
    assert ok.status_code == 200


def test_kbrouters_own_openai_client_passes_the_checks(tmp_path):
    from PIL import Image

    from agent.backends.base import SamplingParams
    from agent.backends.openai_compat import OpenAICompatiblePolicy

    img = tmp_path / "x.png"
    Image.new("RGB", (4, 4)).save(img)
    convs = [
        [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}],
        [{"role": "user", "content": [{"type": "image", "image": str(img)}, {"type": "text", "text": "what?"}]}],
    ]
    params = SamplingParams(max_new_tokens=448, temperature=0.7, top_p=0.9, top_k=20, seed=3, stop=("</a>", "</b>"))
    with serve_in_thread(create_app(EchoPolicy())) as url:
        outs = OpenAICompatiblePolicy(url + "/v1", "echo", retries=0).generate(convs, params)
    assert [o.text for o in outs] == ["HELLO", "WHAT?"]


def test_a_decompression_bomb_image_fails_alone_while_its_batch_succeeds(server):
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (10000, 10000)).save(buf, format="PNG")  # ~12 KB, 100 megapixels declared
    assert buf.tell() < 100_000
    url_ = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    parts = [{"type": "image_url", "image_url": {"url": url_}}, {"type": "text", "text": "what is this?"}]
    bomb = {"model": "echo", "messages": [{"role": "user", "content": parts}]}
    url, policy = server
    *good, rejected = post_all(url, [chat(f"q{i}") for i in range(3)] + [bomb])
    assert [r.status_code for r in good] == [200] * 3
    assert rejected.status_code == 400 and "10000x10000" in rejected.json()["detail"]
    assert sorted(r.json()["choices"][0]["message"]["content"] for r in good) == ["Q0", "Q1", "Q2"]
    assert all("what is this?" not in texts for texts in policy.calls)  # the bomb never reached the policy
