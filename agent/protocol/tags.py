"""The step tags: writing them, parsing them (never raises), and named format errors.

A plan step is `<think>…</think><sub-question>…</sub-question><ret>…</ret>`; an answer or final step is
`<think>…</think><answer>…</answer>`. Tags match case-insensitively, contents keep their case, text outside
the tags is tolerated. Every way a completion can be malformed has a name in `FORMAT_ERRORS`, so the loop,
the format reward and the eval breakdowns all count the same things.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

THINK, SUB_QUESTION, RET, ANSWER = "think", "sub-question", "ret", "answer"
NONE_WORDS = frozenset({"none", "null", "n/a", "no retrieval", "no retriever"})

# name -> meaning; the parser only ever reports names from this table
FORMAT_ERRORS = {
    "missing_think": "no <think>…</think>",
    "missing_sub_question": "no <sub-question>…</sub-question>",
    "missing_ret": "no <ret>…</ret>",
    "missing_answer": "no <answer>…</answer>",
    "empty_think": "<think> is empty",
    "empty_sub_question": "<sub-question> is empty",
    "empty_ret": "<ret> is empty",
    "empty_answer": "<answer> is empty",
    "repeated_tag": "a tag that must appear once appears several times",
    "unclosed_tag": "an opening tag without its closing tag",
    "unknown_kb": "<ret> names a knowledge base that is not configured",
    "multiple_kbs": "<ret> names several knowledge bases where one is allowed",
    "kb_without_sub_question": "a knowledge base is chosen but the sub-question is None",
    "sub_question_without_kb": "a sub-question is asked but <ret> is None",
    "not_text": "the completion is not a string",
}


def _tag_re(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<\s*{re.escape(tag)}\s*>(.*?)<\s*/\s*{re.escape(tag)}\s*>", re.IGNORECASE | re.DOTALL)


_PATTERNS = {t: _tag_re(t) for t in (THINK, SUB_QUESTION, RET, ANSWER)}
_OPEN = {t: re.compile(rf"<\s*{re.escape(t)}\s*>", re.IGNORECASE) for t in (THINK, SUB_QUESTION, RET, ANSWER)}


# `<ret>` up to `</ret>` or the end: a server that stops at `</ret>` drops the stop string
_RET_OPEN_ENDED = re.compile(rf"<\s*{RET}\s*>(.*?)(?:<\s*/\s*{RET}\s*>|$)", re.IGNORECASE | re.DOTALL)


def ret_content(text: str) -> str | None:
    """The content of the first `<ret>` (closed, or open to the end of the text), unstripped; None without one."""
    m = _RET_OPEN_ENDED.search(text)
    return m.group(1) if m else None


def ret_prefix(text: str) -> str | None:
    """The completion up to its first `<ret>` open tag, included (what the policy had written before naming a KB);
    None without one."""
    m = _RET_OPEN_ENDED.search(text)
    return text[: m.start(1)] if m else None


def ret_choice(kb: str) -> str:
    """The rest of a plan completion after `ret_prefix` when it names `kb`: what the route prior scores."""
    return f"{kb}</{RET}>"


def ret_span(text: str) -> tuple[int, int] | None:
    """`(start, end)` of the content of the first closed `<ret>…</ret>`, to replace it in place; None without one."""
    m = _PATTERNS[RET].search(text)
    return m.span(1) if m else None


def strip_tags(text: str) -> str:
    """Best-effort answer from a malformed reply: the text without tags, think blocks removed."""
    text = re.sub(rf"<\s*{THINK}\s*>.*?<\s*/\s*{THINK}\s*>", " ", text, flags=re.IGNORECASE | re.DOTALL)
    return " ".join(re.sub(r"<[^>]{1,40}>", " ", text).split())


def _extract(text: str, tag: str, errors: list[str], required: bool = True) -> str | None:
    """Content of `<tag>…</tag>` stripped, or None (recording why in `errors`)."""
    found = _PATTERNS[tag].findall(text)
    key = tag.replace("-", "_")
    if not found:
        if _OPEN[tag].search(text):
            errors.append("unclosed_tag")
        if required:
            errors.append(f"missing_{key}")
        return None
    if len(found) > 1:
        errors.append("repeated_tag")
    content = found[0].strip()
    if not content:
        if required:
            errors.append(f"empty_{key}")
        return None
    return content


def format_plan(think: str, sub_question: str | None, kb: str | None) -> str:
    """A plan completion: the one way tags are written (prompts' examples, SFT targets, annotation teacher)."""
    return f"<{THINK}>{think}</{THINK}>\n<{SUB_QUESTION}>{sub_question or 'None'}</{SUB_QUESTION}>\n<{RET}>{kb or 'None'}</{RET}>"


def format_answer(think: str, answer: str) -> str:
    """An answer or final completion."""
    return f"<{THINK}>{think}</{THINK}>\n<{ANSWER}>{answer}</{ANSWER}>"


def is_none(text: str | None) -> bool:
    """Whether a sub-question or KB field says "nothing more is needed"."""
    return text is None or text.strip().strip(".").strip().lower() in NONE_WORDS


def normalize_kb(name: str) -> str:
    return " ".join(name.strip().strip("'\"`.").lower().split())


@dataclass(frozen=True)
class PlanParse:
    """A parsed plan step. `kb` is the matched display name as configured; both None when the plan says None."""

    think: str | None
    sub_question: str | None
    kb: str | None
    errors: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def stop(self) -> bool:
        """The plan says no more retrieval is needed."""
        return self.ok and self.sub_question is None


@dataclass(frozen=True)
class AnswerParse:
    """A parsed answer or final step."""

    think: str | None
    answer: str | None
    errors: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


def parse_plan(text: object, kb_names: Sequence[str], require_think: bool = True) -> PlanParse:
    """Parse a plan completion against the configured KB display names; never raises.

    Args:
        text: the raw completion.
        kb_names: display names of the configured KBs (matched case-insensitively).
        require_think: whether a missing `<think>` is a format error.

    Returns:
        The parse with `errors` empty when the step is well formed.
    """
    if not isinstance(text, str):
        return PlanParse(None, None, None, ("not_text",))
    errors: list[str] = []
    think = _extract(text, THINK, errors, required=require_think)
    sub_q = _extract(text, SUB_QUESTION, errors)
    ret = _extract(text, RET, errors)
    kb: str | None = None
    sub_none = sub_q is not None and is_none(sub_q)
    if ret is not None:
        by_norm = {normalize_kb(n): n for n in kb_names}
        parts = [p for p in re.split(r"[,;\n]|\band\b", ret) if p.strip()]
        if is_none(ret):
            kb = None
            if sub_q is not None and not sub_none:
                errors.append("sub_question_without_kb")
        elif normalize_kb(ret) in by_norm:  # a configured name matches whole, even one holding "," or "and"
            kb = by_norm[normalize_kb(ret)]
            if sub_none:
                errors.append("kb_without_sub_question")
        elif len(parts) > 1:
            errors.append("multiple_kbs")
            if any(normalize_kb(p) not in by_norm and not is_none(p) for p in parts):
                errors.append("unknown_kb")
        else:
            errors.append("unknown_kb")
    return PlanParse(think, None if sub_none else sub_q, kb, tuple(dict.fromkeys(errors)))


def parse_answer(text: object, require_think: bool = True) -> AnswerParse:
    """Parse an answer or final completion; never raises."""
    if not isinstance(text, str):
        return AnswerParse(None, None, ("not_text",))
    errors: list[str] = []
    think = _extract(text, THINK, errors, required=require_think)
    answer = _extract(text, ANSWER, errors)
    return AnswerParse(think, answer, tuple(dict.fromkeys(errors)))
