"""Build -> load -> search on the real demo corpus with the real MiniLM encoder, FAISS and bm25s."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from retrievers.config import KBConfig
from retrievers.kb import build_kb_status, load_kb, load_kbs, read_manifest
from retrievers.types import Query

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
QUESTIONS = [json.loads(line) for line in (DEMO / "questions.jsonl").open()]
TEXT_QUESTIONS = [q for q in QUESTIONS if q["kb"] == "text"]


def source_ids(hits) -> list[str]:
    return [h.doc.metadata["doc_id"] for h in hits]


def index_files(index_dir: Path) -> dict[str, int]:
    """Every file of an index folder with its mtime (ns): equal before and after means nothing was rewritten."""
    return {
        p.relative_to(index_dir).as_posix(): p.stat().st_mtime_ns for p in Path(index_dir).rglob("*") if p.is_file()
    }


def refuse_builds(monkeypatch) -> None:
    """Make every KB kind's index builder raise, so a reuse that silently rebuilt would fail the test."""
    import retrievers.kb

    def refuse(*args, **kwargs):
        raise AssertionError("the index was rebuilt, not reused")

    for name, kind in retrievers.kb.KB_KINDS.items():
        monkeypatch.setitem(retrievers.kb.KB_KINDS, name, dataclasses.replace(kind, build=refuse))


def test_hits_are_well_formed(demo_text_kb):
    cfg, kb = demo_text_kb
    (hits,) = kb.search([TEXT_QUESTIONS[0]["question"]], k=5)
    assert len(hits) == 5
    assert [h.rank for h in hits] == [0, 1, 2, 3, 4]
    assert all(h.kb == "text" and h.doc.kb == "text" and h.doc.modality == "text" for h in hits)
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))
    assert len({h.doc.id for h in hits}) == 5  # fusion never returns a unit twice


@pytest.fixture(scope="module")
def rankers(demo_text_kb):
    """The demo KB searched three ways; the hybrid index also serves dense-only and BM25-only configs."""
    cfg, kb = demo_text_kb
    return {"hybrid": kb, **{s: load_kb(dataclasses.replace(cfg, search=s)) for s in ("dense", "bm25")}}


@pytest.mark.parametrize("question", TEXT_QUESTIONS, ids=[q["id"] for q in TEXT_QUESTIONS])
@pytest.mark.parametrize("search", ["hybrid", "dense", "bm25"])
def test_supporting_paragraph_ranks_high(rankers, question, search):
    # each demo question has 2 gold paragraphs among 300; at least one must be in the top 3 with every ranker
    (hits,) = rankers[search].search([question["question"]], k=3)
    assert set(source_ids(hits)) & set(question["metadata"]["supporting_doc_ids"]), source_ids(hits)


def test_single_rankers_load_only_their_index(rankers):
    assert rankers["dense"]._bm25 is None and rankers["dense"]._dense is not None
    assert rankers["bm25"]._dense is None and rankers["bm25"]._encoder is None


def test_batch_equals_single_and_edge_queries(demo_text_kb):
    _, kb = demo_text_kb
    qs = [q["question"] for q in TEXT_QUESTIONS]
    batch = kb.search(qs + ["", "   ", Query("YG Entertainment boy group")], k=4)
    # batched results equal one-at-a-time results
    for q, hits in zip(qs, batch, strict=False):
        assert [h.doc.id for h in hits] == [h.doc.id for h in kb.search([q], k=4)[0]]
    # empty and blank queries give empty lists; Query objects are accepted
    assert batch[len(qs)] == [] and batch[len(qs) + 1] == []
    assert len(batch[-1]) == 4
    # a query with no word in the BM25 vocabulary still gets dense hits
    assert len(kb.search(["qwxzv"], k=2)[0]) == 2


def test_k_larger_than_corpus(demo_text_kb):
    _, kb = demo_text_kb
    (hits,) = kb.search(["Animorphs"], k=10_000)
    assert len(hits) == len(kb) == len({h.doc.id for h in hits})


def test_manifest_reuse_and_mismatch(demo_text_kb, monkeypatch):
    cfg, _ = demo_text_kb
    manifest = read_manifest(cfg.index_dir)
    assert manifest["doc_count"] == 329 and manifest["dim"] == 384 and manifest["encoder"] == "minilm"
    assert manifest["source_docs"] == 300 and len(manifest["corpus_sha256"]) == 64
    # a second build with the same config is a no-op: the builder is not called and no index file is rewritten
    before = index_files(cfg.index_dir)
    with monkeypatch.context() as m:
        refuse_builds(m)
        _, again, reused = build_kb_status(cfg, progress=False)
    assert reused and again == manifest and index_files(cfg.index_dir) == before
    # query-time settings do not invalidate the index: it loads and searches as it is
    requery = load_kb(dataclasses.replace(cfg, k=3, rrf_k=10, fusion_depth=20))
    assert len(requery.search([TEXT_QUESTIONS[0]["question"]], k=3)[0]) == 3
    # another encoder: load fails, naming the index dir, expected vs found and the fix
    other = dataclasses.replace(cfg, encoder="BAAI/bge-m3", source_file="configs/kb/demo.yaml")
    with pytest.raises(ValueError) as info:
        load_kb(other)
    message = str(info.value)
    assert str(cfg.index_dir) in message
    assert "encoder: expected 'BAAI/bge-m3', found 'minilm'" in message
    assert "kbrouter index --kb configs/kb/demo.yaml --force" in message


