"""Parity of the one QA reader (`agent.qa_formats`) with the readers it replaced (issue 12, item 2.2).

Eval's paper (`r1_*`), documents (`docs_qa`) and generic (`jsonl`) loaders and `kbrouter run`'s `read_questions`
read their rows with their own code until they moved onto `agent.qa_formats` (ids by a named `ID_SCHEMES` entry,
golds by a named `GOLD_RULES` entry). The `_old_*` functions below are those readers as they were (commit f9828f3),
kept here as the reference: on the real shared files and on small written files, old and new give the same ids, in
the same order, with the same questions, answers, images and eval fields (cached eval predictions are keyed by id).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.io import read_questions
from agent.metrics import expand_infoseek_golds
from agent.qa_formats import Source, golds, read_rows
from agent.types import Question
from data_synthesis.config import InputSpec
from data_synthesis.inputs import read_inputs
from eval.datasets import LOADERS, DatasetSpec, _image_paths, _row  # _image_paths: unchanged by the move
from retrievers.jsonl import iter_jsonl_objects

ROOT = Path(__file__).resolve().parents[2]


# -- the readers as they were -------------------------------------------------------------------------------------


def _old_read_jsonl_rows(path: Path) -> Iterator[tuple[int, dict]]:
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
    yield from iter_jsonl_objects(path)


def _old_r1_text(prefix: str):
    def load(spec: DatasetSpec, path: Path) -> list[dict]:
        return [_row(f"{prefix}-{n}", r["question"], [r["answer"]]) for n, r in _old_read_jsonl_rows(path)]

    return load


def _old_r1_tabfact(spec: DatasetSpec, path: Path) -> list[dict]:
    join = path.parent.parent / "table" / "tabfact" / "r1router_tabfact_val_to_table.jsonl"
    tables = {r["r1_router_line"]: r["table_id"] for _, r in _old_read_jsonl_rows(join)} if join.is_file() else {}
    return [
        _row(f"r1tabfact-{i}", r["question"], [r["answer"]], gold_kb="tabfact",
             gold_evidence=[tables[i]] if i in tables else [])
        for i, (_, r) in enumerate(_old_read_jsonl_rows(path))
    ]  # fmt: skip


def _old_r1_infoseek(spec: DatasetSpec, path: Path) -> list[dict]:
    return [
        _row(r["data_id"], r["question"], expand_infoseek_golds(r["answer_eval"]),
             images=_image_paths(spec, r["image_id"]), image_id=r["image_id"])
        for _, r in _old_read_jsonl_rows(path)
    ]  # fmt: skip


def _old_r1_dynvqa(spec: DatasetSpec, path: Path) -> list[dict]:
    return [
        _row(f"dynvqa-{r['question_id']}", r["question"], r["answer"], images=_image_paths(spec, r["image_id"]),
             image_id=r["image_id"])
        for _, r in _old_read_jsonl_rows(path)
    ]  # fmt: skip


def _old_r1_webqa(spec: DatasetSpec, path: Path) -> list[dict]:
    return [
        _row(f"webqa-{n}", r["question"], [a.strip('"') for a in r["answer"]],
             images=_image_paths(spec, r["image_id"]), image_id=r["image_id"])
        for n, r in _old_read_jsonl_rows(path)
    ]  # fmt: skip


OLD_DOCS_EVIDENCE_KB = {"text": "text", "table": "table", "figure": "image"}


def _old_docs_qa(spec: DatasetSpec, path: Path) -> list[dict]:
    rows = []
    for n, r in _old_read_jsonl_rows(path):
        kind = r.get("evidence_type")
        if kind not in OLD_DOCS_EVIDENCE_KB:
            raise ValueError(
                f"{path}:{n}: `evidence_type` must be one of {sorted(OLD_DOCS_EVIDENCE_KB)}, got {kind!r}"
            )
        page = r.get("page")
        gold = f"{r['file']}#p{page}" if page is not None else r["file"]
        rows.append(_row(r["qid"], r["question"], r["answers"], gold_kb=OLD_DOCS_EVIDENCE_KB[kind],
                         gold_evidence=[gold], evidence_type=kind, file=r["file"], page=page))  # fmt: skip
    return rows


def _old_jsonl(spec: DatasetSpec, path: Path) -> list[dict]:
    cols = {"id": "id", "question": "question", "answers": "answers", "images": "images", "gold_kb": "gold_kb",
            "gold_evidence": "gold_evidence", **spec.columns}  # fmt: skip
    rows = []
    for n, r in _old_read_jsonl_rows(path):
        for key in ("question", "answers"):
            if cols[key] not in r and not (key == "answers" and "golden_answers" in r):
                raise ValueError(f"{path}:{n}: missing column {cols[key]!r} (for {key!r}); map it with `columns:`")
        answers = r.get(cols["answers"], r.get("golden_answers"))
        if isinstance(answers, (int, float)) and not isinstance(answers, bool):
            answers = str(answers)
        images = r.get(cols["images"]) or []
        evidence = r.get(cols["gold_evidence"]) or []
        for key, value in (("answers", answers), ("images", images), ("gold_evidence", evidence)):
            if not isinstance(value, (str, list)) or (
                isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)
            ):
                raise ValueError(
                    f"{path}:{n}: column {cols[key]!r} ({key}) must be a string or a list of strings, got {value!r}"
                )
        rows.append(_row(str(r.get(cols["id"], f"{spec.name}-{n}")), r[cols["question"]],
                         [answers] if isinstance(answers, str) else list(answers),
                         images=[images] if isinstance(images, str) else images,
                         gold_kb=str(r.get(cols["gold_kb"]) or ""),
                         gold_evidence=[evidence] if isinstance(evidence, str) else evidence))  # fmt: skip
    return rows


OLD_LOADERS = {
    "r1_2wiki": _old_r1_text("2wiki"),
    "r1_openwikitable": _old_r1_text("owt"),
    "r1_tabfact": _old_r1_tabfact,
    "r1_infoseek": _old_r1_infoseek,
    "r1_dynvqa": _old_r1_dynvqa,
    "r1_webqa": _old_r1_webqa,
    "docs_qa": _old_docs_qa,
    "jsonl": _old_jsonl,
}


def _old_question_from_row(row: dict, where: str) -> Question:
    for key in ("id", "question"):
        if key not in row:
            raise ValueError(f"{where}: missing field {key!r}; each line needs 'id' and 'question'")
    text = row["question"]
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: empty question for id {row['id']!r}")
    images = row.get("images") or ([row["image"]] if row.get("image") else [])
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise ValueError(f"{where}: `images` of question {row['id']!r} must be a list of paths, got {images!r}")
    for img in images:
        if not Path(img).exists():
            raise FileNotFoundError(f"{where}: image {img!r} of question {row['id']!r} does not exist")
    answers = row.get("answers", row.get("golden_answers"))
    if isinstance(answers, (str, int, float)) and not isinstance(answers, bool):
        answers = [answers]
    if answers is not None and (
        not isinstance(answers, list) or not all(isinstance(a, (str, int, float)) for a in answers)
    ):
        raise ValueError(f"{where}: `answers` of question {row['id']!r} must be a list of strings, got {answers!r}")
    meta = {
        k: v for k, v in row.items() if k not in {"id", "question", "image", "images", "answers", "golden_answers"}
    }
    return Question(id=str(row["id"]), question=text.strip(), images=tuple(str(i) for i in images),
                    answers=tuple(str(a) for a in answers) if answers is not None else None, metadata=meta)  # fmt: skip


def _old_read_questions(path: Path) -> list[Question]:
    if not path.exists():
        raise FileNotFoundError(f"question file {path} does not exist")
    out, seen = [], set()
    for n, row in iter_jsonl_objects(path):
        out.append(_old_question_from_row(row, where=f"{path}:{n}"))
        if out[-1].id in seen:
            raise ValueError(f"{path}:{n}: duplicate id {out[-1].id!r}; ids must be unique")
        seen.add(out[-1].id)
    return out


# -- parity on the real shared files ------------------------------------------------------------------------------


def _new(loader: str, spec: DatasetSpec, path: Path) -> list[dict]:
    rows, skips = LOADERS[loader][0](spec, path)
    assert skips == []  # these loaders leave no row out: every row is asked, as before
    return rows


PAPER = ["r1_2wiki", "r1_openwikitable", "r1_tabfact", "r1_infoseek", "r1_dynvqa", "r1_webqa"]


@pytest.mark.parametrize("loader", [*PAPER, "docs_qa"])
def test_paper_and_docs_loaders_read_the_shared_files_as_before(shared_path, loader):
    path = shared_path(LOADERS[loader][1])
    spec = DatasetSpec(name=loader, loader=loader)
    old, new = OLD_LOADERS[loader](spec, path), _new(loader, spec, path)
    assert len(new) == len(old) == sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    assert [r["id"] for r in new] == [r["id"] for r in old]  # ids and order
    assert new == old  # questions, answers as written (Dyn-VQA's spaces, WebQA less its quotes), images, eval fields


@pytest.mark.parametrize("loader", ["r1_infoseek", "r1_dynvqa", "r1_webqa"])
def test_paper_images_resolve_as_before(shared_path, tmp_path, loader):
    path = shared_path(LOADERS[loader][1])
    ids = [r["image_id"] for _, r in iter_jsonl_objects(path)][:3]
    (tmp_path / f"{ids[0]}.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / f"{ids[1]}.png").write_bytes(b"\xff\xd8")  # another extension; the third image is missing
    found = DatasetSpec(name=loader, loader=loader, image_root=str(tmp_path))
    new = _new(loader, found, path)
    assert new == OLD_LOADERS[loader](found, path)
    assert [r["images"] for r in new[:3]] == [[str(tmp_path / f"{ids[0]}.jpg")], [str(tmp_path / f"{ids[1]}.png")],
                                              [f"<missing:{ids[2]}>"]]  # fmt: skip
    text_only = DatasetSpec(name=loader, loader=loader, image_root=str(tmp_path), text_only=True)
    new = _new(loader, text_only, path)
    assert new == OLD_LOADERS[loader](text_only, path) and new[0]["images"] == [f"<missing:{ids[0]}>"]


@pytest.mark.parametrize(
    ("parts", "columns"),
    [
        (("text", "questions.jsonl"), {"id": "qid"}),  # HotpotQA + MuSiQue, ids from a mapped column
        (("table", "wtq", "questions.jsonl"), {}),  # no `id` column: `<name>-<line>` ids
        (("video", "qa.jsonl"), {"id": "qid", "answers": "answer"}),  # a one-string answer column
        (("docs", "qa.jsonl"), {"id": "qid"}),
    ],
)
def test_generic_jsonl_loader_reads_shared_files_as_before(shared_path, parts, columns):
    path = shared_path(*parts)
    spec = DatasetSpec(name="mine", loader="jsonl", path=str(path), columns=columns)
    old, new = _old_jsonl(spec, path), _new("jsonl", spec, path)
    assert len(new) > 0 and new == old


def test_run_reads_the_demo_questions_as_before():
    path = ROOT / "data" / "demo" / "questions.jsonl"
    assert read_questions(path) == _old_read_questions(path) and len(read_questions(path)) == 7


def test_synthesis_and_eval_read_the_paper_files_alike(shared_path):
    """Synthesis's `r1router` format and eval's paper loaders now share one reader: the same rows in the same
    order, with the golds eval has as written and synthesis cleaned (stripped, empties dropped)."""
    for loader in ("r1_2wiki", "r1_openwikitable", "r1_tabfact", "r1_dynvqa"):
        path = shared_path(LOADERS[loader][1])
        ev = _new(loader, DatasetSpec(name=loader, loader=loader), path)
        synth, skips = read_inputs([InputSpec(path=str(path), format="r1router")])
        assert not skips and len(synth) == len(ev)
        assert [q.question for q in synth] == [r["question"].strip() for r in ev]
        assert [list(q.answers) for q in synth] == [golds(r["answers"]) for r in ev]


# -- parity on small written files --------------------------------------------------------------------------------


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


JSONL_CASES = [
    # ids: the column, else `<name>-<line>` (a blank line counts), an int 0 and a null kept as the column's
    ([{"id": "a", "question": "Q1?", "answers": ["x"]}, "", {"question": "Q2?", "answers": "y"},
      {"id": 0, "question": "Q3?", "answers": 5}, {"id": None, "question": "Q4?", "answers": [1, "two"]}], {}),
    # answers as written (spaces kept), `golden_answers` when there is no answers column, empty lists kept
    ([{"id": "a", "question": " Q? ", "answers": [" x ", ""]}, {"id": "b", "question": "Q?", "golden_answers": ["g"]},
      {"id": "c", "question": "Q?", "answers": []}], {}),
    # images (a path or a list; an `image` column is not eval's), gold KB and evidence, mapped columns
    ([{"k": "a", "q": "Q?", "g": ["x"], "images": "p.jpg", "image": "other.jpg", "kb": "wiki", "ev": "d1"},
      {"k": "b", "q": "Q?", "g": "yes", "images": ["p.jpg", "q.jpg"], "ev": ["d1", "d2"]}],
     {"id": "k", "question": "q", "answers": "g", "gold_kb": "kb", "gold_evidence": "ev"}),
]  # fmt: skip


@pytest.mark.parametrize(("lines", "columns"), JSONL_CASES)
def test_generic_jsonl_loader_reads_written_files_as_before(tmp_path, lines, columns):
    path = _write(tmp_path / "q.jsonl", lines)
    spec = DatasetSpec(name="mine", loader="jsonl", path=str(path), columns=columns)
    assert _new("jsonl", spec, path) == _old_jsonl(spec, path)


@pytest.mark.parametrize(
    ("lines", "where", "column"),
    [
        (['{"id": "a", "question": "q?", "answers": ["x"]}', '{"id": "b"'], ":2:", ""),  # broken JSON
        ([{"id": "a", "query": "q?", "answers": ["x"]}], ":1:", "'question'"),  # unmapped question column
        ([{"id": "a", "question": "q?"}], ":1:", "'answers'"),  # no answers column
        ([{"id": "a", "question": "q?", "answers": {"x": 1}}], ":1:", "'answers'"),  # not a string or list
        ([{"id": "a", "question": "q?", "answers": ["x"], "images": 3}], ":1:", "'images'"),
        ([{"id": "a", "question": "q?", "answers": ["x"], "gold_evidence": {"d": 1}}], ":1:", "'gold_evidence'"),
    ],
)
def test_generic_jsonl_loader_rejects_what_it_rejected(tmp_path, lines, where, column):
    path = _write(tmp_path / "q.jsonl", lines)
    spec = DatasetSpec(name="mine", loader="jsonl", path=str(path))
    for load in (lambda: _old_jsonl(spec, path), lambda: _new("jsonl", spec, path)):
        with pytest.raises(ValueError, match=rf"{path}{where}.*{column}"):
            load()


def test_run_reads_written_files_as_before(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8")
    img = str(tmp_path / "a.jpg")
    path = _write(tmp_path / "q.jsonl", [
        {"id": 1, "question": " Who? ", "answers": "X", "dataset": "d"},  # stripped question, one answer, metadata
        "",
        {"id": "b", "question": "Q?"},  # no answers: None (not scored)
        {"id": "c", "question": "Q?", "answers": None, "golden_answers": ["g"]},  # a null answers column wins
        {"id": "d", "question": "Q?", "golden_answers": ["g", 2]},
        {"id": "e", "question": "Q?", "image": img, "answers": 5},
        {"id": "f", "question": "Q?", "images": [img, img], "answers": [" a ", ""], "metadata": {"k": 1}},
    ])  # fmt: skip
    new, old = read_questions(path), _old_read_questions(path)
    assert new == old and [q.metadata for q in new] == [q.metadata for q in old]
    assert [q.answers for q in new] == [("X",), None, None, ("g", "2"), ("5",), (" a ", "")]


@pytest.mark.parametrize(
    ("lines", "error", "where"),
    [
        (['{"id": 1, "question": "a"}', "{broken"], ValueError, ":2: not valid JSON"),
        (["[1, 2]"], ValueError, ":1: expected a JSON object"),
        ([{"question": "a"}], ValueError, ":1: missing "),  # no id
        ([{"id": "a"}], ValueError, ":1: "),  # no question
        ([{"id": 1, "question": "   "}], ValueError, ":1: empty question"),
        ([{"id": 1, "question": "a"}, {"id": 1, "question": "b"}], ValueError, ":2: duplicate id"),
        ([{"id": "i", "question": "a", "image": "/nope.jpg"}], FileNotFoundError, ":1: image '/nope.jpg'"),
        ([{"id": "i", "question": "a", "answers": {"x": 1}}], ValueError, ":1: "),
        ([{"id": "i", "question": "a", "image": 5}], ValueError, ":1: "),
    ],
)
def test_run_stops_where_it_stopped(tmp_path, lines, error, where):
    """`kbrouter run` keeps its contract: a bad row stops the run, naming the file and line."""
    path = _write(tmp_path / "q.jsonl", lines)
    for read in (_old_read_questions, read_questions):
        with pytest.raises(error, match=f"q.jsonl{where}"):
            read(path)


def test_a_source_names_an_unknown_scheme_or_rule():
    with pytest.raises(ValueError, match=r"unknown id scheme 'row'; valid: \['column', 'column_or_index'"):
        Source("q.jsonl", id_scheme="row")
    with pytest.raises(ValueError, match=r"unknown gold rule 'raw'; valid: \['as_written', 'clean', 'unquoted'\]"):
        Source("q.jsonl", golds="raw")


def test_a_required_id_column_is_named_with_the_line(tmp_path):
    path = _write(tmp_path / "q.jsonl", [{"data_id": "x", "question": "q?", "answer_eval": ["a"]}, {"question": "r?"}])
    with pytest.raises(ValueError, match=r"q.jsonl:2: missing column 'data_id / question_id'"):
        read_rows("r1router", Source(str(path), id_scheme="column", golds="as_written"))
    assert [r.id for r in read_rows("r1router", Source(str(path)))] == ["x", "q-1"]  # the default falls back
