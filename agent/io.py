"""Reading question files and writing trajectories: JSONL, one finished record at a time, never half a line."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from agent.types import Question, Trajectory
from retrievers.jsonl import JsonlWriter, iter_jsonl_objects, read_jsonl, repair, write_jsonl_atomic


def read_questions(path: str | Path) -> list[Question]:
    """Read a question file: JSONL with `id`, `question`, optional `image`/`images` and `answers`.

    Other columns are kept as metadata. A broken line, a missing field or an empty question stops with a message
    naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"question file {path} does not exist")
    out, seen = [], set()
    for n, row in iter_jsonl_objects(path):
        out.append(question_from_row(row, where=f"{path}:{n}"))
        if out[-1].id in seen:
            raise ValueError(f"{path}:{n}: duplicate id {out[-1].id!r}; ids must be unique")
        seen.add(out[-1].id)
    return out


def question_from_row(row: dict, where: str = "question") -> Question:
    """One `Question` from a dict with `id`, `question`, optional `image`/`images`/`answers` (others → metadata)."""
    for key in ("id", "question"):
        if key not in row:
            raise ValueError(f"{where}: missing field {key!r}; each line needs 'id' and 'question'")
    text = row["question"]
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: empty question for id {row['id']!r}")
    images = row.get("images") or ([row["image"]] if row.get("image") else [])
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise ValueError(
            f"{where}: `images` of question {row['id']!r} must be a list of paths, got {images!r}; "
            'e.g. `"images": ["photo.jpg"]` or `"image": "photo.jpg"`'
        )
    for img in images:
        if not Path(img).exists():
            raise FileNotFoundError(f"{where}: image {img!r} of question {row['id']!r} does not exist")
    answers = row.get("answers", row.get("golden_answers"))
    if isinstance(answers, (str, int, float)) and not isinstance(answers, bool):
        answers = [answers]  # one answer, e.g. `"answers": 5`
    if answers is not None and (
        not isinstance(answers, list) or not all(isinstance(a, (str, int, float)) for a in answers)
    ):
        raise ValueError(
            f"{where}: `answers` of question {row['id']!r} must be a list of strings, got {answers!r}; "
            'e.g. `"answers": ["5"]`'
        )
    meta = {
        k: v for k, v in row.items() if k not in {"id", "question", "image", "images", "answers", "golden_answers"}
    }
    return Question(
        id=str(row["id"]),
        question=text.strip(),
        images=tuple(str(i) for i in images),
        answers=tuple(str(a) for a in answers) if answers is not None else None,
        metadata=meta,
    )


# stop reasons that say the run failed, not the model: such records are run again on resume
ERROR_STOPS = frozenset({"backend_error"})


def prepare_resume(path: str | Path, retry_errors: bool = True) -> tuple[set[str], int]:
    """Make a trajectory file ready to append to; returns (ids finished there, records dropped for a retry).

    A torn last line (a crash mid-write) is dropped first, so reading the finished ids cannot fail on it. With
    `retry_errors`, records that ended in an error (`ERROR_STOPS`) are removed, so their questions run again:
    the file is rewritten to a temporary name and renamed, never left half-written.
    """
    path = Path(path)
    if not path.exists():
        return set(), 0
    repair(path)
    records = read_jsonl(path, log=True)
    keep = [r for r in records if not (retry_errors and r.get("stop_reason") in ERROR_STOPS)]
    if len(keep) < len(records):
        write_jsonl_atomic(path, keep)
    return {r["id"] for r in keep}, len(records) - len(keep)


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """The trajectories of a `kbrouter run` output (a torn last line of a killed run is skipped)."""
    return [Trajectory.from_dict(d) for d in read_jsonl(path, log=True)]


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory], overwrite: bool = False) -> None:
    """Append trajectories to a JSONL file, or with `overwrite` replace the file (written aside, then renamed: an
    interrupted write leaves the previous file whole)."""
    if not overwrite:
        with JsonlWriter(path, fsync_every=0) as w:
            for t in trajectories:
                w.write(t.to_dict())
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(path, (t.to_dict() for t in trajectories))
