"""Benchmark loaders: local files → normalised rows in a `datasets.Dataset` → `agent.types.Question`s.

The shared sets (`hotpotqa`, `musique`, `tabfact`, `wtq`, `coco`, `video`) are read by `agent.qa_formats`, the
reader synthesis uses (`SHARED_FORMATS` names each one's format), so both ask the same questions with the same ids and
gold answers; rows it cannot ask (no gold answer, an empty question, a duplicate id, a missing photo) are left out and
counted by reason (`LoadedDataset.skips`). What eval adds is its own: the gold KB and evidence, splits and subsets.

The other loaders read through `agent.qa_formats` too, with the ids and golds eval has always had, named there:
the paper's sets (`r1_*`) in its `r1router` format with an id scheme and gold rule each (`PAPER_IDS`: `2wiki-1` by
line, `r1tabfact-0` by index, InfoSeek's `data_id`, `dynvqa-<question_id>`; answers as written, WebQA's unquoted),
`docs_qa` in its `docs` format, and the generic `jsonl` loader in its `generic` format (ids: the `id` column, else
`<name>-<line>`). These leave no row out: every row is asked, as before (cached predictions are keyed by id).

Every loader reads JSONL line by line (a malformed line raises naming the file and line) and returns rows with
`id`, `question`, `answers` (gold strings; InfoSeek numeric ranges expanded as the paper does), `images`,
`gold_kb` (KB name holding the evidence, "" when unknown), `gold_evidence` (doc ids: paragraph ids, table ids,
image ids, `<video>@<start>-<end>` spans) and `answer_type` (`yesno` or `open`). Rows go through
`datasets.Dataset` for the subset (seeded shuffle, `limit`) and are returned as `Question`s whose `metadata`
carries the gold fields.

`split_file:` (e.g. `data/splits/shared_heldout.json`, written by `scripts/make_splits.py`) keeps only the questions
listed as held out for the dataset (`split_key:`, default: the loader name, or the dataset name for the generic `jsonl`
loader), before sampling; the loaded dataset
records how many of the split's questions it kept, so a report shows it read held-out questions only.

The paper's six sets (`r1router/`) ship without images: a visual set whose images are missing is reported and
skipped unless `text_only: true` (questions without their image) or `image_root:` points at the images.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from agent.qa_formats import Row, Skip, Source, check_rows, count_skips, read_rows
from agent.types import Question

logger = logging.getLogger(__name__)

YES_NO = frozenset({"yes", "no"})


PARTS = ("test", "validation", "confirm")


@dataclass
class DatasetSpec:
    """One benchmark of an eval config."""

    name: str = field(metadata={"help": "Name in the report and the prediction cache."})
    loader: str = field(metadata={"help": "A key of `LOADERS` (e.g. hotpotqa, tabfact, coco, jsonl)."})
    path: str = field(default="", metadata={"help": "Question file; default: the loader's file under shared_data."})
    group: str = field(default="", metadata={"help": "Report group (text|table|image|video|...); loader default."})
    limit: int | None = field(default=None, metadata={"help": "Keep at most this many questions."})
    sample_seed: int | None = field(default=0, metadata={"help": "Shuffle seed before `limit`; None keeps order."})
    part: str = field(
        default="test",
        metadata={
            "help": "test: the first `limit` questions after the shuffle (the scoreboard); validation: the ones after "
            "them, never scored by `test`, for choosing between models (a dataset without `limit` has none); "
            "confirm: the ones after validation's, for checking once a choice made on the other two parts"
        },
    )
    validation_limit: int | None = field(
        default=None, metadata={"help": "parts validation and confirm: the validation part's size (default: `limit`)."}
    )
    confirm_limit: int | None = field(
        default=None, metadata={"help": "part confirm: at most this many questions (default: `validation_limit`)."}
    )
    text_only: bool = field(default=False, metadata={"help": "Run a visual set without its images."})
    image_root: str = field(default="", metadata={"help": "Folder holding the images of r1router visual sets."})
    gold_kb: str | None = field(default=None, metadata={"help": "KB name holding the evidence; loader default."})
    columns: dict = field(default_factory=dict, metadata={"help": "jsonl loader: our field -> file column."})
    split_file: str = field(
        default="",
        metadata={
            "help": "JSON of held-out ids (scripts/make_splits.py): keep only this dataset's held-out questions."
        },
    )
    split_key: str = field(
        default="",
        metadata={
            "help": "The dataset's entry in `split_file`; default: `loader` (`name` for the generic jsonl loader)."
        },
    )

    def __post_init__(self) -> None:
        if self.loader not in LOADERS:
            raise ValueError(f"dataset {self.name!r}: unknown loader {self.loader!r}; valid: {sorted(LOADERS)}")
        if self.loader == "jsonl" and not self.path:
            raise ValueError(f"dataset {self.name!r}: the jsonl loader needs `path:` (a JSONL question file)")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"dataset {self.name!r}: `limit` must be >= 1 or null, got {self.limit}")
        if self.part not in PARTS:
            raise ValueError(f"dataset {self.name!r}: `part` must be one of {PARTS}, got {self.part!r}")
        for key in ("validation_limit", "confirm_limit"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"dataset {self.name!r}: `{key}` must be >= 1 or null, got {getattr(self, key)}")
        unknown = set(self.columns) - set(COLUMN_KEYS)
        if unknown:
            raise ValueError(
                f"dataset {self.name!r}: unknown `columns` key(s) {sorted(unknown)}; valid: {COLUMN_KEYS}"
            )
        if self.split_key and not self.split_file:
            raise ValueError(
                f"dataset {self.name!r}: `split_key` needs `split_file:` (e.g. data/splits/shared_heldout.json)"
            )


@dataclass
class LoadedDataset:
    """A loaded benchmark: its questions, or the reason it was skipped."""

    spec: DatasetSpec
    group: str
    questions: list[Question]
    skipped: str = ""
    split: str = (
        ""  # the held-out filter applied, e.g. "held-out of shared_heldout.json[wtq]: 1016 of 2136 in the file"
    )
    skips: dict[str, int] = field(default_factory=dict)  # rows of the file left out, by reason (agent.qa_formats)


def _row(
    id_: str,
    question: str,
    answers: list,
    *,
    images: list[str] = (),
    gold_kb: str = "",
    gold_evidence: list[str] = (),
    **extra: object,
) -> dict:
    answers = [str(a) for a in answers]
    answer_type = "yesno" if answers and all(a.strip().lower() in YES_NO for a in answers) else "open"
    return {
        "id": id_,
        "question": question,
        "answers": answers,
        "images": list(images),
        "gold_kb": gold_kb,
        "gold_evidence": [str(e) for e in gold_evidence],
        "answer_type": answer_type,
        "extra": json.dumps(extra, ensure_ascii=False, default=str),
    }


# -- loaders: (spec, file) -> (rows, rows left out) ---------------------------------------------------------------
# A loader: the rows of a dataset's file, and the rows it left out (only the shared formats leave rows out)
Loader = Callable[["DatasetSpec", Path], tuple[list[dict], list[Skip]]]

# paper loader -> the id scheme and prefix of its ids, and its gold rule (`agent.qa_formats`); eval's ids since the
# first paper runs, kept so cached predictions stay valid
PAPER_IDS: dict[str, tuple[str, str, str]] = {
    "r1_2wiki": ("line", "2wiki", "as_written"),  # 2wiki-1, from the file's line 1
    "r1_openwikitable": ("line", "owt", "as_written"),
    "r1_tabfact": ("index", "r1tabfact", "as_written"),  # r1tabfact-0, from the first row
    "r1_infoseek": ("column", "", "as_written"),  # data_id
    "r1_dynvqa": ("prefixed_column", "dynvqa", "as_written"),  # dynvqa-<question_id>
    "r1_webqa": ("line", "webqa", "unquoted"),  # WebQA's answers are quoted sentences
}


def _paper_rows(loader: str, path: Path) -> list[Row]:
    scheme, prefix, gold_rule = PAPER_IDS[loader]
    return read_rows("r1router", Source(str(path), id_scheme=scheme, id_prefix=prefix, golds=gold_rule))


def _r1_text(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
    return [_row(r.id, r.question, r.golds) for r in _paper_rows(spec.loader, path)], []


def _r1_tabfact(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
    join = path.parent.parent / "table" / "tabfact" / "r1router_tabfact_val_to_table.jsonl"
    tables = (
        {r.fields["r1_router_line"]: r.fields["table_id"] for r in read_rows("tabfact", Source(str(join)))}
        if join.is_file()
        else {}
    )
    rows = [
        _row(r.id, r.question, r.golds, gold_kb="tabfact", gold_evidence=[tables[i]] if i in tables else [])
        for i, r in enumerate(_paper_rows(spec.loader, path))
    ]
    return rows, []


def _image_paths(spec: DatasetSpec, image_id: object) -> list[str]:
    if spec.text_only or not spec.image_root:
        return [f"<missing:{image_id}>"]
    for ext in (".jpg", ".JPEG", ".jpeg", ".png"):
        p = Path(spec.image_root) / f"{image_id}{ext}"
        if p.exists():
            return [str(p)]
    return [f"<missing:{image_id}>"]


def _r1_visual(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
    rows = [
        _row(
            r.id,
            r.question,
            r.golds,
            images=_image_paths(spec, r.fields["image_id"]),
            image_id=r.fields["image_id"],
        )
        for r in _paper_rows(spec.loader, path)
    ]
    return rows, []


def _read_shared(loader: str, path: Path, text_only: bool = False) -> tuple[list[Row], list[Skip]]:
    """The askable rows of a shared set read by `agent.qa_formats` (for `shared_text`: this loader's dataset only),
    and the rows left out; `text_only` drops the images before the check, so a missing photo skips nothing."""
    fmt, dataset = SHARED_FORMATS[loader]
    rows = read_rows(fmt, Source(str(path)))
    if dataset:
        rows = [r for r in rows if r.dataset == dataset]
    if text_only:
        rows = [replace(r, images=()) for r in rows]
    return check_rows(rows, str(path))


def _shared_text(dataset: str) -> Loader:
    def load(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
        rows, skips = _read_shared(dataset, path)
        return [
            _row(
                r.id,
                r.question,
                r.golds,
                gold_kb="wiki",
                gold_evidence=r.fields["supporting_doc_ids"],
                hops=r.fields.get("hops"),
            )
            for r in rows
        ], skips

    return load


def _tabfact(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
    rows, skips = _read_shared("tabfact", path)
    return [
        _row(r.id, r.question, r.golds, gold_kb="tabfact", gold_evidence=[r.fields["table_id"]]) for r in rows
    ], skips


def _wtq(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
    rows, skips = _read_shared("wtq", path)
    return [_row(r.id, r.question, r.golds, gold_kb="wtq", gold_evidence=[r.fields["table_id"]]) for r in rows], skips


def _coco(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
    rows, skips = _read_shared("coco", path, text_only=spec.text_only)
    return [
        _row(
            r.id,
            r.question,
            r.golds,
            images=list(r.images),
            gold_kb="coco_captions",
            gold_evidence=[r.fields["image_id"]],
            type=r.fields["type"],
        )
        for r in rows
    ], skips


def _video(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
    rows, skips = _read_shared("video", path)
    return [
        _row(
            r.id,
            r.question,
            r.golds,
            gold_kb="video_clips",
            gold_evidence=[
                f"{r.fields['video_id']}@{r.fields['evidence_span_s'][0]:g}-{r.fields['evidence_span_s'][1]:g}"
            ],
        )
        for r in rows
    ], skips


# evidence type of a documents QA line -> the KB of `kbrouter ingest` that holds it (configs written by ingest)
DOCS_EVIDENCE_KB = {"text": "text", "table": "table", "figure": "image"}


def _docs_qa(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
    """Questions over ingested documents (`shared/data/docs/qa.jsonl` style, `agent.qa_formats`' `docs` format).
    The gold KB is the evidence type's; the gold evidence is the page (`file#p4`, or the file when it has no pages),
    which every record of `kbrouter ingest` names in its `source_id`."""
    rows = []
    for r in read_rows("docs", Source(str(path), id_scheme="column", golds="as_written")):
        kind, page = r.fields["evidence_type"], r.fields.get("page")
        gold = f"{r.fields['file']}#p{page}" if page is not None else r.fields["file"]
        rows.append(
            _row(
                r.id,
                r.question,
                r.golds,
                gold_kb=DOCS_EVIDENCE_KB[kind],
                gold_evidence=[gold],
                evidence_type=kind,
                file=r.fields["file"],
                page=page,
            )
        )
    return rows, []


COLUMN_KEYS = ("id", "question", "answers", "images", "gold_kb", "gold_evidence")


def _jsonl(spec: DatasetSpec, path: Path) -> tuple[list[dict], list[Skip]]:
    """A question file in `agent.qa_formats`' generic format (ids: the `id` column, else `<name>-<line>`), plus
    eval's own columns: the gold KB and evidence."""
    cols = {key: key for key in COLUMN_KEYS} | spec.columns
    # eval reads the `images` column only (not the generic format's `image` spelling too)
    columns = {k: cols[k] for k in ("id", "question", "answers", "images")} | {"image": cols["images"]}
    source = Source(str(path), columns=columns, id_scheme="column_or_line", id_prefix=spec.name, golds="as_written")
    rows = []
    for r in read_rows("generic", source):
        if cols["answers"] not in r.fields and "golden_answers" not in r.fields:
            raise ValueError(f"{path}:{r.line}: missing column {cols['answers']!r} (for 'answers'); map it with "
                             "`columns:`")  # fmt: skip
        evidence = r.fields.get(cols["gold_evidence"]) or []
        if not isinstance(evidence, (str, list)) or (
            isinstance(evidence, list) and any(isinstance(v, (dict, list)) for v in evidence)
        ):
            raise ValueError(
                f"{path}:{r.line}: column {cols['gold_evidence']!r} (gold_evidence) must be a string or a list of "
                f"strings, got {evidence!r}"
            )
        rows.append(
            _row(
                r.id,
                r.question,
                r.golds,
                images=list(r.images),
                gold_kb=str(r.fields.get(cols["gold_kb"]) or ""),
                gold_evidence=[evidence] if isinstance(evidence, str) else evidence,
            )
        )
    return rows, []


# loader name -> (loader, default file under shared_data, default group)
LOADERS: dict[str, tuple[Loader, str, str]] = {
    "r1_2wiki": (_r1_text, "r1router/2wikimultihopqa_val.jsonl", "text"),
    "r1_openwikitable": (_r1_text, "r1router/openwikitqa_val.jsonl", "table"),
    "r1_tabfact": (_r1_tabfact, "r1router/tabfact_val.jsonl", "table"),
    "r1_infoseek": (_r1_visual, "r1router/infoseek_val.jsonl", "image"),
    "r1_dynvqa": (_r1_visual, "r1router/DynVQA_en.202412.jsonl", "image"),
    "r1_webqa": (_r1_visual, "r1router/webqa_val.jsonl", "image"),
    "hotpotqa": (_shared_text("hotpotqa"), "text/questions.jsonl", "text"),
    "musique": (_shared_text("musique"), "text/questions.jsonl", "text"),
    "tabfact": (_tabfact, "table/tabfact/statements.jsonl", "table"),
    "wtq": (_wtq, "table/wtq/questions.jsonl", "table"),
    "coco": (_coco, "image/coco/qa_derived.jsonl", "image"),
    "video": (_video, "video/qa.jsonl", "video"),
    "docs_qa": (_docs_qa, "docs/qa.jsonl", "docs"),
    "jsonl": (_jsonl, "", "custom"),
}
SPEC_KEYS = tuple(f.name for f in fields(DatasetSpec))
# loader name -> (its `agent.qa_formats` format, the dataset its rows name, "" for every row): the sets synthesis reads
SHARED_FORMATS: dict[str, tuple[str, str]] = {
    "hotpotqa": ("shared_text", "hotpotqa"),
    "musique": ("shared_text", "musique"),
    "tabfact": ("tabfact", ""),
    "wtq": ("wtq", ""),
    "coco": ("coco", ""),
    "video": ("video", ""),
}


def read_split(split_file: str | Path, key: str) -> set[str]:
    """The held-out question ids of one dataset in a split file (`{"heldout": {key: {"qids": [...]}}}`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a split file, or `key` is not in it (the message lists the keys it has).
    """
    path = Path(split_file)
    if not path.is_file():
        raise FileNotFoundError(f"split file {str(path)!r} does not exist; write it with scripts/make_splits.py")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"split file {path}: not valid JSON ({e})") from e
    held = data.get("heldout") if isinstance(data, dict) else None
    if not isinstance(held, dict):
        raise ValueError(f'split file {path}: expected {{"heldout": {{dataset: {{"qids": [...]}}}}}}')
    if key not in held or not isinstance(held[key], dict) or not isinstance(held[key].get("qids"), list):
        raise ValueError(
            f"split file {path} has no held-out ids for {key!r}; it has {sorted(held)} "
            "(set `split_key:` to one of them)"
        )
    return {str(q) for q in held[key]["qids"]}


def load_dataset(spec: DatasetSpec, shared_data: str | Path = "") -> LoadedDataset:
    """Load one benchmark into questions (held-out filter, then subset by `sample_seed`/`limit` through `datasets`).

    Raises:
        FileNotFoundError: the question or split file is missing.
        ValueError: a malformed line (named by file and line), a missing column, or a split file that holds none of
            the loader's ids (they name questions differently).
    """
    import datasets

    rows_fn, default_file, default_group = LOADERS[spec.loader]
    path = Path(spec.path) if spec.path else Path(shared_data) / default_file
    group = spec.group or default_group
    rows, skipped_rows = rows_fn(spec, path)
    skips = count_skips(skipped_rows)
    if skips:
        logger.warning("dataset %s: %d row(s) of %s left out: %s", spec.name, len(skipped_rows), path, skips)
    split = ""
    if spec.split_file:
        key = spec.split_key or (spec.name if spec.loader == "jsonl" else spec.loader)
        held = read_split(spec.split_file, key)
        kept = [r for r in rows if r["id"] in held]
        if rows and not kept:
            raise ValueError(
                f"dataset {spec.name!r}: none of the {len(rows)} question ids of {path} (e.g. "
                f"{rows[0]['id']!r}) is held out in {spec.split_file}[{key!r}] (e.g. "
                f"{next(iter(sorted(held)), '')!r}); the split and the loader name questions differently"
            )
        split = f"held-out of {Path(spec.split_file).name}[{key}]: {len(kept)} of {len(rows)} in the file"
        rows = kept
    if not rows:
        return LoadedDataset(spec, group, [], skipped=f"no questions in {path}", split=split, skips=skips)
    ds = datasets.Dataset.from_list(rows)
    if spec.sample_seed is not None:
        ds = ds.shuffle(seed=spec.sample_seed)
    if spec.part != "test":  # the parts follow one another in the shuffle, so no two share a question
        limit = spec.limit or len(ds)  # no `limit`: the test part takes every question
        validation = spec.validation_limit or limit
        start = limit if spec.part == "validation" else limit + validation
        if start >= len(ds):
            before = f"`limit` {spec.limit}" + (
                "" if spec.part == "validation" else f", `validation_limit` {validation}"
            )
            reason = f"part {spec.part}: the parts before it ({before}) take all {len(ds)} questions"
            return LoadedDataset(spec, group, [], skipped=reason, split=split, skips=skips)
        size = validation if spec.part == "validation" else spec.confirm_limit or validation
        ds = ds.select(range(start, min(start + size, len(ds))))
        split = f"{split}; {spec.part} part: after the first {start}".lstrip("; ")
    elif spec.limit is not None:
        ds = ds.select(range(min(spec.limit, len(ds))))
    missing = [img for row in ds for img in row["images"] if img.startswith("<missing:") or not Path(img).exists()]
    if missing and not spec.text_only:
        reason = (
            f"{len(missing)} of {len(ds)} questions' images are not available (e.g. {missing[0]}); the paper's "
            "visual sets ship without images: set `image_root:` to their folder, or `text_only: true`"
        )
        logger.warning("dataset %s skipped: %s", spec.name, reason)
        return LoadedDataset(spec, group, [], skipped=reason, split=split, skips=skips)
    questions = []
    for row in ds:
        gold_kb = spec.gold_kb if spec.gold_kb is not None else row["gold_kb"]
        meta = {
            "dataset": spec.name,
            "group": group,
            "gold_kb": gold_kb,
            "gold_evidence": row["gold_evidence"],
            "answer_type": row["answer_type"],
            **json.loads(row["extra"]),
        }
        images = () if spec.text_only else tuple(row["images"])
        questions.append(
            Question(
                id=row["id"], question=row["question"], images=images, answers=tuple(row["answers"]), metadata=meta
            )
        )
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"dataset {spec.name!r} ({path}): duplicate question id {dup!r}; ids must be unique")
    return LoadedDataset(spec, group, questions, split=split, skips=skips)
