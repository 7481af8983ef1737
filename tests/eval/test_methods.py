"""Methods over the fake policy and KBs: what each one retrieves and answers, the router parser, random routing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.loop import AgentConfig
from agent.types import Question
from eval.methods import (
    MethodContext,
    RandomRoutePolicy,
    available_methods,
    parse_route,
    resolve_methods,
)
from tests.eval.conftest import QUESTIONS
from tests.fakes import FakePolicy

QS = [Question(id=q["id"], question=q["question"], answers=tuple(q["answers"])) for q in QUESTIONS]


@pytest.fixture
def ctx(fake_kbs) -> MethodContext:
    return MethodContext(FakePolicy(), fake_kbs, AgentConfig(max_steps=2, max_retries=0), seed=0, k_per_kb=1)


@pytest.mark.parametrize(
    ("method", "first_kb", "steps", "answer_q1"),
    [
        ("no_retrieval", None, 0, "unknown"),  # nothing retrieved, nothing known
        ("rag_wiki", "wiki", 1, "Paris"),  # one search in the named KB
        ("rag_all", "all", 1, "Paris"),  # one search of every KB
        ("ircot", "all", 1, "Paris"),  # first sentence already says "the answer is": no second search
        ("iter_retgen", "all", 2, "Paris"),  # max_steps rounds, always
        ("router", "wiki", 1, "Paris"),  # the fake router always picks Text KB
        ("agent", "wiki", 2, "Paris"),  # one search, then a None plan (the stop step)
    ],
)
def test_methods_on_fake_parts(
    ctx: MethodContext, method: str, first_kb: str | None, steps: int, answer_q1: str
) -> None:
    trajs = available_methods(["wiki", "tables"])[method](QS, ctx)
    assert [t.id for t in trajs] == [q.id for q in QS]  # one per question, in order
    t = trajs[0]
    assert len(t.steps) == steps and t.final_answer == answer_q1
    assert (t.steps[0].kb if t.steps else None) == first_kb
    assert t.metadata["completion_tokens"] > 0 and "searches" in t.metadata


def test_methods_batch_generation_in_lockstep(fake_kbs) -> None:
    # each stage is one generate() call for the whole batch, whatever the batch size
    calls: list[int] = []

    class Counting(FakePolicy):
        def generate(self, conversations, params):
            calls.append(len(conversations))
            return super().generate(conversations, params)

    ctx = MethodContext(Counting(), fake_kbs, AgentConfig(max_steps=2, max_retries=0))
    available_methods(["wiki"])["agent"](QS, ctx)
    assert calls[0] == len(QS) and len(calls) == 4  # plan, answer, plan (all stop), final


def test_the_agent_method_builds_its_agent_once_per_context(fake_kbs, monkeypatch) -> None:
    """The runner calls a method once per lockstep batch with one context per method: the step agent (its grammars,
    its route prior's encoder and KB profiles) is built on the first batch and reused."""
    import agent.loop

    built = []
    real_init = agent.loop.StepAgent.__init__

    def counting_init(self, *args, **kwargs):
        built.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(agent.loop.StepAgent, "__init__", counting_init)
    ctx = MethodContext(FakePolicy(), fake_kbs, AgentConfig(max_steps=2, max_retries=0))
    method = available_methods(["wiki"])["agent"]
    first, second = method(QS[:1], ctx), method(QS[1:], ctx)
    assert len(first) == 1 and len(second) == len(QS) - 1
    assert len(built) == 1
    other = MethodContext(FakePolicy(), fake_kbs, AgentConfig(max_steps=1, max_retries=0))
    method(QS[:1], other)  # another method's context (other settings) gets its own agent
    assert len(built) == 2 and other.step_agent.config.max_steps == 1


def test_random_routing_is_seeded_and_keeps_none(fake_kbs) -> None:
    names = list(fake_kbs)
    wrapped = RandomRoutePolicy(FakePolicy(), names, seed=3)
    from agent.backends.base import SamplingParams

    conv = [
        {"role": "system", "content": "Knowledge bases you can search"},
        {"role": "user", "content": "Original question: what?\nWhat is the next step?"},
    ]
    params = SamplingParams(max_new_tokens=8, stop=("</ret>",))
    first = wrapped.generate([conv], params)[0]
    assert first.text == wrapped.generate([conv], params)[0].text  # same conversation, same draw
    assert any(f"<ret>{n}</ret>" in first.text for n in names)
    stop = [
        {"role": "system", "content": "Knowledge bases you can search"},
        {"role": "user", "content": "Original question: what?\nSub-question 1: a\nAnswer 1: b\n"},
    ]
    assert "<ret>None</ret>" in wrapped.generate([stop], params)[0].text  # the stop decision is untouched
    # over many questions, both KBs get drawn
    drawn = {
        wrapped.generate([[conv[0], {"role": "user", "content": f"Original question: q{i}"}]], params)[0].text
        for i in range(20)
    }
    assert all(any(f"<ret>{n}</ret>" in t for t in drawn) for n in names)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<ret>Text KB</ret>", "Text KB"),  # exact
        ("<RET> table kb </RET>", "Table KB"),  # case-insensitive, spaces
        ("<ret>None</ret>", None),  # no retrieval
        ("I would use the Table KB here", "Table KB"),  # untagged: a name inside the text
        ("<ret>Video KB</ret>", None),  # not a configured KB
    ],
)
def test_parse_route(text: str, expected: str | None) -> None:
    assert parse_route(text, ["Text KB", "Table KB"]) == expected


