"""Large local KBs from the KB YAML: IVF-PQ + refine in FAISS shards, a killed `kbrouter index` that resumes,
corrupt shard files, and parallel encoding, on real shared paragraphs with the real MiniLM."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from retrievers.config import KBConfig
from retrievers.kb import build_kb_status, load_kb
from tests.conftest import SHARED

ROOT = Path(__file__).resolve().parents[2]
SHARED_TEXT = SHARED / "text"


def shared_subset(tmp_path: Path, every: int, limit: int | None = None) -> Path:
    if not SHARED_TEXT.is_dir():
        pytest.skip(f"shared data {SHARED_TEXT} is absent")
    lines = (SHARED_TEXT / "corpus.jsonl").read_text().splitlines()[::every][:limit]
    out = tmp_path / "corpus.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def questions(n: int) -> list[str]:
    return [json.loads(line)["question"] for line in (SHARED_TEXT / "questions.jsonl").read_text().splitlines()[:n]]


def test_ivfpq_refine_in_shards_from_config(tmp_path):
    import faiss

    corpus = shared_subset(tmp_path, every=25)
    big = KBConfig(name="w", kind="text", corpus=corpus, search="dense", index="ivfpq", ivf_nlist=4, nprobe=4,
                   pq_m=48, refine="flat", shards=3, index_dir=tmp_path / "big", mmap=True)  # fmt: skip
    _, manifest, _ = build_kb_status(big, progress=False)
    assert manifest["index_params"] == {"ivf_nlist": 4, "pq_m": 48, "pq_bits": 8, "refine": "flat", "shards": 3}
    shard_files = sorted(p.name for p in (tmp_path / "big" / "dense_shards").glob("*.faiss"))
    assert shard_files == ["shard_00000.faiss", "shard_00001.faiss", "shard_00002.faiss"]
    assert not (tmp_path / "big.partial").exists()  # the resumable chunks are gone once the index is complete
    kb = load_kb(big)
    assert isinstance(kb._dense, faiss.IndexShards) and kb._dense.ntotal == manifest["doc_count"]
    # exact top-10 over the full vectors the refine stage keeps (IndexRefineFlat.refine_index), shard by shard
    shards = [faiss.downcast_index(kb._dense.at(i)) for i in range(kb._dense.count())]
    assert all(isinstance(s, faiss.IndexRefineFlat) for s in shards)
    full = np.concatenate([faiss.downcast_index(s.refine_index).reconstruct_n(0, s.ntotal) for s in shards])
    qs = questions(20)
    truth = np.argsort(-(kb._encoder.encode(qs) @ full.T), axis=1)[:, :10]
    got = kb.search(qs, 10)
    recall = np.mean(
        [len({h.doc.id for h in g} & {kb.docs[i].id for i in t}) / 10 for g, t in zip(got, truth, strict=True)]
    )
    assert recall >= 0.9, recall  # PQ codes re-ranked by exact scores over 4x the candidates, all cells probed
    # a damaged shard is caught by its checksum at load, naming the file
    shard = tmp_path / "big" / "dense_shards" / "shard_00001.faiss"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"corrupt:\n.*dense_shards/shard_00001.faiss: its bytes differ"):
        load_kb(big)


def write_yaml(path: Path, cfg: dict) -> Path:
    path.write_text(json.dumps({"knowledge_bases": [cfg]}))  # JSON is YAML
    return path


def test_killed_index_build_resumes_to_the_same_index(tmp_path, monkeypatch):
    corpus = shared_subset(tmp_path, every=20, limit=160)
    entry = {"name": "w", "kind": "text", "corpus": str(corpus), "search": "hybrid", "build_chunk": 8}
    killed = write_yaml(tmp_path / "killed.yaml", {**entry, "index_dir": str(tmp_path / "killed")})
    vectors = tmp_path / "killed.partial" / "vectors"
    proc = subprocess.Popen(
        [sys.executable, "-m", "retrievers.build", "--kb", str(killed), "--quiet"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and len(list(vectors.glob("*.npy"))) < 3:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # mid-build, as a crash or an OOM kill would
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    kept = {p.name: p.stat().st_mtime_ns for p in vectors.glob("*.npy")}
    assert len(kept) >= 3 and not (tmp_path / "killed" / "manifest.json").exists()

    import retrievers.store
    from retrievers.build import main

    encoded: list[str] = []
    real_encoder_for = retrievers.store.encoder_for

    def counting_encoder_for(cfg):
        enc = real_encoder_for(cfg)
        return dataclasses.replace(enc, _encode=lambda texts: encoded.extend(texts) or enc._encode(texts))

    monkeypatch.setattr(retrievers.store, "encoder_for", counting_encoder_for)
    assert main(["--kb", str(killed), "--quiet"]) == 0  # the same command again resumes
    monkeypatch.undo()
    n_texts = json.loads((tmp_path / "killed" / "manifest.json").read_text())["embedded_texts"]
    assert len(encoded) == n_texts - 8 * len(kept)  # only the chunks the killed run had not finished
    assert not vectors.exists()  # finished: chunks cleaned up
    uninterrupted = dataclasses.replace(load_kb_cfg(killed), index_dir=tmp_path / "whole")
    build_kb_status(uninterrupted, progress=False)
    a, b = load_kb(load_kb_cfg(killed)), load_kb(uninterrupted)
    assert (tmp_path / "killed" / "docs.jsonl").read_bytes() == (tmp_path / "whole" / "docs.jsonl").read_bytes()
    va, vb = (kb._dense.reconstruct_n(0, kb._dense.ntotal) for kb in (a, b))
    np.testing.assert_array_equal(va, vb)  # same chunk boundaries: bit-identical vectors
    qs = questions(5)
    assert [[h.doc.id for h in hits] for hits in a.search(qs, 10)] == [
        [h.doc.id for h in hits] for hits in b.search(qs, 10)
    ]


def load_kb_cfg(path: Path) -> KBConfig:
    from retrievers.config import load_kb_configs

    return load_kb_configs(path)[0]


def test_two_encoder_processes_give_the_same_vectors(tmp_path):
    from retrievers.chunking import passages, read_text_corpus
    from retrievers.encoders import encoding_pool, load_encoder

    corpus = shared_subset(tmp_path, every=50)
    _, texts = passages(list(read_text_corpus(corpus)), "w")
    encoder = load_encoder("minilm", device="cpu")
    one = encoder.encode(texts)
    with encoding_pool(encoder, workers=2, device="cpu") as encode:
        two = encode(texts)
    assert two.shape == one.shape == (len(texts), 384)
    np.testing.assert_allclose(two, one, atol=1e-5, rtol=0)


def test_workers_flag_is_checked(capsys):
    from retrievers.build import main

    with pytest.raises(SystemExit):
        main(["--kb", str(ROOT / "configs" / "kb" / "demo.yaml"), "--workers", "0"])
    assert "--workers must be >= 1, got 0" in capsys.readouterr().err
