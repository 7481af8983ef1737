"""Step-GRPO rewards (DESIGN §7): query similarity and routing for plan steps, F1-recall/accuracy for answers, format.

Every reward is TRL-shaped, `reward(completions, **columns) -> list[float | None]`, reading the step dataset's columns
(`step_type`, `gold_sub_question`, `gold_kb`, `gold_answers`, `kb_names`; see `training/step_data.py`). `None` means
"not this row's step type", so TRL leaves it out of the weighted sum. The total for a plan step is
`α·ask + β·route (+ w·format)` and for an answer step `answer (+ w·format)`, the weights coming from the recipe.

By default format is a **gate**: a completion whose tags do not parse (agent.protocol) scores 0 on every component;
`format_reward` is logged either way and may also be added with its own weight. A reward never fails silently: a
missing column or an embedder error raises.

Example:
    >>> route = get_route_reward()
    >>> route(["<think>t</think><sub-question>who?</sub-question><ret>Text KB</ret>"], step_type=["plan"],
    ...       gold_kb=["Text KB"], kb_names=[["Text KB", "Table KB"]])
    [1.0]
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from agent.metrics import f1_recall, is_correct
from agent.protocol import AnswerParse, PlanParse, normalize_kb, parse_answer, parse_plan
from agent.step_records import ANSWER, FINAL, PLAN, STEP_TYPES  # noqa: F401 (one definition, shared)
from training.embedders import MINILM, Embedder, get_embedder

logger = logging.getLogger(__name__)

# TRL's reward contract: completions (+ dataset columns as lists) -> one float or None per completion
RewardFunc = Callable[..., list[float | None]]


def completion_text(completion: str | list[dict]) -> str:
    """The text of a completion: a plain string, or the last message of a conversational completion."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"]


def _column(kwargs: dict, name: str, n: int) -> list:
    if name not in kwargs:
        raise KeyError(f"reward needs the dataset column {name!r}; columns present: {sorted(kwargs)}")
    values = kwargs[name]
    if len(values) != n:
        raise ValueError(f"column {name!r} has {len(values)} values for {n} completions")
    return list(values)


def _step_types(kwargs: dict, n: int) -> list[str]:
    types_ = _column(kwargs, "step_type", n)
    bad = sorted({t for t in types_ if t not in STEP_TYPES})
    if bad:
        raise ValueError(f"unknown step_type {bad}; valid: {STEP_TYPES}")
    return types_


def _parse_plans(completions: list, kwargs: dict, types_: list[str]) -> list[PlanParse | None]:
    kb_names = _column(kwargs, "kb_names", len(completions))
    return [
        parse_plan(completion_text(c), kbs) if t == PLAN else None
        for c, t, kbs in zip(completions, types_, kb_names, strict=True)
    ]


def format_reward(completions: list, **kwargs) -> list[float | None]:
    """1.0 when the completion's tags are well formed for its step type (agent.protocol), else 0.0.

    Also logs `format/violation_rate` for the batch through TRL's `log_metric` when it is given.
    """
    n = len(completions)
    types_ = _step_types(kwargs, n)
    plans = _parse_plans(completions, kwargs, types_)
    out: list[float | None] = []
    for c, t, plan in zip(completions, types_, plans, strict=True):
        ok = plan.ok if t == PLAN else parse_answer(completion_text(c)).ok
        out.append(1.0 if ok else 0.0)
    if kwargs.get("log_metric") is not None and out:
        kwargs["log_metric"]("format/violation_rate", 1.0 - sum(out) / len(out))
    return out


def get_format_reward() -> RewardFunc:
    """The format reward (no parameters; a factory so every reward is built the same way from a recipe)."""
    return format_reward


class RouteReward:
    """`r_route`: 1 when exactly one KB is chosen and it is the gold KB; `None` against a gold `None` is right.

    Both sides are display names (the identifier rule: `agent/step_records.py`): the `<ret>` the policy wrote and
    the row's `gold_kb`, which must be one of the row's `kb_names`; a gold KB outside them (e.g. a KB name where its
    display name belongs) would score every completion 0, so it raises instead.
    """

    def __init__(self, gate: bool = True):
        self.gate = gate
        self.__name__ = "route_reward"

    def __call__(self, completions: list, **kwargs) -> list[float | None]:
        n = len(completions)
        types_ = _step_types(kwargs, n)
        gold_kbs = _column(kwargs, "gold_kb", n)
        plans = _parse_plans(completions, kwargs, types_)
        out: list[float | None] = []
        for plan, gold, kbs in zip(plans, gold_kbs, kwargs["kb_names"], strict=True):
            if plan is None:
                out.append(None)
                continue
            if gold is not None and normalize_kb(gold) not in {normalize_kb(k) for k in kbs}:
                raise ValueError(
                    f"route reward: gold_kb {gold!r} is not among the row's kb_names {list(kbs)}; the reward "
                    "compares display names (what the policy writes in <ret>): map a KB name with "
                    "agent.step_records.kb_id"
                )
            if (self.gate and not plan.ok) or "multiple_kbs" in plan.errors or "unknown_kb" in plan.errors:
                out.append(0.0)
            elif plan.kb is None or gold is None:
                # a stop (None) is right only against a gold stop; a missing <ret> tag never is
                out.append(float(plan.kb is None and gold is None and "missing_ret" not in plan.errors))
            else:
                out.append(float(normalize_kb(plan.kb) == normalize_kb(gold)))
        return out


def get_route_reward(gate: bool = True) -> RewardFunc:
    """Routing reward; `gate=False` scores the parsed KB even when other tags are malformed."""
    return RouteReward(gate=gate)


