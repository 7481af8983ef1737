"""The route prior through a served policy: `kbrouter serve` answers vLLM's scoring requests (`prompt_logprobs` with
`continue_final_message`), and the openai backend reads KB-name scores from them that agree with the in-process
transformers policy. Real SmolLM2 behind a real loopback server."""

from __future__ import annotations

import socket

import httpx
import pytest

from agent.backends.openai_compat import OpenAICompatiblePolicy
from agent.routing import normalized
from agent.server import create_app
from retrievers.service import serve_in_thread

CONV = [
    {"role": "system", "content": "Route the question to one knowledge base."},
    {"role": "user", "content": "Which animals are chained on both sides of Sinbad?"},
]
PREFIX = "<think>the clips</think>\n<sub-question>Which animals are chained next to Sinbad?</sub-question>\n<ret>"
OPTIONS = ["Text Retriever</ret>", "Clip Retriever</ret>", "WikiTable Retriever</ret>", "None</ret>"]


@pytest.fixture(scope="module")
def served(smollm2_dir):
    from agent.backends.hf import TransformersPolicy

    policy = TransformersPolicy(smollm2_dir)
    with serve_in_thread(create_app(policy, api_keys=("k",))) as url:
        yield url, policy


def test_served_scores_match_the_in_process_policy(served):
    url, policy = served
    client = OpenAICompatiblePolicy(url + "/v1", policy.name, api_key="k", grammar_field="vllm", send_step=True)
    assert client.supports_continuation_scoring
    (remote,) = client.continuation_logprobs([CONV], [PREFIX], OPTIONS, step="plan")
    (local,) = policy.continuation_logprobs([CONV], [PREFIX], OPTIONS, step="plan")
    assert remote == pytest.approx(local, abs=2e-3)  # same tokens: `<ret>` and a name never merge in SmolLM2
    assert normalized(remote) == pytest.approx(normalized(local), abs=2e-3)
    assert len(set(remote)) == len(OPTIONS)


def test_a_scoring_reply_has_vllms_shape(served):
    url, policy = served
    body = {
        "messages": [*CONV, {"role": "assistant", "content": PREFIX + OPTIONS[1]}],
        "prompt_logprobs": 0,
        "continue_final_message": True,
        "add_generation_prompt": False,
        "return_token_ids": True,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer k"}, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    ids, scored = data["prompt_token_ids"], data["prompt_logprobs"]
    assert scored[0] is None and len(scored) == len(ids) == data["usage"]["prompt_tokens"]
    assert all(list(d) == [str(i)] and d[str(i)]["logprob"] <= 0 for d, i in zip(scored[1:], ids[1:], strict=True))
    assert policy.tokenizer.decode(ids).endswith(PREFIX + OPTIONS[1])  # the last message left open, not closed
    assert data["choices"][0]["message"]["content"] == ""  # scored, not generated


@pytest.mark.parametrize(
    ("extra", "detail"),
    [
        ({"prompt_logprobs": 5}, "only 0 is supported"),
        ({"prompt_logprobs": 0}, "send continue_final_message: true"),
        ({"continue_final_message": True}, "supported for scoring only"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ],
)
def test_scoring_requests_it_cannot_answer_get_400_naming_the_fix(served, extra, detail):
    url, _ = served
    body = {"messages": [*CONV, {"role": "assistant", "content": PREFIX}], **extra}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer k"}, timeout=60)
    assert r.status_code == 400 and detail in r.json()["detail"]


def test_a_server_that_cannot_score_leaves_the_plan_unscored():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = OpenAICompatiblePolicy(f"http://127.0.0.1:{port}/v1", "m", grammar_field="vllm", retries=0, timeout=2)
    assert client.continuation_logprobs([CONV], [PREFIX], OPTIONS) == [None]
    assert not OpenAICompatiblePolicy(
        "http://127.0.0.1:1/v1", "m", grammar_field="sglang"
    ).supports_continuation_scoring


def test_grouped_prompt_scores_equal_one_forward_per_conversation(served):
    """`prompt_logprobs` shares one forward among conversations that differ only in their open reply; every token's
    score equals that of a plain forward over its own conversation, mixed groups and a lone conversation included."""
    import torch

    _, policy = served
    other = [{"role": "user", "content": "What is the capital of France?"}]
    convs = [[*CONV, {"role": "assistant", "content": PREFIX + o}] for o in ("", *OPTIONS)]
    convs.insert(2, [*other, {"role": "assistant", "content": "<think>"}])
    for conv, (ids, logprobs) in zip(convs, policy.prompt_logprobs(convs, step="plan"), strict=True):
        full = policy.tokenizer(policy.render(conv, continue_final=True), add_special_tokens=False)["input_ids"]
        assert ids == full and logprobs[0] is None
        with torch.inference_mode():
            logp = policy.model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
        expected = [float(logp[j - 1, t]) for j, t in enumerate(ids) if j]
        assert logprobs[1:] == pytest.approx(expected, abs=2e-3)
