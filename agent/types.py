"""The agent's data model: the `Question` asked, one `Step` per retrieval step and one `Trajectory` per question.

Frozen dataclasses with a JSON round-trip; a trajectory is one JSON object per line on disk.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from retrievers.types import Hit

STOP_REASONS = ("answered", "max_steps", "format_error", "backend_error")


@dataclass(frozen=True)
class Question:
    """One question to answer. `answers` are gold answers when known; `metadata` keeps other input columns."""

    id: str
    question: str
    images: tuple[str, ...] = ()
    answers: tuple[str, ...] | None = None
    metadata: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Step:
    """One retrieval step: plan (think, sub-question, KB), evidence, intermediate answer.

    `sub_question`/`kb` are None when the plan said `None` (the step that ends the trajectory). `raw` holds every
    model output of the step in order (plan attempts, then answer attempts) so nothing the model wrote is lost.
    """

    index: int
    think: str = ""
    sub_question: str | None = None
    kb: str | None = None
    hits: tuple[Hit, ...] = ()
    answer_think: str = ""
    answer: str = ""
    raw: tuple[str, ...] = ()
    format_errors: tuple[str, ...] = ()
    timings: dict = field(default_factory=dict, compare=False, hash=False)
    tokens: dict = field(default_factory=dict, compare=False, hash=False)
    # the route prior's view of this step (`agent.routing`): the policy's KB, the fused one, their scores
    route: dict = field(default_factory=dict, compare=False, hash=False)
    # the answer vote of `agent.answer_samples` > 1: every decoded answer (None = malformed), its agreement, the kept one
    votes: dict = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("route", "votes"):  # records of agents without a route prior or a vote stay as they were
            if not d[key]:
                del d[key]
        d["hits"] = [h.to_dict() for h in self.hits]
        d["raw"] = list(self.raw)
        d["format_errors"] = list(self.format_errors)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Step:
        return cls(
            index=int(d["index"]),
            think=d.get("think", ""),
            sub_question=d.get("sub_question"),
            kb=d.get("kb"),
            hits=tuple(Hit.from_dict(h) for h in d.get("hits", [])),
            answer_think=d.get("answer_think", ""),
            answer=d.get("answer", ""),
            raw=tuple(d.get("raw", [])),
            format_errors=tuple(d.get("format_errors", [])),
            timings=dict(d.get("timings") or {}),
            tokens=dict(d.get("tokens") or {}),
            route=dict(d.get("route") or {}),
            votes=dict(d.get("votes") or {}),
        )


@dataclass(frozen=True)
class Trajectory:
    """A question answered step by step; `stop_reason` is one of `STOP_REASONS`."""

    id: str
    question: str
    images: tuple[str, ...] = ()
    steps: tuple[Step, ...] = ()
    final_think: str = ""
    final_answer: str = ""
    final_raw: tuple[str, ...] = ()
    stop_reason: str = "answered"
    gold: tuple[str, ...] | None = None
    metadata: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason {self.stop_reason!r} is not one of {STOP_REASONS}")

    @property
    def retrieval_steps(self) -> tuple[Step, ...]:
        """The steps that asked a sub-question (the final `None` plan, or a malformed one, retrieved nothing)."""
        return tuple(s for s in self.steps if s.sub_question is not None)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "question": self.question,
            "images": list(self.images),
            "steps": [s.to_dict() for s in self.steps],
            "final_think": self.final_think,
            "final_answer": self.final_answer,
            "final_raw": list(self.final_raw),
            "stop_reason": self.stop_reason,
            "gold": list(self.gold) if self.gold is not None else None,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Trajectory:
        gold = d.get("gold")
        return cls(
            id=str(d["id"]),
            question=d["question"],
            images=tuple(d.get("images", [])),
            steps=tuple(Step.from_dict(s) for s in d.get("steps", [])),
            final_think=d.get("final_think", ""),
            final_answer=d.get("final_answer", ""),
            final_raw=tuple(d.get("final_raw", [])),
            stop_reason=d.get("stop_reason", "answered"),
            gold=tuple(gold) if gold is not None else None,
            metadata=dict(d.get("metadata") or {}),
        )
