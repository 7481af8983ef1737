"""Chat turns in, agent steps out: the conversions behind `kbrouter serve-agent` (`agent.agent_server`).

- `question_text` turns an OpenAI conversation into one agent question: the last user turn, with up to a few earlier
  turns as context, so a follow-up such as "and where was she born?" can be resolved.
- `hit_card` is the structured form of a hit sent to clients (the `kbrouter` extension field): id, KB, score,
  title, snippet, a table's rows, and a signed media link with its time span.
- `public_trajectory` is a trajectory as clients see it: media paths replaced by links, uploads by their name, so no
  server path leaves the server; it still reads back with `Trajectory.from_dict`.
- `kb_label` is `agent.step_records.kb_id` for rendering: a KB the server does not know is shown as given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.step_records import KBIdKind, NamedKB, kb_id
from agent.types import Trajectory
from retrievers.provenance import provenance_label
from retrievers.security import MediaRoots
from retrievers.types import Hit

SNIPPET_CHARS = 300


@dataclass(frozen=True)
class Turn:
    """One chat message reduced to what the agent reads: role, text and image references (URLs as sent)."""

    role: str
    text: str
    images: tuple[str, ...] = ()


def question_text(turns: Sequence[Turn], max_context_turns: int = 4) -> str:
    """The question the agent answers: the last user turn, prefixed by earlier exchanges as context.

    Raises:
        ValueError: the last message is not a user turn with text.
    """
    if not turns or turns[-1].role != "user":
        raise ValueError("the last message must be the user's question (role 'user')")
    question = " ".join(turns[-1].text.split())
    if not question:
        raise ValueError("the last user message has no text; ask a question (an image alone is not one)")
    pairs: list[tuple[str, str]] = []
    pending: str | None = None
    for t in turns[:-1]:
        text = " ".join(t.text.split())
        if t.role == "user" and text:
            if pending is not None:
                pairs.append((pending, ""))
            pending = text
        elif t.role == "assistant" and pending is not None:
            pairs.append((pending, text))
            pending = None
    if pending is not None:
        pairs.append((pending, ""))
    pairs = pairs[-max_context_turns:] if max_context_turns > 0 else []
    if not pairs:
        return question
    context = " ".join(f'Earlier question: "{q}"' + (f' answered "{a}".' if a else ".") for q, a in pairs)
    return f"{context} Now: {question}"


def latest_images(turns: Sequence[Turn]) -> tuple[str, ...]:
    """The images of the most recent user turn that has any (a follow-up about the same picture keeps it)."""
    for t in reversed(turns):
        if t.role == "user" and t.images:
            return t.images
    return ()


def table_rows(text: str) -> dict | None:
    """`{"header": [...], "rows": [[...], ...]}` from a linearised table (`| a | b |` lines), or None."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    if not cells:
        return None
    return {"header": cells[0], "rows": cells[1:]}


def hit_card(hit: Hit, media: MediaRoots | None) -> dict:
    """A hit as clients receive it (see the module docstring)."""
    doc = hit.doc
    text = " ".join(doc.text.split())
    card = {
        "id": doc.id,
        "kb": hit.kb,
        "score": round(float(hit.score), 4),
        "rank": hit.rank,
        "title": doc.title,
        "modality": doc.modality,
        "snippet": text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…",
        "table": table_rows(doc.text) if doc.modality == "table" else None,
        "media": None,
    }
    source = provenance_label(doc.metadata)
    if source:  # records written by `kbrouter ingest`: "report.pdf p. 4, table 2"
        card["source"] = source
    if doc.media is not None:
        link = media.link(doc.media.path) if media is not None else None
        kind = "image" if doc.modality == "image" else "video"
        card["media"] = {"url": link, "kind": kind, "start": doc.media.start, "end": doc.media.end}
    return card


def evidence_line(kb: str, cards: list[dict]) -> str:
    """A one-line summary of a step's evidence, for the reasoning stream."""
    if not cards:
        return f"Evidence from {kb}: nothing found."
    best = cards[0]
    what = best["title"] or best["id"]
    if best.get("source"):
        what = f"{what} [{best['source']}]"
    snippet = best["snippet"][:100] + ("…" if len(best["snippet"]) > 100 else "")
    return f"Evidence from {kb}: {len(cards)} hits; best {what!r} (score {best['score']:.2f}): {snippet}"


def public_trajectory(traj: Trajectory, media: MediaRoots | None) -> dict:
    """`traj.to_dict()` with server paths replaced: media by their links (or None), question images by file name."""
    d = traj.to_dict()
    d["images"] = [f"upload:{p.rsplit('/', 1)[-1]}" for p in d["images"]]
    for step in d["steps"]:
        for h in step["hits"]:
            m = h["doc"].get("media")
            if m:
                m["path"] = (media.link(m["path"]) if media is not None else None) or "unavailable"
            h["doc"]["metadata"] = {k: v for k, v in h["doc"].get("metadata", {}).items() if k != "path"}
    return d


def kb_label(kb: str | None, kbs: Iterable[NamedKB], to: KBIdKind = "display_name") -> str | None:
    """`kb_id` for rendering: the identifier `to` of the KB that `kb` names, or `kb` itself where `kb_id` refuses.

    A step's KB that the server cannot map (a trajectory from another KB set, a KB renamed since, a name that is
    another KB's display name) is shown as the trajectory names it, so rendering an old trajectory never fails.

    Args:
        kb: a KB name or display name; None (a step that did not search) stays None.
        kbs: the KBs being served (e.g. `kbs.values()`).
        to: `"name"` or `"display_name"`.
    """
    if kb is None:
        return None
    try:
        return kb_id(kb, kbs, to)
    except ValueError:
        return kb


def reasoning_of(traj: Trajectory, kbs: Iterable[NamedKB]) -> str:
    """The whole reasoning text of a finished trajectory, as the stream sends it step by step (KBs by display name)."""
    kbs = list(kbs)
    out = []
    for s in traj.steps:
        kb = kb_label(s.kb, kbs)
        out.append(plan_line(s.index, s.think, s.sub_question, kb, list(s.format_errors)))
        if s.sub_question is not None:
            out.append(evidence_line(kb or "", [hit_card(h, None) for h in s.hits]))
            out.append(f"Answer {s.index + 1}: {s.answer}")
    return "\n".join(out)


def plan_line(index: int, think: str | None, sub_question: str | None, kb: str | None, errors: list[str]) -> str:
    """The reasoning text of one plan: thought, sub-question and KB (or why the agent stops)."""
    head = f"Step {index + 1}. Thought: {think or '(none)'}"
    if errors:
        return f"{head}\nThe reply broke the step format ({'; '.join(errors)})."
    if sub_question is None:
        return f"{head}\nEnough is known to answer."
    return f"{head}\nSub-question: {sub_question}\nKnowledge base: {kb}"
