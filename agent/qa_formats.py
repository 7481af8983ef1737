"""QA formats: read the questions of a local file in a named format, and count the rows left out, by reason.

Synthesis (`data_synthesis/inputs.py`) and eval (`eval/datasets.py`) both read the shared datasets through this
module, so a dataset's questions, ids and gold answers are read one way. Each caller keeps only what is its own:
synthesis its `InputSpec`, held-out exclusion and sampling; eval its splits, subsets and gold KB / evidence fields,
which it takes from `Row.fields`.

One reader per format, named in `FORMATS` (STYLE §18); each turns a file into `Row`s in file order:

- `generic`: columns `id`, `question`, `answers` (str, number or list; else `golden_answers`), `images` or `image`
  (a path or a list), renamed by `columns`; a missing question column, or answers / images of another type, raise
  naming the file and line.
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

- `docs`: questions over ingested documents, `../shared/data/docs/qa.jsonl` (`qid`, `file`, `question`,
  `answers`, `page`, `evidence_type` text / table / figure).

Every reader also keeps, per row, its `modality` (text / table / image / video) and the source columns
(`Row.fields`: decomposition, supporting facts, table / image / video ids, ...), and its line (`Row.line`, for
file:line errors). JSONL files are read line by line (`retrievers.jsonl`); the generic format reads other files
through `datasets`.

Two choices are named options of a `Source`, so each caller keeps the ids and golds it has always had:

- `id_scheme`, a key of `ID_SCHEMES`: the id column's value, or the row's position (`<prefix>-<index from 0>`,
  `<prefix>-<line from 1>`), or the one with the other as a fallback. Each format has a default (`DEFAULT_IDS`);
  eval names its own (cached predictions are keyed by id), and `kbrouter run` requires the `id` column.
- `golds`, a key of `GOLD_RULES`: `clean` (stripped, empty answers dropped; synthesis) or the answers as written
  (`as_written`, `unquoted`: eval).

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


class _Missing:
    """The id value of a row that has no id column (distinct from a column holding null)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()

# An id scheme: (the id column's value or MISSING, prefix, index from 0, line from 1) -> the id, or None when the
# scheme needs the column and the row has no value there (the reader then raises naming the file and line)
IdScheme = Callable[[object, str, int, int], "str | None"]

ID_SCHEMES: dict[str, IdScheme] = {
    # the column when it holds a value (not null, "" or 0), else `<prefix>-<index from 0>`: synthesis's ids
    "column_or_index": lambda v, prefix, i, line: str(v) if v is not MISSING and v else f"{prefix}-{i}",
    # the column when the row has it (whatever it holds), else `<prefix>-<line from 1>`: eval's generic `jsonl`
    "column_or_line": lambda v, prefix, i, line: str(v) if v is not MISSING else f"{prefix}-{line}",
    # the column, which every row must have: `kbrouter run`, eval's InfoSeek and documents sets
    "column": lambda v, prefix, i, line: None if v is MISSING or v is None else str(v),
    # `<prefix>-<column>`, the column required: eval's Dyn-VQA (`dynvqa-en1`)
    "prefixed_column": lambda v, prefix, i, line: None if v is MISSING or v is None else f"{prefix}-{v}",
    "index": lambda v, prefix, i, line: f"{prefix}-{i}",  # eval's paper TabFact (`r1tabfact-0`), the step set
    "line": lambda v, prefix, i, line: f"{prefix}-{line}",  # eval's paper 2Wiki, Open-WikiTable, WebQA (`2wiki-1`)
}


