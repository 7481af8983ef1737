"""`index: milvus` on the embedded engine (Milvus Lite) with the real shared text corpus and the real MiniLM.

The corpus is every 30th paragraph of ../shared/data/text/corpus.jsonl (194 paragraphs from HotpotQA and MuSiQue,
so source filters have both kinds), encoded for real; the questions are the shared HotpotQA/MuSiQue questions.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pymilvus", reason="needs the milvus extra: pip install 'kbrouter[milvus]'")

from retrievers import milvus  # noqa: E402
from retrievers.config import KBConfig  # noqa: E402
from retrievers.fusion import reciprocal_rank_fusion  # noqa: E402
from retrievers.kb import build_kb_status, load_kb  # noqa: E402
from tests.conftest import SHARED

ROOT = Path(__file__).resolve().parents[2]
K = 10


def subset(src: Path, out: Path, every: int = 30) -> Path:
    lines = src.read_text().splitlines()
    out.write_text("\n".join(lines[::every]) + "\n")
    return out


@pytest.fixture(scope="module")
def shared_kbs(tmp_path_factory):
    """The same subset as a FAISS flat KB (dense) and a Milvus Lite KB (hybrid), both built for real."""
    shared = SHARED / "text"
    if not shared.is_dir():
        pytest.skip(f"shared data {shared} is absent")
    tmp = tmp_path_factory.mktemp("milvus")
    corpus = subset(shared / "corpus.jsonl", tmp / "corpus.jsonl")
    questions = [json.loads(line)["question"] for line in (shared / "questions.jsonl").read_text().splitlines()[:20]]
    flat = KBConfig(name="wiki", kind="text", corpus=corpus, search="dense", index="flat", index_dir=tmp / "flat")
    mv = KBConfig(name="wiki", kind="text", corpus=corpus, search="hybrid", index="milvus", index_dir=tmp / "mv",
                  uri=str(tmp / "wiki.db"))  # fmt: skip
    build_kb_status(flat, progress=False)
    _, manifest, _ = build_kb_status(mv, progress=False)
    return {"flat": flat, "milvus": mv, "questions": questions, "tmp": tmp, "manifest": manifest}


def ids(hits) -> list[str]:
    return [h.doc.id for h in hits]


def test_manifest_records_the_backend(shared_kbs):
    m = shared_kbs["manifest"]
    assert m["backend"] == "milvus" and m["index"] == "milvus"
    assert m["milvus"]["collection"] == "wiki" and m["milvus"]["upserted"] == m["doc_count"] > 190
    assert not (Path(shared_kbs["milvus"].index_dir) / "docs.jsonl").exists()  # the units live in the engine


def test_dense_top10_equals_faiss_flat(shared_kbs):
    flat = load_kb(shared_kbs["flat"])
    dense = load_kb(dataclasses.replace(shared_kbs["milvus"], search="dense"))  # the hybrid collection serves dense
    for question, want, got in zip(
        shared_kbs["questions"],
        flat.search(shared_kbs["questions"], K),
        dense.search(shared_kbs["questions"], K),
        strict=True,
    ):
        assert ids(got) == ids(want), question
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
        assert got[0].doc.text == want[0].doc.text and got[0].kb == "wiki"


def test_hybrid_is_the_engine_rrf_of_its_dense_and_bm25_rankings(shared_kbs):
    cfg = shared_kbs["milvus"]
    hybrid = load_kb(cfg)
    dense = load_kb(dataclasses.replace(cfg, search="dense"))
    bm25 = load_kb(dataclasses.replace(cfg, search="bm25"))
    qs = shared_kbs["questions"]
    depth = cfg.fusion_depth
    for got, d, b in zip(hybrid.search(qs, K), dense.search(qs, depth), bm25.search(qs, depth), strict=True):
        ours = {h.doc.id: h.score for h in reciprocal_rank_fusion([d, b], k=cfg.rrf_k)}
        assert len(got) == K
        # every engine hit carries the fused score kbrouter computes, and they are the K best fused scores
        np.testing.assert_allclose([h.score for h in got], [ours[i] for i in ids(got)], rtol=1e-5)
        np.testing.assert_allclose([h.score for h in got], sorted(ours.values(), reverse=True)[:K], rtol=1e-5)
    # BM25 scores are positive and best first; each ranking finds docs the other misses
    scores = [h.score for h in bm25.search(qs[:1], K)[0]]
    assert scores[0] > 0 and scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("search", ["dense", "bm25", "hybrid"])
def test_filters_pass_through(shared_kbs, search):
    kb = load_kb(dataclasses.replace(shared_kbs["milvus"], search=search))
    qs = shared_kbs["questions"][:5]
    for where, want in (
        ({"source": "musique_ans_train"}, {"musique_ans_train"}),  # one value
        ({"source": ["hotpotqa_train_distractor", "musique_ans_train"]}, None),  # a list
    ):
        for hits in kb.search(qs, K, where=where):
            assert hits, where
            sources = {h.doc.metadata["source"] for h in hits}
            assert sources <= (want or set(where["source"])), sources
    unfiltered = {h.doc.metadata["source"] for hits in kb.search(qs, K) for h in hits}
    assert "hotpotqa_dev_distractor" in unfiltered  # the filter changed the answer
    (hits,) = kb.search(qs[:1], K, where={"modality": "text", "source_file": "corpus.jsonl"})
    assert len(hits) == K
    with pytest.raises(ValueError, match="filter field 'title'.*modality, source, source_file, doc_id"):
        kb.search(qs[:1], K, where={"title": "x"})


def test_reload_after_restart(shared_kbs):
    cfg = shared_kbs["milvus"]
    before = [ids(h) for h in load_kb(cfg).search(shared_kbs["questions"][:3], 5)]
    milvus.close_all()  # Milvus Lite lets one process hold a database: hand it to the new process
    yaml = shared_kbs["tmp"] / "kb.yaml"
    entry = {"name": "wiki", "kind": "text", "corpus": str(cfg.corpus), "search": "hybrid", "index": "milvus",
             "uri": cfg.uri, "index_dir": str(cfg.index_dir)}  # fmt: skip
    yaml.write_text(json.dumps({"knowledge_bases": [entry]}))  # JSON is YAML
    code = (
        "import json, sys; from retrievers.config import load_kb_configs; from retrievers.kb import load_kb\n"
        "kb = load_kb(load_kb_configs(sys.argv[1])[0])\n"
        "print(json.dumps([[h.doc.id for h in hits] for hits in kb.search(json.loads(sys.argv[2]), 5)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(yaml), json.dumps(shared_kbs["questions"][:3])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == before


def test_upsert_and_delete_are_incremental(shared_kbs, tmp_path):
    lines = Path(shared_kbs["milvus"].corpus).read_text().splitlines()[:12]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    cfg = KBConfig(name="inc", kind="text", corpus=corpus, search="hybrid", index="milvus", chunk_words=1000,
                   index_dir=tmp_path / "idx", uri=str(tmp_path / "inc.db"))  # fmt: skip
    _, first, _ = build_kb_status(cfg, progress=False)
    assert (first["milvus"]["upserted"], first["milvus"]["deleted"], first["doc_count"]) == (12, 0, 12)
    rows = [json.loads(line) for line in lines]
    changed, removed = rows[0]["doc_id"], rows[1]["doc_id"]
    rows[0]["text"] = "Zorblatt quintessence is a fictional mineral mined on the moon of Gliese in 2231."
    new = {**rows[2], "doc_id": "new-doc", "title": "Ferrocene", "text": "Ferrocene is a sandwich compound of iron."}
    rows = [rows[0], *rows[2:], new]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, second, reused = build_kb_status(cfg, progress=False)
    assert not reused  # the corpus changed
    # one changed and one new unit were encoded and upserted; the removed one was deleted; 10 were left alone
    assert (second["milvus"]["upserted"], second["milvus"]["deleted"], second["doc_count"]) == (2, 1, 12)
    kb = load_kb(cfg)
    assert len(kb) == 12
    (top,) = kb.search(["Zorblatt quintessence mineral"], 1)
    assert top[0].doc.id == changed and "Gliese" in top[0].doc.text
    (top,) = kb.search(["sandwich compound of iron"], 1)
    assert top[0].doc.id == "new-doc"
    assert kb.search(["anything"], 5, where={"doc_id": removed}) == [[]]
    _, third, _ = build_kb_status(dataclasses.replace(cfg), force=True, progress=False)
    assert third["milvus"]["upserted"] == 0  # --force re-checks every unit and re-encodes none that is current


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_engine_names_the_uri(shared_kbs, tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = dataclasses.replace(shared_kbs["milvus"], uri=uri, index_dir=tmp_path / "idx")
    with pytest.raises(ConnectionError, match=rf"Milvus at '{uri}' cannot be reached after 3 tries"):
        build_kb_status(cfg, progress=False)


def test_other_encoder_or_dimension_is_refused(shared_kbs, tmp_path, monkeypatch):
    from retrievers.encoders import Encoder, resolve_encoder_path

    cfg = shared_kbs["milvus"]
    # the same model under another name is another encoder to the manifest: never mixed into the collection
    other = dataclasses.replace(cfg, encoder=resolve_encoder_path("minilm"), index_dir=tmp_path / "other")
    with pytest.raises(ValueError, match=r"refusing to mix vectors:\n.*encoder: the collection holds 'minilm'"):
        build_kb_status(other, progress=False)
    # a 16-d encoder against the 384-d collection
    monkeypatch.setattr(
        "retrievers.store.encoder_for", lambda c: Encoder("minilm", 16, lambda t: np.ones((len(t), 16)))
    )
    with pytest.raises(ValueError, match="dim: the collection holds 384, this KB needs 16"):
        build_kb_status(dataclasses.replace(cfg, index_dir=tmp_path / "d16"), progress=False)
    # a collection replaced behind the manifest's back (16-d vectors where the manifest says 384) is refused at load
    swap = dataclasses.replace(cfg, uri=str(tmp_path / "swap.db"), index_dir=tmp_path / "swap")
    build_kb_status(swap, progress=False)
    monkeypatch.undo()
    manifest = json.loads((Path(cfg.index_dir) / "manifest.json").read_text())
    manifest["index_params"]["uri"] = manifest["milvus"]["uri"] = swap.uri
    (Path(swap.index_dir) / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="corrupt:\n.*dim: the collection holds 16, this KB needs 384"):
        load_kb(swap)


def test_table_kb_on_milvus(shared_kbs, tmp_path):
    tables = SHARED / "table" / "wtq" / "tables"
    corpus = tmp_path / "tables"
    corpus.mkdir()
    for p in sorted(tables.glob("*.csv"))[:6]:
        (corpus / p.name).write_bytes(p.read_bytes())
    cfg = KBConfig(name="tables", kind="table", corpus=corpus, index="milvus", index_dir=tmp_path / "idx",
                   uri=str(tmp_path / "t.db"))  # fmt: skip
    _, manifest, _ = build_kb_status(cfg, progress=False)
    assert manifest["doc_count"] == 6 and manifest["embedded_texts"] >= 6
    kb = load_kb(cfg)
    first = next(iter(sorted(corpus.glob("*.csv")))).stem
    header_and_row = " ".join((corpus / f"{first}.csv").read_text().splitlines()[:2])
    (hits,) = kb.search([header_and_row], 3, where={"modality": "table"})
    assert hits[0].doc.id == first and hits[0].doc.modality == "table"
