"""Policy backends on real parts: SmolLM2 through transformers, and through `kbrouter serve` over loopback HTTP."""

import base64
import socket
import threading
import time

import httpx
import pytest

from agent.backends.base import SamplingParams
from agent.backends.openai_compat import OpenAICompatiblePolicy, to_openai_messages

CONV = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    from agent.backends.hf import TransformersPolicy

    return TransformersPolicy(smollm2_dir, max_batch_size=4)


@pytest.fixture(scope="module")
def server(smol):
    """`kbrouter serve`'s app over the real SmolLM2 policy, on a free loopback port."""
    import uvicorn

    from agent.server import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(smol, "smollm2"), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    srv.should_exit = True
    thread.join(timeout=10)


def test_transformers_batch_matches_single_greedy(smol):
    params = SamplingParams(max_new_tokens=8)
    convs = [CONV, [{"role": "user", "content": "Name a colour. One word."}]]
    batch = smol.generate(convs, params)
    single = smol.generate([CONV], params)
    assert len(batch) == 2 and batch[0].text.strip() and batch[0].completion_tokens > 0
    assert batch[0].prompt_tokens > 5
    assert single[0].text == batch[0].text  # left padding does not change greedy output


def test_stop_string_ends_generation(smol):
    out = smol.generate(
        [[{"role": "user", "content": "Write <answer>Paris</answer> and then a long story."}]],
        SamplingParams(max_new_tokens=48, stop=("</answer>",)),
    )[0]
    assert out.text.count("</answer>") <= 1
    assert "</answer>" not in out.text or out.text.endswith("</answer>")


def test_openai_backend_against_kbrouter_serve(server, smol):
    remote = OpenAICompatiblePolicy(server, "smollm2", retries=0)
    params = SamplingParams(max_new_tokens=8)
    outs = remote.generate([CONV, CONV, [{"role": "user", "content": "Say hi."}]], params)
    assert [o.finish_reason for o in outs] != ["error"] * 3
    local = smol.generate([CONV], params)[0]
    assert outs[0].text == local.text  # same model, same greedy decoding, through HTTP
    assert outs[0].completion_tokens == local.completion_tokens and outs[0].prompt_tokens == local.prompt_tokens
    models = httpx.get(server + "/models").json()
    assert models["data"][0]["id"] == "smollm2"


@pytest.mark.parametrize(
    "body",
    [
        {"model": "x"},  # no messages
        {"model": "x", "messages": []},  # empty messages
        {"model": "x", "messages": [{"role": "user"}]},  # message without content
        {"model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": True},  # streaming unsupported
        {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},  # bad sampling value
    ],
)
def test_serve_rejects_bad_requests_with_400(server, body):
    r = httpx.post(server + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["detail"]


def test_unreachable_server_gives_error_completion_not_exception():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    p = OpenAICompatiblePolicy(f"http://127.0.0.1:{port}/v1", "m", retries=1, backoff=0.01, timeout=2)
    (out,) = p.generate([CONV], SamplingParams())
    assert out.finish_reason == "error" and f"127.0.0.1:{port}" in out.metadata["error"]


@pytest.mark.parametrize("status, tries", [(400, 1), (404, 1), (422, 1), (429, 3), (500, 3), (503, 3)])
def test_a_client_error_is_not_retried_a_server_error_is(status, tries):
    """4xx: the request is wrong, asking again cannot help; 5xx: the server may recover (retries=2: three tries)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server hook name
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.path)
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"no")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p = OpenAICompatiblePolicy(
            f"http://127.0.0.1:{server.server_port}/v1", "m", retries=2, backoff=0.01, timeout=5
        )
        (out,) = p.generate([CONV], SamplingParams())
    finally:
        server.shutdown()
        server.server_close()
    assert out.finish_reason == "error" and str(status) in out.metadata["error"]
    assert len(seen) == tries


def test_images_travel_as_data_urls(shared_data):
    img = next((shared_data / "image" / "coco" / "images").glob("*.jpg"))
    msgs = [{"role": "user", "content": [{"type": "image", "image": str(img)}, {"type": "text", "text": "what?"}]}]
    part = to_openai_messages(msgs)[0]["content"][0]
    assert part["type"] == "image_url"
    head, data = part["image_url"]["url"].split(",", 1)
    assert head == "data:image/jpeg;base64" and base64.b64decode(data) == img.read_bytes()


@pytest.mark.gpu
def test_vllm_engine_generates():
    from agent.backends.vllm_engine import VLLMPolicy

    p = VLLMPolicy("HuggingFaceTB/SmolLM2-135M-Instruct", max_model_len=2048, gpu_memory_utilization=0.3)
    (out,) = p.generate([CONV], SamplingParams(max_new_tokens=8))
    assert out.text and out.completion_tokens > 0


@pytest.mark.gpu
def test_vllm_engine_scores_kb_names_as_transformers_does(smollm2_dir):
    """The route prior on the vLLM engine: KB-name scores from prompt_logprobs agree with the transformers policy."""
    pytest.importorskip("vllm", reason="the vLLM engine needs vllm: pip install 'kbrouter[vllm]'")
    from agent.backends.hf import TransformersPolicy
    from agent.backends.vllm_engine import VLLMPolicy

    prefix = "<think>the clips</think>\n<sub-question>Where are the lions?</sub-question>\n<ret>"
    options = ["Text Retriever</ret>", "Clip Retriever</ret>", "None</ret>"]
    engine = VLLMPolicy(smollm2_dir, max_model_len=2048, gpu_memory_utilization=0.3, dtype="float32")
    (got,) = engine.continuation_logprobs([CONV], [prefix], options)
    (expected,) = TransformersPolicy(smollm2_dir).continuation_logprobs([CONV], [prefix], options)
    assert got == pytest.approx(expected, abs=2e-2)