def golds(value: object) -> list:
    """Gold answers as a list of non-empty strings (None, NaN and empty strings dropped)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    items = value if isinstance(value, list) else [value]
    return [str(a).strip() for a in items if a is not None and not (isinstance(a, float) and math.isnan(a))
            and str(a).strip()]  # fmt: skip


def as_written(value: object) -> list:
    """Gold answers as the file writes them, each as a string, nothing stripped or dropped (None: no answers)."""
    if value is None:
        return []
    return [str(a) for a in (value if isinstance(value, list) else [value])]


def unquoted(value: object) -> list:
    """Gold answers as written, with the double quotes around each removed (WebQA's quoted sentences)."""
    return [a.strip('"') for a in as_written(value)]


# A gold rule: a gold column's value -> the gold answers
GoldRule = Callable[[object], list]

GOLD_RULES: dict[str, GoldRule] = {
    "clean": golds,  # synthesis: stripped, empty / NaN dropped (a row left with none is skipped as `no_gold`)
    "as_written": as_written,  # eval: the answers exactly as the file has them (its figures and reports)
    "unquoted": unquoted,  # eval's WebQA: as written, less the quotes around each sentence
}


@dataclass(frozen=True)
class Source:
    """One QA file and the options its format reads it with."""

    path: str
    dataset: str = ""  # name in ids and summaries; default: from the rows or the file
    columns: dict = field(default_factory=dict, hash=False)  # generic: {id, question, answers, image(s)} -> column
    image_root: str = ""  # folder of the images (r1router, coco); empty: text only (r1router), the file's (coco)
    image_pattern: str = "{image_id}.jpg"  # r1router image file name under image_root
    limit: int | None = None  # the first N rows only
    id_scheme: str = ""  # a key of ID_SCHEMES; empty: the format's (DEFAULT_IDS)
    id_prefix: str = ""  # the prefix of position ids; empty: the format's (the dataset name)
    golds: str = "clean"  # a key of GOLD_RULES

    def __post_init__(self) -> None:
        if self.id_scheme and self.id_scheme not in ID_SCHEMES:
            raise ValueError(f"{self.path}: unknown id scheme {self.id_scheme!r}; valid: {sorted(ID_SCHEMES)}")
        if self.golds not in GOLD_RULES:
            raise ValueError(f"{self.path}: unknown gold rule {self.golds!r}; valid: {sorted(GOLD_RULES)}")


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
    """A reader's output before validation: id, dataset, question, golds, image paths, modality, source fields, and
    the row's line in the file (its row number, from 1, for files that are not JSONL)."""

    id: str
    dataset: str
    question: object
    golds: list
    images: tuple[str, ...] = ()
    modality: str = "text"
    fields: dict = field(default_factory=dict, compare=False, hash=False)
    line: int = field(default=0, compare=False)


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


def _jsonl(path: str | Path, limit: int | None = None) -> list[tuple[int, dict]]:
    """`(line, row)` of a JSONL file read line by line (Python's parser: it accepts the paper's Dyn-VQA `NaN`, and
    nested fields keep their types where `datasets` would unify them into one Arrow type)."""
    from retrievers.jsonl import iter_jsonl_objects

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"QA file {path} does not exist")
    rows = []
    for n, row in iter_jsonl_objects(path):
        if limit is not None and len(rows) >= limit:
            break
        rows.append((n, row))
    return rows


def _lines(path: str | Path, limit: int | None = None) -> list[tuple[int, dict]]:
    """`(line, row)` of a JSON, parquet or CSV file through `datasets` (its row numbers), else of a JSONL file line
    by line."""
    if Path(path).suffix in (".json", ".parquet", ".csv"):
        return [(i, row) for i, row in enumerate(load_rows(path, limit), 1)]
    return _jsonl(path, limit)


def _ids(src: Source, fmt: str, prefix: str) -> Callable[[object, int, int], str]:
    """The row id function of a source: `(id value or MISSING, index, line) -> id`, raising on a missing id."""
    name = src.id_scheme or DEFAULT_IDS[fmt]
    scheme, prefix = ID_SCHEMES[name], src.id_prefix or prefix

    def row_id(value: object, index: int, line: int) -> str:
        rid = scheme(value, prefix, index, line)
        if rid is None:
            raise ValueError(f"{src.path}:{line}: missing column {ID_COLUMNS[fmt]!r} (the question id, id scheme "
                             f"{name!r}); each row needs one")  # fmt: skip
        return rid

    return row_id


GENERIC_COLUMNS = ("id", "question", "answers", "images", "image")


def _scalars(value: object) -> bool:
    """A string, a number, or a list of those: what an answers / images column may hold."""
    items = value if isinstance(value, list) else [value]
    return all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in items if v is not None)


