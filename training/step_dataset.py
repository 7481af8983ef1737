"""From step records to a TRL-ready `datasets.Dataset`: prompts, gold columns, SFT targets, length handling.

See `training/step_data.py` for the formats and the over-long prompt rule implemented here.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter

from agent.backends.base import text_only
from agent.protocol import answer_grammar, fit_answer, fit_plan, format_answer, format_plan, plan_grammar
from training.rewards import ANSWER, PLAN
from training.step_data import StepRecord

logger = logging.getLogger(__name__)


def target_text(record: StepRecord, grammar_tokens: dict | None = None) -> str | None:
    """The gold completion written with the step's tags (SFT target).

    The teacher's reasoning goes in `<think>` when the record has it; otherwise a short template sentence (the
    paper's release keeps no reasoning). With `grammar_tokens` (`{plan, answer, final}` token budgets) the target is
    fitted to the step grammar of those budgets (what constrained decoding can produce): None when it cannot be.
    """
    think = (record.gold.get("think") or "").strip()
    if record.step_type == PLAN:
        sq, kb = record.gold["sub_question"], record.gold["kb"]
        if not think:
            think = "What is known is enough to answer." if sq is None else f"Next I need to find out: {sq}"
        if grammar_tokens:
            fitted = fit_plan(think, sq, kb, plan_grammar(tuple(record.kb_names), grammar_tokens[PLAN]))
            if fitted is None:
                return None
            think, sq, kb = fitted
        return format_plan(think, sq, kb)
    if not think:
        think = "The evidence answers the question." if record.step_type == ANSWER else "The answers so far suffice."
    answer = str(record.gold["answers"][0])
    if grammar_tokens:
        fitted = fit_answer(think, answer, answer_grammar(grammar_tokens[record.step_type]))
        if fitted is None:
            return None
        think, answer = fitted
    return format_answer(think, answer)


def _prompt_len(tokenizer, messages: list[dict]) -> int:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids)


def fit_prompt(messages: list[dict], step_type: str, tokenizer, max_tokens: int) -> list[dict] | None:
    """Drop whole user lines until the templated prompt fits `max_tokens`; None when it cannot fit.

    The first user line (question) and the last (instruction) are kept; answer steps lose lines from the end of the
    middle block (lowest-ranked evidence), plan/final steps from its start (oldest history).
    """
    if _prompt_len(tokenizer, messages) <= max_tokens:
        return messages
    lines = messages[-1]["content"].split("\n")
    if len(lines) <= 2:
        return None
    head, middle, tail = lines[:1], lines[1:-1], lines[-1:]

    def with_dropped(k: int) -> list[dict]:
        kept = middle[: len(middle) - k] if step_type == ANSWER else middle[k:]
        return [*messages[:-1], {**messages[-1], "content": "\n".join(head + kept + tail)}]

    lo, hi = 1, len(middle)  # binary search for the fewest dropped lines that fit
    if _prompt_len(tokenizer, with_dropped(hi)) > max_tokens:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _prompt_len(tokenizer, with_dropped(mid)) <= max_tokens:
            hi = mid
        else:
            lo = mid + 1
    return with_dropped(lo)


def build_step_dataset(
    records: list[StepRecord],
    tokenizer=None,
    max_prompt_tokens: int | None = None,
    use_images: bool = False,
    step_types: list[str] | None = None,
    grammar_tokens: dict | None = None,
):
    """Build the training dataset from step records.

    Args:
        records: step records (images already resolved when `use_images`).
        tokenizer: a tokenizer with a chat template; needed only for `max_prompt_tokens`.
        max_prompt_tokens: prompt budget; longer prompts are shortened or skipped (see `fit_prompt`).
        use_images: keep an `images` column (decoded as PIL by `datasets`); otherwise images are dropped.
        step_types: keep only these step types (e.g. `[plan]`).
        grammar_tokens: `{plan, answer, final}` token budgets: targets are fitted to those step grammars (what the
            constrained agent can write); records whose target cannot fit are skipped and counted.

    Returns:
        A `datasets.Dataset` with `prompt`, `completion`, `step_type`, `gold_sub_question`, `gold_kb`,
        `gold_answers`, `kb_names`, `trajectory_id`, `step_index` and, with `use_images`, `images`.
    """
    import datasets

    if max_prompt_tokens is not None and tokenizer is None:
        raise ValueError("max_prompt_tokens needs a tokenizer to count tokens")
    rows: dict[str, list] = {k: [] for k in ("prompt", "completion", "step_type", "gold_sub_question", "gold_kb",
                                             "gold_answers", "kb_names", "trajectory_id", "step_index", "images")}  # fmt: skip
    skipped, shortened = Counter(), Counter()
    for r in records:
        if step_types and r.step_type not in step_types:
            continue
        messages = text_only(r.messages)  # images travel in the `images` column
        if max_prompt_tokens is not None:
            fitted = fit_prompt(messages, r.step_type, tokenizer, max_prompt_tokens)
            if fitted is None:
                skipped[r.step_type] += 1
                continue
            if fitted is not messages:
                shortened[r.step_type] += 1
            messages = fitted
        target = target_text(r, grammar_tokens)
        if target is None:
            skipped[f"{r.step_type}_off_grammar"] += 1
            continue
        rows["prompt"].append(messages)
        rows["completion"].append([{"role": "assistant", "content": target}])
        rows["step_type"].append(r.step_type)
        rows["gold_sub_question"].append(r.gold.get("sub_question") if r.step_type == PLAN else None)
        rows["gold_kb"].append(r.gold.get("kb") if r.step_type == PLAN else None)
        rows["gold_answers"].append([] if r.step_type == PLAN else [str(a) for a in r.gold["answers"]])
        rows["kb_names"].append(list(r.kb_names))
        rows["trajectory_id"].append(r.trajectory_id)
        rows["step_index"].append(r.step_index)
        rows["images"].append(list(r.images))
    if skipped or shortened:
        logger.warning("prompt budget %s tokens: shortened %s, skipped %s", max_prompt_tokens, dict(shortened),
                       dict(skipped))  # fmt: skip
    if not rows["prompt"]:
        raise ValueError(f"no step prompts left (step_types={step_types}, skipped={dict(skipped)})")
    has_images = use_images and any(rows["images"])
    if not has_images:
        del rows["images"]
    features = {
        "prompt": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
        "completion": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
        "step_type": datasets.Value("string"),
        "gold_sub_question": datasets.Value("string"),
        "gold_kb": datasets.Value("string"),
        "gold_answers": datasets.Sequence(datasets.Value("string")),
        "kb_names": datasets.Sequence(datasets.Value("string")),
        "trajectory_id": datasets.Value("string"),
        "step_index": datasets.Value("int64"),
    }
    if has_images:
        features["images"] = datasets.Sequence(datasets.Image())
    ds = datasets.Dataset.from_dict(rows, features=datasets.Features(features))
    ds.info.description = f"skipped_over_length={dict(skipped)} shortened={dict(shortened)}"
    return ds


def prompt_length_stats(dataset, tokenizer, limit: int | None = None) -> dict:
    """Token lengths of the templated prompts (with generation header), overall and per step type.

    Returns:
        `{"all": {...}, "plan": {...}, ...}` with `n, mean, median, p90, max` and, given `limit`, `over_limit`.
    """

    def stats(lengths: list[int]) -> dict:
        s = sorted(lengths)
        out = {"n": len(s), "mean": statistics.fmean(s), "median": statistics.median(s),
               "p90": s[min(len(s) - 1, int(0.9 * len(s)))], "max": s[-1]}  # fmt: skip
        if limit is not None:
            out["over_limit"] = sum(x > limit for x in s)
        return out

    by_type: dict[str, list[int]] = {}
    for prompt, t in zip(dataset["prompt"], dataset["step_type"], strict=True):
        by_type.setdefault(t, []).append(_prompt_len(tokenizer, prompt))
    result = {"all": stats([x for v in by_type.values() for x in v])}
    result.update({t: stats(v) for t, v in sorted(by_type.items())})
    return result