def test_resolve_methods() -> None:
    assert resolve_methods(["single_kb", "agent", "agent"], ["wiki", "tables"]) == ["rag_wiki", "rag_tables", "agent"]
    assert resolve_methods(["agent_sft"], ["wiki"], variants={"agent_sft": "agent"}) == ["agent_sft"]
    with pytest.raises(ValueError, match=r"agent_variants.rag_x: method 'rag_images' is not one of .*rag_wiki"):
        resolve_methods(["rag_x"], ["wiki"], variants={"rag_x": "rag_images"})
    with pytest.raises(ValueError, match=r"unknown method 'rag_images'; valid methods: .*rag_wiki.*single_kb"):
        resolve_methods(["rag_images"], ["wiki"])


class GrammarPolicy(FakePolicy):
    """The fake policy as a backend with structured output: it records the grammar of every call and, where one is
    sent, replies as the grammar allows (a route from the list; an answer in think/answer tags)."""

    supports_grammar = True

    def __init__(self) -> None:
        super().__init__()
        self.grammars: list[str | None] = []

    def generate(self, conversations, params):
        self.grammars.append(params.grammar)
        outs = super().generate(conversations, params)
        if params.grammar and params.grammar.startswith('root ::= "<ret>"'):
            return [replace(o, text="<ret>Table KB</ret>") for o in outs]  # a reply only the grammar makes legal
        return outs


def test_baselines_decode_inside_the_step_grammars_when_constrained(fake_kbs) -> None:
    policy = GrammarPolicy()
    ctx = MethodContext(policy, fake_kbs, AgentConfig(max_steps=2, max_retries=0, constrained="on"), k_per_kb=1)
    t = available_methods(["wiki", "tables"])["router"](QS, ctx)[0]
    route, answer = policy.grammars
    assert '"Text KB" | "Table KB" | "None"' in route  # the router picks exactly one configured KB, or None
    assert answer.startswith('root ::= "<think>"') and "<answer>" in answer
    assert t.steps[0].kb == "tables" and t.metadata["route"] == "tables"
    policy.grammars.clear()
    available_methods(["wiki", "tables"])["no_retrieval"](QS, ctx)
    assert policy.grammars and all(g and "<answer>" in g for g in policy.grammars)


def test_constrained_baselines_need_structured_output_and_off_sends_none(fake_kbs) -> None:
    plain = FakePolicy()
    ctx = MethodContext(plain, fake_kbs, AgentConfig(max_steps=2, max_retries=0, constrained="on"))
    with pytest.raises(ValueError, match="has no structured output. Fix:"):
        available_methods(["wiki", "tables"])["router"](QS, ctx)
    policy = GrammarPolicy()
    ctx = MethodContext(policy, fake_kbs, AgentConfig(max_steps=2, max_retries=0, constrained="off"))
    available_methods(["wiki", "tables"])["rag_all"](QS, ctx)
    assert policy.grammars == [None]


def test_constant_baselines_answer_yes_no_questions_only_and_never_call_the_policy(fake_kbs) -> None:
    from eval.scoring import score_prediction

    class Refusing(FakePolicy):
        def generate(self, conversations, params):
            raise AssertionError("a constant baseline must not generate")

    ctx = MethodContext(Refusing(), fake_kbs, AgentConfig(max_steps=2, max_retries=0))
    qs = [
        Question(id="yn", question="Is Paris in France?", answers=("yes",), metadata={"answer_type": "yesno"}),
        Question(id="open", question="Where is Paris?", answers=("France",), metadata={"answer_type": "open"}),
    ]
    methods = available_methods(["wiki", "tables"])
    for word in ("yes", "no"):
        yn, open_q = methods[f"always_{word}"](qs, ctx)
        assert (yn.final_answer, open_q.final_answer) == (word, "")
        assert yn.steps == () and yn.metadata["searches"] == 0 and yn.stop_reason == "answered"
        scores = score_prediction({"trajectory": yn.to_dict()}, ["wiki"], routes=False, retrieves=False)
        assert scores["answer/f1_recall"] == (1.0 if word == "yes" else 0.0)
        assert scores["count/outputs"] == 0  # nothing generated, so no valid-step figure


def test_baselines_answer_in_their_prompts_words_with_answer_words_shown(fake_kbs):
    """`agent.answer_words: shown` reaches the baselines' answer steps: one grammar per question, from its own prompt;
    without a grammar it is refused before anything is generated."""
    from tests.fakes import RecordsParams

    class Grammared(RecordsParams, FakePolicy):
        pass

    cfg = AgentConfig(max_steps=2, max_retries=0, constrained="on", answer_words="shown")
    policy = Grammared()
    ctx = MethodContext(policy, fake_kbs, cfg, seed=0, k_per_kb=1)
    available_methods(["wiki", "tables"])["rag_all"](QS, ctx)
    [params] = policy.params
    assert isinstance(params.grammar, tuple) and len(params.grammar) == len(QS)
    assert len(set(params.grammar)) > 1  # each question's hits give its own words
    assert all('"Paris"' in g for g in params.grammar[:1])
    with pytest.raises(ValueError, match="agent.answer_words: shown needs constrained decoding"):
        MethodContext(FakePolicy(), fake_kbs, replace(cfg, constrained="off")).grammar("answer")