def _paths(value: object) -> bool:
    """No images, one path, or a list of paths: what an images column may hold."""
    return not value or isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def _generic(src: Source) -> Iterator[Row]:
    cols = {key: key for key in GENERIC_COLUMNS} | src.columns
    unknown = set(src.columns) - set(GENERIC_COLUMNS)
    if unknown:
        raise ValueError(f"input {src.path}: unknown `columns` keys {sorted(unknown)}; use {list(GENERIC_COLUMNS)}")
    dataset = src.dataset or Path(src.path).stem
    row_id, gold = _ids(src, "generic", dataset), GOLD_RULES[src.golds]
    for n, (line, row) in enumerate(_lines(src.path, src.limit)):
        where = f"{src.path}:{line}"
        if cols["question"] not in row:
            raise ValueError(f"{where}: missing column {cols['question']!r} (the question; the row has "
                             f"{sorted(row)}); map it with `columns: {{question: <name>}}`")  # fmt: skip
        answers = row[cols["answers"]] if cols["answers"] in row else row.get("golden_answers")
        image_col = cols["images"] if row.get(cols["images"]) else cols["image"]
        answers_col = cols["answers"] if cols["answers"] in row else "golden_answers"
        image = row.get(image_col)
        for key, col, value, ok in (("answers", answers_col, answers, _scalars), ("images", image_col, image, _paths)):
            if not ok(value):
                raise ValueError(f"{where}: column {col!r} ({key}) must be a string or a list of strings, "
                                 f"got {value!r}")  # fmt: skip
        images = tuple(str(i) for i in (image if isinstance(image, list) else [image])) if image else ()
        if src.image_root:
            images = tuple(str(Path(src.image_root) / i) for i in images)
        yield Row(row_id(row.get(cols["id"], MISSING), n, line), dataset, row.get(cols["question"]), gold(answers),
                  images, "image" if images else "text", row, line)  # fmt: skip


def _shared_text(src: Source) -> Iterator[Row]:
    gold = GOLD_RULES[src.golds]
    for n, (line, row) in enumerate(_jsonl(src.path, src.limit)):  # line by line: MuSiQue and HotpotQA differ
        dataset = src.dataset or row.get("dataset") or "text"
        yield Row(_ids(src, "shared_text", dataset)(row.get("qid", MISSING), n, line), dataset, row.get("question"),
                  gold(row.get("answers")), (), "text", row, line)  # fmt: skip


def _r1router(src: Source) -> Iterator[Row]:
    from agent.metrics import expand_infoseek_golds

    dataset = src.dataset or Path(src.path).stem.removesuffix("_val").split("_")[0].lower()
    row_id, gold = _ids(src, "r1router", dataset), GOLD_RULES[src.golds]
    for n, (line, row) in enumerate(_lines(src.path, src.limit)):
        if src.golds != "clean":  # the paper's golds: InfoSeek's `answer_eval` (ranges expanded), else `answer`
            answers = gold(expand_infoseek_golds(row["answer_eval"]) if "answer_eval" in row else row.get("answer"))
        elif row.get("answer_eval"):  # synthesis: those, then `answer`'s that are not among them
            answers = list(dict.fromkeys(golds(expand_infoseek_golds(row["answer_eval"])) + golds(row.get("answer"))))
        else:
            answers = golds(row.get("answer"))
        images: tuple[str, ...] = ()
        if src.image_root and row.get("image_id") is not None:
            images = (str(Path(src.image_root) / src.image_pattern.format(image_id=row["image_id"])),)
        modality = "image" if row.get("image_id") is not None else "text"
        rid = row_id(row.get("data_id") or row.get("question_id") or MISSING, n, line)
        yield Row(rid, dataset, row.get("question"), answers, images, modality, row, line)


def _tabfact(src: Source) -> Iterator[Row]:
    path = Path(src.path)
    if path.is_dir():
        path = path / "r1router_tabfact_val_to_table.jsonl"
    dataset = src.dataset or "tabfact"
    gold = GOLD_RULES[src.golds]
    # JSONL line by line (the same rows as `datasets` gives on both shared files, without its Arrow cache)
    for n, (line, row) in enumerate(_lines(path, src.limit)):
        if "statement" in row:  # statements.jsonl: a claim with a 0/1 label
            label = row.get("label")
            answers = [] if label is None else ["yes" if int(label) == 1 else "no"]
            question = tabfact_question(row["statement"]) if row.get("statement") else None
            rid = _ids(src, "tabfact", dataset)(row.get("qid", MISSING), n, line)
            yield Row(rid, dataset, question, answers, (), "table", row, line)
        else:  # R1-Router's questions joined to their tables: ids by their line in the paper's file
            rid = _ids(src, "tabfact_join", "tabfact-val")(row.get("r1_router_line", n), n, line)
            yield Row(rid, dataset, row["question"], gold(row.get("answer")), (), "table", row, line)


