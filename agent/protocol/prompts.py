"""Prompt builders for the three step types: plan, intermediate answer, final answer.

Each returns chat messages (system + user). A user turn with images carries a list of content parts
(`{"type": "image", "image": path}` then `{"type": "text", "text": ...}`), which chat VLMs and the
OpenAI-compatible backend understand; text-only turns are plain strings. Images stay paths: the question image
comes first, then the pixels behind retrieved hits (`add_evidence_images`); a backend loads them under its own
pixel budget.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.protocol.evidence import GAP, check_focus_mode, focused_text
from agent.protocol.tags import format_answer, format_plan
from retrievers.config import default_cache_dir
from retrievers.provenance import provenance_label
from retrievers.types import Hit

logger = logging.getLogger(__name__)

Message = dict  # {"role": str, "content": str | list[dict]}


@dataclass(frozen=True)
class PromptSettings:
    """Everything that changes what a prompt looks like. The loop, synthesis, training and eval render with it, and
    each step record stores the settings it was rendered with.

    The defaults are those the shipped router was trained with (no worked example); an untrained policy follows the
    tags far more often with `few_shot=True`.
    """

    few_shot: bool = False
    evidence_chars: int = 1200  # longest evidence text per hit
    evidence_focus: str = "head"  # which longer hits show their parts nearest the sub-question: head | tables | all

    def __post_init__(self) -> None:
        check_focus_mode(self.evidence_focus)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> PromptSettings:
        return cls(**(d or {}))


DEFAULT_PROMPT = PromptSettings()

PLAN_SYSTEM = """You answer questions step by step, looking things up in knowledge bases when you need to.
At each step, decide whether what you already know is enough to answer the original question.
If it is not, ask ONE simple sub-question and choose ONE knowledge base to search for it.
If it is, write None as the sub-question and None as the knowledge base.

Knowledge bases you can search:
{kb_list}

Reply in exactly this format:
<think>your reasoning about what is known and what is missing</think>
<sub-question>one atomic question, or None</sub-question>
<ret>the name of one knowledge base from the list, or None</ret>"""

ANSWER_SYSTEM = """You answer a question using the evidence retrieved for it.
Read the evidence, reason briefly, then give a short answer (a name, number, date, yes/no or short phrase).
Reply in exactly this format:
<think>your reasoning over the evidence</think>
<answer>the short answer</answer>"""

FINAL_SYSTEM = """You give the final answer to a question, using the sub-questions already answered.
Reason briefly over them, then give a short answer (a name, number, date, yes/no or short phrase).
Reply in exactly this format:
<think>your reasoning</think>
<answer>the short final answer</answer>"""

FORMAT_REMINDER = "Your last reply did not follow the format ({errors}). Reply again, using only the tags asked for."


def kb_list(kbs: Sequence[tuple[str, str]]) -> str:
    """Render `(display_name, description)` pairs as the list shown to the policy."""
    return "\n".join(f"- {name}: {desc}" if desc else f"- {name}" for name, desc in kbs)


_KB_LIST_HEAD, _KB_LIST_TAIL = PLAN_SYSTEM.split("{kb_list}")


def plan_kb_list(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """The `(display_name, description)` pairs a plan prompt (from `plan_messages`) lists: the inverse of `kb_list`."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    if not (system.startswith(_KB_LIST_HEAD) and system.endswith(_KB_LIST_TAIL)):
        raise ValueError("not a plan prompt written by agent.protocol.plan_messages (its system message differs)")
    pairs = []
    for line in system[len(_KB_LIST_HEAD) : len(system) - len(_KB_LIST_TAIL)].splitlines():
        name, _, desc = line.removeprefix("- ").partition(": ")
        pairs.append((name, desc))
    return pairs


def with_kb_list(messages: Sequence[Message], kbs: Sequence[tuple[str, str]]) -> list[Message]:
    """The same plan prompt listing other KBs (training re-renders it with shuffled and subsetted lists).

    Only plain prompts: a few-shot prompt's worked example names a KB of the old list.
    """
    plan_kb_list(messages)  # raises on anything else
    if len(messages) != 2:
        raise ValueError("with_kb_list re-renders plain plan prompts (system + user), not few-shot ones")
    return [{"role": "system", "content": PLAN_SYSTEM.format(kb_list=kb_list(kbs))}, messages[1]]


def history_lines(history: Sequence[tuple[str, str]]) -> str:
    return "".join(f"Sub-question {i}: {q}\nAnswer {i}: {a}\n" for i, (q, a) in enumerate(history, 1))


