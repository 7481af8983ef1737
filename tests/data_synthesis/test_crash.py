"""Crash safety: a job SIGKILLed at random points and restarted ends with the outputs of an uninterrupted run."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import data_synthesis.job as job
from data_synthesis.commit_log import OUTPUTS, PROGRESS, SKIPPED
from data_synthesis.config import SynthConfig
from data_synthesis.job import run_synthesis
from tests.fakes import case_teacher, teacher_kbs

CASES = ("ok", "vary", "wrong", "format", "long", "backend", "unsupported", "empty")
ROOT = Path(__file__).resolve().parents[2]
VOLATILE = {"timings", "final_s", "seconds"}  # wall-clock figures differ between runs


def _questions(path: Path) -> Path:
    rows = [{"id": f"q{n:02d}-{c}", "question": f"[{c}] In which city is the Eiffel Tower? (#{n})", "answers": ["Paris"]}
            for n in range(2) for c in CASES] + [{"id": "nogold", "question": "no gold?"}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(tmp: Path, name: str) -> dict:
    return {"inputs": [{"path": str(tmp / "q.jsonl")}], "m": 2, "max_steps": 3, "questions_per_batch": 2,
            "output_dir": str(tmp / name), "rejection": {"max_steps": 2}, "teacher": {"retries": 1, "backoff_s": 0},
            "progress": False, "export_format": "none"}  # fmt: skip


def _strip(x: object) -> object:
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def snapshot(out: Path) -> dict:
    """Every output file as parsed lines (volatile fields removed); raises on a truncated or broken line."""
    snap = {}
    for name in (*OUTPUTS, SKIPPED):
        text = (out / name).read_text()
        assert text == "" or text.endswith("\n"), f"{name} ends with a truncated line"
        snap[name] = [_strip(json.loads(line)) for line in text.splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("time")
    snap["summary"] = summary
    return snap


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    _questions(tmp / "q.jsonl")
    run_synthesis(SynthConfig(**_config(tmp, "out")), policy=case_teacher(), kbs=teacher_kbs())
    snap = snapshot(tmp / "out")
    ids = [t["id"] for name in OUTPUTS[:2] for t in snap[name]]
    assert len(ids) == len(set(ids)) == 2 * 2 * len(CASES)  # sanity: every sample once
    return snap


def _committed(out: Path) -> int:
    path = out / PROGRESS
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_sigkill_at_random_points_then_resume(tmp_path, reference):
    _questions(tmp_path / "q.jsonl")
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(_config(tmp_path, "out")))
    out = tmp_path / "out"
    # this module's `__main__` runs the job, as a module from the repo root so that it imports `tests.fakes`
    cmd = [sys.executable, "-m", "tests.data_synthesis.test_crash", str(cfg_file), "0.08"]
    rng = random.Random(20261130)
    kills = 0
    for _ in range(12):
        before = _committed(out)
        proc = subprocess.Popen(cmd, cwd=ROOT)
        deadline = time.monotonic() + 60
        # wait for at least one new commit (so every round makes progress), then kill a random moment later
        while proc.poll() is None and _committed(out) <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        if kills >= 5:
            break
    assert kills >= 5, f"only {kills} kills landed while the job was running"
    subprocess.run(cmd, check=True, timeout=120, cwd=ROOT)  # finish the job
    assert snapshot(out) == reference


def test_uncommitted_batch_and_torn_lines_are_rolled_back(tmp_path, reference, monkeypatch):
    _questions(tmp_path / "q.jsonl")
    cfg = SynthConfig(**_config(tmp_path, "out"))
    out = tmp_path / "out"
    real_append = job.append_jsonl
    calls = {"n": 0}

    class Crash(Exception):
        pass

    def crashing_append(path: Path, rows: list[dict], fsync: bool = True) -> int:
        if path.name == PROGRESS:
            calls["n"] += 1
            if calls["n"] == 3:  # batch 2's records are on disk, its commit line is not
                raise Crash
        return real_append(path, rows, fsync=fsync)

    monkeypatch.setattr(job, "append_jsonl", crashing_append)
    with pytest.raises(Crash):
        run_synthesis(cfg, policy=case_teacher(), kbs=teacher_kbs())
    monkeypatch.setattr(job, "append_jsonl", real_append)
    assert _committed(out) == 2
    # and a crash mid-line on top: half a record and half a commit line
    with (out / "trajectories.jsonl").open("a") as f:
        f.write('{"id": "half a rec')
    with (out / PROGRESS).open("a") as f:
        f.write('{"batch": 2, "ids"')
    run_synthesis(cfg, policy=case_teacher(), kbs=teacher_kbs())
    assert snapshot(out) == reference


def test_ctrl_c_says_how_many_questions_were_committed(tmp_path, reference, monkeypatch):
    _questions(tmp_path / "q.jsonl")
    cfg = SynthConfig(**_config(tmp_path, "out"))
    real_append = job.append_jsonl
    calls = {"n": 0}

    def interrupted_append(path: Path, rows: list[dict], fsync: bool = True) -> int:
        if path.name == PROGRESS:
            calls["n"] += 1
            if (
                calls["n"] == 3
            ):  # Ctrl-C while batch 2 commits: 2 batches of 2 questions are kept (the gold-less one is skipped)
                raise KeyboardInterrupt
        return real_append(path, rows, fsync=fsync)

    monkeypatch.setattr(job, "append_jsonl", interrupted_append)
    with pytest.raises(KeyboardInterrupt, match=rf"^4 of {2 * len(CASES)} questions done \(committed batches in "):
        run_synthesis(cfg, policy=case_teacher(), kbs=teacher_kbs())
    monkeypatch.setattr(job, "append_jsonl", real_append)
    run_synthesis(cfg, policy=case_teacher(), kbs=teacher_kbs())
    assert snapshot(tmp_path / "out") == reference


if __name__ == "__main__":  # the subprocess above: python -m tests.data_synthesis.test_crash CONFIG.json DELAY_S
    import logging

    logging.basicConfig(level=logging.WARNING)
    config, delay_s = json.loads(Path(sys.argv[1]).read_text()), float(sys.argv[2])
    run_synthesis(SynthConfig(**config), policy=case_teacher(delay_s=delay_s), kbs=teacher_kbs())
