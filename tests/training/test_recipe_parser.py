"""`load_config` on TRL's `TrlParser` gives every recipe the values the loader before it gave (issue 12, 1.1).

`_previous_load` is that loader as it was at 4bcba38 (the project's YAML dialect, `--key value` overrides read by
`retrievers.config_file.parse_overrides`, then `cls(**values)`), kept here as the reference the new path is pinned to;
a recipe's `base:` chain (`read_recipe`, tested at the end of this file) is applied before either.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path

import pytest

from retrievers.config_file import parse_overrides, yaml_loads
from training.cli import main
from training.config import CONFIGS, load_config, read_recipe, resolve_auto_bf16

from .conftest import CPU_GRPO_RECIPE, CPU_SFT_RECIPE, REPO

RECIPES = sorted((REPO / "configs" / "train").glob("*.yaml"))


def _previous_load(command: str, path: Path, overrides: list[str]):
    values = read_recipe(path)  # the YAML as written, with its `base:` chain applied
    values.update({key.replace("-", "_"): value for key, value in parse_overrides(overrides)})
    resolve_auto_bf16(values, [])  # `bf16: auto` came after that loader: both resolve it the same way
    return CONFIGS[command](**values)


def _values(cfg) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _command(recipe: Path) -> str:
    return "grpo" if "_grpo" in recipe.stem else "sft"


def _cpu(recipe: Path) -> list[str]:
    import torch

    # GPU recipes ask for bf16, which TrainingArguments refuses without a GPU: both loaders parse them as CPU runs
    return [] if torch.cuda.is_available() or "cpu" in recipe.stem else ["--bf16", "false", "--use_cpu", "true"]


def _header_example(recipe: Path) -> list[str]:
    """The overrides of the recipe's `# override example:` header line (none when it has no such line)."""
    for line in recipe.read_text().splitlines()[:3]:
        if line.startswith("# override example:"):
            return shlex.split(line.split(str(recipe.relative_to(REPO)), 1)[1])
    return []


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_loads_to_the_previous_values(recipe: Path):
    overrides = _cpu(recipe) + _header_example(recipe)
    new, old = load_config(_command(recipe), recipe, overrides), _previous_load(_command(recipe), recipe, overrides)
    assert type(new) is type(old)
    assert _values(new) == _values(old)


@pytest.mark.parametrize(
    "overrides",
    [
        ["--bf16", "false", "--use_cpu=true"],  # `--key value` and `--key=value` of bools
        ["--num-generations", "8", "--beta", "1e-4"],  # `-` means `_`; an exponent float
        ["--step_types", "null", "--save_strategy", "no"],  # a list field cleared; `no` is the string (an enum value)
        ["--step_types", "[plan]", "--max_per_step_type", "{plan: 3}"],  # list and mapping fields read as YAML
        ["--rewards", "[{name: answer, weight: 1.0, kwargs: {final_rule: accuracy}}, {name: format, weight: 0}]"],
        ["--lora", "{r: 8, alpha: 16}", "--report_to", "none", "--max_train_samples", "null"],
        ["--init_adapter", "null", "--eval_file", "null", "--output_dir", "runs/x"],  # `str | None` cleared with null
        ["--reward_weights", "[0.5, 0.5, 1.0, 0.0]", "--resume_from_checkpoint", "last", "--max_steps", "3"],
        ["--learning_rate", "2e-5", "--learning_rate", "3e-5"],  # the last one wins
    ],
)
def test_overrides_give_the_previous_values(overrides):
    new, old = load_config("grpo", CPU_GRPO_RECIPE, overrides), _previous_load("grpo", CPU_GRPO_RECIPE, overrides)
    assert _values(new) == _values(old)


