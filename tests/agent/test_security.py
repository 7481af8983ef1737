"""Security of the three servers on loopback (fake policy and KBs, no model): a missing or wrong API key is a 401 on
every route, media requests cannot leave the KBs' media folders (and leak nothing when they try), and oversized or
over-limit requests are a 4xx with a message."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import threading

import httpx
import pytest

from agent.agent_server import AgentServerLimits, create_agent_app
from agent.server import create_app as create_policy_app
from retrievers.security import ImageLimits, MediaRoots, resolve_api_keys, warn_if_exposed
from retrievers.service import create_app as create_retrieval_app
from retrievers.service import serve_in_thread
from tests.agent.agent_setups import DocRetriever, make_setups
from tests.agent.test_server import EchoPolicy
from tests.fakes import StepPolicy

KEY, OTHER = "key-one-1234", "key-two-5678"
SECRET = "TOP-SECRET-CONTENT"
CHAT = {"model": "kbrouter-demo", "messages": [{"role": "user", "content": "Where was Marie Curie born?"}]}


def png(width: int = 8, height: int = 8) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_chat(url: str, model: str = "kbrouter-vision") -> dict:
    content = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": model, "messages": [{"role": "user", "content": content}]}


@pytest.fixture
def servers(tmp_path):
    """All three servers with keys KEY and OTHER; yields {name: (url, [(method, path, body)])}."""
    setups, media = make_setups(tmp_path)
    (tmp_path / "secret.txt").write_text(SECRET)
    agent_app = create_agent_app(setups, api_keys=(KEY, OTHER), media_roots=[media])
    policy_app = create_policy_app(EchoPolicy(), api_keys=(KEY, OTHER))
    retrieval_app = create_retrieval_app({"text": setups[0].kbs["Text KB"].retriever}, api_keys=(KEY, OTHER))
    search = {"queries": [{"kb": "text", "text": "Marie"}]}
    with serve_in_thread(agent_app) as a, serve_in_thread(policy_app) as p, serve_in_thread(retrieval_app) as r:
        yield {
            "agent": (a, [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", CHAT), ("GET", "/health", None),
                          ("GET", "/media/0/horses.png", None)]),
            "serve": (p, [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", CHAT), ("GET", "/health", None)]),
            "serve-retrieval": (r, [("POST", "/search", search), ("GET", "/kbs", None), ("GET", "/health", None),
                                    ("GET", "/metrics", None)]),
        }  # fmt: skip


@pytest.mark.parametrize("server", ["agent", "serve", "serve-retrieval"])
@pytest.mark.parametrize(
    "auth",
    [
        None,  # no header
        "Bearer wrong-key-0000",  # a wrong key
        f"Basic {KEY}",  # the right key, wrong scheme
        "Bearer",  # no token
    ],
)
def test_a_missing_or_wrong_key_is_a_401_on_every_route(servers, server, auth):
    url, routes = servers[server]
    headers = {"authorization": auth} if auth else {}
    for method, path, body in routes:
        r = httpx.request(method, url + path, json=body, headers=headers, timeout=10)
        assert r.status_code == 401, (server, path, r.status_code)
        assert r.headers["www-authenticate"] == "Bearer" and "API key" in r.json()["error"]["message"]


@pytest.mark.parametrize("server", ["agent", "serve", "serve-retrieval"])
def test_each_of_several_keys_opens_every_route(servers, server):
    url, routes = servers[server]
    for key in (KEY, OTHER):
        for method, path, body in routes:
            if path.startswith("/media"):
                continue  # media needs a link the server signed (below)
            r = httpx.request(method, url + path, json=body, headers={"authorization": f"Bearer {key}"}, timeout=10)
            assert r.status_code == 200, (server, path, r.text)


def test_the_page_is_public_but_holds_no_data(servers):
    url, _ = servers["agent"]
    page = httpx.get(url + "/", timeout=10)
    assert page.status_code == 200 and "<html" in page.text
    assert "Marie" not in page.text and "kbrouter-demo" not in page.text  # models and KBs come from the API


def test_keys_come_from_flags_and_the_environment():
    assert resolve_api_keys(["aaaaaaaa,bbbbbbbb"], env={"KBROUTER_API_KEY": "cccccccc"}) == (
        "aaaaaaaa", "bbbbbbbb", "cccccccc")  # fmt: skip
    assert resolve_api_keys(None, env={}) == ()
    with pytest.raises(ValueError, match="at least 8 characters"):
        resolve_api_keys(["short"], env={})


@pytest.mark.parametrize(
    "host,keys,warns",
    [("127.0.0.1", (), False), ("localhost", (), False), ("::1", (), False), ("0.0.0.0", (), True),
     ("192.168.1.5", (), True), ("0.0.0.0", (KEY,), False)],
)  # fmt: skip
def test_binding_beyond_loopback_without_a_key_warns(caplog, host, keys, warns):
    with caplog.at_level(logging.WARNING):
        message = warn_if_exposed(host, keys, "kbrouter serve")
    assert (message is not None) == warns and (("--api-key" in caplog.text) == warns)


# -- media containment ---------------------------------------------------------------------------------------------


@pytest.fixture
def media_server(tmp_path):
    setups, media = make_setups(tmp_path)
    (tmp_path / "secret.txt").write_text(SECRET)
    os.symlink(tmp_path / "secret.txt", media / "link.png")  # a symlink inside the folder that points out of it
    app = create_agent_app(setups, media_roots=[media])
    with serve_in_thread(app) as url:
        r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "messages": [
            {"role": "user", "content": "Which image shows horses?"}]}, timeout=10)  # fmt: skip
        link = r.json()["kbrouter"]["steps"][0]["hits"][0]["media"]["url"]
        yield url, link, media, tmp_path


def test_a_signed_link_serves_its_file(media_server):
    url, link, media, _ = media_server
    r = httpx.get(url + link, timeout=10)
    assert r.status_code == 200 and r.content == (media / "horses.png").read_bytes()


@pytest.mark.parametrize(
    "path",
    [
        "/media/0/../secret.txt",  # dot-dot (httpx normalises it; sent raw below too)
        "/media/0/%2e%2e/secret.txt",  # encoded dot-dot
        "/media/0/..%2fsecret.txt",  # encoded slash
        "/media/0//etc/passwd",  # absolute path
        "/media/0/%2Fetc%2Fpasswd",  # encoded absolute path
        "/media/0/link.png",  # a symlink out of the folder
        "/media/0/popeye.mp4",  # inside the folder, but never linked (no signature)
        "/media/9/horses.png",  # no such root
        "/media/0/file:%2F%2F%2Fetc%2Fpasswd",  # a file URL
    ],
)
def test_path_traversal_is_403_or_404_and_leaks_nothing(media_server, path):
    url, link, media, _ = media_server
    sig = link.split("sig=")[1]
    for query in ("", f"?sig={sig}", "?sig=" + "0" * 32):
        r = httpx.get(url + path + query, timeout=10)
        assert r.status_code in (401, 403, 404), (path, r.status_code)
        assert SECRET not in r.text and "root:" not in r.text


def test_even_a_correctly_signed_symlink_out_of_the_folder_is_refused(media_server):
    url, _, media, tmp_path = media_server
    roots = MediaRoots([media])
    assert roots.link(media / "link.png") is None  # the server would never link it...
    forged = MediaRoots([media], secret=b"x" * 32)  # ...and a link signed with another secret does not open it
    r = httpx.get(url + f"/media/0/link.png?sig={forged.sign(0, 'link.png')}", timeout=10)
    assert r.status_code in (401, 403) and SECRET not in r.text
    with pytest.raises(PermissionError, match="outside"):
        roots.resolve(0, "link.png", roots.sign(0, "link.png"))
    with pytest.raises(PermissionError, match="`..`"):
        roots.resolve(0, "../secret.txt", roots.sign(0, "../secret.txt"))


def test_raw_dot_dot_paths_are_refused(media_server):
    import socket

    url, *_ = media_server
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"GET /media/0/../../secret.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.split(b" ")[1] in (b"401", b"403", b"404") and SECRET.encode() not in reply


# -- limits --------------------------------------------------------------------------------------------------------


@pytest.fixture
def limited(tmp_path):
    setups, media = make_setups(tmp_path)
    (tmp_path / "secret.png").write_bytes(png())
    limits = AgentServerLimits(max_body_bytes=200_000, max_messages=4, max_tokens=512, max_steps=3,
                               images=ImageLimits(max_bytes=50_000, max_pixels=100_000, max_images=1))  # fmt: skip
    with serve_in_thread(create_agent_app(setups, limits=limits, media_roots=[media])) as url:
        yield url, tmp_path


@pytest.mark.parametrize(
    "body,status,match",
    [
        ({**CHAT, "messages": [{"role": "user", "content": "x" * 300_000}]}, 413, "limit of 200000 bytes"),
        ({**CHAT, "messages": [{"role": "user", "content": "hi"}] * 5}, 400, "at most 4"),
        ({**CHAT, "max_tokens": 100_000}, 400, "limit of 512"),
        ({**CHAT, "n": 3}, 400, "n"),
        ({**CHAT, "kbrouter": {"max_steps": 50}}, 400, "limit of 3"),
        ({**CHAT, "messages": [{"role": "user", "content": "x" * 9000}]}, 400, "characters"),
        (image_chat(data_url(png(400, 400))), 400, "pixels"),  # 160k pixels > 100k
        (image_chat(data_url(os.urandom(60_000))), 400, "bytes"),  # over 50 kB
        (image_chat(data_url(b"GIF89a not really", "image/gif")), 400, "not a readable image"),
        (image_chat(data_url(b"%PDF-1.4", "application/pdf")), 400, "must be one of"),
        (image_chat("data:image/png;base64,@@@not-base64@@@"), 400, "not valid base64"),
        (image_chat("file:///etc/passwd"), 400, "data URL"),
        (image_chat("/etc/passwd"), 400, "data URL"),
        (image_chat("SECRET_PATH"), 400, "data URL"),
        (image_chat("http://169.254.169.254/latest/meta-data"), 400, "not fetched"),
    ],
)
def test_over_limit_and_refused_requests_get_a_4xx_with_a_message(limited, body, status, match):
    url, tmp_path = limited
    body = json.loads(json.dumps(body).replace("SECRET_PATH", str(tmp_path / "secret.png")))
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == status and match in r.json()["error"]["message"], r.text
    ok = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert ok.status_code == 200


def test_more_concurrent_requests_than_the_limit_get_a_429(tmp_path):
    gate = threading.Event()
    setups, media = make_setups(tmp_path, StepPolicy(gate=gate))
    app = create_agent_app(setups, limits=AgentServerLimits(max_concurrent=2), media_roots=[media])
    with serve_in_thread(app) as url:
        results: list = []
        threads = [threading.Thread(target=lambda: results.append(
            httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=20).status_code)) for _ in range(2)]  # fmt: skip
        for t in threads:
            t.start()
        for _ in range(100):
            if app.in_flight == 2:
                break
            threading.Event().wait(0.02)
        third = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=10)
        gate.set()
        for t in threads:
            t.join(20)
        after = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert third.status_code == 429 and "limit" in third.json()["error"]["message"]
    assert sorted(results) == [200, 200] and after.status_code == 200


def test_kbrouter_serve_decodes_data_urls_and_reads_no_path(tmp_path):
    seen = []

    class ImagePolicy:
        name = "img"

        def generate(self, conversations, params):
            from agent.backends.base import Completion

            paths = [p["image"] for c in conversations for m in c if isinstance(m["content"], list)
                     for p in m["content"] if p["type"] == "image"]  # fmt: skip
            seen.extend(paths)
            return [Completion(text="ok") for _ in conversations]

    secret = tmp_path / "secret.png"
    secret.write_bytes(png())
    with serve_in_thread(create_policy_app(ImagePolicy())) as url:
        good = httpx.post(url + "/v1/chat/completions", json=image_chat(data_url(png())), timeout=10)
        bad = [httpx.post(url + "/v1/chat/completions", json=image_chat(u), timeout=10)
               for u in (str(secret), f"file://{secret}", "http://127.0.0.1:1/x.png")]  # fmt: skip
        assert good.status_code == 200 and len(seen) == 1 and open(seen[0], "rb").read() == png()
    assert [r.status_code for r in bad] == [400, 400, 400] and str(secret) not in seen


def test_serve_retrieval_reads_query_images_only_inside_its_folders(tmp_path):
    inside, outside = tmp_path / "media", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (inside / "a.png").write_bytes(png())
    (outside / "b.png").write_bytes(png())
    kb = DocRetriever("text", [])
    app = create_retrieval_app({"text": kb}, image_roots=[inside])
    with serve_in_thread(app) as url:

        def search(image: str) -> httpx.Response:
            return httpx.post(
                url + "/search", json={"queries": [{"kb": "text", "text": "q", "image": image}]}, timeout=10
            )

        ok, refused = search(str(inside / "a.png")), [search(str(outside / "b.png")), search(str(inside / "../elsewhere/b.png")), search("http://example.com/x.png")]  # fmt: skip
    assert ok.status_code == 200 and kb.queries[-1].image == str((inside / "a.png").resolve())
    assert [r.status_code for r in refused] == [403, 403, 403]
    assert "image folders" in refused[0].json()["error"]


def test_remote_retriever_sends_the_key_from_the_environment(monkeypatch):
    from retrievers.remote import RemoteRetriever

    kb = DocRetriever("text", [])
    with serve_in_thread(create_retrieval_app({"text": kb}, api_keys=(KEY,))) as url:
        monkeypatch.setenv("KBROUTER_API_KEY", f"{KEY},{OTHER}")
        assert RemoteRetriever(url, "text", retries=0).search(["q"], 1) == [[]]
        monkeypatch.setenv("KBROUTER_API_KEY", "wrong-key-000")
        with pytest.raises(Exception, match="401"):
            RemoteRetriever(url, "text", retries=0).search(["q"], 1)
