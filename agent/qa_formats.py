"""QA formats: read the questions of a local file in a named format, and count the rows left out, by reason.

Synthesis (`data_synthesis/inputs.py`) and eval (`eval/datasets.py`) both read the shared datasets through this
module, so a dataset's questions, ids and gold answers are read one way. Each caller keeps only what is its own:
synthesis its `InputSpec`, held-out exclusion and sampling; eval its splits, subsets and gold KB / evidence fields,
which it takes from `Row.fields`.

One reader per format, named in `FORMATS` (STYLE §18); each turns a file into `Row`s in file order:

- `generic`: columns `id`, `question`, `answers` (str or list), `image` (path), renamed by `columns`.
- `shared_text`: `../shared/data/text/questions.jsonl` (`qid`, `dataset`, `question`, `answers`; MuSiQue rows add
  `decomposition`, HotpotQA-train rows `type` and `supporting_facts`).
- `r1router`: the paper's `../shared/data/r1router/*_val.jsonl` (`question`, `answer`, optional `data_id` /
  `question_id`, `image_id`, InfoSeek `answer_eval` with numeric ranges expanded as the paper does).
- `tabfact`: `../shared/data/table/tabfact` (its `r1router_tabfact_val_to_table.jsonl`, yes/no answers) or its
  `statements.jsonl` (claims worded by `agent.phrasing.tabfact_question`).
- `wtq`: `../shared/data/table/wtq/questions.jsonl` (`qid`, `table_id`, `question`, `answers`).
- `coco`: `../shared/data/image/coco/qa_derived.jsonl` (images under the file's `images/` folder).
- `video`: `../shared/data/video/qa.jsonl` (`qid`, `video_id`, `question`, `answer`, `evidence_span_s`).
- `r1router_steps`: the paper's step-level `../shared/data/r1router/stepgrpo_valid.jsonl` (the question is the
  `Origin question:` line of the first step, the gold the last step's answer list).

Every reader also keeps, per row, its `modality` (text / table / image / video) and the source columns
(`Row.fields`: decomposition, supporting facts, table / image / video ids, ...).

Bad rows are not fatal: `check_rows` turns a question without a gold answer, an empty question, a duplicate id or an
image file that does not exist into a `Skip(id, dataset, reason, detail)`, which callers count (`count_skips`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agent.phrasing import tabfact_question

logger = logging.getLogger(__name__)

SKIP_REASONS = ("no_gold", "empty_question", "duplicate_id", "missing_image")


@dataclass(frozen=True)
class Source:
    """One QA file and the options its format reads it with."""

    path: str
    dataset: str = ""  # name in ids and summaries; default: from the rows or the file
    columns: dict = field(default_factory=dict, hash=False)  # generic: {id, question, answers, image} -> column
    image_root: str = ""  # folder of the images (r1router, coco); empty: text only (r1router), the file's (coco)
    image_pattern: str = "{image_id}.jpg"  # r1router image file name under image_root
    limit: int | None = None  # the first N rows only


@dataclass(frozen=True)
class Skip:
    """A question left out before generation, and why (`reason`: one of `SKIP_REASONS`, or a caller's reason)."""

    id: str
    dataset: str
    reason: str
    detail: str = ""
    modality: str = ""

    def to_dict(self) -> dict:
        return {"id": self.id, "dataset": self.dataset, "reason": self.reason, "detail": self.detail,
                "modality": self.modality}  # fmt: skip


@dataclass(frozen=True)
class Row:
    """A reader's output before validation: id, dataset, question, golds, image paths, modality, source fields."""

    id: str
    dataset: str
    question: object
    golds: list
    images: tuple[str, ...] = ()
    modality: str = "text"
    fields: dict = field(default_factory=dict, compare=False, hash=False)


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
    # datasets logs its own ERROR line for a malformed file; the error raised below names it once, with the line
    ds_logger = logging.getLogger("datasets")
    level = ds_logger.level
    ds_logger.setLevel(logging.CRITICAL)
    try:
        ds = datasets.load_dataset(builder, data_files=str(path), split="train")
    except datasets.exceptions.DatasetGenerationError as e:  # a malformed line, wrapped twice by datasets
        if path.suffix == ".jsonl":
            from retrievers.jsonl import iter_jsonl_objects

            for _ in iter_jsonl_objects(path):  # raises naming the file, the line and the fix
                pass
        cause = e.__cause__ or e
        raise ValueError(f"{path}: not readable as {builder} ({type(cause).__name__}: {cause}); fix the file") from e
    finally:
        ds_logger.setLevel(level)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return ds.to_list()


def _jsonl(path: str | Path, limit: int | None = None) -> list[dict]:
    """Rows of a JSONL file read line by line: for files whose nested fields `datasets` would unify into one
    Arrow type (the paper's step answers are a dict in one step and a list in the next)."""
    from retrievers.jsonl import iter_jsonl_objects

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"QA file {path} does not exist")
    rows = []
    for _, row in iter_jsonl_objects(path):
        if limit is not None and len(rows) >= limit:
            break
        rows.append(row)
    return rows