def render_hits(
    hits: Sequence[Hit],
    max_chars: int = DEFAULT_PROMPT.evidence_chars,
    query: str | None = None,
    focus_mode: str = "all",
) -> str:
    """Numbered evidence lines tagged by KB (`text-0: …`); a table keeps its rows, indented under its line.

    A hit longer than `max_chars` is cut at its head, or, given the sub-question as `query`, shows the parts of it
    nearest the query (`agent.protocol.evidence.focus`) if `focus_mode` covers its modality. A record with
    provenance (written by `kbrouter ingest`) ends with `[source: report.pdf p. 4, table 2]`.
    """
    lines = []
    for i, hit in enumerate(hits):
        text = focused_text(hit.doc.text, hit.doc.modality, max_chars, query, focus_mode)
        if text is None:
            text = hit.doc.text if len(hit.doc.text) <= max_chars else hit.doc.text[:max_chars] + " " + GAP
        if hit.doc.modality == "table":
            body = "\n    ".join(line for line in text.splitlines() if line.strip())
        else:
            body = " ".join(text.split())
            if hit.doc.title and not body.startswith(hit.doc.title):
                body = f"{hit.doc.title}: {body}"
        if hit.doc.media is not None and hit.doc.media.start is not None:
            body += f" [{hit.doc.media.start:.1f}s–{hit.doc.media.end:.1f}s]"
        source = provenance_label(hit.doc.metadata)  # "" for records without provenance: their lines are unchanged
        if source:
            body += f" [source: {source}]"
        lines.append(f"{hit.kb}-{i}: {body}")
    return "\n".join(lines) if lines else "(no evidence found)"


def _user(text: str, images: Sequence[str]) -> Message:
    if not images:
        return {"role": "user", "content": text}
    return {
        "role": "user",
        "content": [*({"type": "image", "image": p} for p in images), {"type": "text", "text": text}],
    }


def evidence_image_paths(
    hits: Sequence[Hit], max_images: int, frame_dir: str | os.PathLike | None = None
) -> list[str]:
    """Image paths for the pixels behind hits: the image of an image hit, a middle frame of a clip or video hit.

    Frames are written once as JPEGs under `frame_dir` (default `$KBROUTER_CACHE/frames`) so they can be
    referenced by path like any other image. Unreadable media are skipped with a warning.
    """
    from retrievers.media import MediaError, frames_at, probe_video

    out: list[str] = []
    folder = Path(frame_dir) if frame_dir else default_cache_dir() / "frames"
    for hit in hits:
        if len(out) >= max_images:
            break
        media = hit.doc.media
        if media is None:
            continue
        if hit.doc.modality == "image":
            out.append(media.path)
            continue
        try:
            start = media.start or 0.0
            end = media.end if media.end is not None else probe_video(media.path).duration
            t = (start + end) / 2
            target = folder / f"{Path(media.path).stem}_{t:09.3f}.jpg"
            if not target.exists():
                folder.mkdir(parents=True, exist_ok=True)
                frame = frames_at(media.path, [t])[0]
                tmp = target.with_suffix(f".tmp{os.getpid()}.jpg")
                frame.save(tmp, quality=90)
                tmp.replace(target)
            out.append(str(target))
        except (MediaError, OSError) as e:
            logger.warning("no evidence frame for %s: %s", hit.doc.id, e)
    return out


def add_evidence_images(messages: list[Message], hits: Sequence[Hit], max_images: int = 2) -> list[Message]:
    """Append evidence image parts (after the question image, before the text) to the last user turn; other turns
    are unchanged. The loop does this for `agent.evidence_images > 0` (pixels only help a VL policy)."""
    paths = evidence_image_paths(hits, max_images)
    if not paths:
        return messages
    last = messages[-1]
    content = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
    images = [p for p in content if p.get("type") == "image"]
    rest = [p for p in content if p.get("type") != "image"]
    new = {**last, "content": [*images, *({"type": "image", "image": p} for p in paths), *rest]}
    return [*messages[:-1], new]


def _plan_user(question: str, history: Sequence[tuple[str, str]]) -> str:
    return f"Original question: {question}\n{history_lines(history)}What is the next step?"


