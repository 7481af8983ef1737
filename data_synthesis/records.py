"""Step-level training records of accepted trajectories, and the `datasets` export.

`steps.jsonl` holds `agent.step_records.StepRecord`s (one line per step prompt: plan / answer / final, with the chat
messages, images and gold target), cut by `agent.step_records.records_from_trajectory`, i.e. exactly what
`kbrouter train` reads (`train_format: steps`). The prompts are rendered with the job's `SynthConfig.step_prompt`: no
worked example, whatever the teacher was shown (the prompts the trained router sees at inference), and the evidence
length the teacher read; each record stores them.

The export (`export/steps.parquet`, `export/trajectories.parquet`, or `save_to_disk` folders) flattens the records
to Arrow-friendly columns: every message's content becomes a list of `{type, text, image}` parts, the gold a
`{sub_question, kb, answers, think}` struct, so `datasets.load_dataset("parquet", data_files=...)` reads it.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

from agent.protocol import PromptSettings
from agent.step_records import NamedKB, records_from_trajectory
from agent.types import Trajectory

logger = logging.getLogger(__name__)

STEP_PROMPT = PromptSettings(few_shot=False)  # training prompts = the trained router's inference prompts


def step_records(
    traj: Trajectory, kbs: list[tuple[str, str]], ids: Iterable[NamedKB], settings: PromptSettings = STEP_PROMPT
) -> list[dict]:
    """The step records of one accepted trajectory as dicts (`StepRecord.to_dict`).

    A trajectory's steps name their KB by `KnowledgeBase.name` (as hits do); a plan record's gold `kb` is the
    display name the policy writes in `<ret>` (what `kb_names` lists and the route reward compares), mapped by
    `agent.step_records.kb_id` (the rule: `agent/step_records.py`'s docstring).

    Args:
        traj: an accepted trajectory (with gold).
        kbs: `(display_name, description)` of the KBs the plan prompts list.
        ids: the loaded KBs (`kbs.values()` of the job's `dict[str, KnowledgeBase]`).
        settings: how the prompts are rendered (the job's `SynthConfig.step_prompt`).

    Raises:
        ValueError: a step's KB is not one of `ids` (named with the trajectory and step).
    """
    out = []
    for r in records_from_trajectory(traj, kbs, settings, ids):
        d = r.to_dict()
        d["metadata"] = {**d["metadata"], "dataset": traj.metadata.get("dataset", ""),
                         "question_id": traj.metadata.get("question_id", traj.id),
                         "sample": traj.metadata.get("sample", 0)}  # fmt: skip
        out.append(d)
    return out


def _parts(content: str | list) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content, "image": None}]
    return [{"type": p.get("type", "text"), "text": p.get("text"), "image": p.get("image")} for p in content]


def flat_step(d: dict) -> dict:
    """One step record with uniform nested types (Arrow needs one type per column)."""
    gold = d["gold"]
    return {
        "trajectory_id": d["trajectory_id"],
        "step_type": d["step_type"],
        "step_index": d["step_index"],
        "messages": [{"role": m["role"], "content": _parts(m["content"])} for m in d["messages"]],
        "images": list(d["images"]),
        "kb_names": list(d["kb_names"]),
        "gold": {
            "sub_question": gold.get("sub_question"),
            "kb": gold.get("kb"),
            "answers": [str(a) for a in gold.get("answers") or []],
            "think": gold.get("think"),
        },  # fmt: skip
        "dataset": d["metadata"].get("dataset", ""),
        "question_id": str(d["metadata"].get("question_id", "")),
    }


def flat_trajectory(d: dict) -> dict:
    """One accepted trajectory as flat columns plus its full JSON (`trajectory_json`)."""
    steps = [s for s in d["steps"] if s.get("sub_question") is not None]
    return {
        "id": d["id"],
        "question_id": str(d["metadata"].get("question_id", d["id"])),
        "dataset": d["metadata"].get("dataset", ""),
        "sample": int(d["metadata"].get("sample", 0)),
        "question": d["question"],
        "images": list(d["images"]),
        "gold": [str(g) for g in d.get("gold") or []],
        "final_answer": d["final_answer"],
        "num_steps": len(steps),
        "sub_questions": [s["sub_question"] for s in steps],
        "kbs": [s["kb"] for s in steps],
        "answers": [s["answer"] for s in steps],
        "trajectory_json": json.dumps(d, ensure_ascii=False),
    }


def export_dataset(traj_dicts: list[dict], step_dicts: list[dict], out_dir: Path, fmt: str = "parquet") -> list[Path]:
    """Write the accepted trajectories and step records as a `datasets`-loadable export under `out_dir/export`.

    Args:
        traj_dicts: accepted trajectories (`Trajectory.to_dict`).
        step_dicts: step records (`StepRecord.to_dict`).
        out_dir: the output folder.
        fmt: `parquet` (one file per table) or `disk` (`Dataset.save_to_disk` folders); `none` writes nothing.

    Returns:
        The written paths.
    """
    if fmt == "none":
        return []
    import datasets

    datasets.disable_progress_bars()
    export = Path(out_dir) / "export"
    tmp = Path(out_dir) / "export.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    written = []
    for name, rows in (("trajectories", [flat_trajectory(d) for d in traj_dicts]),
                       ("steps", [flat_step(d) for d in step_dicts])):  # fmt: skip
        ds = datasets.Dataset.from_list(rows) if rows else datasets.Dataset.from_dict({})
        if fmt == "parquet":
            ds.to_parquet(str(tmp / f"{name}.parquet"))
            written.append(export / f"{name}.parquet")
        else:
            ds.save_to_disk(str(tmp / name))
            written.append(export / name)
    if export.exists():
        shutil.rmtree(export)
    tmp.rename(export)  # the export appears whole or not at all
    logger.info("exported %d trajectories and %d step records to %s", len(traj_dicts), len(step_dicts), export)
    return written
