"""A prompt longer than the model's context is refused before generation, that conversation alone; a fake model
and tokenizer (one token per word), no weights."""

from __future__ import annotations

from types import SimpleNamespace

from agent.backends.base import Completion, SamplingParams
from agent.backends.hf import TransformersPolicy
from agent.kbs import KnowledgeBase
from agent.loop import AgentConfig, StepAgent
from agent.types import Question
from tests.fakes import FakeRetriever


class WordTokenizer:
    def apply_chat_template(self, conv, tokenize=False, add_generation_prompt=True):  # noqa: ANN001, ANN201
        return " ".join(str(m["content"]) for m in conv)

    def __call__(self, prompts, add_special_tokens=False):  # noqa: ANN001, ANN201
        return {"input_ids": [p.split() for p in prompts]}


def _policy(context: int) -> TransformersPolicy:
    policy = object.__new__(TransformersPolicy)
    policy.name, policy.max_batch_size = "fake-lm", 4
    policy.tokenizer = WordTokenizer()
    policy.model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=context))
    policy.generated = []
    policy.prefix_cache, policy.continuous_batching = None, False  # what __init__ sets by default

    def chunk(prompts, params, rows=None):  # noqa: ANN001, ANN202
        policy.generated += prompts
        return [Completion(text="<think>t</think><answer>Paris</answer>", prompt_tokens=1) for _ in prompts]

    policy._generate_chunk = chunk
    return policy


def test_an_over_long_prompt_is_refused_and_its_batch_mates_answered() -> None:
    policy = _policy(context=100)
    convs = [[{"role": "user", "content": "short question"}], [{"role": "user", "content": "word " * 5000}]]
    out = policy.generate(convs, SamplingParams(max_new_tokens=20))
    assert out[0].finish_reason == "stop" and out[1].finish_reason == "error"
    assert (
        "prompt of 5000 tokens + 20 new ones exceeds the context of fake-lm (100 tokens)" in out[1].metadata["error"]
    )
    assert policy.generated == ["short question"]  # the long prompt never reached the model


def test_a_one_megabyte_question_ends_in_backend_error_not_a_crash() -> None:
    kbs = {"Text KB": KnowledgeBase("wiki", "Text KB", FakeRetriever("wiki", ["paris"]), k=1)}
    agent = StepAgent(_policy(context=8192), kbs, AgentConfig(max_steps=1, min_steps=0, few_shot=False))
    huge = Question("huge", "why " * 262_144)
    trajs = agent.run_batch([Question("ok", "What is the capital?"), huge])
    assert trajs[1].stop_reason == "backend_error" and "exceeds the context" in trajs[1].metadata["error"]
    assert trajs[0].stop_reason != "backend_error"