def plan_examples(kbs: Sequence[tuple[str, str]]) -> list[Message]:
    """A worked two-hop example as chat turns: small models follow the tags far more often with it."""
    kb = kbs[0][0] if kbs else "None"
    q = "In which country was the director of the film Jaws born?"
    turns = [
        ([], "I need to know who directed Jaws first.", "Who directed the film Jaws?", kb),
        (
            [("Who directed the film Jaws?", "Steven Spielberg")],
            "Now I need where Steven Spielberg was born.",
            "In which country was Steven Spielberg born?",
            kb,
        ),
        (
            [
                ("Who directed the film Jaws?", "Steven Spielberg"),
                ("In which country was Steven Spielberg born?", "United States"),
            ],
            "I know enough to answer the original question.",
            None,
            None,
        ),
    ]
    out: list[Message] = []
    for history, think, sub_q, ret in turns:
        out.append({"role": "user", "content": _plan_user(q, history)})
        out.append({"role": "assistant", "content": format_plan(think, sub_q, ret)})
    return out


def plan_messages(
    question: str,
    history: Sequence[tuple[str, str]],
    kbs: Sequence[tuple[str, str]],
    images: Sequence[str] = (),
    settings: PromptSettings = DEFAULT_PROMPT,
) -> list[Message]:
    """Messages for a plan step: the original question, the answered sub-questions so far, the KB list."""
    system = {"role": "system", "content": PLAN_SYSTEM.format(kb_list=kb_list(kbs))}
    shots = plan_examples(kbs) if settings.few_shot else []
    return [system, *shots, _user(_plan_user(question, history), images)]


ANSWER_EXAMPLE: list[Message] = [
    {
        "role": "user",
        "content": "Evidence:\ntext-0: Jaws (film): Jaws is a 1975 American thriller film directed by Steven "
        "Spielberg.\n\nQuestion: Who directed the film Jaws?",
    },
    {
        "role": "assistant",
        "content": format_answer("The evidence says Jaws was directed by Steven Spielberg.", "Steven Spielberg"),
    },
]

FINAL_EXAMPLE: list[Message] = [
    {
        "role": "user",
        "content": "Original question: In which country was the director of the film Jaws born?\n"
        "Sub-question 1: Who directed the film Jaws?\nAnswer 1: Steven Spielberg\n"
        "Sub-question 2: In which country was Steven Spielberg born?\nAnswer 2: United States\n"
        "Now give the final answer to the original question: In which country was the director of the film Jaws born?",
    },
    {
        "role": "assistant",
        "content": format_answer(
            "Jaws was directed by Steven Spielberg, who was born in the United States.", "United States"
        ),
    },
]


def answer_messages(
    sub_question: str,
    hits: Sequence[Hit],
    images: Sequence[str] = (),
    settings: PromptSettings = DEFAULT_PROMPT,
) -> list[Message]:
    """Messages for an intermediate-answer step: only the sub-question and its evidence (and the question image)."""
    evidence = render_hits(hits, settings.evidence_chars, sub_question, settings.evidence_focus)
    user = f"Evidence:\n{evidence}\n\nQuestion: {sub_question}"
    shots = ANSWER_EXAMPLE if settings.few_shot else []
    return [{"role": "system", "content": ANSWER_SYSTEM}, *shots, _user(user, images)]


def answer_evidence(messages: Sequence[Message]) -> str:
    """The evidence block of an intermediate-answer prompt (`answer_messages`), without its question; "" for none."""
    user = messages[-1]["content"] if messages else ""
    if not isinstance(user, str):  # multimodal content: the text parts
        user = "\n".join(part.get("text", "") for part in user if isinstance(part, dict))
    head, sep, rest = user.partition("Evidence:\n")
    return rest.rpartition("\n\nQuestion: ")[0] if sep and not head.strip() else ""


def final_messages(
    question: str,
    history: Sequence[tuple[str, str]],
    images: Sequence[str] = (),
    settings: PromptSettings = DEFAULT_PROMPT,
) -> list[Message]:
    """Messages for the final step: the original question and the whole history."""
    user = f"Original question: {question}\n{history_lines(history)}Now give the final answer to the original question: {question}"
    shots = FINAL_EXAMPLE if settings.few_shot else []
    return [{"role": "system", "content": FINAL_SYSTEM}, *shots, _user(user, images)]


def with_format_reminder(messages: list[Message], bad_output: str, errors: Sequence[str]) -> list[Message]:
    """Append the malformed reply and a short correction request, for a bounded re-ask."""
    reminder = FORMAT_REMINDER.format(errors=", ".join(errors))
    return [*messages, {"role": "assistant", "content": bad_output}, {"role": "user", "content": reminder}]
