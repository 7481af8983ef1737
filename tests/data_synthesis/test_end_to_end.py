"""End to end on real parts: the SmolLM2-135M-Instruct teacher, a real BM25 KB over the shared Wikipedia paragraphs,
20 real HotpotQA/MuSiQue questions, through `kbrouter synth` (`main`) with the CPU recipe and small overrides."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from agent.types import Trajectory
from data_synthesis.cli import main
from data_synthesis.commit_log import OUTPUTS

ROOT = Path(__file__).resolve().parents[2]
N_QUESTIONS = 20


def _small_kb(shared_path, tmp: Path) -> Path:
    """A KB YAML over the context paragraphs of the first N shared questions (gold + distractors)."""
    questions = [json.loads(line) for line in shared_path("text", "questions.jsonl").read_text().splitlines()]
    wanted = {d for q in questions[:N_QUESTIONS] for d in q["context_doc_ids"]}
    with shared_path("text", "corpus.jsonl").open() as f:
        docs = [line for line in f if json.loads(line)["doc_id"] in wanted]
    (tmp / "corpus.jsonl").write_text("".join(docs))
    kb = {"knowledge_bases": [{"name": "wiki", "display_name": "Text Retriever", "kind": "text",
                               "corpus": str(tmp / "corpus.jsonl"), "search": "bm25", "k": 3,
                               "index_dir": str(tmp / "index"),
                               "description": "Wikipedia paragraphs about people, places, works and organisations."}]}  # fmt: skip
    (tmp / "kb.yaml").write_text(yaml.safe_dump(kb))
    return tmp / "kb.yaml"


@pytest.fixture
def cpu_threads():
    """One torch thread when the machine is oversubscribed: OpenMP spin-waiting then costs ~3x (measured here)."""
    import torch

    before = torch.get_num_threads()
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_smollm2_teacher_on_shared_questions(shared_path, tmp_path, capsys, cpu_threads):
    questions = shared_path("text", "questions.jsonl")
    kb_yaml = _small_kb(shared_path, tmp_path)
    out = tmp_path / "out"
    argv = ["--config", str(ROOT / "configs" / "synth" / "smollm2_cpu.yaml"),
            "--inputs", json.dumps([{"path": str(questions), "format": "shared_text", "limit": N_QUESTIONS}]),
            "--kb_config", str(kb_yaml), "--kbs", "null", "--output_dir", str(out), "--m", "1", "--max_steps", "1",
            "--plan_tokens", "40", "--answer_tokens", "16", "--final_tokens", "12", "--max_retries", "0",
            "--top_k_hits", "1", "--few_shot", "false", "--questions_per_batch", str(N_QUESTIONS), "--teacher.max_batch_size",
            str(N_QUESTIONS), "--progress", "false"]  # fmt: skip
    assert main(argv) == 0

    accepted = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    for name in OUTPUTS:  # well-formed: whole lines of JSON
        text = (out / name).read_text()
        assert text == "" or text.endswith("\n")
    trajs = [Trajectory.from_dict(d) for d in accepted] + [Trajectory.from_dict(r["trajectory"]) for r in rejected]
    # every question accounted for: 20 asked x m=1, none skipped (all have gold)
    assert sorted(t.metadata["question_id"] for t in trajs) == sorted(
        json.loads(line)["qid"] for line in questions.read_text().splitlines()[:N_QUESTIONS]
    )
    assert all(t.metadata["model"] for t in trajs) and all(t.gold for t in trajs)
    assert all(r["reasons"] for r in rejected)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounted"] and summary["trajectories"] == N_QUESTIONS and summary["skipped"] == 0
    assert summary["tokens"]["completion"] > 0
    if accepted:  # a 135M teacher may keep none; when it keeps some, their step records are exported
        from training.step_data import load_step_records

        records = load_step_records(out / "steps.jsonl", "steps")
        assert {r.trajectory_id for r in records} == {t["id"] for t in accepted}
    assert (out / "export" / "steps.parquet").exists() and (out / "summary.md").exists()
    with capsys.disabled():
        print(f"\n[e2e smollm2] accepted {summary['accepted']}/{summary['trajectories']} "
              f"({100 * summary['acceptance_rate']:.1f}%), reasons {summary['rejection_reasons']}, "
              f"stop {summary['stop_reasons']}, {summary['time']['seconds']} s, "
              f"{summary['time']['trajectories_per_minute']} traj/min")  # fmt: skip
