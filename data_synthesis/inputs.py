"""QA input readers: local JSONL/JSON/parquet files read with `datasets`, turned into `agent.types.Question`s.

One reader per format, named in `READERS` (STYLE §18):

- `generic`: columns `id`, `question`, `answers` (str or list), `image` (path), renamed by `columns`.
- `shared_text`: `../shared/data/text/questions.jsonl` (`qid`, `dataset`, `question`, `answers`; MuSiQue rows add
  `decomposition`, HotpotQA-train rows `type` and `supporting_facts`).
- `r1router`: the paper's `../shared/data/r1router/*_val.jsonl` (`question`, `answer`, optional `data_id` /
  `question_id`, `image_id`, InfoSeek `answer_eval` with numeric ranges expanded as the paper does).
- `tabfact`: `../shared/data/table/tabfact` (its `r1router_tabfact_val_to_table.jsonl`, yes/no answers) or its
  `statements.jsonl` (claims worded by `agent.phrasing.tabfact_question`, as eval words them).
- `wtq`: `../shared/data/table/wtq/questions.jsonl` (`qid`, `table_id`, `question`, `answers`).
- `coco`: `../shared/data/image/coco/qa_derived.jsonl` (images under the file's `images/` folder).
- `video`: `../shared/data/video/qa.jsonl` (`qid`, `video_id`, `question`, `answer`, `evidence_span_s`).
- `r1router_steps`: the paper's step-level `../shared/data/r1router/stepgrpo_valid.jsonl` (the question is the
  `Origin question:` line of the first step, the gold the last step's answer list).

Every reader also keeps, per row, its `modality` (text / table / image / video) and the source fields the annotation
teacher builds gold steps from (`Row.fields`: decomposition, supporting facts, table / image / video ids, ...).

Held-out rows (`exclude_split`): a row is left out when its id, its `table_id` or its `image_id` is listed in the
split file (`scripts/make_splits.py` writes `{"heldout": {dataset: {"qids", "tables"?, "images"?}}}`). Each one is
recorded as a `Skip` with reason `held_out`, so the summary can show that training never read one. `sample: N` then
draws N of the remaining rows (seeded by `seed`, file order kept).

Bad rows are not fatal: a question without a gold answer, an empty question, a duplicate id or an image file that
does not exist becomes a `Skip(id, dataset, reason, detail)` that the job counts and writes to `skipped.jsonl`.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agent.phrasing import tabfact_question
from agent.types import Question
from data_synthesis.config import InputSpec

logger = logging.getLogger(__name__)

HELD_OUT = "held_out"
SKIP_REASONS = ("no_gold", "empty_question", "duplicate_id", "missing_image", HELD_OUT)


@dataclass(frozen=True)
class Skip:
    """A question left out before generation, and why (`reason`: one of `SKIP_REASONS`, or an annotation reason)."""

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
        raise ValueError(
            f"input {spec.path}: unknown `columns` keys {sorted(unknown)}; use id, question, answers, image"
        )
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
                  _golds(row.get(cols["answers"])), images, "image" if images else "text", row)  # fmt: skip


def _shared_text(spec: InputSpec) -> Iterator[Row]:
    for n, row in enumerate(_jsonl(spec.path, spec.limit)):  # line by line: MuSiQue and HotpotQA columns differ
        dataset = spec.dataset or row.get("dataset") or "text"
        yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, row.get("question"), _golds(row.get("answers")),
                  (), "text", row)  # fmt: skip


def _r1router(spec: InputSpec) -> Iterator[Row]:
    from agent.metrics import expand_infoseek_golds

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
        modality = "image" if row.get("image_id") is not None else "text"
        yield Row(str(rid), dataset, row.get("question"), golds, images, modality, row)


def _tabfact(spec: InputSpec) -> Iterator[Row]:
    path = Path(spec.path)
    if path.is_dir():
        path = path / "r1router_tabfact_val_to_table.jsonl"
    dataset = spec.dataset or "tabfact"
    for n, row in enumerate(load_rows(path, spec.limit)):
        if "statement" in row:  # statements.jsonl: a claim with a 0/1 label
            label = row.get("label")
            golds = [] if label is None else ["yes" if int(label) == 1 else "no"]
            question = tabfact_question(row["statement"]) if row.get("statement") else None
            yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, question, golds, (), "table", row)
        else:
            line = row.get("r1_router_line", n)
            yield Row(f"tabfact-val-{line}", dataset, row["question"], _golds(row.get("answer")), (), "table", row)


def _wtq(spec: InputSpec) -> Iterator[Row]:
    dataset = spec.dataset or "wtq"
    for n, row in enumerate(_jsonl(spec.path, spec.limit)):
        yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, row.get("question"), _golds(row.get("answers")),
                  (), "table", row)  # fmt: skip


def _coco(spec: InputSpec) -> Iterator[Row]:
    root = Path(spec.image_root) if spec.image_root else Path(spec.path).parent
    images: dict[str, dict] = {}
    index = root / "images.jsonl"
    if index.exists():
        images = {r["image_id"]: r for r in _jsonl(index)}
    dataset = spec.dataset or "coco"
    for n, row in enumerate(_jsonl(spec.path, spec.limit)):
        image_id = row.get("image_id")
        info = images.get(image_id, {})
        paths: tuple[str, ...] = ()
        if image_id:  # a row without one is kept (text only) for the annotation teacher to skip by name
            paths = (str(root / (info.get("file") or f"images/{int(str(image_id).split('-')[-1]):012d}.jpg")),)
        fields = {**row, "captions": list(info.get("captions") or [])}
        yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, row.get("question"), _golds(row.get("answer")),
                  paths, "image", fields)  # fmt: skip


def _video(spec: InputSpec) -> Iterator[Row]:
    dataset = spec.dataset or "video"
    for n, row in enumerate(_jsonl(spec.path, spec.limit)):
        yield Row(str(row.get("qid") or f"{dataset}-{n}"), dataset, row.get("question"), _golds(row.get("answer")),
                  (), "video", row)  # fmt: skip


_ORIGIN = re.compile(r"Origin question:\s*(.+)")


def _r1router_steps(spec: InputSpec) -> Iterator[Row]:
    dataset = spec.dataset or "r1router_steps"
    for n, row in enumerate(_jsonl(spec.path, spec.limit)):
        steps = row.get("steps") or []
        first = _ORIGIN.search(str(steps[0].get("problem", ""))) if steps else None
        golds = _golds(steps[-1].get("answer")) if steps and steps[-1].get("step_type") == "ans" else []
        raw_images = [str(p) for p in row.get("images") or []]
        images = tuple(str(Path(spec.image_root) / Path(p).name) if spec.image_root else p for p in raw_images)
        rets = {r.lower() for s in steps if s.get("step_type") == "ret" and isinstance(s.get("answer"), dict)
                for r in s["answer"].get("retriever") or []}  # fmt: skip
        modality = "image" if images else "table" if "table retriever" in rets else "text"
        yield Row(f"{dataset}-{n}", dataset, first.group(1).strip() if first else None, golds, images, modality, row)


READERS: dict[str, Callable[[InputSpec], Iterator[Row]]] = {
    "generic": _generic,
    "shared_text": _shared_text,
    "r1router": _r1router,
    "tabfact": _tabfact,
    "wtq": _wtq,
    "coco": _coco,
    "video": _video,
    "r1router_steps": _r1router_steps,
}


@dataclass(frozen=True)
class HeldOut:
    """The ids a split file holds out: question ids, table ids and image ids (over all its datasets)."""

    qids: frozenset[str] = frozenset()
    tables: frozenset[str] = frozenset()
    images: frozenset[str] = frozenset()

    @classmethod
    def load(cls, path: str | Path) -> HeldOut:
        """Read `{"heldout": {dataset: {"qids": [...], "tables"?: [...], "images"?: [...]}}}`.

        Raises:
            FileNotFoundError: the file does not exist (the message names the script that writes it).
            ValueError: the file has no `heldout` mapping.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"held-out split {path} does not exist; write it with `python scripts/make_splits.py`"
            )
        data = json.loads(path.read_text(encoding="utf-8"))
        held = data.get("heldout") if isinstance(data, dict) else None
        if not isinstance(held, dict):
            raise ValueError(
                f"{path}: a split file is {{'heldout': {{dataset: {{'qids': [...]}}}}}}; found no 'heldout'"
            )
        sets: dict[str, set[str]] = {"qids": set(), "tables": set(), "images": set()}
        for entry in held.values():
            for key, ids in sets.items():
                ids.update(str(i) for i in entry.get(key) or [])
        return cls(frozenset(sets["qids"]), frozenset(sets["tables"]), frozenset(sets["images"]))

    def why(self, row: Row) -> str:
        """Why `row` is held out (`qid`, `table ...`, `image ...`), or "" when it is not."""
        if row.id in self.qids:
            return "qid"
        table, image = row.fields.get("table_id"), row.fields.get("image_id")
        if table is not None and str(table) in self.tables:
            return f"table {table}"
        if image is not None and str(image) in self.images:
            return f"image {image}"
        return ""