def golds(value: object) -> list:
    """Gold answers as a list of non-empty strings (None, NaN and empty strings dropped)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    items = value if isinstance(value, list) else [value]
    return [str(a).strip() for a in items if a is not None and not (isinstance(a, float) and math.isnan(a))
            and str(a).strip()]  # fmt: skip


def _generic(src: Source) -> Iterator[Row]:
    cols = {"id": "id", "question": "question", "answers": "answers", "image": "image", **src.columns}
    unknown = set(src.columns) - {"id", "question", "answers", "image"}
    if unknown:
        raise ValueError(
            f"input {src.path}: unknown `columns` keys {sorted(unknown)}; use id, question, answers, image"
        )
    dataset = src.dataset or Path(src.path).stem
    for n, row in enumerate(load_rows(src.path, src.limit)):
        if cols["question"] not in row:
            raise ValueError(f"{src.path}: no column {cols['question']!r} (columns: {sorted(row)}); set "
                             "`columns: {question: <name>}` in the input")  # fmt: skip
        image = row.get(cols["image"])
        images = tuple(image if isinstance(image, list) else [image]) if image else ()
        if src.image_root:
            images = tuple(str(Path(src.image_root) / i) for i in images)
        yield Row(str(row.get(cols["id"]) or f"{dataset}-{n}"), dataset, row.get(cols["question"]),
                  golds(row.get(cols["answers"])), images, "image" if images else "text", row)  # fmt: skip


def _shared_text(src: Source) -> Iterator[Row]:
    for n, row in enumerate(_jsonl(src.path, src.limit)):  # line by line: MuSiQue and HotpotQA columns differ
        dataset = src.dataset or row.get("dataset") or "text"
        yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, row.get("question"), golds(row.get("answers")),
                  (), "text", row)  # fmt: skip


def _r1router(src: Source) -> Iterator[Row]:
    from agent.metrics import expand_infoseek_golds

    dataset = src.dataset or Path(src.path).stem.removesuffix("_val").split("_")[0].lower()
    for n, row in enumerate(load_rows(src.path, src.limit)):
        rid = row.get("data_id") or row.get("question_id") or f"{dataset}-{n}"
        answers = golds(row.get("answer"))
        if row.get("answer_eval"):
            answers = golds(expand_infoseek_golds(row["answer_eval"])) + [g for g in answers]
            answers = list(dict.fromkeys(answers))
        images: tuple[str, ...] = ()
        if src.image_root and row.get("image_id") is not None:
            name = src.image_pattern.format(image_id=row["image_id"])
            images = (str(Path(src.image_root) / name),)
        modality = "image" if row.get("image_id") is not None else "text"
        yield Row(str(rid), dataset, row.get("question"), answers, images, modality, row)


def _tabfact(src: Source) -> Iterator[Row]:
    path = Path(src.path)
    if path.is_dir():
        path = path / "r1router_tabfact_val_to_table.jsonl"
    dataset = src.dataset or "tabfact"
    # JSONL line by line (the same rows as `datasets` gives on both shared files, without its Arrow cache)
    rows = _jsonl(path, src.limit) if path.suffix == ".jsonl" else load_rows(path, src.limit)
    for n, row in enumerate(rows):
        if "statement" in row:  # statements.jsonl: a claim with a 0/1 label
            label = row.get("label")
            answers = [] if label is None else ["yes" if int(label) == 1 else "no"]
            question = tabfact_question(row["statement"]) if row.get("statement") else None
            yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, question, answers, (), "table", row)
        else:
            line = row.get("r1_router_line", n)
            yield Row(f"tabfact-val-{line}", dataset, row["question"], golds(row.get("answer")), (), "table", row)


def _wtq(src: Source) -> Iterator[Row]:
    dataset = src.dataset or "wtq"
    for n, row in enumerate(_jsonl(src.path, src.limit)):
        yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, row.get("question"), golds(row.get("answers")),
                  (), "table", row)  # fmt: skip


def _coco(src: Source) -> Iterator[Row]:
    root = Path(src.image_root) if src.image_root else Path(src.path).parent
    images: dict[str, dict] = {}
    index = root / "images.jsonl"
    if index.exists():
        images = {r["image_id"]: r for r in _jsonl(index)}
    dataset = src.dataset or "coco"
    for n, row in enumerate(_jsonl(src.path, src.limit)):
        image_id = row.get("image_id")
        info = images.get(image_id, {})
        paths: tuple[str, ...] = ()
        if image_id:  # a row without one is kept (text only) for the annotation teacher to skip by name
            paths = (str(root / (info.get("file") or f"images/{int(str(image_id).split('-')[-1]):012d}.jpg")),)
        fields = {**row, "captions": list(info.get("captions") or [])}
        yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, row.get("question"), golds(row.get("answer")),
                  paths, "image", fields)  # fmt: skip


def _video(src: Source) -> Iterator[Row]:
    dataset = src.dataset or "video"
    for n, row in enumerate(_jsonl(src.path, src.limit)):
        yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, row.get("question"), golds(row.get("answer")),
                  (), "video", row)  # fmt: skip


_ORIGIN = re.compile(r"Origin question:\s*(.+)")


def _r1router_steps(src: Source) -> Iterator[Row]:
    dataset = src.dataset or "r1router_steps"
    for n, row in enumerate(_jsonl(src.path, src.limit)):
        steps = row.get("steps") or []
        first = _ORIGIN.search(str(steps[0].get("problem", ""))) if steps else None
        answers = golds(steps[-1].get("answer")) if steps and steps[-1].get("step_type") == "ans" else []
        raw_images = [str(p) for p in row.get("images") or []]
        images = tuple(str(Path(src.image_root) / Path(p).name) if src.image_root else p for p in raw_images)
        rets = {r.lower() for s in steps if s.get("step_type") == "ret" and isinstance(s.get("answer"), dict)
                for r in s["answer"].get("retriever") or []}  # fmt: skip
        modality = "image" if images else "table" if "table retriever" in rets else "text"
        yield Row(f"{dataset}-{n}", dataset, first.group(1).strip() if first else None, answers, images, modality, row)


# A format reader: one file's rows, in file order (see the module docstring for each format's columns)
FormatReader = Callable[[Source], Iterator[Row]]

FORMATS: dict[str, FormatReader] = {
    "generic": _generic,
    "shared_text": _shared_text,
    "r1router": _r1router,
    "tabfact": _tabfact,
    "wtq": _wtq,
    "coco": _coco,
    "video": _video,
    "r1router_steps": _r1router_steps,
}


def read_rows(fmt: str, src: Source) -> list[Row]:
    """The rows of one file in format `fmt` (a key of `FORMATS`), unchecked, in file order.

    Raises:
        ValueError: `fmt` is not a format (the message lists them), or the file is malformed (named with the line).
        FileNotFoundError: no such file.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown QA format {fmt!r}; valid: {sorted(FORMATS)}")
    return list(FORMATS[fmt](src))


