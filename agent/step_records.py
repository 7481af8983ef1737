"""The step-level training record: one step prompt with its gold target (DESIGN §3).

Written by synthesis (`steps.jsonl`), read by training. It lives in `agent` because both sides need it and
nothing may import `training`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.protocol import DEFAULT_PROMPT, PromptSettings, answer_messages, final_messages, plan_messages
from agent.types import Trajectory

PLAN, ANSWER, FINAL = "plan", "answer", "final"
STEP_TYPES = (PLAN, ANSWER, FINAL)


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
    traj: Trajectory, kbs: list[tuple[str, str]], settings: PromptSettings = DEFAULT_PROMPT
) -> list[StepRecord]:
    """Cut one trajectory into step records conditioned on its gold prefix, rendered with `settings`."""
    if traj.gold is None:
        raise ValueError(f"trajectory {traj.id!r} has no gold answer: the final step would have no target")
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