def read_spec(spec: InputSpec) -> tuple[list[Row], list[Skip]]:
    """The rows of one input after held-out exclusion and sampling, and the held-out rows as skips."""
    if spec.format not in READERS:
        raise ValueError(f"unknown input format {spec.format!r}; valid: {sorted(READERS)}")
    rows = list(READERS[spec.format](spec))
    skips: list[Skip] = []
    if spec.exclude_split:
        held = HeldOut.load(spec.exclude_split)
        kept = []
        for row in rows:
            why = held.why(row)
            if why:
                skips.append(Skip(row.id, row.dataset, HELD_OUT, f"{why} in {Path(spec.exclude_split).name}",
                                  row.modality))  # fmt: skip
            else:
                kept.append(row)
        rows = kept
    if spec.sample is not None and spec.sample < len(rows):
        picked = sorted(random.Random(spec.seed).sample(range(len(rows)), spec.sample))
        logger.info("input %s: sampled %d of %d rows (seed %d)", spec.path, spec.sample, len(rows), spec.seed)
        rows = [rows[i] for i in picked]
    return rows, skips


def read_inputs(specs: list[InputSpec], with_fields: bool = False) -> tuple[list[Question], list[Skip]]:
    """Read every input file; returns the questions to ask and the rows skipped (with reasons), in file order.

    Each question's metadata holds `dataset`, `question_id` (the source id) and `modality`, which flow into its
    trajectories; with `with_fields` also `fields` (the source columns, for the annotation teacher) and `input`
    (the index of its `InputSpec`).
    """
    questions: list[Question] = []
    skips: list[Skip] = []
    seen: set[str] = set()
    for n_spec, spec in enumerate(specs):
        rows, held = read_spec(spec)
        skips += held
        for row in rows:
            skip = None
            if row.id in seen:
                skip = Skip(row.id, row.dataset, "duplicate_id", f"id already read ({spec.path})", row.modality)
            elif not isinstance(row.question, str) or not row.question.strip():
                skip = Skip(row.id, row.dataset, "empty_question", "", row.modality)
            elif not row.golds:
                skip = Skip(row.id, row.dataset, "no_gold", "", row.modality)
            else:
                missing = [p for p in row.images if not Path(p).exists()]
                if missing:
                    skip = Skip(row.id, row.dataset, "missing_image", ", ".join(missing), row.modality)
                    logger.warning("question %s: image %s does not exist; skipped", row.id, ", ".join(missing))
            if skip is not None:
                skips.append(skip)
                continue
            seen.add(row.id)
            meta = {"dataset": row.dataset, "question_id": row.id, "modality": row.modality}
            if with_fields:
                meta.update(fields=row.fields, input=n_spec)
            questions.append(Question(id=row.id, question=str(row.question).strip(), images=row.images,
                                      answers=tuple(row.golds), metadata=meta))  # fmt: skip
    counts: dict[str, int] = {}
    for s in skips:
        counts[s.reason] = counts.get(s.reason, 0) + 1
    logger.info("read %d questions from %d input(s); skipped %s", len(questions), len(specs), counts or "none")
    return questions, skips
