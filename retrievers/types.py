"""Shared data types of the retrieval layer: documents, queries, hits and the retriever protocol.

Everything here is a frozen dataclass with a JSON round-trip (`to_dict` / `from_dict`), so hits can be
written inside trajectories and read back unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

MODALITIES = ("text", "table", "image", "video")
GRANULARITIES = ("paragraph", "document", "table", "image", "clip", "video")


@dataclass(frozen=True)
class Media:
    """Pixels behind a document: an image path, or a video path with an optional clip span in seconds."""

    path: str
    start: float | None = None
    end: float | None = None

    @classmethod
    def from_dict(cls, d: dict) -> Media:
        return cls(path=d["path"], start=d.get("start"), end=d.get("end"))


@dataclass(frozen=True)
class Doc:
    """One retrievable unit of a knowledge base.

    `text` is what gets embedded and what the policy reads: a passage, a linearised table, a caption or a transcript.
    """

    id: str
    text: str
    title: str = ""
    kb: str = ""
    modality: str = "text"
    media: Media | None = None
    metadata: dict = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Doc:
        media = d.get("media")
        return cls(
            id=str(d["id"]),
            text=d["text"],
            title=d.get("title", ""),
            kb=d.get("kb", ""),
            modality=d.get("modality", "text"),
            media=Media.from_dict(media) if media else None,
            metadata=dict(d.get("metadata") or {}),
        )


@dataclass(frozen=True)
class Hit:
    """A scored document returned by a knowledge base; `kb` names the KB it came from, `rank` is 0-based."""

    doc: Doc
    score: float
    rank: int
    kb: str

    def to_dict(self) -> dict:
        return {"doc": self.doc.to_dict(), "score": self.score, "rank": self.rank, "kb": self.kb}

    @classmethod
    def from_dict(cls, d: dict) -> Hit:
        return cls(doc=Doc.from_dict(d["doc"]), score=float(d["score"]), rank=int(d["rank"]), kb=d["kb"])


@dataclass(frozen=True)
class Query:
    """A search query: text and, optionally, the path of an image that goes with it."""

    text: str
    image: str | None = None


def as_queries(queries: list[str | Query]) -> list[Query]:
    """Accept plain strings where a `Query` is expected."""
    return [q if isinstance(q, Query) else Query(text=q) for q in queries]


def text_queries(queries: list[str | Query]) -> tuple[list[int], list[str]]:
    """Positions and stripped texts of the queries that have text: an empty query is not searched (it gets [])."""
    texts = [q.text.strip() for q in as_queries(queries)]
    live = [i for i, t in enumerate(texts) if t]
    return live, [texts[i] for i in live]


@runtime_checkable
class Retriever(Protocol):
    """What every knowledge base satisfies: batched, always scored.

    A single query is written `retriever.search([q], k)[0]`.
    """

    def search(self, queries: list[str | Query], k: int) -> list[list[Hit]]: ...