def test_changed_corpus_is_detected(tmp_path, monkeypatch):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "the cat sat"}\n{"id": "b", "text": "dogs bark loudly"}\n')
    cfg = KBConfig(name="tiny", kind="text", corpus=corpus, search="bm25", index_dir=tmp_path / "idx")
    with pytest.raises(FileNotFoundError, match="no built index in .*idx.*kbrouter index"):
        load_kb(cfg)
    _, _, reused = build_kb_status(cfg, progress=False)
    assert not reused
    assert load_kb(cfg).search(["dogs"], 2)[0][0].doc.id == "b"
    before = index_files(cfg.index_dir)
    with monkeypatch.context() as m:  # the same corpus again: reused, the builder not called, no file rewritten
        refuse_builds(m)
        assert build_kb_status(cfg, progress=False)[2] is True
    assert index_files(cfg.index_dir) == before
    corpus.write_text(corpus.read_text() + '{"id": "c", "text": "dogs again"}\n')
    with pytest.raises(ValueError, match="corpus_sha256: expected '[0-9a-f]{64}', found '[0-9a-f]{64}'"):
        load_kb(cfg)
    _, manifest, reused = build_kb_status(cfg, progress=False)  # build notices the change and rebuilds
    assert not reused and manifest["doc_count"] == 3
    assert {h.doc.id for h in load_kb(cfg).search(["dogs"], 5)[0]} == {"b", "c"}  # zero-score units dropped
    # a BM25-only index cannot serve a hybrid config
    with pytest.raises(ValueError, match="search: expected 'hybrid', found 'bm25'"):
        load_kb(dataclasses.replace(cfg, search="hybrid"))


def test_interrupted_build_is_not_reused(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "alpha"}\n')
    cfg = KBConfig(name="tiny", kind="text", corpus=corpus, search="bm25", index_dir=tmp_path / "idx")
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / "docs.jsonl").write_text("half written")  # no manifest: never finished
    _, _, reused = build_kb_status(cfg, progress=False)
    assert not reused and load_kbs([cfg])["tiny"].search(["alpha"], 1)[0][0].doc.id == "a"


@pytest.mark.parametrize(
    "index, params",
    [
        ("hnsw", {"hnsw_m": 8, "hnsw_ef_construction": 40}),  # graph index
        ("ivf", {"ivf_nlist": 4}),  # inverted lists
    ],
)
def test_approximate_indexes_match_flat(demo_text_kb, tmp_path, index, params):
    # real MiniLM vectors of the demo corpus (read back from the flat index, so nothing is re-encoded)
    from retrievers.dense import build_faiss_index, dense_search, load_faiss_index, save_faiss_index

    _, flat_kb = demo_text_kb
    vectors = flat_kb._dense.reconstruct_n(0, flat_kb._dense.ntotal)
    save_faiss_index(build_faiss_index(vectors, index, **params), tmp_path)
    approx = load_faiss_index(tmp_path, ef_search=64, nprobe=4)  # nprobe = nlist: IVF is exact here
    queries = flat_kb._encoder.encode([q["question"] for q in TEXT_QUESTIONS])
    got = dense_search(approx, queries, 5)[1]
    exact = dense_search(flat_kb._dense, queries, 5)[1]
    overlap = np.mean([len(set(g) & set(e)) / 5 for g, e in zip(got, exact, strict=True)])
    assert overlap >= 0.8, (got, exact)


@pytest.mark.parametrize("index", ["hnsw", "ivf"])
def test_index_type_selectable_in_config(tmp_path, index):
    import faiss

    lines = (DEMO / "passages.jsonl").read_text().splitlines()[:10]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    cfg = KBConfig(name="small", kind="text", corpus=tmp_path / "c.jsonl", search="dense", index=index,
                   hnsw_m=8, ivf_nlist=2, nprobe=2, index_dir=tmp_path / "idx")  # fmt: skip
    _, manifest, _ = build_kb_status(cfg, progress=False)
    assert manifest["index"] == index
    kb = load_kb(cfg)
    assert isinstance(kb._dense, faiss.IndexHNSW if index == "hnsw" else faiss.IndexIVF)
    first = json.loads(lines[0])
    (hits,) = kb.search([first["title"] + " " + first["text"][:200]], k=3)
    assert hits[0].doc.metadata["doc_id"] == first["id"]
