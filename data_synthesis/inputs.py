"""QA input readers: local JSONL/JSON/parquet files read with `datasets`, turned into `agent.loop.Question`s.

One reader per format, named in `READERS` (STYLE §18):

- `generic`: columns `id`, `question`, `answers` (str or list), `image` (path), renamed by `columns`.
- `shared_text`: `../shared/data/text/questions.jsonl` (`qid`, `dataset`, `question`, `answers`).
- `r1router`: the paper's `../shared/data/r1router/*_val.jsonl` (`question`, `answer`, optional `data_id` /
  `question_id`, `image_id`, InfoSeek `answer_eval` with numeric ranges expanded as the paper does).
- `tabfact`: `../shared/data/table/tabfact` (its `r1router_tabfact_val_to_table.jsonl`, yes/no answers) or its
  `statements.jsonl` (claims asked as "Is it true that ...?").
- `coco`: `../shared/data/image/coco/qa_derived.jsonl` (images under the file's `images/` folder).

Bad rows are not fatal: a question without a gold answer, an empty question, a duplicate id or an image file that
does not exist becomes a `Skip(id, dataset, reason, detail)` that the job counts and writes to `skipped.jsonl`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.loop import Question
from data_synthesis.config import InputSpec

logger = logging.getLogger(__name__)

SKIP_REASONS = ("no_gold", "empty_question", "duplicate_id", "missing_image")


@dataclass(frozen=True)
class Skip:
    """A question left out before generation, and why (`reason` is one of `SKIP_REASONS`)."""

    id: str
    dataset: str
    reason: str
    detail: str = ""

    def to_dict(self) -> dict:
        return {"id": self.id, "dataset": self.dataset, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class Row:
    """A reader's output before validation: id, dataset, question, golds, image paths."""

    id: str
    dataset: str
    question: object
    golds: list
    images: tuple[str, ...] = ()


def load_rows(path: str | Path, limit: int | None = None) -> list[dict]:
    """Rows of a local JSONL/JSON/parquet/CSV file through `datasets` (offline, no hub)."""
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a core dependency
        raise ImportError("reading QA files needs `datasets`: pip install datasets") from e
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"QA file {path} does not exist")
    builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
    if builder is None:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json, .parquet or .csv")
    datasets.disable_progress_bars()
    ds = datasets.load_dataset(builder, data_files=str(path), split="train")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return ds.to_list()