def test_values_override_the_recipe_and_keep_their_types():
    cfg = load_config("grpo", CPU_GRPO_RECIPE, ["--beta", "1e-4", "--init_adapter", "null", "--step_types", "[plan]"])
    assert (cfg.beta, cfg.init_adapter, cfg.step_types, cfg.num_generations) == (1e-4, None, ["plan"], 4)
    assert type(cfg.beta) is float and type(cfg.num_generations) is int
    assert load_config("grpo", CPU_GRPO_RECIPE, ["--use_images"]).use_images is True  # a bare bool flag (TRL's)
    # the one value that changed: a `str | None` field keeps `true` as the string (before: the bool True), which
    # training.trainers.resume_checkpoint reads the same way (the newest complete checkpoint)
    assert load_config("grpo", CPU_GRPO_RECIPE, ["--resume_from_checkpoint", "true"]).resume_from_checkpoint == "true"
    assert load_config("grpo", CPU_GRPO_RECIPE, ["--no_format_gate"]).format_gate is False  # TRL's `--no_` form


@pytest.mark.parametrize(
    "yaml_line, overrides, match",
    [
        # the file's unknown key: named with the file and the closest key (TRL's message names neither)
        ("group_size: 8", [], r"unknown key 'group_size' in .*bad\.yaml"),
        ("num_generatons: 8", [], r"unknown key 'num_generatons' in .*bad\.yaml; did you mean \['num_generations'"),
        # TrlParser.parse_args_and_config would export this into os.environ; here it is just an unknown key
        ("env: {KBROUTER_TEST_VAR: 1}", [], r"unknown key 'env' in .*bad\.yaml"),
        # an override's unknown key, and a prefix of a real one (argparse would take it for num_generations)
        ("", ["--num_generatons", "4"], r"unknown key 'num_generatons' in the overrides .*'num_generations'"),
        ("", ["--num_gen", "4"], r"unknown key 'num_gen' in the overrides"),
        ("", ["num_generations=4"], r"old `key=value` form; write `--num_generations 4`"),  # the old form
        ("", ["--bf16", "false", "stray"], r"unexpected argument 'stray'"),
        ("", ["--step_types", "plan", "final"], r"unexpected argument 'final': a flag takes one value"),  # TRL's nargs
        ("", ["--lora", "{r: 8"], r"the overrides: argument --lora: '\{r: 8' is not YAML"),
        # a value its field's type refuses, named with where it came from
        ("", ["--num_generations", "eight"], r"the overrides: argument --num_generations.*invalid int value"),
        ("bf16: off", [], r"bad\.yaml: argument --bf16.*Truthy value expected: got off"),
    ],
)
def test_bad_keys_and_values_name_the_culprit(tmp_path, yaml_line, overrides, match):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CPU_GRPO_RECIPE.read_text() + "\n" + yaml_line + "\n")
    with pytest.raises(ValueError, match=match):
        load_config("grpo", bad, overrides)
    assert "KBROUTER_TEST_VAR" not in os.environ


def test_the_yaml_dialect_in_a_recipe(tmp_path):
    # only true/false are booleans: `no` stays the string a str or enum field wants (yaml.safe_load: False), and a
    # bool field reads `no` through TRL's string_to_bool (False; before, the string "no" reached TrainingArguments)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(CPU_SFT_RECIPE.read_text() + "\nsave_strategy: no\nlearning_rate: 1e-4\nbf16: no\n")
    cfg = load_config("sft", recipe)
    assert (cfg.save_strategy.value, cfg.learning_rate, cfg.bf16) == ("no", 1e-4, False)


def test_trl_parse_args_and_config_reads_another_dialect(tmp_path):
    """Why `load_config` reads the file itself: TRL's own `--config` reading takes `no` for False."""
    import trl

    from training.config import StepSFTConfig

    recipe = tmp_path / "r.yaml"
    recipe.write_text(CPU_SFT_RECIPE.read_text() + "\nsave_strategy: no\n")
    with pytest.raises(ValueError, match="False"):  # IntervalStrategy(False)
        trl.TrlParser([StepSFTConfig]).parse_args_and_config(["--config", str(recipe)])


