"""Sharding and merging: N shards cover every question once, and the merge equals a single-shard run."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_synthesis.cli import merge_main
from data_synthesis.commit_log import OUTPUTS
from data_synthesis.config import SynthConfig
from data_synthesis.job import run_synthesis, shard_of
from data_synthesis.merge import merge_shards
from tests.data_synthesis.test_crash import _questions, _strip
from tests.fakes import case_teacher, teacher_kbs

REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp: Path, out: str, **kw) -> SynthConfig:
    return SynthConfig(inputs=[{"path": str(tmp / "q.jsonl")}], m=2, questions_per_batch=3, output_dir=str(tmp / out),
                       teacher={"retries": 0, "backoff_s": 0}, progress=False, **kw)  # fmt: skip


def _records(folder: Path) -> dict[str, list]:
    return {n: sorted((_strip(json.loads(x)) for x in (folder / n).read_text().splitlines()), key=json.dumps)
            for n in OUTPUTS}  # fmt: skip


def test_shard_of_is_stable_and_balanced():
    # the same shards in another Python run (a salted `hash()` would differ under another PYTHONHASHSEED) ...
    ids = [f"hotpotqa-dev-{i}" for i in range(40)]
    here = [shard_of(i, 8) for i in ids]
    code = f"from data_synthesis.job import shard_of; print([shard_of(i, 8) for i in {ids!r}])"
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=REPO
        )
        assert ast.literal_eval(out.stdout) == here
    # ... and in another version, so shard folders written before still hold the same questions: the first 12 hex
    # digits of the id's SHA-1 mod 8 (`printf %s ID | sha1sum`)
    assert shard_of("hotpotqa-dev-5a85ea095542994775f606a8", 8) == 3
    counts = [0] * 4
    for i in range(400):
        counts[shard_of(f"q{i}", 4)] += 1
    assert min(counts) > 70


def test_three_shards_merge_to_the_single_run(tmp_path):
    _questions(tmp_path / "q.jsonl")
    run_synthesis(_cfg(tmp_path, "single"), policy=case_teacher(), kbs=teacher_kbs())
    run_synthesis(_cfg(tmp_path, "sharded", shard=0, num_shards=3), policy=case_teacher(), kbs=teacher_kbs())
    with pytest.raises(ValueError, match="missing"):  # merging before every shard exists
        merge_shards(tmp_path / "sharded")
    for i in (1, 2):
        run_synthesis(_cfg(tmp_path, "sharded", shard=i, num_shards=3), policy=case_teacher(), kbs=teacher_kbs())
    ids = [
        json.loads(x)["ids"]
        for i in range(3)
        for x in (tmp_path / "sharded" / "shards" / f"{i:05d}-of-00003" / "progress.jsonl").read_text().splitlines()
    ]
    flat = [q for batch in ids for q in batch]
    assert len(flat) == len(set(flat)) == 16  # each question in exactly one shard
    assert merge_main(["--output_dir", str(tmp_path / "sharded")]) == 0
    # the same records: only batch numbers differ (batches are per shard; the scripted teacher ignores seeds)
    single, merged = _records(tmp_path / "single"), _records(tmp_path / "sharded")
    for name in OUTPUTS:
        assert len(single[name]) == len(merged[name])
        assert {json.dumps(_nobatch(r), sort_keys=True) for r in single[name]} == {
            json.dumps(_nobatch(r), sort_keys=True) for r in merged[name]
        }
    summary = json.loads((tmp_path / "sharded" / "summary.json").read_text())
    assert summary["accounted"] and summary["questions_asked"] == 16 and summary["skipped"] == 1
    assert (tmp_path / "sharded" / "export" / "steps.parquet").exists()


def _nobatch(r: object) -> object:
    if isinstance(r, dict):
        return {k: _nobatch(v) for k, v in r.items() if k != "batch"}
    if isinstance(r, list):
        return [_nobatch(v) for v in r]
    return r


def test_unfinished_shard_stops_the_merge(tmp_path):
    _questions(tmp_path / "q.jsonl")
    for i in range(2):
        run_synthesis(_cfg(tmp_path, "out", shard=i, num_shards=2), policy=case_teacher(), kbs=teacher_kbs())
    progress = tmp_path / "out" / "shards" / "00001-of-00002" / "progress.jsonl"
    lines = progress.read_text().splitlines(keepends=True)
    progress.write_text("".join(lines[:-1]))  # as if its last batch had not been committed
    with pytest.raises(ValueError, match="committed"):
        merge_shards(tmp_path / "out")
    assert merge_shards(tmp_path / "out", allow_partial=True, export_format="none")["accounted"]
