"""Unit tests for training/rewards.py: each component on hand-made cases, None handling, gate, errors raise."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from training.embedders import SentenceTransformerEmbedder
from training.rewards import (
    REWARDS,
    answer_score,
    build_reward,
    format_reward,
    get_answer_reward,
    get_ask_reward,
    get_route_reward,
)

KBS = ["Text Retriever", "Table Retriever"]


def plan(sub_q: str, kb: str, think: str = "thinking") -> str:
    return f"<think>{think}</think>\n<sub-question>{sub_q}</sub-question>\n<ret>{kb}</ret>"


def ans(answer: str, think: str = "thinking") -> str:
    return f"<think>{think}</think>\n<answer>{answer}</answer>"


def plan_cols(n: int, gold_q=None, gold_kb=None) -> dict:
    return {"step_type": ["plan"] * n, "gold_sub_question": [gold_q] * n, "gold_kb": [gold_kb] * n,
            "kb_names": [KBS] * n, "gold_answers": [[]] * n}  # fmt: skip


@pytest.mark.parametrize(
    "completion, gold_kb, expected",
    [
        (plan("who directed X?", "Text Retriever"), "Text Retriever", 1.0),  # right KB
        (plan("who directed X?", "text retriever"), "Text Retriever", 1.0),  # KB names match case-insensitively
        (plan("who directed X?", "Table Retriever"), "Text Retriever", 0.0),  # wrong KB
        (
            plan("who directed X?", "Text Retriever, Table Retriever"),
            "Text Retriever",
            0.0,
        ),  # two KBs: not exactly one
        (plan("who directed X?", "Web Search"), "Text Retriever", 0.0),  # unknown KB
        (plan("None", "None"), None, 1.0),  # stop against a gold stop is right
        (plan("None", "None"), "Text Retriever", 0.0),  # stop where the gold retrieves
        (plan("who directed X?", "Text Retriever"), None, 0.0),  # retrieve where the gold stops
        ("<sub-question>who?</sub-question><ret>Text Retriever</ret>", "Text Retriever", 0.0),  # no <think>: gated
        ("just an answer", None, 0.0),  # no tags at all: gated, even against a gold None
        ([{"role": "assistant", "content": plan("q?", "Table Retriever")}], "Table Retriever", 1.0),  # conversational
    ],
)
def test_route_reward(completion, gold_kb, expected):
    assert get_route_reward()([completion], **plan_cols(1, "q?", gold_kb)) == [expected]


def test_route_reward_without_gate_scores_the_parsed_kb():
    # the <think> tag is missing, but with gate=False the right KB still scores
    text = "<sub-question>who?</sub-question><ret>Text Retriever</ret>"
    assert get_route_reward(gate=False)([text], **plan_cols(1, "who?", "Text Retriever")) == [1.0]


@pytest.fixture(scope="module")
def minilm_ask():
    return get_ask_reward(model="minilm")


@pytest.mark.parametrize(
    "completion, gold_q, low, high",
    [
        (plan("who is the director of the film Strangler of the Swamp?", "Text Retriever"),
         "who is the director of the film strangler of the swamp?", 0.99, 1.001),  # same question (case aside)
        (plan("who directed Strangler of the Swamp?", "Text Retriever"),
         "who is the director of the film strangler of the swamp?", 0.6, 0.99),  # paraphrase: high, not 1
        (plan("what is the boiling point of water?", "Text Retriever"),
         "who is the director of the film strangler of the swamp?", -0.3, 0.3),  # unrelated question: low
        (plan("None", "None"), None, 1.0, 1.0),  # None vs gold None: 1
        (plan("None", "None"), "when was frank wisbar born?", 0.0, 0.0),  # None vs a real question: 0
        (plan("when was frank wisbar born?", "Text Retriever"), None, 0.0, 0.0),  # a question where gold stops: 0
        ("<think>x</think><sub-question>when was he born?</sub-question>", "when was he born?", 0.0, 0.0),  # no <ret>
    ],
)  # fmt: skip
def test_ask_reward_minilm(minilm_ask, completion, gold_q, low, high):
    (score,) = minilm_ask([completion], **plan_cols(1, gold_q, "Text Retriever"))
    assert low <= score <= high


class CountingEmbedder:
    """Deterministic fake embedder: a one-hot per distinct text; counts what it encodes."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.index: dict[str, int] = {}

    def encode(self, texts):
        self.calls.append(list(texts))
        out = np.zeros((len(texts), 16), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, self.index.setdefault(t, len(self.index))] = 1.0
        return out


