"""Recipes parse into their config classes; bad recipes and bad data fail with clear errors before a model loads."""

from __future__ import annotations

import enum
import json
from pathlib import Path

import pytest

from training.cli import main
from training.config import load_config, read_recipe

from .conftest import CPU_GRPO_RECIPE, REPO

RECIPES = sorted((REPO / "configs" / "train").glob("*.yaml"))


def test_there_are_cpu_and_gpu_recipes_for_both_stages():
    names = {p.name for p in RECIPES}
    assert {"smollm2_grpo_cpu.yaml", "smollm2_sft_cpu.yaml", "qwen2p5vl7b_grpo.yaml", "qwen2p5vl7b_grpo_lora.yaml",
            "qwen2p5vl7b_sft.yaml"} <= names  # fmt: skip


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_parses(recipe: Path, monkeypatch):  # line 1 (the command): tests/test_configs.py
    command = "grpo" if "_grpo" in recipe.stem else "sft"
    import torch

    from agent.backends import models

    monkeypatch.setattr(models, "cpu_has_bf16", lambda: False)  # `bf16: auto` then means float32 on any CPU

    # GPU recipes ask for bf16, which TrainingArguments refuses on a machine without a GPU: parse them as CPU runs
    cpu = [] if torch.cuda.is_available() or "cpu" in recipe.stem else ["--bf16", "false", "--use_cpu", "true"]
    cfg = load_config(command, recipe, cpu)
    # every key reaches the config as written (a dropped key or a dialect slip such as `no` -> False shows here),
    # but what the CPU flags override and `report_to`, which TRL turns into a list; a variant's keys are its `base:`
    # recipe's with its own on top
    written = read_recipe(recipe)
    got = {k: getattr(cfg, k) for k in written if not (cpu and k in ("bf16", "use_cpu"))}
    got = {k: v.value if isinstance(v, enum.Enum) else v for k, v in got.items()}
    report_to = written.get("report_to")
    want = {k: v for k, v in written.items() if k in got}
    if isinstance(report_to, str):
        want["report_to"] = [] if report_to == "none" else [report_to]
    if want.get("bf16") == "auto":
        want["bf16"] = torch.cuda.is_available() and not cfg.use_cpu and torch.cuda.is_bf16_supported()
    assert got == want
    if command == "grpo":
        assert cfg.num_generations >= 2 and len(cfg.reward_weights) == len(cfg.rewards)


@pytest.mark.parametrize("recipe", sorted((REPO / "configs" / "accelerate").glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_configs_are_valid_yaml(recipe: Path):  # line 1 (the command): tests/test_configs.py
    import yaml

    assert yaml.safe_load(recipe.read_text())["distributed_type"] in {"MULTI_GPU", "FSDP", "DEEPSPEED"}


def test_paper_defaults_and_overrides():
    cfg = load_config("grpo", CPU_GRPO_RECIPE, ["--num_generations", "8", "--save_strategy", "no", "--beta=0.1"])
    assert (cfg.num_generations, cfg.save_strategy.value, cfg.beta) == (8, "no", 0.1)  # 'no' stays a string
    assert [r["name"] for r in cfg.rewards] == ["ask", "route", "answer", "format"]
    assert cfg.reward_weights == [0.5, 0.5, 1.0, 0.0]  # α = β = 0.5, answer 1, format gate only
    assert cfg.epsilon == 0.2


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (["--num_generatons", "4"], ValueError, "num_generatons.*num_generations"),  # typo: names key and fix
        (["--num_generations", "1"], ValueError, "must be >= 2"),  # G < 2
        (["--rewards", "[{name: bleu}]"], ValueError, "unknown reward 'bleu'"),  # unknown reward name
        (["--rewards", "[]"], ValueError, "empty"),  # no rewards
        (["--reward_weights", "[1.0]"], ValueError, "not in `reward_weights`"),  # two sources of weights
        (["--train_format", "csv"], ValueError, "train_format"),  # unknown data format
        (["--step_types", "[retrieve]"], ValueError, "step_types"),  # unknown step type
        (["--lora", "{rank: 8}"], ValueError, "lora"),  # unknown LoRA key
        (["--train_file", ""], ValueError, "train_file"),  # no data
        # destructive values: each would have trained (wrongly) before
        (["--beta", "-1"], ValueError, r"`beta` \(the KL coefficient\) must be >= 0, got -1"),
        (["--epsilon", "-0.2"], ValueError, r"`epsilon` .* must be > 0, got -0.2"),
        (["--epsilon", "0"], ValueError, r"`epsilon` .* must be > 0"),
        (
            ["--rewards", "[{name: answer, weight: -1}]"],
            ValueError,
            r"reward 'answer': `weight` must be a number >= 0",
        ),
        (["--rewards", "[{name: answer, weight: yes}]"], ValueError, r"`weight` must be a number"),
        (["--rewards", "[{name: answer, weight: 0}]"], ValueError, "every reward `weight` is 0"),
        (["--max_steps", "-5"], ValueError, r"`max_steps` must be -1 .* or > 0, got -5"),
        (["--max_steps", "0"], ValueError, r"`max_steps` must be -1"),
        (["--kb_list_share", "1.5"], ValueError, r"`kb_list_share` must be a share in \[0, 1\], got 1.5"),
        (["--kb_list_min", "0"], ValueError, r"`kb_list_min` must be >= 1"),
        (["--kb_name_share", "2"], ValueError, r"`kb_name_share` must be a share in \[0, 1\], got 2"),
        (["--kb_name_aliases", "{Text Retriever: [a<b]}"], ValueError, r"`kb_name_aliases.Text Retriever`: display_"),
        (["--max_per_dataset", "{coco: -1}"], ValueError, r"`max_per_dataset.coco` must be a count >= 0, got -1"),
        (["--max_per_dataset", "{coco: {answer: x}}"], ValueError, r"`max_per_dataset.coco.answer` must be a count"),
        (
            ["--max_per_dataset", "{coco: {answers: 2}}"],
            ValueError,
            r"`max_per_dataset.coco.answers`: a per-step-type",
        ),
        (["--rollout_min_steps", "1"], ValueError, r"`rollout_min_steps` .* needs `constrained_rollouts: true`"),
        (["--rollout_min_steps", "-1"], ValueError, r"`rollout_min_steps` must be a step count >= 0, got -1"),
        # constrained rollouts need the grammars' budgets and transformers generation
        (["--constrained_rollouts", "true"], ValueError, r"`constrained_rollouts: true` .* set `grammar_tokens"),
        (
            [
                "--constrained_rollouts",
                "true",
                "--grammar_tokens",
                "{plan: 448, answer: 256, final: 256}",
                "--use_vllm",
                "true",
            ],
            ValueError,
            r"TRL's vLLM path cannot take; set `use_vllm: false`",
        ),
    ],
)
def test_bad_recipes_fail_at_parse_time(overrides, error, match):
    with pytest.raises(error, match=match):
        load_config("grpo", CPU_GRPO_RECIPE, overrides)