def _golds(value: object) -> list:
    """Gold answers as a list of non-empty strings (None, NaN and empty strings dropped)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    items = value if isinstance(value, list) else [value]
    return [str(a).strip() for a in items if a is not None and not (isinstance(a, float) and math.isnan(a))
            and str(a).strip()]  # fmt: skip


def _generic(spec: InputSpec) -> Iterator[Row]:
    cols = {"id": "id", "question": "question", "answers": "answers", "image": "image", **spec.columns}
    unknown = set(spec.columns) - {"id", "question", "answers", "image"}
    if unknown:
        raise ValueError(f"input {spec.path}: unknown `columns` keys {sorted(unknown)}; use id, question, answers, image")
    dataset = spec.dataset or Path(spec.path).stem
    for n, row in enumerate(load_rows(spec.path, spec.limit)):
        if cols["question"] not in row:
            raise ValueError(f"{spec.path}: no column {cols['question']!r} (columns: {sorted(row)}); set "
                             "`columns: {question: <name>}` in the input")  # fmt: skip
        image = row.get(cols["image"])
        images = tuple(image if isinstance(image, list) else [image]) if image else ()
        if spec.image_root:
            images = tuple(str(Path(spec.image_root) / i) for i in images)
        yield Row(str(row.get(cols["id"]) or f"{dataset}-{n}"), dataset, row.get(cols["question"]),
                  _golds(row.get(cols["answers"])), images)  # fmt: skip


def _shared_text(spec: InputSpec) -> Iterator[Row]:
    for row in load_rows(spec.path, spec.limit):
        yield Row(str(row["qid"]), spec.dataset or row.get("dataset") or "text", row["question"],
                  _golds(row.get("answers")))  # fmt: skip


def _r1router(spec: InputSpec) -> Iterator[Row]:
    from eval.metrics import expand_infoseek_golds

    dataset = spec.dataset or Path(spec.path).stem.removesuffix("_val").split("_")[0].lower()
    for n, row in enumerate(load_rows(spec.path, spec.limit)):
        rid = row.get("data_id") or row.get("question_id") or f"{dataset}-{n}"
        golds = _golds(row.get("answer"))
        if row.get("answer_eval"):
            golds = _golds(expand_infoseek_golds(row["answer_eval"])) + [g for g in golds]
            golds = list(dict.fromkeys(golds))
        images: tuple[str, ...] = ()
        if spec.image_root and row.get("image_id") is not None:
            name = spec.image_pattern.format(image_id=row["image_id"])
            images = (str(Path(spec.image_root) / name),)
        yield Row(str(rid), dataset, row.get("question"), golds, images)


def _tabfact(spec: InputSpec) -> Iterator[Row]:
    path = Path(spec.path)
    if path.is_dir():
        path = path / "r1router_tabfact_val_to_table.jsonl"
    dataset = spec.dataset or "tabfact"
    for n, row in enumerate(load_rows(path, spec.limit)):
        if "statement" in row:  # statements.jsonl: a claim with a 0/1 label
            question = f"Is it true that {row['statement'].strip()}?"
            yield Row(str(row["qid"]), dataset, question, ["yes" if int(row["label"]) == 1 else "no"])
        else:
            line = row.get("r1_router_line", n)
            yield Row(f"tabfact-val-{line}", dataset, row["question"], _golds(row.get("answer")))


def _coco(spec: InputSpec) -> Iterator[Row]:
    root = Path(spec.image_root) if spec.image_root else Path(spec.path).parent
    files: dict[str, str] = {}
    index = root / "images.jsonl"
    if index.exists():
        files = {r["image_id"]: r["file"] for r in load_rows(index)}
    for row in load_rows(spec.path, spec.limit):
        image_id = row["image_id"]
        rel = files.get(image_id) or f"images/{int(image_id.split('-')[-1]):012d}.jpg"
        yield Row(str(row["qid"]), spec.dataset or "coco", row["question"], _golds(row.get("answer")),
                  (str(root / rel),))  # fmt: skip


READERS: dict[str, Callable[[InputSpec], Iterator[Row]]] = {
    "generic": _generic,
    "shared_text": _shared_text,
    "r1router": _r1router,
    "tabfact": _tabfact,
    "coco": _coco,
}


def read_inputs(specs: list[InputSpec]) -> tuple[list[Question], list[Skip]]:
    """Read every input file; returns the questions to ask and the rows skipped (with reasons), in file order.

    Each question's metadata holds `dataset` and `question_id` (the source id), which flow into its trajectories.
    """
    questions: list[Question] = []
    skips: list[Skip] = []
    seen: set[str] = set()
    for spec in specs:
        if spec.format not in READERS:
            raise ValueError(f"unknown input format {spec.format!r}; valid: {sorted(READERS)}")
        for row in READERS[spec.format](spec):
            skip = None
            if row.id in seen:
                skip = Skip(row.id, row.dataset, "duplicate_id", f"id already read ({spec.path})")
            elif not isinstance(row.question, str) or not row.question.strip():
                skip = Skip(row.id, row.dataset, "empty_question")
            elif not row.golds:
                skip = Skip(row.id, row.dataset, "no_gold")
            else:
                missing = [p for p in row.images if not Path(p).exists()]
                if missing:
                    skip = Skip(row.id, row.dataset, "missing_image", ", ".join(missing))
                    logger.warning("question %s: image %s does not exist; skipped", row.id, ", ".join(missing))
            if skip is not None:
                skips.append(skip)
                continue
            seen.add(row.id)
            questions.append(Question(id=row.id, question=str(row.question).strip(), images=row.images,
                                      answers=tuple(row.golds),
                                      metadata={"dataset": row.dataset, "question_id": row.id}))  # fmt: skip
    counts: dict[str, int] = {}
    for s in skips:
        counts[s.reason] = counts.get(s.reason, 0) + 1
    logger.info("read %d questions from %d input(s); skipped %s", len(questions), len(specs), counts or "none")
    return questions, skips
