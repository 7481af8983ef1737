"""Grammars of the step format, generated from the configured KB set.

A plan step must read `<think>T</think>\\n<sub-question>Q?</sub-question>\\n<ret>KB</ret>` (Q a question, KB one of
the display names) or `<think>T</think>\\n<sub-question>None</sub-question>\\n<ret>None</ret>`; an answer or final
step `<think>T</think>\\n<answer>A</answer>`. The grammars are EBNF in the dialect that xgrammar, vLLM's
`structured_outputs.grammar`, SGLang's `ebnf` and llama.cpp's GBNF `grammar` all read.

Why a step always closes inside its token budget: contents are limited in characters, and every allowed character
is at most 2 UTF-8 bytes (code points U+0020-U+07FF: Latin, Greek, Cyrillic, Hebrew, Arabic), so a byte-level
tokenizer (every byte is a token) needs at most 2 tokens for it. The whole output is then at most
`max_bytes(grammar)` tokens (+1 for end-of-sequence); the character limits are derived from the budget to fit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from agent.protocol.tags import ANSWER, NONE_WORDS, RET, SUB_QUESTION, THINK

# any character from U+0020 to U+07FF except the tag brackets; the first one of a field is not a space
_CHAR = r"[ -;=?-\u07FF]"
_FIRST = r"[!-;=?-\u07FF]"
_BYTES_PER_CHAR = 2
_THINK_SHARE = 0.4  # of a plan's free characters; the sub-question gets the rest
_MIN_CHARS = 8

STOP_PLAN = f"<{SUB_QUESTION}>None</{SUB_QUESTION}>\n<{RET}>None</{RET}>"


def check_display_name(name: str, where: str = "knowledge base") -> None:
    """Raise when a KB display name cannot be written inside `<ret>` (the grammar could not express it)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: display_name is empty; give it a name the policy can write in <ret>")
    bad = sorted({c for c in name if c in '<>"\\' or ord(c) < 0x20 or ord(c) > 0x7FF})
    if bad:
        raise ValueError(
            f"{where}: display_name {name!r} holds {bad}, which cannot appear inside <ret>…</ret>; "
            "use letters, digits, spaces and simple punctuation"
        )
    if name.strip().strip(".").lower() in NONE_WORDS:
        raise ValueError(f"{where}: display_name {name!r} reads as 'None' (no retrieval); choose another name")


@dataclass(frozen=True)
class StepGrammar:
    """One step type's grammar with the worst-case length of any output it allows."""

    ebnf: str
    max_tokens: int  # upper bound on tokens of a complete output, end-of-sequence included
    limits: dict[str, int]
    kind: str  # "plan", "route" or "answer" (an answer or final step: `<think>` + `<answer>`)


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _field(name: str, chars: int) -> str:
    return f"{name} ::= {_FIRST} {_CHAR}{{0,{chars - 1}}}"


def _fixed_bytes(parts: Sequence[str]) -> int:
    return sum(len(p.encode()) for p in parts)


def _split_chars(budget_tokens: int, fixed: int, shares: Sequence[float], step: str) -> list[int]:
    free = (budget_tokens - 1 - fixed) // _BYTES_PER_CHAR
    chars = [int(free * s) for s in shares]
    if min(chars) < _MIN_CHARS:
        need = fixed + 1 + _BYTES_PER_CHAR * _MIN_CHARS / min(shares)
        raise ValueError(
            f"the {step} token budget of {budget_tokens} leaves {free} characters for the step's text; "
            f"raise it to at least {int(need) + 1} (agent.{step}_tokens)"
        )
    return chars