def test_sft_max_steps_is_checked_too():
    with pytest.raises(ValueError, match=r"`max_steps` must be -1"):
        load_config("sft", REPO / "configs" / "train" / "smollm2_sft_cpu.yaml", ["--max_steps", "-5"])
    assert (
        load_config("sft", REPO / "configs" / "train" / "smollm2_sft_cpu.yaml", ["--max_steps", "-1"]).max_steps == -1
    )


def test_unknown_yaml_key_names_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CPU_GRPO_RECIPE.read_text() + "\ngroup_size: 8\n")
    with pytest.raises(ValueError, match="unknown key 'group_size'"):
        load_config("grpo", bad)


@pytest.mark.parametrize(
    "setup, error, match",
    [
        # a step record without a gold target
        (lambda d: (d / "s.jsonl").write_text(json.dumps({"trajectory_id": "t", "step_type": "final",
                                                          "messages": [{"role": "user", "content": "q"}]}) + "\n"),
         ValueError, "gold"),
        # a dataset whose images are missing
        (lambda d: (d / "s.jsonl").write_text(json.dumps({"trajectory_id": "t", "step_type": "final",
                                                          "messages": [{"role": "user", "content": "q"}],
                                                          "gold": {"answers": ["x"]},
                                                          "images": ["/missing/img.jpg"]}) + "\n"),
         FileNotFoundError, "img.jpg"),
    ],
)  # fmt: skip
def test_bad_data_fails_before_any_model_loads(tmp_path, monkeypatch, setup, error, match):
    from training import trainers

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(trainers, "load_policy", no_model)
    monkeypatch.setattr(trainers, "resolve_model_path", no_model)
    setup(tmp_path)
    cfg = load_config("grpo", CPU_GRPO_RECIPE, ["--train_file", str(tmp_path / "s.jsonl"), "--train_format",
                                                 "steps", "--use_images", "true", "--step_types", "null"])  # fmt: skip
    with pytest.raises(error, match=match):
        trainers.build_grpo_trainer(cfg)


def test_cli_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "grpo" in capsys.readouterr().out


def test_cli_rejects_unknown_key(tmp_path):
    with pytest.raises(ValueError, match="unknown key 'no_such_key'"):
        main(["grpo", "--config", str(CPU_GRPO_RECIPE), "--no_such_key", "1", "--output_dir", str(tmp_path)])


