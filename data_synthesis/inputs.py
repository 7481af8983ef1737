"""Synthesis inputs: the QA files of a `SynthConfig`, read through `agent.qa_formats`, as `agent.types.Question`s.

The formats (`generic`, `shared_text`, `r1router`, `tabfact`, `wtq`, `coco`, `video`, `r1router_steps`), their
columns, ids (`ID_SCHEMES`; synthesis keeps each format's default) and golds (`GOLD_RULES`; synthesis's `clean`) and
the row checks (`no_gold`, `empty_question`, `duplicate_id`, `missing_image`) live in `agent.qa_formats`, which eval
and `kbrouter run` read their question files with. This module keeps what is synthesis's own: the `InputSpec`, held-out
exclusion, sampling and the question metadata.

Held-out rows (`exclude_split`): a row is left out when its id, its `table_id` or its `image_id` is listed in the
split file (`scripts/make_splits.py` writes `{"heldout": {dataset: {"qids", "tables"?, "images"?}}}`). Each one is
recorded as a `Skip` with reason `held_out`, so the summary can show that training never read one. `sample: N` then
draws N of the remaining rows (seeded by `seed`, file order kept).

Bad rows are not fatal: each becomes a `Skip(id, dataset, reason, detail)` that the job counts and writes to
`skipped.jsonl`.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

from agent.qa_formats import FORMATS, Row, Skip, Source, check_row, count_skips, read_rows
from agent.qa_formats import SKIP_REASONS as ROW_SKIP_REASONS
from agent.types import Question
from data_synthesis.config import InputSpec

logger = logging.getLogger(__name__)

HELD_OUT = "held_out"
SKIP_REASONS = (*ROW_SKIP_REASONS, HELD_OUT)


def source(spec: InputSpec) -> Source:
    """The `agent.qa_formats.Source` of an input: its file and the options its format reads."""
    return Source(path=spec.path, dataset=spec.dataset, columns=spec.columns, image_root=spec.image_root,
                  image_pattern=spec.image_pattern, limit=spec.limit)  # fmt: skip


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
    if spec.format not in FORMATS:
        raise ValueError(f"unknown input format {spec.format!r}; valid: {sorted(FORMATS)}")
    rows = read_rows(spec.format, source(spec))
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
            skip = check_row(row, seen, spec.path)
            if skip is not None:
                skips.append(skip)
                continue
            seen.add(row.id)
            meta = {"dataset": row.dataset, "question_id": row.id, "modality": row.modality}
            if with_fields:
                meta.update(fields=row.fields, input=n_spec)
            questions.append(Question(id=row.id, question=str(row.question).strip(), images=row.images,
                                      answers=tuple(row.golds), metadata=meta))  # fmt: skip
    counts = count_skips(skips)
    logger.info("read %d questions from %d input(s); skipped %s", len(questions), len(specs), counts or "none")
    return questions, skips