@lru_cache(maxsize=64)
def plan_grammar(kb_names: tuple[str, ...], budget_tokens: int, allow_stop: bool = True) -> StepGrammar:
    """The plan grammar over these display names, sized to close within `budget_tokens`. Cached per KB set.

    `allow_stop=False` drops the None/None branch: the step must search (`agent.min_steps`).
    """
    if not kb_names:
        raise ValueError("a plan grammar needs at least one knowledge base")
    for n in kb_names:
        check_display_name(n)
    open_think, mid = f"<{THINK}>", f"</{THINK}>\n"
    ask_open, ask_mid, ask_close = f"<{SUB_QUESTION}>", f"?</{SUB_QUESTION}>\n<{RET}>", f"</{RET}>"
    longest_kb = max(len(n.encode()) for n in kb_names)
    fixed = _fixed_bytes([open_think, mid, ask_open, ask_mid, ask_close]) + max(longest_kb, 0)
    fixed = max(fixed, _fixed_bytes([open_think, mid, STOP_PLAN]))
    think_chars, question_chars = _split_chars(budget_tokens, fixed, (_THINK_SHARE, 1 - _THINK_SHARE), "plan")
    kbs = " | ".join(_literal(n) for n in kb_names)
    ebnf = "\n".join([
        f"root ::= {_literal(open_think)} think {_literal(mid)} {'(ask | stop)' if allow_stop else 'ask'}",
        f"ask ::= {_literal(ask_open)} question {_literal(ask_mid)} kb {_literal(ask_close)}",
        f"stop ::= {_literal(STOP_PLAN)}",
        f"kb ::= {kbs}",
        _field("think", think_chars),
        # a sub-question ends with "?" (in `ask`), so it never reads as None
        _field("question", question_chars - 1),
    ])  # fmt: skip
    bound = fixed + _BYTES_PER_CHAR * (think_chars + question_chars) + 1
    return StepGrammar(ebnf, bound, {"think_chars": think_chars, "sub_question_chars": question_chars}, kind="plan")


@lru_cache(maxsize=64)
def route_grammar(kb_names: tuple[str, ...]) -> StepGrammar:
    """The one-shot router's reply: `<ret>KB</ret>`, KB one of the display names or None (`eval.methods.router`)."""
    if not kb_names:
        raise ValueError("a route grammar needs at least one knowledge base")
    for n in kb_names:
        check_display_name(n)
    choices = " | ".join(_literal(n) for n in (*kb_names, "None"))
    ebnf = f"root ::= {_literal(f'<{RET}>')} ({choices}) {_literal(f'</{RET}>')}"
    bound = _fixed_bytes([f"<{RET}>", f"</{RET}>"]) + max(len(n.encode()) for n in (*kb_names, "None")) + 1
    return StepGrammar(ebnf, bound, {}, kind="route")


# `agent.answer_words`: any characters; words of the prompt the step read; the same, but a final answer's words come
# from the intermediate answers (the final step of a 135M reader rewrites a right one into words of the question)
ANSWER_WORDS = ("free", "shown", "found")
_YES_NO = ("yes", "no", "Yes", "No")
_NUMBER = "[0-9]{1,6}"  # a count or a year the evidence need not spell out
_MAX_WORD_BYTES = 40  # longer runs (URLs, joined cells) are not words an answer copies
_MAX_ANSWER_WORDS = 24
_WORD_EDGES = " \t.,;:!?()[]{}\"'“”‘’…|*"


def check_answer_words(mode: object) -> None:
    if mode not in ANSWER_WORDS:
        raise ValueError(f"agent.answer_words must be one of {ANSWER_WORDS}, got {mode!r}")


def shown_words(text: str, labels: Sequence[str] = ()) -> tuple[str, ...]:
    """The words an answer may copy from `text` (what the step was shown): each whitespace- or `|`-separated token with
    its edge punctuation stripped, also in lower case, less evidence labels (`labels`, e.g. `wiki` for `wiki-0`, which
    a reader should not give as an answer), in first-seen order.

    Example:
        >>> shown_words("wiki-0: Paris (France) | 2,100 people.", labels=["wiki"])
        ('Paris', 'paris', 'France', 'france', '2,100', 'people')
    """
    label = re.compile(rf"(?:{'|'.join(re.escape(x) for x in labels)})-\d+", re.IGNORECASE) if labels else None
    seen: dict[str, None] = {}
    for token in re.split(r"[\s|]+", text):
        word = token.strip(_WORD_EDGES)
        if not word or len(word.encode()) > _MAX_WORD_BYTES or (label and label.fullmatch(word)):
            continue
        if any(c in "<>" or ord(c) < 0x20 for c in word):
            continue  # a tag bracket would end the answer field for the parser
        seen.setdefault(word, None)
        seen.setdefault(word.lower(), None)
    return tuple(w for w in seen if not re.fullmatch(_NUMBER, w))  # numbers come from `_NUMBER`