def _wtq(src: Source) -> Iterator[Row]:
    dataset = src.dataset or "wtq"
    row_id, gold = _ids(src, "wtq", dataset), GOLD_RULES[src.golds]
    for n, (line, row) in enumerate(_jsonl(src.path, src.limit)):
        yield Row(row_id(row.get("qid", MISSING), n, line), dataset, row.get("question"), gold(row.get("answers")),
                  (), "table", row, line)  # fmt: skip


def _coco(src: Source) -> Iterator[Row]:
    root = Path(src.image_root) if src.image_root else Path(src.path).parent
    images: dict[str, dict] = {}
    index = root / "images.jsonl"
    if index.exists():
        images = {r["image_id"]: r for _, r in _jsonl(index)}
    dataset = src.dataset or "coco"
    row_id, gold = _ids(src, "coco", dataset), GOLD_RULES[src.golds]
    for n, (line, row) in enumerate(_jsonl(src.path, src.limit)):
        image_id = row.get("image_id")
        info = images.get(image_id, {})
        paths: tuple[str, ...] = ()
        if image_id:  # a row without one is kept (text only) for the annotation teacher to skip by name
            paths = (str(root / (info.get("file") or f"images/{int(str(image_id).split('-')[-1]):012d}.jpg")),)
        fields = {**row, "captions": list(info.get("captions") or [])}
        yield Row(row_id(row.get("qid", MISSING), n, line), dataset, row.get("question"), gold(row.get("answer")),
                  paths, "image", fields, line)  # fmt: skip


def _video(src: Source) -> Iterator[Row]:
    dataset = src.dataset or "video"
    row_id, gold = _ids(src, "video", dataset), GOLD_RULES[src.golds]
    for n, (line, row) in enumerate(_jsonl(src.path, src.limit)):
        yield Row(row_id(row.get("qid", MISSING), n, line), dataset, row.get("question"), gold(row.get("answer")),
                  (), "video", row, line)  # fmt: skip


_ORIGIN = re.compile(r"Origin question:\s*(.+)")


def _r1router_steps(src: Source) -> Iterator[Row]:
    dataset = src.dataset or "r1router_steps"
    row_id, gold = _ids(src, "r1router_steps", dataset), GOLD_RULES[src.golds]
    for n, (line, row) in enumerate(_jsonl(src.path, src.limit)):
        steps = row.get("steps") or []
        first = _ORIGIN.search(str(steps[0].get("problem", ""))) if steps else None
        answers = gold(steps[-1].get("answer")) if steps and steps[-1].get("step_type") == "ans" else []
        raw_images = [str(p) for p in row.get("images") or []]
        images = tuple(str(Path(src.image_root) / Path(p).name) if src.image_root else p for p in raw_images)
        rets = {r.lower() for s in steps if s.get("step_type") == "ret" and isinstance(s.get("answer"), dict)
                for r in s["answer"].get("retriever") or []}  # fmt: skip
        modality = "image" if images else "table" if "table retriever" in rets else "text"
        question = first.group(1).strip() if first else None
        yield Row(row_id(MISSING, n, line), dataset, question, answers, images, modality, row, line)


# evidence type of a documents question -> the modality of its evidence
DOCS_MODALITIES = {"text": "text", "table": "table", "figure": "image"}


def _docs(src: Source) -> Iterator[Row]:
    dataset = src.dataset or "docs"
    row_id, gold = _ids(src, "docs", dataset), GOLD_RULES[src.golds]
    for n, (line, row) in enumerate(_jsonl(src.path, src.limit)):
        kind = row.get("evidence_type")
        if kind not in DOCS_MODALITIES:
            raise ValueError(f"{src.path}:{line}: `evidence_type` must be one of {sorted(DOCS_MODALITIES)}, got "
                             f"{kind!r}")  # fmt: skip
        yield Row(row_id(row.get("qid", MISSING), n, line), dataset, row.get("question"), gold(row.get("answers")),
                  (), DOCS_MODALITIES[kind], row, line)  # fmt: skip


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
    "docs": _docs,
}
# format -> the id column a row's id comes from, and its default id scheme (`Source.id_scheme` overrides it)
ID_COLUMNS = {"generic": "id", "shared_text": "qid", "r1router": "data_id / question_id", "tabfact": "qid",
              "tabfact_join": "r1_router_line", "wtq": "qid", "coco": "qid", "video": "qid", "r1router_steps": "",
              "docs": "qid"}  # fmt: skip
DEFAULT_IDS = {fmt: "column_or_index" for fmt in ID_COLUMNS} | {"tabfact_join": "prefixed_column",
                                                                 "r1router_steps": "index"}  # fmt: skip


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