def test_ask_reward_batches_predictions_and_caches_gold_vectors():
    from training.rewards import AskReward

    emb = CountingEmbedder()
    reward = AskReward(emb)
    comps = [plan("q1", "Text Retriever"), plan("q2", "Text Retriever")]
    assert reward(comps, **plan_cols(2, "q1", "Text Retriever")) == [1.0, 0.0]
    assert reward(comps, **plan_cols(2, "q1", "Text Retriever")) == [1.0, 0.0]
    # one batch of predictions per call; the gold 'q1' is embedded once across both calls
    assert emb.calls == [["q1", "q2"], ["q1"], ["q1", "q2"]]


class FixedEmbedder:
    """Fake embedder with hand-picked unit vectors (float64), so similarities are exact numbers."""

    VECTORS = {
        "who directed jaws?": [1.0, 0.0],
        "who was the director of jaws?": [0.6, 0.8],
        "when was jaws released?": [-0.8, 0.6],
    }

    def encode(self, texts):
        return np.array([self.VECTORS[t] for t in texts], dtype=np.float64)


def test_pinned_numbers_on_a_fixed_batch():
    """All four rewards on one fixed mixed batch, with exact values (computed by hand, not read off the code)."""
    from training.rewards import AskReward

    comps = [
        plan("who was the director of jaws?", "Text Retriever"),  # right KB, paraphrased sub-question
        plan("when was jaws released?", "Table Retriever"),  # wrong KB, other question
        ans("steven spielberg directed it"),  # 7-word gold, 'the' dropped: 3 of 6 gold tokens
        "<answer>x</answer>",  # final without <think>: format gate
    ]
    cols = {"step_type": ["plan", "plan", "answer", "final"],
            "gold_sub_question": ["who directed jaws?", "who directed jaws?", None, None],
            "gold_kb": ["Text Retriever", "Text Retriever", None, None], "kb_names": [KBS, KBS, [], []],
            "gold_answers": [[], [], ["steven spielberg directed the 1975 film jaws"], ["x"]]}  # fmt: skip
    assert AskReward(FixedEmbedder())(comps, **cols) == [0.6, -0.8, None, None]  # dot products, not clipped
    assert get_route_reward()(comps, **cols) == [1.0, 0.0, None, None]
    assert get_answer_reward()(comps, **cols) == [None, None, 0.5, 0.0]
    assert format_reward(comps, **cols) == [1.0, 1.0, 1.0, 0.0]


def test_embedder_exception_raises_not_zero():
    from training.rewards import AskReward

    class Broken:
        def encode(self, texts):
            raise RuntimeError("embedding service down")

    with pytest.raises(RuntimeError, match="embedding service down"):
        AskReward(Broken())([plan("q", "Text Retriever")], **plan_cols(1, "g", "Text Retriever"))


def answer_cols(step_type: str, golds: list[str], n: int = 1) -> dict:
    return {"step_type": [step_type] * n, "gold_answers": [golds] * n, "kb_names": [[]] * n,
            "gold_sub_question": [None] * n, "gold_kb": [None] * n}  # fmt: skip


@pytest.mark.parametrize(
    "step_type, completion, golds, expected",
    [
        ("final", ans("9 December 1899"), ["9 December 1899"], 1.0),  # exact final answer
        ("final", ans("He was born on 9 December 1899."), ["9 December 1899"], 1.0),  # verbose but full recall
        ("final", ans("December 1899"), ["9 December 1899"], 0.0),  # final = accuracy: partial recall is 0
        ("answer", ans("December 1899"), ["9 December 1899"], 0.0),  # short single gold (<= 5 words): binary
        # long single gold (> 5 words): continuous recall; 'the' is dropped, so 3 of 7 gold tokens are found
        ("answer", ans("frank wisbar directed it"), ["frank wisbar directed the film strangler of swamp"], 3 / 7),
        ("answer", ans("Roma"), ["Rome", "Roma"], 1.0),  # several golds: binary, any gold
        ("answer", ans("Milan"), ["Rome", "Roma"], 0.0),  # several golds, wrong
        ("final", "<answer>9 December 1899</answer>", ["9 December 1899"], 0.0),  # no <think>: format gate
        ("final", ans(""), ["9 December 1899"], 0.0),  # empty answer tag
        ("final", "<THINK>t</THINK><ANSWER>three</ANSWER>", ["3"], 1.0),  # tags case-insensitive, 'three' -> '3'
    ],
)
def test_answer_reward(step_type, completion, golds, expected):
    assert get_answer_reward()([completion], **answer_cols(step_type, golds)) == [pytest.approx(expected)]


