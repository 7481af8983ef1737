"""The one config loader (`retrievers.config_file`): dialect, `--a.b value` overrides, unknown keys, YAML-relative paths."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from retrievers.config_file import (
    Gate,
    drop_new_at_default,
    load_config_file,
    parse_overrides,
    read_config,
    yaml_loads,
)


@dataclass
class Recipe:
    name: str = "x"
    lr: float = 0.1
    mode: str = "auto"
    flag: bool = False
    corpus: str = ""
    files: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    teacher: dict = field(default_factory=dict)


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / "sub" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_the_dialect_keeps_no_a_string_and_reads_1e_4_as_a_float():
    data = yaml_loads("a: no\nb: 1e-4\nc: true\nd: off\ne: 2.0e-5\nf: False\ng: 3")
    assert data == {"a": "no", "b": 1e-4, "c": True, "d": "off", "e": 2e-5, "f": False, "g": 3}
    assert type(data["b"]) is float


def test_overrides_are_dotted_and_parsed_by_the_same_dialect():
    pairs = parse_overrides(["--teacher.model", "/m", "--lr=1e-4", "--mode", "no", "--flag", "true"])
    assert pairs == [("teacher.model", "/m"), ("lr", 1e-4), ("mode", "no"), ("flag", True)]


def test_an_override_reaches_a_nested_key_and_keeps_its_siblings(tmp_path):
    path = write(tmp_path, "teacher: {model: a, dtype: float32}\n")
    cfg = load_config_file(Recipe, path, ["--teacher.model", "b", "--teacher.kwargs.tp", "2"])
    assert cfg.teacher == {"model": "b", "dtype": "float32", "kwargs": {"tp": 2}}


def test_a_hyphen_in_a_key_means_an_underscore_unless_the_yaml_has_it_as_written(tmp_path):
    path = write(tmp_path, "teacher: {my-name: 1}\n")
    data = read_config(Recipe, path, ["--teacher.my-name", "2", "--teacher.max-batch", "3"])
    assert data["teacher"] == {"my-name": 2, "max_batch": 3}


def test_the_old_key_equals_value_form_says_the_new_form():
    with pytest.raises(
        ValueError, match=r"'agent\.max_steps=2' is the old `key=value` form; write `--agent\.max_steps 2`"
    ):
        parse_overrides(["agent.max_steps=2"])
    with pytest.raises(ValueError, match=r"unexpected argument 'stray'; overrides look like `--key value`"):
        parse_overrides(["stray"])
    with pytest.raises(ValueError, match=r"override --lr has no value"):
        parse_overrides(["--lr"])


def test_an_unknown_key_names_the_key_and_the_file(tmp_path):
    path = write(tmp_path, "name: a\nlrr: 0.2\n")
    with pytest.raises(ValueError, match=rf"unknown key 'lrr' in {path}; did you mean \['lr'\]\?"):
        load_config_file(Recipe, path)
    with pytest.raises(ValueError, match=r"unknown key 'zzz' in the overrides; valid keys: \["):
        load_config_file(Recipe, None, ["--zzz", "1"])


def test_a_nested_override_into_a_scalar_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"override --name\.x: `name` is 'a', not a mapping"):
        load_config_file(Recipe, write(tmp_path, "name: a\n"), ["--name.x", "1"])


def test_yaml_paths_resolve_against_its_folder_and_override_paths_stay_as_written(tmp_path):
    path = write(
        tmp_path, "corpus: data/c.jsonl\nfiles: [a.yaml, /abs/b.yaml]\ninputs: [{path: ../q.jsonl}, {x: 1}]\n"
    )
    data = read_config(Recipe, path, path_keys=("corpus", "files", "inputs.*.path"))
    folder = path.parent.resolve()
    assert data["corpus"] == str(folder / "data" / "c.jsonl")
    assert data["files"] == [str(folder / "a.yaml"), "/abs/b.yaml"]
    assert data["inputs"] == [{"path": str(tmp_path.resolve() / "q.jsonl")}, {"x": 1}]
    assert read_config(Recipe, path, ["--corpus", "rel/c.jsonl"], path_keys=("corpus",))["corpus"] == "rel/c.jsonl"


def test_a_base_file_is_read_first_and_each_file_resolves_its_own_paths(tmp_path):
    """`base:` works in every config, as in training recipes: the variant's keys on top, `null` drops a key."""
    base = tmp_path / "shared" / "base.yaml"
    base.parent.mkdir()
    base.write_text("name: b\nlr: 0.5\nflag: true\ncorpus: data/c.jsonl\nteacher: {backend: annotation, k: 3}\n")
    variant = write(tmp_path, "base: ../shared/base.yaml\nname: v\nflag: null\nfiles: [a.txt]\nteacher: {k: 5}\n")
    data = read_config(Recipe, variant, ["--lr", "0.25"], path_keys=("corpus", "files"))
    assert data == {
        "name": "v",
        "lr": 0.25,
        "corpus": str((base.parent / "data/c.jsonl").resolve()),  # the base's folder, not the variant's
        "files": [str((variant.parent / "a.txt").resolve())],
        "teacher": {"k": 5},  # a mapping is replaced whole
    }
    assert load_config_file(Recipe, variant).flag is False  # `null` dropped the base's value: the default applies