def test_train_help_lists_every_field(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["grpo", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "kbrouter train grpo" in out and "--num_generations" in out and "--rewards" in out and "--config" in out


# --- `base:`: a recipe that names only what it changes ---


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_variant_is_its_base_with_its_own_keys_on_top(tmp_path, monkeypatch):
    # the base lives in another folder, and the command runs from a third: `base:` is relative to the recipe's folder
    _write(tmp_path / "recipes" / "base.yaml", CPU_GRPO_RECIPE.read_text() + "init_adapter: runs/sft\n"
           "max_per_step_type: {plan: 3, final: 2}\n")  # fmt: skip
    variant = _write(tmp_path / "recipes" / "variants" / "v.yaml", "base: ../base.yaml\nlearning_rate: 2e-5\n"
                     "max_per_step_type: {plan: 5}\ninit_adapter: null\n")  # fmt: skip
    monkeypatch.chdir(tmp_path / "recipes" / "variants")
    got = load_config("grpo", variant.name)
    want = load_config("grpo", CPU_GRPO_RECIPE, ["--learning_rate", "2e-5", "--max_per_step_type", "{plan: 5}"])
    assert got.learning_rate == 2e-5 and got.beta == 0.01  # its own key, and the base's
    assert got.max_per_step_type == {"plan": 5}  # a mapping is replaced whole, not merged
    assert got.init_adapter is None  # `null` dropped the base's value: the field's default
    assert _values(got) == _values(want)


@pytest.mark.parametrize("recipe", [r for r in RECIPES if "\nbase:" not in r.read_text()], ids=lambda p: p.name)
def test_a_recipe_without_a_base_reads_as_its_yaml(recipe: Path):
    assert read_recipe(recipe) == yaml_loads(recipe.read_text())


def test_a_base_may_have_a_base(tmp_path):
    _write(tmp_path / "a.yaml", CPU_SFT_RECIPE.read_text())
    _write(tmp_path / "b.yaml", "base: a.yaml\nlearning_rate: 3e-5\nseed: 7\n")
    c = _write(tmp_path / "c.yaml", "base: b.yaml\nseed: 9\n")
    assert read_recipe(c) == {**yaml_loads(CPU_SFT_RECIPE.read_text()), "learning_rate": 3e-5, "seed": 9}
    cfg = load_config("sft", c, ["--max_steps", "2"])
    assert (cfg.learning_rate, cfg.seed, cfg.max_steps) == (3e-5, 9, 2)


@pytest.mark.parametrize(
    ("files", "error", "match"),
    [
        ({"v.yaml": "base: gone.yaml\n"}, FileNotFoundError, r"v\.yaml: base recipe not found: .*gone\.yaml .*folder"),
        ({"v.yaml": "base: w.yaml\n", "w.yaml": "base: v.yaml\n"}, ValueError, r"makes a cycle of recipes"),
        ({"v.yaml": "base: v.yaml\n"}, ValueError, r"v\.yaml: `base: v\.yaml` makes a cycle"),
        ({"v.yaml": "base: 3\n"}, ValueError, r"v\.yaml: `base:` names another recipe file .* got 3"),
        ({"v.yaml": "base: w.yaml\n", "w.yaml": "- a list\n"}, ValueError, r"w\.yaml: this recipe must be a mapping"),
        (
            {"v.yaml": "base: w.yaml\nnum_generatons: 4\n", "w.yaml": "seed: 1\n"},
            ValueError,
            r"unknown key 'num_generatons' in .*v\.yaml",
        ),
    ],
)
def test_bad_bases_name_the_culprit(tmp_path, files, error, match):
    for name, text in files.items():
        _write(tmp_path / name, text)
    with pytest.raises(error, match=match):
        load_config("grpo", tmp_path / "v.yaml")


def test_the_shipped_variants_name_only_what_they_change():
    """The stop-30/31 Step-GRPO variants are pool3's recipe plus a few keys, and load as their full copies did."""
    pool3 = read_recipe(REPO / "configs/train/smollm2_router_grpo_pool3_lora_cpu.yaml")
    for name, changed in {"pool4": {"init_adapter", "step_types", "sample_seed", "max_per_dataset",
                                    "max_per_step_type", "output_dir", "learning_rate"},
                          "pool5": {"init_adapter", "output_dir"},
                          "pool6": {"init_adapter", "sample_seed", "output_dir"}}.items():  # fmt: skip
        variant = read_recipe(REPO / f"configs/train/smollm2_router_grpo_{name}_lora_cpu.yaml")
        assert {k for k in variant if variant[k] != pool3.get(k)} == changed, name
        assert variant.keys() == pool3.keys(), name
