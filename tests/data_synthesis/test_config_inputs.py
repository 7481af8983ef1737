"""Recipes, overrides and the input readers (on the real shared files)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from data_synthesis.cli import main, merge_main
from data_synthesis.config import InputSpec, SynthConfig, load_config
from data_synthesis.inputs import read_inputs

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "configs" / "synth").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_parses(recipe):  # line 1 (the command): tests/test_configs.py
    cfg = load_config(recipe)
    assert cfg.inputs and cfg.kb_config and Path(cfg.inputs[0].path).is_absolute()  # YAML paths resolve to its folder


def test_recipe_count():
    assert {p.stem for p in RECIPES} >= {"smollm2_cpu", "paper_vl7b_vllm", "paper_r1_32b_vllm"}


@pytest.mark.parametrize(
    ("overrides", "check"),
    [
        (["--m", "2"], lambda c: c.m == 2),  # plain key
        (["--teacher.model", "/models/x"], lambda c: c.teacher.model == "/models/x"),  # dotted nested key
        (["--rejection.max_steps=2"], lambda c: c.rejection.max_steps == 2),  # `--key=value` form
        (["--shard", "1", "--num_shards", "4"], lambda c: (c.shard, c.num_shards) == (1, 4)),
    ],
)
def test_overrides(overrides, check):
    assert check(load_config(ROOT / "configs" / "synth" / "smollm2_cpu.yaml", overrides))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"teacher": {"modle": "x"}}, "unknown key 'modle' in teacher"),
        ({"inputs": [{"path": "x", "format": "csv2"}]}, "unknown format 'csv2'"),
        ({"m": 4, "temperature": 0.0}, "greedy samples are identical"),
        ({"shard": 3, "num_shards": 2}, "out of range"),
        ({"teacher": {"backend": "tgi"}}, "'tgi' is unknown"),  # backends come from agent.backends.factory
        ({"teacher": {"kwargs": {"tp": 4}}}, "teacher: unknown key\\(s\\) \\['tp'\\]"),  # backend kwargs checked early
        # wrong types and ranges, each a traceback or a silent wrong value before
        ({"m": "abc"}, r"`m` must be an integer, got 'abc'"),
        ({"temperature": "hot"}, r"`temperature` must be a number"),
        ({"top_p": 0}, r"0 < `top_p` <= 1"),
        ({"plan_tokens": 0}, r"`plan_tokens` must be >= 1"),
        ({"teacher": {"retries": "3"}}, r"teacher.`retries` must be an integer"),
        ({"inputs": [{"path": "x", "limit": "ten"}]}, r"input 'x': `limit` must be an integer or null"),
        ({"rejection": {"max_steps": True}}, r"rejection.`max_steps` must be an integer or null"),
        # the teacher's step loop (agent.loop.AgentConfig), checked when the recipe loads
        ({"constrained": "maybe"}, r"teacher's step loop: .*constrained must be one of"),
        ({"max_steps": 2, "min_steps": 3}, r"teacher's step loop: min_steps must be in \[0, max_steps=2\]"),
        ({"evidence_chars": 0}, r"teacher's step loop: agent.evidence_chars must be >= 1"),
    ],
)
def test_bad_config_names_the_problem(values, message):
    with pytest.raises(ValueError, match=message):
        SynthConfig(**values)


def test_the_teachers_agent_settings_reach_its_step_loop_and_the_hash():
    cfg = load_config(ROOT / "configs" / "synth" / "self_rft_cpu.yaml")
    agent = cfg.agent_config(seed=7)
    assert (agent.constrained, agent.min_steps, agent.evidence_chars, agent.few_shot) == ("on", 1, 250, False)
    assert agent.seed == 7 and cfg.step_prompt.evidence_chars == 250 and not cfg.step_prompt.few_shot
    base = load_config(ROOT / "configs" / "synth" / "smollm2_cpu.yaml")
    # at their defaults the keys added in stops 32 and 43 leave the hash alone: runs started before them still resume
    old = {k: v for k, v in dataclasses.asdict(base).items() if k not in {"shard", "output_dir", "progress",
           "log_level", "build_kbs", "constrained", "min_steps", "evidence_chars", "evidence_focus"}}  # fmt: skip
    old["teacher"] = {k: v for k, v in old["teacher"].items() if k not in ("retries", "backoff_s", "max_batch_size")}
    assert base.result_hash() == hashlib.sha256(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()[:16]
    for key, value in (
        ("constrained", "auto"),
        ("min_steps", 1),
        ("evidence_chars", 250),
        ("evidence_focus", "tables"),
    ):
        assert dataclasses.replace(base, **{key: value}).result_hash() != base.result_hash(), key
    focused = dataclasses.replace(
        base, evidence_focus="tables"
    )  # the teacher reads, and the records show, focused tables
    assert focused.agent_config(seed=0).evidence_focus == focused.step_prompt.evidence_focus == "tables"


def test_m_abc_on_the_command_line_is_one_clear_error():
    with pytest.raises(ValueError, match=r"`m` must be an integer, got 'abc'"):
        load_config(ROOT / "configs" / "synth" / "smollm2_cpu.yaml", ["--m", "abc"])


def test_a_broken_input_line_names_the_file_and_line(tmp_path):
    from agent.qa_formats import load_rows

    path = tmp_path / "qa.jsonl"
    path.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n{"id": "2", "question": \n')
    with pytest.raises(ValueError, match=r"qa.jsonl:2: not valid JSON"):
        load_rows(path)


def test_kbrouter_synth_gives_one_line_for_m_abc_and_for_a_broken_input_line(tmp_path, capsys):
    from kbrouter.cli import main as kbrouter

    recipe = ROOT / "configs" / "synth" / "smollm2_cpu.yaml"
    assert kbrouter(["synth", "--config", str(recipe), "--m", "abc", "--output_dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "`m` must be an integer, got 'abc'" in err and len(err.strip().splitlines()) == 1
    # a malformed line in an input file was a `DatasetGenerationError` traceback; it fails before any model loads
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"id": "1", "question": "q?", "answers": ["a"]}\n{"id": "2", "question": \n')
    broken = tmp_path / "broken.yaml"
    broken.write_text(f"inputs:\n  - {{path: {qa}, format: generic}}\nkb_config: {ROOT / 'configs' / 'kb' / 'demo.yaml'}\n"
                      f"output_dir: {tmp_path / 'out'}\n")  # fmt: skip
    assert kbrouter(["synth", "--config", str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"{qa}:2: not valid JSON" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unknown_top_level_key_names_the_key_and_the_fix():
    with pytest.raises(ValueError, match=r"unknown key 'mm'.*did you mean \['m'\]"):
        load_config(None, ["--mm", "2"])


def test_cli_help_exits_zero():
    for entry in (main, merge_main):
        with pytest.raises(SystemExit) as e:
            entry(["--help"])
        assert e.value.code == 0


@pytest.mark.parametrize(
    ("parts", "fmt", "first_id", "check"),
    [
        # HotpotQA/MuSiQue: ids, per-row dataset names, gold lists
        (("text", "questions.jsonl"), "shared_text", "hotpotqa-dev-5a85ea095542994775f606a8",
         lambda q: q.answers == ("Animorphs",) and q.metadata["dataset"] == "hotpotqa"),
        # 2Wiki: no ids in the file -> dataset-line ids; a string answer becomes a one-gold list
        (("r1router", "2wikimultihopqa_val.jsonl"), "r1router", "2wikimultihopqa-0",
         lambda q: q.answers == ("Małgorzata Braunek",)),
        # InfoSeek: data_id, answer_eval golds first (numeric ranges expanded), no image_root -> text only
        (("r1router", "infoseek_val.jsonl"), "r1router", "infoseek_val_00000000",
         lambda q: q.answers[:3] == ("energy conversion", "energy transformation", "conversion") and not q.images),
        # TabFact folder: R1-Router's yes/no questions joined to tables
        (("table", "tabfact"), "tabfact", "tabfact-val-0", lambda q: q.answers == ("yes",)),
        # COCO derived QA: images resolved through images.jsonl and present on disk
        (("image", "coco", "qa_derived.jsonl"), "coco", "coco-535506-q0",
         lambda q: q.answers == ("1",) and Path(q.images[0]).exists()),
    ],
)  # fmt: skip
def test_readers_on_shared_files(shared_path, parts, fmt, first_id, check):
    questions, skips = read_inputs([InputSpec(path=str(shared_path(*parts)), format=fmt, limit=5)])
    assert questions[0].id == first_id and check(questions[0]) and not skips


def test_infoseek_numeric_range_and_dynvqa_nan(shared_path):
    infoseek = shared_path("r1router", "infoseek_val.jsonl")
    rows = [json.loads(line) for line in infoseek.read_text().splitlines()]
    n = next(i for i, r in enumerate(rows) if r["answer_eval"] and isinstance(r["answer_eval"][0], dict))
    questions, _ = read_inputs([InputSpec(path=str(infoseek), format="r1router", limit=n + 1)])
    lo, hi = rows[n]["answer_eval"][0]["range"]
    assert str(int(lo)) in questions[n].answers and len(questions[n].answers) > 2  # expanded range
    dyn = shared_path("r1router", "DynVQA_en.202412.jsonl")
    questions, skips = read_inputs([InputSpec(path=str(dyn), format="r1router", dataset="dynvqa")])
    assert len(questions) + len(skips) == 715 and all(q.answers for q in questions)


def test_missing_image_is_reported_with_the_question_id(tmp_path, caplog):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(
        json.dumps({"image_id": 42, "question": "What is this?", "answer": ["a cat"], "data_id": "x1"}) + "\n"
    )
    questions, skips = read_inputs([InputSpec(path=str(qa), format="r1router", image_root=str(tmp_path))])
    assert not questions and skips[0].id == "x1" and skips[0].reason == "missing_image"
    assert "x1" in caplog.text and "42.jpg" in caplog.text


def test_generic_parquet_with_column_mapping(tmp_path):
    import datasets

    rows = [
        {"uid": "a", "q": "Who wrote Hamlet?", "gold": "Shakespeare"},  # a string gold -> one-gold list
        {"uid": "b", "q": "Capital of France?", "gold": None},
    ]  # no gold -> skipped, counted
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "qa.parquet"))
    spec = InputSpec(path=str(tmp_path / "qa.parquet"), columns={"id": "uid", "question": "q", "answers": "gold"})
    questions, skips = read_inputs([spec])
    assert [(q.id, q.answers, q.metadata["dataset"]) for q in questions] == [("a", ("Shakespeare",), "qa")]
    assert [(s.id, s.reason) for s in skips] == [("b", "no_gold")]
    with pytest.raises(ValueError, match=r"qa.parquet:1: missing column 'question'"):
        read_inputs([InputSpec(path=str(tmp_path / "qa.parquet"))])
