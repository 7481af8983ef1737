"""The step-level training record: one step prompt with its gold target (DESIGN §3), and the KB identifier rule.

Written by synthesis (`steps.jsonl`), read by training. It lives in `agent` because both sides need it and
nothing may import `training`.

Which identifier names a KB, layer by layer (one rule; `kb_id` is the one function that crosses it):

- **name** (`KnowledgeBase.name`, the KB YAML's `name:`): what the code carries. `Hit.kb`, `Step.kb` (so every
  `Trajectory`, synthesis' `trajectories.jsonl` included), eval's `gold_kb` column and `rag_<name>` methods, gold
  plans of the annotation teacher.
- **display name** (`KnowledgeBase.display_name`): what the policy reads and writes. The prompts' KB list, `<ret>`,
  and therefore everything scored against a completion: `StepRecord.kb_names` and `StepRecord.gold["kb"]`
  (`steps.jsonl`), the step dataset's `kb_names`/`gold_kb` columns, the rewards, online GRPO's gold steps. A
  `dict[str, KnowledgeBase]` of loaded KBs is keyed by display name, so `kbs[display].name` reads the name of a KB
  the plan parser matched.

A site that holds one identifier and needs the other calls `kb_id` (synthesis' step records, the annotation teacher's
gold plans, online GRPO's gold steps); no site builds its own name -> display name table. A plan record whose gold KB
is not among its `kb_names` (a name where a display name belongs) is refused when the record is made.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from agent.protocol import DEFAULT_PROMPT, PromptSettings, answer_messages, final_messages, normalize_kb, plan_messages
from agent.types import Trajectory

PLAN, ANSWER, FINAL = "plan", "answer", "final"
STEP_TYPES = (PLAN, ANSWER, FINAL)

KBIdKind = Literal["name", "display_name"]
KB_ID_KINDS: tuple[KBIdKind, ...] = ("name", "display_name")


class NamedKB(Protocol):
    """Anything that names a KB both ways: `agent.kbs.KnowledgeBase`, `retrievers.config.KBConfig`."""

    @property
    def name(self) -> str: ...

    @property
    def display_name(self) -> str: ...


def kb_id(kb: str, kbs: Iterable[NamedKB], to: KBIdKind, where: str = "") -> str:
    """The identifier `to` of the KB that `kb` names: KB name <-> display name (see the module docstring).

    `kb` may be either identifier: a KB name (matched exactly) or a display name (matched as the plan parser
    matches `<ret>`: case and surrounding quotes ignored), so a value already on the `to` side comes back as is.

    Args:
        kb: a KB name or display name.
        kbs: the configured KBs (`KnowledgeBase`s, e.g. `kbs.values()`, or `KBConfig`s).
        to: `"name"` or `"display_name"`.
        where: what `kb` comes from (e.g. `"steps.jsonl:3"`), to start the error message.

    Returns:
        The KB's name or display name, as configured.

    Raises:
        ValueError: `to` is neither kind; no configured KB has `kb` as its name or display name; `kb` is one KB's
            name and another KB's display name.

    Example:
        >>> from agent.kbs import KnowledgeBase
        >>> wiki = KnowledgeBase("wiki", "Text Retriever", retriever=None)
        >>> kb_id("wiki", [wiki], "display_name"), kb_id("text retriever", [wiki], "name")
        ('Text Retriever', 'wiki')
    """
    if to not in KB_ID_KINDS:
        raise ValueError(f"kb_id: `to` is {to!r}; use one of {KB_ID_KINDS}")
    kbs = list(kbs)
    norm = normalize_kb(str(kb))
    matches = {c.name: c for c in kbs if c.name == kb or normalize_kb(c.display_name) == norm}
    prefix = f"{where}: " if where else ""
    if len(matches) > 1:
        a, b = sorted(matches)
        raise ValueError(
            f"{prefix}KB {kb!r} names two KBs ({a!r} and {b!r}): one's name is the other's display name; rename one "
            "in the KB YAML"
        )
    if not matches:
        raise ValueError(
            f"{prefix}KB {kb!r} is neither the name nor the display name of a configured KB (names "
            f"{[c.name for c in kbs]}, display names {[c.display_name for c in kbs]}); write one of them, or add "
            "the KB to the KB YAML"
        )
    found = next(iter(matches.values()))
    return found.name if to == "name" else found.display_name


@dataclass(frozen=True)
class StepRecord:
    """One step prompt with its gold target (one JSON object per line in `steps.jsonl`).

    Attributes:
        trajectory_id: id of the trajectory (or source question) the step comes from.
        step_type: `plan`, `answer` or `final`.
        messages: chat messages, system then user. A user turn may carry image parts
            (`{"type": "image", "image": path}`) as `agent.prompts` writes them; they are taken out into `images`.
        gold: the target. Plan: `{"sub_question": str | None, "kb": str | None}` (both None = stop).
            Answer/final: `{"answers": [str, ...]}` (non-empty). Optional `"think"`: the teacher's reasoning, used
            for SFT targets.
        images: image paths of the question (given to every step of a visual question).
        kb_names: KB display names the plan step may choose from (empty for answer steps).
        step_index: 0-based position of the step in its trajectory.
        metadata: free-form (source dataset, ...).
        prompt_settings: the `PromptSettings` the messages were rendered with (`to_dict()`), so a trainer or a
            re-render can tell a few-shot prompt from a plain one.
    """

    trajectory_id: str
    step_type: str
    messages: list[dict]
    gold: dict
    images: tuple[str, ...] = ()
    kb_names: tuple[str, ...] = ()
    step_index: int = 0
    metadata: dict = field(default_factory=dict, compare=False, hash=False)
    prompt_settings: dict = field(default_factory=DEFAULT_PROMPT.to_dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        where = f"step {self.step_index} of trajectory {self.trajectory_id!r}"
        if self.step_type not in STEP_TYPES:
            raise ValueError(f"{where}: step_type {self.step_type!r} is not one of {STEP_TYPES}")
        if not self.messages:
            raise ValueError(f"{where}: no messages")
        if self.step_type == PLAN:
            if not isinstance(self.gold, dict) or "sub_question" not in self.gold or "kb" not in self.gold:
                raise ValueError(f"{where}: a plan step needs gold {{'sub_question', 'kb'}}, got {self.gold!r}")
            if not self.kb_names:
                raise ValueError(f"{where}: a plan step needs kb_names (the KBs it may choose from)")
            kb = self.gold["kb"]
            if kb is not None and normalize_kb(str(kb)) not in {normalize_kb(n) for n in self.kb_names}:
                raise ValueError(
                    f"{where}: gold kb {kb!r} is not among kb_names {list(self.kb_names)}; a step record names a KB "
                    "by the display name the policy writes in <ret>: map a KB name with agent.step_records.kb_id "
                    "(records_from_trajectory does, given the KBs)"
                )
        elif not isinstance(self.gold, dict) or not self.gold.get("answers"):
            raise ValueError(
                f"{where}: an {self.step_type} step needs a non-empty gold 'answers' list, got {self.gold!r}"
            )

    def to_dict(self) -> dict:
        return {
            "trajectory_id": self.trajectory_id,
            "step_type": self.step_type,
            "step_index": self.step_index,
            "messages": self.messages,
            "images": list(self.images),
            "kb_names": list(self.kb_names),
            "gold": self.gold,
            "metadata": self.metadata,
            "prompt_settings": self.prompt_settings,
        }

    @classmethod
    def from_dict(cls, d: dict) -> StepRecord:
        for key in ("trajectory_id", "step_type", "messages", "gold"):
            if key not in d:
                raise ValueError(f"step record is missing {key!r}: {str(d)[:200]}")
        gold = dict(d["gold"])
        if "answers" in gold and isinstance(gold["answers"], str):
            gold["answers"] = [gold["answers"]]
        return cls(
            trajectory_id=str(d["trajectory_id"]),
            step_type=d["step_type"],
            messages=list(d["messages"]),
            gold=gold,
            images=tuple(d.get("images") or ()),
            kb_names=tuple(d.get("kb_names") or ()),
            step_index=int(d.get("step_index", 0)),
            metadata=dict(d.get("metadata") or {}),
            # records written before settings were stored were rendered with the then-default few-shot prompts
            prompt_settings=dict(d.get("prompt_settings") or {}),
        )


def records_from_trajectory(
    traj: Trajectory,
    kbs: list[tuple[str, str]],
    settings: PromptSettings = DEFAULT_PROMPT,
    ids: Iterable[NamedKB] | None = None,
) -> list[StepRecord]:
    """Cut one trajectory into step records conditioned on its gold prefix, rendered with `settings`.

    Args:
        traj: a trajectory with gold answers.
        kbs: `(display_name, description)` of the KBs the plan prompts list.
        settings: the prompt settings to render with.
        ids: the configured KBs (`KnowledgeBase`s or `KBConfig`s). Given, each step's KB (a name, as `Step.kb`
            is) becomes its display name through `kb_id`. None: the steps already name their KB by display name
            (a training recipe's `kbs` list knows no KB names).

    Raises:
        ValueError: no gold answers; a step's KB is not one of `ids`, or (without `ids`) not among `kbs`.
    """
    if traj.gold is None:
        raise ValueError(f"trajectory {traj.id!r} has no gold answer: the final step would have no target")
    if ids is not None:
        ids = list(ids)
        steps = tuple(
            replace(s, kb=kb_id(s.kb, ids, "display_name", f"trajectory {traj.id!r} step {s.index}")) if s.kb else s
            for s in traj.steps
        )
        traj = replace(traj, steps=steps)
    kb_names = tuple(name for name, _ in kbs)
    out: list[StepRecord] = []
    history: list[tuple[str, str]] = []
    meta = {"source": traj.metadata.get("dataset", "")}
    ps = settings.to_dict()
    for step in traj.steps:
        out.append(StepRecord(
            traj.id, PLAN, plan_messages(traj.question, history, kbs, traj.images, settings),
            {"sub_question": step.sub_question, "kb": step.kb, "think": step.think},
            traj.images, kb_names, len(out), meta, ps,
        ))  # fmt: skip
        if step.sub_question is None:
            break
        out.append(StepRecord(
            traj.id, ANSWER, answer_messages(step.sub_question, step.hits, traj.images, settings),
            {"answers": [step.answer], "think": step.answer_think}, traj.images, (), len(out), meta, ps,
        ))  # fmt: skip
        history.append((step.sub_question, step.answer))
    out.append(StepRecord(
        traj.id, FINAL, final_messages(traj.question, history, traj.images, settings),
        {"answers": list(traj.gold), "think": traj.final_think}, traj.images, (), len(out), meta, ps,
    ))  # fmt: skip
    return out
