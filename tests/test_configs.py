"""Every YAML under configs/ parses into its dataclass with the project's own loader, and opens with its command.

Header rule: line 1 is `# ` followed by the command that uses the file, naming the file by its path from the repo
root (an optional `Run:` / `Build:` label first). Parsing builds no index and loads no model.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*/*.yaml"))
KINDS = {"accelerate", "eval", "kb", "synth", "train"}

# The command of each folder, as a regex; `{path}` is the file's own path, e.g. configs/train/smollm2_sft_cpu.yaml.
_TRAIN = r"(?:sft|grpo) --config "
_ENV = r"(?:[A-Z_]+=\S+ )*"
COMMANDS = {
    "accelerate": _ENV + r"accelerate launch --config_file {path} -m training\.cli " + _TRAIN + r"configs/train/\S+",
    "eval": r"(?:Run: +)?kbrouter eval --config {path}",
    "kb": r"(?:Build: +)?kbrouter index --kb {path}",
    "synth": r"(?:Run: +)?kbrouter synth --config {path}",
    "train": r"(?:kbrouter train |python -m training\.cli |accelerate launch --config_file configs/accelerate/\S+ "
    r"-m training\.cli )" + _TRAIN + "{path}",
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_config_folder_has_a_loader_and_a_command():
    assert {p.parent.name for p in CONFIGS} == KINDS == set(COMMANDS)
    assert len(CONFIGS) >= 20


@pytest.mark.parametrize("path", CONFIGS, ids=_rel)
def test_line_one_is_the_command_that_uses_the_file(path: Path):
    first = path.read_text().splitlines()[0]
    pattern = "# " + COMMANDS[path.parent.name].format(path=re.escape(_rel(path))) + r"(?:\s|$)"
    assert re.match(pattern, first), f"{_rel(path)} line 1 must match {pattern!r}, got {first!r}"
    if path.parent.name in ("train", "accelerate"):  # the stage the file names is its own (`*_grpo*` -> grpo)
        train = re.search(r"--config (configs/train/\S+)", first).group(1)
        assert re.search(rf" {'grpo' if '_grpo' in Path(train).stem else 'sft'} --config ", first), first
    for named in re.findall(r"configs/[\w/.-]+\.yaml", first):  # every recipe the command names exists
        assert (ROOT / named).is_file(), f"{_rel(path)} line 1 names {named}, which does not exist"


@pytest.fixture
def no_heavy_work(monkeypatch):
    """Parsing a config must build no index and load no model: each of these raises if called."""
    import transformers

    import retrievers.kb

    def refuse(*args, **kwargs):
        raise AssertionError("parsing a config built an index or loaded a model")

    monkeypatch.setattr(retrievers.kb, "build_kb", refuse)
    monkeypatch.setattr(retrievers.kb, "load_kb", refuse)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "from_pretrained", classmethod(refuse))


def _parse(path: Path):
    kind = path.parent.name
    if kind == "train":
        import torch

        from training.config import StepGRPOConfig, StepSFTConfig, load_config

        command = "grpo" if "_grpo" in path.stem else "sft"
        # GPU recipes ask for bf16, which TrainingArguments refuses without a GPU: parse them as CPU runs there.
        # `init_adapter: runs/train/...` (router recipes) is the previous stage's output, checked when the trainer
        # loads it, not here, so these parse in a fresh clone.
        cpu = [] if torch.cuda.is_available() or "cpu" in path.stem else ["--bf16", "false", "--use_cpu", "true"]
        cfg = load_config(command, path, cpu)
        assert type(cfg) is (StepGRPOConfig if command == "grpo" else StepSFTConfig)
        return cfg
    if kind == "synth":
        from data_synthesis.config import SynthConfig, load_config

        cfg = load_config(path)
        assert type(cfg) is SynthConfig and cfg.inputs
        return cfg
    if kind == "eval":
        from eval.config import EvalConfig, load_eval_config

        cfg = load_eval_config(path)
        assert type(cfg) is EvalConfig and cfg.methods
        return cfg
    if kind == "kb":
        from retrievers.config import KBConfig, load_kb_configs

        try:
            cfgs = load_kb_configs(path)
        except FileNotFoundError as e:  # corpora outside the repo (../shared, outputs/eval_corpora) may be absent
            if f"{ROOT}/data/" in str(e):
                raise  # a shipped corpus must be there
            pytest.skip(f"corpus not present on this machine: {e}")
        assert cfgs and all(type(c) is KBConfig for c in cfgs)
        assert len({c.name for c in cfgs}) == len(cfgs)
        return cfgs
    assert kind == "accelerate"  # accelerate's own files: valid YAML that accelerate's launcher reads
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and data["distributed_type"] in {"MULTI_GPU", "MULTI_CPU", "FSDP", "DEEPSPEED"}
    assert isinstance(data["num_processes"], int) and data["num_processes"] >= 1
    return data


@pytest.mark.parametrize("path", CONFIGS, ids=_rel)
def test_every_config_parses_into_its_dataclass(path: Path, no_heavy_work):
    assert _parse(path)


@pytest.mark.parametrize("path", [p for p in CONFIGS if "init_adapter:" in p.read_text()], ids=_rel)
def test_a_missing_init_adapter_does_not_fail_parsing(path: Path, tmp_path: Path, no_heavy_work):
    """In a fresh clone the previous stage's `runs/train/...` adapter is absent; the trainer checks it when it loads."""
    from training.config import load_config

    absent = str(tmp_path / "absent_adapter")
    command = "grpo" if "_grpo" in path.stem else "sft"
    assert load_config(command, path, ["--init_adapter", absent]).init_adapter == absent