def test_answer_reward_paper_final_rule_gives_continuous_recall_for_long_gold():
    # the release applies one rule to final answers too: a long single gold gets continuous recall
    gold = ["the eiffel tower is in paris france near the seine"]
    comp = [ans("paris france")]
    assert get_answer_reward(final_rule="paper")(comp, **answer_cols("final", gold)) == [pytest.approx(2 / 8)]
    assert get_answer_reward()(comp, **answer_cols("final", gold)) == [0.0]


@pytest.mark.parametrize(
    "rule, answer, golds, expected",
    [
        ("paper", "a b c", ["a b c d e f"], 0.5),  # 6-word gold, 'a' kept by the paper normaliser: 3/6
        ("accuracy", "a b c", ["a b c d e f"], 0.0),  # accuracy needs recall 1
        ("recall", "b", ["b c"], 0.5),  # recall rule: always continuous
    ],
)
def test_answer_score_rules(rule, answer, golds, expected):
    assert answer_score(answer, golds, rule) == pytest.approx(expected)


@pytest.mark.parametrize(
    "step_type, completion, expected",
    [
        ("plan", plan("q?", "Text Retriever"), 1.0),  # well-formed plan
        ("plan", plan("None", "None"), 1.0),  # well-formed stop
        ("plan", plan("None", "Text Retriever"), 0.0),  # a KB with a None sub-question
        ("plan", plan("q?", "None"), 0.0),  # a sub-question with no KB
        ("plan", "<think>t</think><sub-question>q?</sub-question><ret>Text Retriever", 0.0),  # unclosed <ret>
        ("plan", ans("x"), 0.0),  # answer tags on a plan step
        ("answer", ans("x"), 1.0),  # well-formed answer
        ("final", "<think>t</think>x", 0.0),  # missing <answer>
        ("final", plan("q?", "Text Retriever"), 0.0),  # plan tags on a final step
    ],
)
def test_format_reward(step_type, completion, expected):
    cols = plan_cols(1, "q?", "Text Retriever") if step_type == "plan" else answer_cols(step_type, ["x"])
    assert format_reward([completion], **cols) == [expected]


def test_format_reward_logs_violation_rate():
    logged = {}
    cols = answer_cols("answer", ["x"], n=4)
    format_reward([ans("x"), ans("x"), "bad", "bad"], log_metric=logged.__setitem__, **cols)
    assert logged == {"format/violation_rate": 0.5}


def test_rewards_return_none_for_other_step_types():
    mixed = {"step_type": ["plan", "final"], "gold_sub_question": ["q?", None], "gold_kb": ["Text Retriever", None],
             "kb_names": [KBS, []], "gold_answers": [[], ["x"]]}  # fmt: skip
    comps = [plan("q?", "Text Retriever"), ans("x")]
    assert get_route_reward()(comps, **mixed) == [1.0, None]
    assert get_answer_reward()(comps, **mixed) == [None, 1.0]
    assert get_ask_reward(model="minilm")(comps, **mixed)[1] is None


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: get_route_reward()([plan("q", "Text Retriever")], step_type=["plan"], kb_names=[KBS]), KeyError),
        (lambda: format_reward(["x"], step_type=["retrieve"], kb_names=[[]]), ValueError),  # unknown step type
        (lambda: get_answer_reward()([ans("x")], **answer_cols("final", [])), ValueError),  # no gold answers
        (lambda: build_reward("bleu"), ValueError),  # unknown reward name
        (lambda: get_answer_reward(final_rule="lenient"), ValueError),  # unknown rule
    ],
)
def test_bad_input_raises(call, error):
    # missing gold_kb column / unknown step type / empty gold / unknown name / unknown rule: errors, never zeros
    with pytest.raises(error):
        call()


def test_rewards_are_picklable_and_named():
    funcs = [build_reward(name) for name in REWARDS]
    names = [getattr(f, "__name__", None) for f in funcs]
    assert names == ["ask_reward", "route_reward", "answer_reward", "format_reward"]
    emb = funcs[0].embedder
    assert isinstance(emb, SentenceTransformerEmbedder)
    emb.encode(["warm the model up"])
    clone = pickle.loads(pickle.dumps(funcs[0]))  # the loaded model is dropped, rebuilt on first use
    assert clone.embedder._st is None
    assert clone([plan("None", "None")], **plan_cols(1, None, None)) == [1.0]