class AskReward:
    """`r_ask = E(q̂)·E(q*)`: dot product of L2-normalised dense embeddings of predicted and gold sub-questions.

    A `None` sub-question against a gold `None` scores 1; `None` against a real question (or the reverse) scores 0
    (the paper's code embeds the literal word 'none' there, which gives a spurious partial credit). Gold vectors are
    cached per gold query; predictions are embedded in one batch per call.
    """

    def __init__(self, embedder: Embedder, gate: bool = True):
        self.embedder = embedder
        self.gate = gate
        self._gold_cache: dict[str, object] = {}
        self.__name__ = "ask_reward"

    def _gold_vectors(self, golds: list[str]) -> list:
        missing = sorted({g for g in golds if g not in self._gold_cache})
        if missing:
            for g, v in zip(missing, self.embedder.encode(missing), strict=True):
                self._gold_cache[g] = v
        return [self._gold_cache[g] for g in golds]

    def __call__(self, completions: list, **kwargs) -> list[float | None]:
        n = len(completions)
        types_ = _step_types(kwargs, n)
        gold_qs = _column(kwargs, "gold_sub_question", n)
        plans = _parse_plans(completions, kwargs, types_)
        out: list[float | None] = [None] * n
        to_embed: list[int] = []
        for i, (plan, gold) in enumerate(zip(plans, gold_qs, strict=True)):
            if plan is None:
                continue
            if (self.gate and not plan.ok) or (plan.sub_question is None and "missing_sub_question" in plan.errors):
                out[i] = 0.0
            elif plan.sub_question is None or gold is None:
                out[i] = float(plan.sub_question is None and gold is None)
            else:
                to_embed.append(i)
        if to_embed:
            preds = self.embedder.encode([plans[i].sub_question for i in to_embed])
            golds = self._gold_vectors([gold_qs[i] for i in to_embed])
            for i, p, g in zip(to_embed, preds, golds, strict=True):
                out[i] = float(p @ g)
        return out


def get_ask_reward(
    model: str = MINILM, backend: str = "sentence-transformers", gate: bool = True, **embedder_kwargs
) -> RewardFunc:
    """Query-similarity reward over a dense embedder (`backend: flagembedding, model: BAAI/bge-m3` for the paper's)."""
    return AskReward(get_embedder(backend=backend, model=model, **embedder_kwargs), gate=gate)


def answer_score(answer: str, golds: Sequence[str], rule: str = "paper", short_gold_words: int = 5) -> float:
    """Score an answer against its golds with F1-recall.

    Args:
        answer: the predicted answer text.
        golds: gold answers.
        rule: `paper` — the released code's rule: a single gold of at most `short_gold_words` whitespace words, or
            several golds, scores 1 only when recall is 1; a single longer gold scores the continuous recall.
            `accuracy` — 1 when recall is 1, else 0. `recall` — the continuous recall always.
        short_gold_words: word limit of a "short" single gold under the `paper` rule.
    """
    if rule not in ("paper", "accuracy", "recall"):
        raise ValueError(f"unknown answer rule {rule!r}; valid: paper, accuracy, recall")
    recall = f1_recall(answer, list(golds)).recall
    if rule == "recall":
        return recall
    if rule == "accuracy" or len(golds) != 1 or len(golds[0].split()) <= short_gold_words:
        return float(is_correct(recall))
    return recall


class AnswerReward:
    """F1-recall for intermediate answers (`intermediate_rule`), accuracy for final answers (`final_rule`)."""

    def __init__(self, gate: bool = True, intermediate_rule: str = "paper", final_rule: str = "accuracy",
                 short_gold_words: int = 5):  # fmt: skip
        for rule in (intermediate_rule, final_rule):
            if rule not in ("paper", "accuracy", "recall"):
                raise ValueError(f"unknown answer rule {rule!r}; valid: paper, accuracy, recall")
        self.gate = gate
        self.intermediate_rule = intermediate_rule
        self.final_rule = final_rule
        self.short_gold_words = short_gold_words
        self.__name__ = "answer_reward"

    def __call__(self, completions: list, **kwargs) -> list[float | None]:
        n = len(completions)
        types_ = _step_types(kwargs, n)
        golds = _column(kwargs, "gold_answers", n)
        out: list[float | None] = []
        for c, t, gold in zip(completions, types_, golds, strict=True):
            if t == PLAN:
                out.append(None)
                continue
            if not gold:
                raise ValueError(f"an {t} step has no gold answers: {gold!r}")
            parsed: AnswerParse = parse_answer(completion_text(c))
            if (self.gate and not parsed.ok) or parsed.answer is None:
                out.append(0.0)
                continue
            rule = self.final_rule if t == FINAL else self.intermediate_rule
            out.append(answer_score(parsed.answer, list(gold), rule, self.short_gold_words))
        return out


def get_answer_reward(
    gate: bool = True, intermediate_rule: str = "paper", final_rule: str = "accuracy", short_gold_words: int = 5
) -> RewardFunc:
    """Answer reward; `final_rule: paper` reproduces the release exactly (it uses one rule for both kinds)."""
    return AnswerReward(gate, intermediate_rule, final_rule, short_gold_words)


# The one name -> factory table recipes use (STYLE §18).
REWARDS: dict[str, Callable[..., RewardFunc]] = {
    "ask": get_ask_reward,
    "route": get_route_reward,
    "answer": get_answer_reward,
    "format": get_format_reward,
}


def build_reward(name: str, **kwargs) -> RewardFunc:
    """Build one reward by its recipe name; an unknown name raises listing the valid ones."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; valid rewards: {sorted(REWARDS)}")
    return REWARDS[name](**kwargs)