@lru_cache(maxsize=256)
def answer_grammar(
    budget_tokens: int, words: tuple[str, ...] | None = None, max_words: int | None = None
) -> StepGrammar:
    """The answer/final grammar, sized to close within `budget_tokens`.

    With `words` (`shown_words` of the step's prompt) the answer is a phrase of those words, yes/no or numbers,
    separated by spaces or commas (`agent.answer_words: shown`): a reader that cannot invent a name it was not shown.
    The think stays free. Bounded like the free answer: the phrase has at most as many bytes as its characters would,
    and at most `max_words` words when given (a `found` final: no longer than the answers it is built from).
    """
    open_think, mid, close = f"<{THINK}>", f"</{THINK}>\n<{ANSWER}>", f"</{ANSWER}>"
    fixed = _fixed_bytes([open_think, mid, close])
    think_chars, answer_chars = _split_chars(budget_tokens, fixed, (0.5, 0.5), "answer")
    rules = [
        f"root ::= {_literal(open_think)} think {_literal(mid)} answer {_literal(close)}",
        _field("think", think_chars),
    ]
    limits = {"think_chars": think_chars, "answer_chars": answer_chars}
    if words is None:
        rules.append(_field("answer", answer_chars))
    else:
        vocab = tuple(dict.fromkeys((*_YES_NO, *words)))
        widest = max(6, *(len(w.encode()) for w in vocab))  # 6: the number's digits
        cap = min(_MAX_ANSWER_WORDS, max_words or _MAX_ANSWER_WORDS)
        n = max(1, min(cap, (_BYTES_PER_CHAR * answer_chars + 2) // (widest + 2)))
        rules += [
            f"answer ::= word (sep word){{0,{n - 1}}}",
            'sep ::= " " | ", "',
            f"word ::= {' | '.join(_literal(w) for w in vocab)} | {_NUMBER}",
        ]
        limits["answer_words"] = n
    ebnf = "\n".join(rules)
    bound = fixed + _BYTES_PER_CHAR * (think_chars + answer_chars) + 1
    return StepGrammar(ebnf, bound, limits, kind="answer")


def shown_answer_grammars(
    prompts: Sequence[str], budget_tokens: int, labels: Sequence[str], max_words: Sequence[int | None] = ()
) -> tuple[str, ...]:
    """One answer grammar per prompt (the text of the user turn each step answers), its answer made of that prompt's
    words (`agent.answer_words: shown`): what the step loop and the eval baselines send as a per-conversation tuple.
    `max_words[i]` bounds the i-th answer's word count (None or left out: the grammar's own bound)."""
    bounds = [*max_words, *[None] * (len(prompts) - len(max_words))]
    return tuple(
        answer_grammar(budget_tokens, shown_words(p, tuple(labels)), n).ebnf
        for p, n in zip(prompts, bounds, strict=True)
    )


def _clean(text: str) -> str:
    """`text` with every character the grammars forbid turned into a space, whitespace collapsed."""
    return " ".join("".join(c if 0x20 <= ord(c) <= 0x7FF and c not in "<>" else " " for c in text).split())


def _clip_words(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    cut = text[:chars].rsplit(" ", 1)[0] if " " in text[:chars] else text[:chars]
    return cut.rstrip(" ,;:")


def fit_plan(think: str, sub_question: str | None, kb: str | None, grammar: StepGrammar) -> tuple | None:
    """A plan target the grammar can produce: think clipped at a word, a sub-question that ends with "?".

    Returns `(think, sub_question, kb)`, or None when the sub-question is longer than the grammar allows (a training
    target the constrained policy could never write is dropped, not cut mid-question).
    """
    think = _clip_words(_clean(think), grammar.limits["think_chars"]) or "Next step."
    if sub_question is None:
        return think, None, None
    q = _clean(sub_question).rstrip("?").rstrip() + "?"
    if len(q) > grammar.limits["sub_question_chars"] or len(q) < 2:
        return None
    return think, q, kb


def fit_answer(think: str, answer: str, grammar: StepGrammar) -> tuple[str, str] | None:
    """An answer/final target the grammar can produce, or None when the answer is too long for it."""
    think = _clip_words(_clean(think), grammar.limits["think_chars"]) or "The evidence answers it."
    answer = _clean(answer)
    if not answer or len(answer) > grammar.limits["answer_chars"]:
        return None
    return think, answer
