"""Reading question files and writing trajectories: JSONL, one finished record at a time, never half a line."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from agent.qa_formats import Source, read_rows
from agent.types import Question, Trajectory
from retrievers.jsonl import JsonlWriter, read_jsonl, repair, write_jsonl_atomic


def read_questions(path: str | Path) -> list[Question]:
    """Read a question file: JSONL with `id`, `question`, optional `image`/`images` and `answers` (or
    `golden_answers`), in `agent.qa_formats`' generic format.

    Other columns are kept as metadata. `kbrouter run`'s contract: a broken line, a missing field, an empty question,
    a missing image or a duplicate id stops with a message naming the file and line (nothing is skipped).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"question file {path} does not exist")
    out, seen = [], set()
    for row in read_rows("generic", Source(str(path), id_scheme="column", golds="as_written")):
        where = f"{path}:{row.line}"
        if not isinstance(row.question, str) or not row.question.strip():
            raise ValueError(f"{where}: empty question for id {row.id!r}")
        for img in row.images:
            if not Path(img).exists():
                raise FileNotFoundError(f"{where}: image {img!r} of question {row.id!r} does not exist")
        if row.id in seen:
            raise ValueError(f"{where}: duplicate id {row.id!r}; ids must be unique")
        seen.add(row.id)
        given = row.fields.get("answers", row.fields.get("golden_answers"))  # None: no gold answers (not scored)
        out.append(
            Question(
                id=row.id,
                question=row.question.strip(),
                images=row.images,
                answers=None if given is None else tuple(row.golds),
                metadata={k: v for k, v in row.fields.items() if k not in QUESTION_COLUMNS},
            )
        )
    return out


# the columns of a question row that become the `Question`'s fields (the others become its metadata)
QUESTION_COLUMNS = frozenset({"id", "question", "image", "images", "answers", "golden_answers"})


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