def test_max_per_dataset_caps_each_dataset_and_step_type(tmp_path):
    from agent.step_records import StepRecord
    from training.trainers import _cap_per_dataset

    def rec(i, dataset, step_type="plan"):
        gold = {"sub_question": None, "kb": None} if step_type == "plan" else {"answers": ["x"]}
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": f"q{i}"}]
        kbs = ("Text Retriever",) if step_type == "plan" else ()
        return StepRecord(f"t{i}", step_type, msgs, gold, kb_names=kbs, metadata={"dataset": dataset})

    records = [rec(i, "clip_notes") for i in range(5)] + [rec(10 + i, "coco") for i in range(5)]
    records += [rec(20 + i, "coco", "final") for i in range(3)] + [rec(30, "")]
    kept = _cap_per_dataset(records, {"clip_notes": 4, "*": 2})
    ids = [r.trajectory_id for r in kept]
    assert ids == ["t0", "t1", "t2", "t3", "t10", "t11", "t20", "t21", "t30"]
    assert len(_cap_per_dataset(records, {"coco": 0})) == 6  # no "*": the other datasets are kept whole
    # a mapping caps step types apart: two coco finals, every plan (a step type it leaves out is not capped)
    kept = _cap_per_dataset(records, {"*": {"final": 2}})
    assert [r.trajectory_id for r in kept] == [f"t{i}" for i in (0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 20, 21, 30)]
    kept = _cap_per_dataset(records, {"clip_notes": 1, "*": {"plan": 0, "final": 1}})
    assert [r.trajectory_id for r in kept] == ["t0", "t20"]


def test_balance_plan_decisions_alternates_gold_stops_and_searches_before_the_caps():
    from agent.step_records import StepRecord
    from training.trainers import _balance_plan_decisions, _cap_per_dataset

    def plan(i, dataset, stops):
        gold = {"sub_question": None, "kb": None} if stops else {"sub_question": f"q{i}?", "kb": "Text Retriever"}
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": f"q{i}"}]
        return StepRecord(f"t{i}", "plan", msgs, gold, kb_names=("Text Retriever",), metadata={"dataset": dataset})

    final = StepRecord("f", "final", [{"role": "user", "content": "q"}], {"answers": ["x"]})
    # mostly searches first, as a shuffled file of first steps holds them: a plain cap of 4 takes no stop
    records = [plan(i, "hotpotqa", stops=False) for i in range(4)] + [final]
    records += [plan(4 + i, "hotpotqa", stops=True) for i in range(2)] + [plan(9, "coco", stops=False)]
    assert not any(r.step_type == "plan" and r.gold["kb"] is None for r in _cap_per_dataset(records, {"*": 4}))
    balanced = _balance_plan_decisions(records)
    assert balanced[4] is final  # other step types keep their places
    plans = [r.trajectory_id for r in balanced if r.step_type == "plan"]
    # rank 0 of each (dataset, decision) first, in file order, then rank 1, ...
    assert plans == ["t0", "t4", "t9", "t1", "t5", "t2", "t3"]
    kept = _cap_per_dataset(balanced, {"*": 4})
    assert [r.gold["kb"] is None for r in kept if r.metadata.get("dataset") == "hotpotqa"] == [False, True] * 2
    assert sorted(r.trajectory_id for r in balanced) == sorted(r.trajectory_id for r in records)  # nothing lost


@pytest.mark.parametrize("has_bf16", [True, False])
def test_bf16_auto_follows_the_cpu(tmp_path, monkeypatch, caplog, has_bf16):
    """`bf16: auto` is bf16 autocast only on a CPU with bf16 units: without them bf16 runs ~40x slower (stop 52)."""
    from agent.backends import models

    monkeypatch.setattr(models, "cpu_has_bf16", lambda: has_bf16)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"base: {REPO / 'configs' / 'train' / 'smollm2_router_sft_lora_cpu.yaml'}\n")
    assert read_recipe(recipe)["bf16"] == "auto"
    with caplog.at_level("INFO", logger="training.config"):
        assert load_config("sft", recipe).bf16 is has_bf16
    assert f"bf16: auto -> {has_bf16}" in caplog.text
    # the override wins over the recipe, in both directions, and `--bf16 auto` / `--bf16=auto` resolve the same way
    assert load_config("sft", recipe, ["--bf16", "false"]).bf16 is False
    assert load_config("sft", recipe, ["--bf16=true"]).bf16 is True
    plain = REPO / "configs" / "train" / "smollm2_sft_cpu.yaml"  # `bf16: false`
    assert load_config("sft", plain, ["--bf16", "auto"]).bf16 is has_bf16
    assert load_config("sft", plain, ["--bf16=auto", "--max_steps", "3"]).bf16 is has_bf16
    assert load_config("sft", plain, ["--bf16", "auto", "--bf16", "false"]).bf16 is False  # the last one wins
    with pytest.raises(ValueError, match="--bf16: expected one argument"):  # as the parser reads it, auto or not
        load_config("sft", recipe, ["--max_steps", "3", "--bf16"])
