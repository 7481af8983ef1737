"""Index integrity: a corrupt index (truncated FAISS, missing or rotated docs, a swapped file) is never reused or
loaded; an old manifest is upgraded in place; leftover build folders are removed. Fake encoder, no model."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrievers.build import main
from retrievers.config import KBConfig
from retrievers.encoders import Encoder
from retrievers.kb import build_kb_status, load_kb, read_manifest

WORDS = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "peach"]


def _hash_encode(texts: list[str]) -> np.ndarray:
    """A deterministic bag-of-words vector per text (16 dims): similar texts, similar vectors."""
    out = np.zeros((len(texts), 16), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in t.lower().split():
            out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % 16] += 1.0
    return out + 1e-3


@pytest.fixture(autouse=True)
def fake_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("retrievers.store.encoder_for", lambda cfg: Encoder("fake", 16, _hash_encode))


@pytest.fixture
def kb(tmp_path: Path) -> KBConfig:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": f"{w} is a fruit"}) + "\n" for i, w in enumerate(WORDS))
    )
    cfg = KBConfig(name="fruit", kind="text", corpus=corpus, search="hybrid", index_dir=tmp_path / "idx")
    _, _, reused = build_kb_status(cfg, progress=False)
    assert not reused
    return cfg


def _reuse(cfg: KBConfig, verify: bool = False) -> bool:
    return build_kb_status(cfg, progress=False, verify=verify)[2]


def test_the_manifest_records_every_file_and_an_intact_index_is_reused(kb: KBConfig) -> None:
    manifest = read_manifest(kb.index_dir)
    assert {"docs.jsonl", "dense.faiss", "bm25/params.index.json"} <= set(manifest["files"])
    assert manifest["files"]["docs.jsonl"]["size"] == (Path(kb.index_dir) / "docs.jsonl").stat().st_size
    assert manifest["doc_count"] == len(WORDS)
    assert _reuse(kb) and _reuse(kb, verify=True)
    assert load_kb(kb).search(["plum"], 1)[0][0].doc.id == "d2"


def _truncate_faiss(d: Path) -> None:
    p = d / "dense.faiss"
    p.write_bytes(p.read_bytes()[:-40])


def _drop_doc_lines(d: Path) -> None:
    p = d / "docs.jsonl"
    p.write_text("".join(p.read_text().splitlines(keepends=True)[:-2]))


def _rotate_docs(d: Path) -> None:
    p = d / "docs.jsonl"
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[1:] + lines[:1]))  # same size, same count: other docs at each row


def _swap_faiss(d: Path) -> None:
    import faiss

    p = d / "dense.faiss"
    index = faiss.read_index(str(p))
    vectors = index.reconstruct_n(0, index.ntotal)[::-1].copy()  # same shape, rows reversed
    other = faiss.IndexFlatIP(index.d)
    other.add(vectors)
    faiss.write_index(other, str(p))


@pytest.mark.parametrize(
    ("corrupt", "file", "problem"),
    [
        (_truncate_faiss, "dense.faiss", "truncated or replaced"),
        (_drop_doc_lines, "docs.jsonl", "truncated or replaced"),
        (_rotate_docs, "docs.jsonl", "bytes differ"),
        (_swap_faiss, "dense.faiss", "bytes differ"),
    ],
)
def test_a_corrupt_index_is_refused_naming_the_file_then_rebuilt(
    kb: KBConfig, corrupt, file: str, problem: str
) -> None:
    corrupt(Path(kb.index_dir))
    with pytest.raises(ValueError, match=rf"(?s)is corrupt:\n  .*{file}: [^\n]*{problem}.*\nRebuild it with"):
        load_kb(kb)
    assert not _reuse(kb)  # rebuilt from the corpus
    assert _reuse(kb) and load_kb(kb).search(["plum"], 1)[0][0].doc.id == "d2"


def test_missing_doc_lines_are_caught_by_the_count_when_the_sizes_are_unknown(kb: KBConfig) -> None:
    manifest = read_manifest(kb.index_dir)
    del manifest["files"]  # an older manifest
    (Path(kb.index_dir) / "manifest.json").write_text(json.dumps(manifest))
    _drop_doc_lines(Path(kb.index_dir))
    with pytest.raises(ValueError, match=r"docs.jsonl: 6 lines, the manifest says 8 documents"):
        load_kb(kb)


def test_a_truncated_faiss_file_under_an_old_manifest_is_not_reused(kb: KBConfig) -> None:
    manifest = read_manifest(kb.index_dir)
    del manifest["files"]
    (Path(kb.index_dir) / "manifest.json").write_text(json.dumps(manifest))
    _truncate_faiss(Path(kb.index_dir))
    with pytest.raises(ValueError, match=r"dense.faiss: unreadable"):
        load_kb(kb)
    assert not _reuse(kb)


def test_an_old_manifest_is_upgraded_in_place_without_a_rebuild(kb: KBConfig) -> None:
    path = Path(kb.index_dir) / "manifest.json"
    manifest = read_manifest(kb.index_dir)
    old = {k: v for k, v in manifest.items() if k != "files"}
    path.write_text(json.dumps(old))
    faiss_mtime = (Path(kb.index_dir) / "dense.faiss").stat().st_mtime_ns
    assert _reuse(kb)  # not rebuilt
    upgraded = read_manifest(kb.index_dir)
    assert upgraded == old | {"files": manifest["files"]}  # only the checksums were added
    assert (Path(kb.index_dir) / "dense.faiss").stat().st_mtime_ns == faiss_mtime
    # later changes are now caught by the checksums
    _rotate_docs(Path(kb.index_dir))
    assert not _reuse(kb)


def test_index_verify_flag_hashes_and_rebuilds_a_modified_file(kb: KBConfig, tmp_path: Path, capsys) -> None:
    kb_yaml = tmp_path / "kb.yaml"
    kb_yaml.write_text(
        f"knowledge_bases:\n  - {{name: fruit, kind: text, corpus: {kb.corpus}, search: hybrid, index_dir: idx}}\n"
    )
    assert main(["--kb", str(kb_yaml), "--verify", "--quiet"]) == 0
    assert "reused (verified)" in capsys.readouterr().out
    # a byte changed in the middle of a large file escapes the sampled hash of the fast check, not --verify
    import retrievers.integrity as integrity

    p = Path(kb.index_dir) / "docs.jsonl"
    data = bytearray(p.read_bytes())
    integrity_sample, integrity.SAMPLE_BYTES = integrity.SAMPLE_BYTES, 64
    try:
        manifest = read_manifest(kb.index_dir)
        manifest["files"] = integrity.record_files(Path(kb.index_dir))
        integrity.write_manifest(Path(kb.index_dir), manifest)
        data[len(data) // 2] ^= 1
        p.write_bytes(bytes(data))
        assert main(["--kb", str(kb_yaml), "--quiet"]) == 0
        assert "reused" in capsys.readouterr().out
        assert main(["--kb", str(kb_yaml), "--verify", "--quiet"]) == 0
        assert "built" in capsys.readouterr().out
    finally:
        integrity.SAMPLE_BYTES = integrity_sample


def test_leftover_build_folders_of_dead_processes_are_removed(kb: KBConfig) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    parent = Path(kb.index_dir).parent
    for name in (f"idx.building-{dead_pid}", f"idx.old-{dead_pid}", f"idx.building-{os.getppid()}"):
        (parent / name).mkdir()
        (parent / name / "docs.jsonl").write_text("half")
    assert _reuse(kb)
    assert not (parent / f"idx.building-{dead_pid}").exists() and not (parent / f"idx.old-{dead_pid}").exists()
    assert (parent / f"idx.building-{os.getppid()}").exists()  # a live process's build is left alone


def test_a_metadata_file_counts_by_its_bytes_not_its_path(tmp_path: Path) -> None:
    """Two checkouts of the same files (a clone, a git worktree) share an index; a changed metadata file rebuilds."""
    from retrievers.kb import expected_manifest

    manifests = []
    for checkout in ("a", "b"):
        folder = tmp_path / checkout
        folder.mkdir()
        corpus = folder / "tables.jsonl"
        corpus.write_text(json.dumps({"id": "t1", "title": "Fruit", "header": ["fruit", "n"], "rows": [["fig", "2"]]}))
        (folder / "claims.jsonl").write_text(json.dumps({"table_id": "t1", "statement": "two figs"}) + "\n")
        cfg = KBConfig(
            name="tables",
            kind="table",
            corpus=corpus,
            search="bm25",
            options={"metadata_file": str(folder / "claims.jsonl")},
        )
        manifests.append(expected_manifest(cfg))
    assert manifests[0] == manifests[1]
    (tmp_path / "b" / "claims.jsonl").write_text(json.dumps({"table_id": "t1", "statement": "three figs"}) + "\n")
    assert expected_manifest(cfg)["corpus_sha256"] != manifests[0]["corpus_sha256"]