def check_row(row: Row, seen: set[str], where: str) -> Skip | None:
    """Why `row` cannot be asked (a `Skip` with one of `SKIP_REASONS`), or None; `where` names the file in a
    duplicate's detail. Does not add `row.id` to `seen`: the caller does once it keeps the row."""
    if row.id in seen:
        return Skip(row.id, row.dataset, "duplicate_id", f"id already read ({where})", row.modality)
    if not isinstance(row.question, str) or not row.question.strip():
        return Skip(row.id, row.dataset, "empty_question", "", row.modality)
    if not row.golds:
        return Skip(row.id, row.dataset, "no_gold", "", row.modality)
    missing = [p for p in row.images if not Path(p).exists()]
    if missing:
        logger.warning("question %s: image %s does not exist; skipped", row.id, ", ".join(missing))
        return Skip(row.id, row.dataset, "missing_image", ", ".join(missing), row.modality)
    return None


def check_rows(rows: list[Row], where: str, seen: set[str] | None = None) -> tuple[list[Row], list[Skip]]:
    """The rows that can be asked and the others as `Skip`s, in order; `seen` (ids read before, e.g. from other
    files) is updated with the kept ids."""
    seen = set() if seen is None else seen
    kept, skips = [], []
    for row in rows:
        skip = check_row(row, seen, where)
        if skip is None:
            seen.add(row.id)
            kept.append(row)
        else:
            skips.append(skip)
    return kept, skips


def count_skips(skips: list[Skip]) -> dict[str, int]:
    """Skips counted by reason, in first-seen order."""
    counts: dict[str, int] = {}
    for s in skips:
        counts[s.reason] = counts.get(s.reason, 0) + 1
    return counts
