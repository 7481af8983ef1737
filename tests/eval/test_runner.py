"""The eval runner: caching and resume, method errors, bad input, the CLI; with the fake policy and KBs."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from agent.backends.base import Completion, SamplingParams
from agent.types import Question
from eval.cli import main
from eval.config import load_eval_config
from eval.runner import read_cache, run_eval
from tests.eval.conftest import QUESTIONS, eval_yaml
from tests.fakes import FakePolicy

METHODS = ["no_retrieval", "single_kb", "rag_all", "ircot", "iter_retgen", "router", "agent", "agent_random"]
N_METHODS = 9  # single_kb expands to rag_wiki and rag_tables


class Interrupt(KeyboardInterrupt):
    """Stands in for Ctrl-C / a kill: not an Exception, so nothing inside the run swallows it."""


def _without_latency(results: dict) -> dict:
    """results.json minus latency, the one measured (not computed) figure."""
    text = json.dumps(results, sort_keys=True)
    return json.loads(re.sub(r'"cost/latency_s": [0-9.e-]+', '"cost/latency_s": 0', text))


def _report_without_latency(path: Path) -> str:
    """The report above its cost table, with the scoreboard's `latency s/q` cells blanked: latency is measured, so
    on a busy machine 0.00 becomes 0.01; everything else must be identical."""
    text = path.read_text()
    lines, column = [], None
    for line in text[: text.index("## Cost per question")].splitlines():
        cells = line.split("|")
        names = [c.strip() for c in cells]
        if "latency s/q" in names:  # a table header
            column = names.index("latency s/q")
        elif not line.startswith("|"):
            column = None
        elif column is not None:
            cells[column] = " - "
        lines.append("|".join(cells))
    return "\n".join(lines)


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

    with pytest.raises(Interrupt, match=f"^{total // 2} predictions computed this run; {total // 2} cached in "):
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
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval"]), ["--agent.max_steps", "1"])
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
        (["--batch_sizes", "3"], r"unknown key 'batch_sizes' in .*out\.yaml; did you mean \['batch_size'\]"),  # a typo
        (["--agent.max_step", "2"], r"`agent` has unknown key\(s\) \['max_step'\]"),  # typo in an agent field
        (["--batch_size", "0"], r"`batch_size` must be >= 1"),  # invalid value, with the fix
        (["nokeyvalue"], r"unexpected argument 'nokeyvalue'; overrides look like `--key value`"),
        (["batch_size=8"], r"'batch_size=8' is the old `key=value` form; write `--batch_size 8`"),
        (["--seed", "abc"], r"`seed` must be an integer, got 'abc'"),  # a wrong type: a traceback later, before
        (["--batch_size=true"], r"`batch_size` must be an integer, got True"),  # a bool is not a count
        (["--k_per_kb", "0"], r"`k_per_kb` must be >= 1"),
        (["--methods", "agent"], r"`methods` must be a list"),
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
    # `--key value` after `--methods` is an override, not a method name
    assert main(["--config", str(cfg), "--quiet", "--methods", "no_retrieval", "--agent.max_step", "2"]) == 2
    out = capsys.readouterr().out
    assert "`agent` has unknown key(s) ['max_step']" in out and "unknown method" not in out
    # the old `key=value` form, after `--methods` or alone, gives the new form instead of running
    for old in (["--methods", "no_retrieval", "agent.max_steps=2"], ["agent.max_steps=2"]):
        assert main(["--config", str(cfg), "--quiet", *old]) == 2
        assert "is the old `key=value` form; write `--agent.max_steps 2`" in capsys.readouterr().out
    # the help gives the new form and no example of the old one
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    assert "--agent.max_steps 2" in help_text and "max_steps=" not in help_text


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_scoring_uses_the_current_gold_not_the_one_cached_with_the_prediction(
    tmp_path: Path, questions_file: Path, fake_kbs
) -> None:
    wrong = [{**q, "answers": ["Lyon"], "gold_kb": "tables"} if q["id"] == "q1" else q for q in QUESTIONS]
    _write_rows(questions_file, wrong)
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["agent"]))
    first = run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs)
    assert first["per_dataset"]["toy"]["agent"]["answer/f1_recall"] == pytest.approx(2 / 4)  # q1 and q4 wrong
    # the gold is fixed: the cached prediction "Paris" is re-scored against it, not recomputed
    _write_rows(questions_file, QUESTIONS)
    computed: list[dict] = []
    results = run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs, on_prediction=computed.append)
    assert computed == []
    preds = {p["qid"]: p for p in map(json.loads, (tmp_path / "out" / "predictions.jsonl").read_text().splitlines())}
    assert preds["q1"]["prediction"] == "Paris" and preds["q1"]["gold"] == ["Paris"]
    assert preds["q1"]["scores"]["answer/f1_recall"] == 1.0 and preds["q1"]["scores"]["routing/accuracy"] == 1.0
    assert results["per_dataset"]["toy"]["agent"]["answer/f1_recall"] == pytest.approx(3 / 4)


def test_a_changed_row_seed_or_kb_set_is_recomputed(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    run_eval(
        load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval"])), policy=FakePolicy(), kbs=fake_kbs
    )

    def computed_ids(cfg_path: Path, kbs: dict = fake_kbs, overrides: tuple = ()) -> list[str]:
        computed: list[dict] = []
        run_eval(load_eval_config(cfg_path, list(overrides)), FakePolicy(), kbs, on_prediction=computed.append)
        return sorted(r["qid"] for r in computed)

    cfg_path = eval_yaml(tmp_path, questions_file, ["no_retrieval"])
    assert computed_ids(cfg_path) == []
    # another seed, or another KB set, makes every prediction stale
    assert computed_ids(cfg_path, overrides=("--seed", "7")) == ["q1", "q2", "q3", "q4"]
    assert computed_ids(cfg_path, overrides=("--seed", "7")) == []
    fewer = {"Text KB": fake_kbs["Text KB"]}
    assert computed_ids(cfg_path, kbs=fewer, overrides=("--seed", "7")) == ["q1", "q2", "q3", "q4"]


def test_a_row_digest_covers_what_the_method_sees_and_not_the_gold() -> None:
    from eval.runner import row_digest

    q = Question("q1", "What is the capital?", metadata={"dataset": "toy", "gold_kb": "wiki", "extra": 1})
    assert row_digest(replace(q, metadata={**q.metadata, "gold_kb": "tables", "answer_type": "yesno"})) == row_digest(
        q
    )
    assert row_digest(replace(q, answers=("other",))) == row_digest(q)
    assert row_digest(replace(q, metadata={**q.metadata, "extra": 2})) != row_digest(q)  # a column a loader keeps
    assert row_digest(replace(q, images=("a.png",))) != row_digest(q)


def test_a_rebuilt_kb_index_makes_the_predictions_stale(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "p1", "contents": "Paris"}\n')
    index = tmp_path / "index"
    index.mkdir()
    manifest = {"corpus_sha256": "a", "created": "2026-01-01T00:00:00Z", "doc_count": 1}
    (index / "manifest.json").write_text(json.dumps(manifest))
    kb_yaml = tmp_path / "kb.yaml"
    kb_yaml.write_text(
        f"knowledge_bases:\n  - {{name: wiki, kind: text, search: bm25, corpus: {corpus}, index_dir: {index}}}\n"
    )
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval"], kb_config=str(kb_yaml)))
    run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs)
    computed: list[dict] = []
    run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs, on_prediction=computed.append)
    assert computed == []
    (index / "manifest.json").write_text(json.dumps({**manifest, "created": "2026-02-01T00:00:00Z"}))
    run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs, on_prediction=computed.append)
    assert len(computed) == len(QUESTIONS)


def test_a_checkpoint_retrained_at_the_same_path_is_evaluated_again(
    tmp_path: Path, questions_file: Path, fake_kbs
) -> None:
    ckpt = tmp_path / "runs" / "sft" / "final"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights v1")
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["sft"], checkpoints={"sft": str(ckpt)}))
    loaded: list[str] = []

    def factory(settings: dict, where: str) -> FakePolicy:
        loaded.append(settings["model"])
        return FakePolicy()

    def computed_ids() -> list[str]:
        computed: list[dict] = []
        run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs, on_prediction=computed.append, policy_factory=factory)
        return sorted(r["qid"] for r in computed)

    assert computed_ids() == ["q1", "q2", "q3", "q4"] and loaded == [str(ckpt)]
    assert computed_ids() == [] and len(loaded) == 1  # unchanged weights: cached, the checkpoint not even loaded
    (ckpt / "model.safetensors").write_bytes(b"weights v2, retrained in place")
    assert computed_ids() == ["q1", "q2", "q3", "q4"] and len(loaded) == 2


def test_a_variant_runs_another_method_with_its_own_settings(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    # `method: router` runs the one-shot router (not the step agent) with the variant's settings; its predictions
    # are cached and scored apart from the plain router's, as a routing method without the step protocol
    variants = {"router_k1": {"method": "router", "agent": {"top_k": 1}}}
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["router", "router_k1"], agent_variants=variants))
    results = run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs)
    cache = read_cache(Path(cfg.output_dir) / "cache.jsonl")
    rows = {(r["method"], r["qid"]): r for r in cache.values()}
    plain, variant = rows[("router", "q1")]["trajectory"], rows[("router_k1", "q1")]["trajectory"]
    assert variant["metadata"]["route"] == plain["metadata"]["route"] == "wiki"  # the router's own reply
    assert len(variant["steps"][0]["hits"]) == 1 < len(plain["steps"][0]["hits"])  # top_k 1 from the variant
    assert rows[("router", "q1")]["fingerprint"] != rows[("router_k1", "q1")]["fingerprint"]
    assert "router_k1" in results["routing_methods"]
    assert all(len(by_method["router_k1"]) == 1 for by_method in results["routing_by_step"].values())  # one decision
    assert cfg.base_method("router_k1") == "router" and cfg.base_method("agent") == "agent"


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ({"method": "self_rag"}, r"agent_variants.v.method: 'self_rag' is not a built-in method"),
        ({"method": "single_kb"}, r"agent_variants.v.method: 'single_kb' is not a built-in method"),
        ({"method": ["router"]}, r"agent_variants.v.method: \['router'\] is not a built-in method"),
    ],
)
def test_a_variant_method_that_is_not_built_in_fails_at_load(
    tmp_path: Path, questions_file: Path, variant: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_eval_config(eval_yaml(tmp_path, questions_file, ["v"], agent_variants={"v": variant}))


def test_the_report_pairs_each_method_with_the_plot_method(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    methods = ["no_retrieval", "rag_all", "agent"]
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, methods, plot_method="agent"))
    results = run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs)
    paired = results["paired"]
    assert paired["reference"] == "agent" and set(paired["vs"]) == {"no_retrieval", "rag_all"}
    for m in ("no_retrieval", "rag_all"):  # every question answered by both: the paired macro is the macro difference
        macro = results["macro_over_groups"]
        expected = macro["agent"]["answer/f1_recall"] - macro[m]["answer/f1_recall"]
        assert paired["vs"][m]["diff"] == pytest.approx(expected) and paired["vs"][m]["n"] == len(QUESTIONS)
    assert paired["vs"]["no_retrieval"]["diff"] > 0  # the fake agent finds what no_retrieval cannot know
    report = (Path(cfg.output_dir) / "report.md").read_text()
    assert "### Paired difference: agent − each method (macro F1-R)" in report
    # a plot_method that did not run: no pairing, no section
    other = load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval"], out="other", plot_method="agent"))
    assert run_eval(other, policy=FakePolicy(), kbs=fake_kbs)["paired"] == {}
    assert "Paired difference" not in (Path(other.output_dir) / "report.md").read_text()


class OutagePolicy(FakePolicy):
    """A backend that fails (finish_reason `error`, as the HTTP backends report an outage) on questions naming
    OUTAGE, while `down` is set."""

    def __init__(self, down: bool = True) -> None:
        super().__init__()
        self.down = down

    def generate(self, conversations: list[list[dict]], params: SamplingParams) -> list[Completion]:
        outs = super().generate(conversations, params)
        return [
            Completion(text="", finish_reason="error", metadata={"error": "connection refused"})
            if self.down and "OUTAGE" in json.dumps(c)
            else o
            for c, o in zip(conversations, outs, strict=True)
        ]


def test_backend_outages_are_errors_left_out_of_accuracy_and_retried(tmp_path: Path, fake_kbs) -> None:
    path = tmp_path / "q.jsonl"
    _write_rows(path, [*QUESTIONS, {"id": "down", "question": "OUTAGE: capital of France?", "answers": ["Paris"]}])
    cfg = load_eval_config(eval_yaml(tmp_path, path, ["no_retrieval", "rag_all"]))
    results = run_eval(cfg, policy=OutagePolicy(), kbs=fake_kbs)
    preds = {
        (p["method"], p["qid"]): p
        for p in map(json.loads, (tmp_path / "out" / "predictions.jsonl").read_text().split("\n")[:-1])
    }
    for method in ("no_retrieval", "rag_all"):
        assert preds[(method, "down")]["error"], method
        assert preds[(method, "down")]["scores"] == {"run/error": 1.0}  # not a wrong answer
        per = results["per_dataset"]["toy"][method]
        assert per["run/error"] == pytest.approx(1 / 5)
    # the answer figures are those of the four good questions alone: the outage is not among the wrong answers
    _write_rows(tmp_path / "good.jsonl", QUESTIONS)
    good = run_eval(
        load_eval_config(eval_yaml(tmp_path, tmp_path / "good.jsonl", ["no_retrieval", "rag_all"], out="good")),
        policy=OutagePolicy(),
        kbs=fake_kbs,
    )
    for method in ("no_retrieval", "rag_all"):
        for key in ("answer/f1_recall", "answer/em", "cost/steps", "format/valid_step_rate"):
            assert results["per_dataset"]["toy"][method][key] == good["per_dataset"]["toy"][method][key], key
    # the backend is back: only the errored predictions are computed again
    computed: list[dict] = []
    again = run_eval(cfg, policy=OutagePolicy(down=False), kbs=fake_kbs, on_prediction=computed.append)
    assert sorted((r["method"], r["qid"]) for r in computed) == [("no_retrieval", "down"), ("rag_all", "down")]
    assert again["per_dataset"]["toy"]["rag_all"]["run/error"] == 0.0


def test_report_only_changes_no_input(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    cfg_path = eval_yaml(tmp_path, questions_file, ["no_retrieval"], prepare_corpora=["coco_captions"])
    cfg = load_eval_config(cfg_path)
    cfg.prepare_corpora = []
    run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs)
    cache = tmp_path / "out" / "cache.jsonl"
    with cache.open("a") as f:
        f.write('{"dataset": "toy", "method": "no_retr')  # a run killed mid-line
    before = cache.read_bytes()
    only = run_eval(load_eval_config(cfg_path), policy=FakePolicy(), kbs=fake_kbs, compute=False)
    assert cache.read_bytes() == before  # not repaired, not appended to
    assert only["per_dataset"]["toy"]["no_retrieval"]["n"] == len(QUESTIONS)
    assert not Path(load_eval_config(cfg_path).path("corpora_dir")).exists()  # no derived corpus was written


def test_a_report_only_run_names_the_kbs_of_kb_config_without_building_them(
    tmp_path: Path, questions_file: Path, fake_kbs
) -> None:
    """`compute=False` with no KBs given reads only the KB names of `kb_config` (`agent.kbs.kb_configs`)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "p1", "contents": "Paris"}\n')
    kb_yaml = tmp_path / "kb.yaml"
    kb_yaml.write_text(
        "knowledge_bases:\n"
        f"  - {{name: wiki, display_name: Text KB, kind: text, search: bm25, corpus: {corpus}, index_dir: {tmp_path / 'i1'}}}\n"
        f"  - {{name: tables, display_name: Table KB, kind: text, search: bm25, corpus: {corpus}, index_dir: {tmp_path / 'i2'}}}\n"
    )
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval", "single_kb"], kb_config=str(kb_yaml)))
    computed = run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs)
    report = run_eval(cfg, compute=False)
    assert _without_latency(report) == _without_latency(computed)
    assert set(report["macro"]) == {"no_retrieval", "rag_wiki", "rag_tables"}  # the methods the KB names expand to
    assert not (tmp_path / "i1").exists() and not (tmp_path / "i2").exists()  # no index was built


def test_the_cli_summary_prints_the_scoreboards_headline_macro():
    """The printed F1-R is report.md's first table (groups weigh equally), not the plain mean over datasets."""
    from eval.cli import summary_lines

    row = {"run/error": 0.0, "cost/steps": 1.0, "cost/gen_tokens": 10}
    results = {
        "methods": ["a", "b"],
        "macro": {"a": {**row, "answer/f1_recall": 0.2, "answer/em": 0.1}, "b": {}},
        "macro_over_groups": {"a": {**row, "answer/f1_recall": 0.3, "answer/em": 0.25}, "b": {}},
    }
    lines = summary_lines(results)
    assert "over groups" in lines[0]
    assert "F1-R  30.0  EM  25.0" in lines[1] and "no predictions yet" in lines[2]
