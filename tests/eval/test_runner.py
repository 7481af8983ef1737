"""The eval runner: caching and resume, method errors, bad input, the CLI; with the fake policy and KBs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eval.cli import main
from eval.config import load_eval_config
from eval.runner import read_cache, run_eval
from tests.eval.conftest import QUESTIONS, FakePolicy, eval_yaml

METHODS = ["no_retrieval", "single_kb", "rag_all", "ircot", "iter_retgen", "router", "agent", "agent_random"]
N_METHODS = 9  # single_kb expands to rag_wiki and rag_tables


class Interrupt(KeyboardInterrupt):
    """Stands in for Ctrl-C / a kill: not an Exception, so nothing inside the run swallows it."""


def _without_latency(results: dict) -> dict:
    """results.json minus latency, the one measured (not computed) figure."""
    text = json.dumps(results, sort_keys=True)
    return json.loads(re.sub(r'"cost/latency_s": [0-9.e-]+', '"cost/latency_s": 0', text))


def _report_without_latency(path: Path) -> str:
    text = path.read_text()
    cost = text.index("## Cost per question")
    return text[:cost]  # everything above the cost table (which holds latency) must be identical


def test_resume_after_interruption_computes_only_missing(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    total = len(QUESTIONS) * N_METHODS
    # reference: one uninterrupted run
    ref_cfg = load_eval_config(eval_yaml(tmp_path, questions_file, METHODS, out="ref"))
    ref = run_eval(ref_cfg, policy=FakePolicy(), kbs=fake_kbs)

    # interrupted run: stop after half of the predictions were cached
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, METHODS, out="run"))
    done: list[dict] = []

    def stop_halfway(record: dict) -> None:
        done.append(record)
        if len(done) == total // 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs, on_prediction=stop_halfway)
    cached = read_cache(Path(cfg.output_dir) / "cache.jsonl")
    assert len(cached) == total // 2
    assert not (Path(cfg.output_dir) / "report.md").exists()

    # restart: only the missing predictions are computed, none of the cached ones again
    again: list[dict] = []
    results = run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs, on_prediction=again.append)
    assert len(again) == total - total // 2
    new_keys = {(r["method"], r["qid"]) for r in again}
    old_keys = {(r["method"], r["qid"]) for r in done}
    assert not new_keys & old_keys and len(new_keys | old_keys) == total

    # same report as the uninterrupted run
    assert _without_latency(results) | {"config": None} == _without_latency(ref) | {"config": None}
    assert _report_without_latency(Path(cfg.output_dir) / "report.md") == _report_without_latency(
        Path(ref_cfg.output_dir) / "report.md"
    )
    # and a third run has nothing left to compute
    third: list[dict] = []
    run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs, on_prediction=third.append)
    assert third == []


def test_extending_a_run_computes_only_the_new_method(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    run_eval(
        load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval"])), policy=FakePolicy(), kbs=fake_kbs
    )
    computed: list[dict] = []
    results = run_eval(
        load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval", "agent"])),
        policy=FakePolicy(),
        kbs=fake_kbs,
        on_prediction=computed.append,
    )
    assert {r["method"] for r in computed} == {"agent"} and len(computed) == len(QUESTIONS)
    assert set(results["macro"]) == {"no_retrieval", "agent"}
    # report only: a method never run is listed with no figures, and nothing is computed
    computed.clear()
    only = run_eval(
        load_eval_config(eval_yaml(tmp_path, questions_file, ["agent", "router"])),
        policy=FakePolicy(),
        kbs=fake_kbs,
        on_prediction=computed.append,
        compute=False,
    )
    assert computed == [] and only["per_dataset"]["toy"]["router"] == {"n": 0.0}
    assert only["per_dataset"]["toy"]["agent"] == results["per_dataset"]["toy"]["agent"] | {
        "cost/latency_s": only["per_dataset"]["toy"]["agent"]["cost/latency_s"]
    }
    # changed settings make the cached predictions stale: they are recomputed
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval"]), ["agent.max_steps=1"])
    computed.clear()
    run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs, on_prediction=computed.append)
    assert len(computed) == len(QUESTIONS)


def test_a_failing_question_is_recorded_and_the_run_continues(tmp_path: Path, fake_kbs) -> None:
    rows = [*QUESTIONS, {"id": "bad", "question": "EXPLODE now", "answers": ["x"]}]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = run_eval(
        load_eval_config(eval_yaml(tmp_path, path, ["rag_all", "agent"])), policy=FakePolicy(), kbs=fake_kbs
    )
    preds = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    errors = {(p["method"], p["qid"]): p["error"] for p in preds}
    assert "injected failure" in errors[("rag_all", "bad")] and "injected failure" in errors[("agent", "bad")]
    assert all(not e for (m, q), e in errors.items() if q != "bad")  # the batch-mates were answered
    assert results["per_dataset"]["toy"]["agent"]["run/error"] == pytest.approx(1 / len(rows))
    # the good questions were answered right by the fake agent (text and table routes)
    ok = [p for p in preds if p["method"] == "agent" and p["qid"] != "bad"]
    assert all(p["scores"]["answer/f1_recall"] == 1.0 for p in ok if p["qid"] != "q4")  # q4's gold is "yes"
    assert all(p["scores"]["routing/accuracy"] == 1.0 for p in ok)


def test_report_files_and_tables(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, METHODS))
    results = run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs)
    out = Path(cfg.output_dir)
    for name in (
        "report.md",
        "results.json",
        "predictions.jsonl",
        "routing_by_step.png",
        "steps_per_question.png",
        "accuracy_vs_retrievals.png",
    ):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()
    assert "## Main table" in report and "## custom" in report and "**" in report
    # oracle single-KB RAG finds the paragraph of every text question: recall@k 1 on those, 0 on the table one
    assert results["per_dataset"]["toy"]["rag_wiki"]["retrieval/recall@k"] == pytest.approx(3 / 4)
    assert "routing/accuracy" not in results["per_dataset"]["toy"]["rag_all"]  # rag_all does not route
    assert "retrieval/recall@k" not in results["per_dataset"]["toy"]["no_retrieval"]
    # the agent's KB choices per step (fig. 3): step 1 searched, step 2 stopped
    steps = results["routing_by_step"]["custom"]["agent"]
    assert steps[0] == {"wiki": 3, "tables": 1} and steps[1] == {"none": 4}


def test_unknown_method_lists_valid_ones(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["agent", "self_rag"]))
    with pytest.raises(ValueError, match=r"unknown method 'self_rag'; valid methods: .*no_retrieval.*rag_wiki"):
        run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["batch_sizes=3"], r"unknown key\(s\) \['batch_sizes'\]"),  # typo in a top-level key
        (["agent.max_step=2"], r"`agent` has unknown key\(s\) \['max_step'\]"),  # typo in an agent field
        (["batch_size=0"], r"`batch_size` must be >= 1"),  # invalid value, with the fix
        (["nokeyvalue"], r"is not key=value"),  # malformed override
    ],
)
def test_bad_config(tmp_path: Path, questions_file: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_eval_config(eval_yaml(tmp_path, questions_file, ["agent"]), overrides)


def test_cli_help_and_errors(tmp_path: Path, questions_file: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    # a malformed dataset line: exit code 2 and the message names the file and line
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "ok?", "answers": ["a"]}\n{"id": "2", "question": \n')
    cfg = eval_yaml(tmp_path, bad, ["no_retrieval"])
    assert main(["--config", str(cfg), "--quiet"]) == 2
    assert f"{bad}:2: not valid JSON" in capsys.readouterr().out
    # `key=value` after `--methods` is an override, not a method name (argparse would give it to --methods)
    assert main(["--config", str(cfg), "--quiet", "--methods", "no_retrieval", "agent.max_step=2"]) == 2
    out = capsys.readouterr().out
    assert "`agent` has unknown key(s) ['max_step']" in out and "unknown method" not in out
