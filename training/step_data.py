"""Step-level training data: one prompt per step, conditioned on the gold prefix (DESIGN §3, §8).

Three inputs, one output:

- **trajectories** (`trajectories`): kbrouter `Trajectory` JSONL (the synthesis output, accepted trajectories). Each
  retrieval step gives a plan prompt and, when it asked something, an answer prompt; the trajectory ends with a final
  prompt. Prompts come from `agent.prompts`, so training sees exactly what the agent loop shows.
- **step records** (`steps`): `StepRecord` JSONL (what synthesis writes as `steps.jsonl`).
- **the paper's release** (`paper`): `{images, steps: [{step_type: ret|ans, system, problem, answer}]}`, mapping
  `ret → plan`, the last `ans → final`, the other `ans → answer`.

`build_step_dataset` turns records into a `datasets.Dataset` with a conversational `prompt` (string contents),
`step_type`, the gold columns the rewards read (`gold_sub_question`, `gold_kb`, `gold_answers`, `kb_names`), a
`completion` (the gold target written with the step's tags, for SFT) and `images` when images are used.

Over-long prompts (`max_prompt_tokens`, counted with the chat template and the generation header): whole lines of the
user message are dropped, never the system message, the first user line (the question) or the last user line (the
instruction), so the assistant header is never cut. Answer steps lose evidence lines from the end of the evidence
block (the lowest-ranked hits); plan and final steps lose the oldest history lines first. A prompt that still does
not fit is skipped and counted (logged). Image tokens are not counted: they depend on the processor's resolution.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from agent.step_records import ANSWER, FINAL, PLAN, STEP_TYPES, StepRecord, records_from_trajectory  # noqa: F401 (re-exported)
from agent.types import Trajectory
from retrievers.jsonl import iter_jsonl_objects

logger = logging.getLogger(__name__)

FORMATS = ("auto", "paper", "steps", "trajectories")
PAPER_KBS = ("Text Retriever", "Text Image Retriever", "Table Retriever")  # display names in the paper's prompts
_IMAGE_MARK = re.compile(r"\s*<image>\s*")


def _read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"training file not found: {path}")
    return [row for _, row in iter_jsonl_objects(path)]


def records_from_paper(row: dict, row_id: str) -> list[StepRecord]:
    """Map one record of the paper's step-level release to step records."""
    steps = row["steps"]
    last_ans = max((i for i, s in enumerate(steps) if s["step_type"] == "ans"), default=-1)
    by_lower = {k.lower(): k for k in PAPER_KBS}
    out = []
    for i, s in enumerate(steps):
        problem = _IMAGE_MARK.sub("\n", s["problem"]).strip()
        messages = [{"role": "system", "content": s["system"]}, {"role": "user", "content": problem}]
        if s["step_type"] == "ret":
            query, rets = s["answer"]["query"].strip(), [r.strip().lower() for r in s["answer"]["retriever"]]
            if len(rets) != 1 or (rets[0] != "none" and rets[0] not in by_lower):
                raise ValueError(f"paper record {row_id} step {i}: retriever label {rets} is not one known KB or none")
            gold = {"sub_question": None if query.lower() == "none" else query,
                    "kb": None if rets[0] == "none" else by_lower[rets[0]]}  # fmt: skip
            out.append(StepRecord(row_id, PLAN, messages, gold, tuple(row.get("images") or ()), PAPER_KBS, i))
        elif s["step_type"] == "ans":
            answers = s["answer"] if isinstance(s["answer"], list) else [s["answer"]]
            kind = FINAL if i == last_ans else ANSWER
            out.append(StepRecord(row_id, kind, messages, {"answers": [str(a).strip() for a in answers]},
                                  tuple(row.get("images") or ()), (), i))  # fmt: skip
        else:
            raise ValueError(f"paper record {row_id} step {i}: unknown step_type {s['step_type']!r}")
    return out


def detect_format(first_row: dict) -> str:
    """Guess a file's format from its first row."""
    if "step_type" in first_row and "messages" in first_row:
        return "steps"
    if "steps" in first_row and "question" in first_row:
        return "trajectories"
    if "steps" in first_row:
        return "paper"
    raise ValueError(f"cannot tell the format of a row with keys {sorted(first_row)}; set train_format")


def load_step_records(
    path: str | Path, fmt: str = "auto", kbs: list[tuple[str, str]] | None = None
) -> list[StepRecord]:
    """Read step records from any of the three formats (see module docstring).

    Args:
        path: JSONL file.
        fmt: `auto`, `paper`, `steps` or `trajectories`.
        kbs: `(display_name, description)` of the configured KBs; required for trajectories (their plan prompts
            list the KBs).

    Raises:
        ValueError: unknown format, a step without a gold target, a trajectory without gold, missing kbs.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown train_format {fmt!r}; valid: {FORMATS}")
    rows = _read_jsonl(path)
    if not rows:
        raise ValueError(f"{path} holds no records")
    fmt = detect_format(rows[0]) if fmt == "auto" else fmt
    records: list[StepRecord] = []
    if fmt == "steps":
        records = [StepRecord.from_dict(r) for r in rows]
    elif fmt == "paper":
        for n, row in enumerate(rows):
            records += records_from_paper(row, f"{Path(path).stem}-{n}")
    else:
        if not kbs:
            raise ValueError(
                "trajectories need the KB list (`kbs: [{name, description}]` in the recipe) for plan prompts"
            )
        skipped = 0
        for row in rows:
            traj = Trajectory.from_dict(row)
            if traj.stop_reason not in ("answered", "max_steps"):
                skipped += 1
                continue
            records += records_from_trajectory(traj, kbs)
        if skipped:
            logger.warning("skipped %d trajectories that did not end with an answer", skipped)
    logger.info("read %d step records (%s) from %s", len(records), fmt, path)
    return records


def resolve_images(records: list[StepRecord], image_root: str | None = None) -> list[StepRecord]:
    """Point image paths at existing files (optionally under `image_root` by basename); missing files raise.

    Raises:
        FileNotFoundError: naming the first missing images and how many are missing.
    """
    out, missing = [], []
    for r in records:
        paths = []
        for p in r.images:
            q = Path(image_root) / Path(p).name if image_root else Path(p)
            if not q.exists():
                missing.append(str(q))
            paths.append(str(q))
        out.append(StepRecord(r.trajectory_id, r.step_type, r.messages, r.gold, tuple(paths), r.kb_names,
                              r.step_index, r.metadata))  # fmt: skip
    if missing:
        uniq = sorted(set(missing))
        raise FileNotFoundError(
            f"{len(uniq)} image(s) of the step data are missing, e.g. {uniq[:3]}; set `image_root` to the folder "
            "holding them, or `use_images: false` to train on the text only"
        )
    return out