@pytest.mark.parametrize(
    ("files", "error", "match"),
    [
        ({"v.yaml": "base: gone.yaml\n"}, FileNotFoundError, r"v\.yaml: base eval config not found: .*gone\.yaml"),
        ({"v.yaml": "base: w.yaml\n", "w.yaml": "base: v.yaml\n"}, ValueError, r"makes a cycle of eval configs"),
        ({"v.yaml": "base: [w.yaml]\n"}, ValueError, r"v\.yaml: `base:` names another eval config file"),
        ({"v.yaml": "base: w.yaml\n", "w.yaml": "- 1\n"}, ValueError, r"w\.yaml: this eval config must be a mapping"),
    ],
)
def test_a_bad_base_is_named(tmp_path, files, error, match):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(error, match=match):
        read_config(Recipe, tmp_path / "v.yaml", what="eval config")


def test_a_bad_value_names_the_file_and_a_missing_file_is_named(tmp_path):
    @dataclass
    class Checked:
        n: int = 1

        def __post_init__(self):
            if self.n < 1:
                raise ValueError(f"`n` must be >= 1, got {self.n}")

    path = write(tmp_path, "n: 0\n")
    with pytest.raises(ValueError, match=rf"{path}: `n` must be >= 1, got 0"):
        load_config_file(Checked, path)
    with pytest.raises(FileNotFoundError, match=r"recipe file '.*missing.yaml' does not exist"):
        load_config_file(Checked, tmp_path / "missing.yaml", what="recipe")
    with pytest.raises(ValueError, match=r"this config must be a mapping of keys to values, got list"):
        load_config_file(Checked, write(tmp_path, "- 1\n", "list.yaml"))


# the shape of the agent's table (eval.config.AGENT_NEW_AT_DEFAULT): a gate, a key it gates, and a plain key
NEW_KEYS = {"prior": Gate(0, ("encoder", "size")), "size": 0, "focus": "head"}


@pytest.mark.parametrize(
    "data, kept",
    [
        # every new key at its old-behaviour value: only the old keys are left
        ({"lr": 1, "prior": 0, "encoder": "minilm", "size": 0, "focus": "head"}, {"lr": 1}),
        # the gate closed drops the keys it gates whatever their values, and nothing else
        ({"lr": 1, "prior": 0, "encoder": "clip", "size": 0.5, "focus": "all"}, {"lr": 1, "focus": "all"}),
        # a float at an int value is at that value (0.0 == 0), as the hash has always compared
        ({"lr": 1, "prior": 0.0, "encoder": "minilm", "size": 0.5, "focus": "all"}, {"lr": 1, "focus": "all"}),
        # the gate open: the gated key is checked on its own (0 dropped), the gate's other key is kept
        (
            {"lr": 1, "prior": 10, "encoder": "minilm", "size": 0, "focus": "head"},
            {"lr": 1, "prior": 10, "encoder": "minilm"},
        ),
        # the gate open and every key off its value: nothing is dropped
        (
            {"lr": 1, "prior": 10, "encoder": "minilm", "size": 0.08, "focus": "tables"},
            {"lr": 1, "prior": 10, "encoder": "minilm", "size": 0.08, "focus": "tables"},
        ),
        # None (auto) is not 0: the gate stays open
        (
            {"lr": 1, "prior": None, "encoder": "minilm", "size": 0.08, "focus": "head"},
            {"lr": 1, "prior": None, "encoder": "minilm", "size": 0.08},
        ),
        # an old key that happens to hold a table value is not touched (only the table's keys are)
        (
            {"lr": 0, "prior": 5, "encoder": "minilm", "size": 0.08, "focus": "all"},
            {"lr": 0, "prior": 5, "encoder": "minilm", "size": 0.08, "focus": "all"},
        ),
    ],
)
def test_new_keys_are_dropped_exactly_at_their_old_behaviour_values(data, kept):
    before = dict(data)
    assert drop_new_at_default(data, NEW_KEYS) == kept
    reordered = dict(reversed(NEW_KEYS.items()))  # the gated key checked before its gate: the same result
    assert drop_new_at_default(data, reordered) == kept
    assert data == before  # the caller's dict is left as it was


def test_a_table_key_missing_from_the_data_is_an_error():
    with pytest.raises(KeyError, match="focus"):
        drop_new_at_default({"lr": 1, "prior": 10, "encoder": "minilm", "size": 0}, NEW_KEYS)
