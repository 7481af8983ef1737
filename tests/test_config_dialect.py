"""Every config loader reads YAML the same way (`retrievers.config_file`): `no`/`off` stay strings and `1e-4` is a
float in synth recipes, eval configs, run/ask/demo configs, KB files and training recipes; each takes `--a.b value`
overrides and answers the old `a.b=value` form with the new one."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from retrievers.config_file import yaml_loads

ROOT = Path(__file__).resolve().parents[1]
OLD_FORM = r"is the old `key=value` form; write `--agent\.max_steps 2`"


def _run_args(config: Path | None, overrides: list[str] = ()) -> argparse.Namespace:
    from agent.cli import add_common_args

    ap = argparse.ArgumentParser()
    add_common_args(ap, kb_default=None)
    args, args.overrides = ap.parse_known_args([*(["--config", str(config)] if config else []), *overrides])
    return args


def test_synth(tmp_path):
    from data_synthesis.config import load_config

    path = tmp_path / "synth.yaml"
    path.write_text("temperature: 1e-4\nlog_level: no\n")
    cfg = load_config(path)
    assert (cfg.temperature, cfg.log_level) == (1e-4, "no") and type(cfg.temperature) is float
    assert load_config(path, ["--teacher.dtype", "no", "--top_p", "5e-1"]).top_p == 0.5
    with pytest.raises(ValueError, match=OLD_FORM):
        load_config(path, ["agent.max_steps=2"])


def test_eval(tmp_path):
    from eval.config import load_eval_config

    path = tmp_path / "eval.yaml"
    path.write_text("name: no\nagent: {temperature: 1e-4, constrained: off}\ndatasets: [{name: toy}]\n")
    cfg = load_eval_config(path)
    assert cfg.name == "no" and cfg.agent_config().temperature == 1e-4 and cfg.agent_config().constrained == "off"
    assert load_eval_config(path, ["--agent.temperature", "2e-1"]).agent_config().temperature == 0.2
    with pytest.raises(ValueError, match=OLD_FORM):
        load_eval_config(path, ["agent.max_steps=2"])


def test_run_ask_demo(tmp_path):
    from agent.cli import resolve_configs

    (tmp_path / "kbs").mkdir()
    path = tmp_path / "kbs" / "run.yaml"
    path.write_text("kb: ../demo.yaml\nagent: {temperature: 1e-4, constrained: off}\n")
    _, agent, kb = resolve_configs(_run_args(path))
    assert (agent.temperature, agent.constrained) == (1e-4, "off")
    assert kb == str((tmp_path / "demo.yaml").resolve())  # against the YAML's folder, not the working directory
    _, agent, _ = resolve_configs(_run_args(path, ["--agent.max_steps", "2", "--agent.temperature=5e-1"]))
    assert (agent.max_steps, agent.temperature) == (2, 0.5)
    with pytest.raises(ValueError, match=OLD_FORM):
        resolve_configs(_run_args(path, ["agent.max_steps=2"]))
    with pytest.raises(ValueError, match=rf"unknown key 'max_stepz' in {path}: agent; did you mean \['max_steps'"):
        resolve_configs(_run_args(path, ["--agent.max_stepz", "2"]))


def test_kb_files(tmp_path):
    from retrievers.config import load_kb_configs

    (tmp_path / "c.jsonl").write_text('{"id": "1", "contents": "x"}\n')
    path = tmp_path / "kb.yaml"
    path.write_text(
        "knowledge_bases:\n  - {name: t, kind: text, corpus: c.jsonl, description: no, options: {x: 1e-4}}\n"
    )
    (cfg,) = load_kb_configs(path)
    assert (cfg.description, cfg.options["x"]) == ("no", 1e-4)
    path.write_text("knowledge_bases:\n  - {name: t, kind: text, corpus: c.jsonl, mmap: no}\n")
    with pytest.raises(
        ValueError, match=r"`mmap` must be true or false \(unquoted; `yes`/`no` are strings\), got 'no'"
    ):
        load_kb_configs(path)


def test_training_uses_the_same_dialect():
    import training.config
    from training.config import load_config

    assert training.config._yaml_load is yaml_loads  # the recipe file and its `--key value` overrides
    cfg = load_config("sft", ROOT / "configs" / "train" / "smollm2_sft_cpu.yaml", ["--learning_rate", "1e-4"])
    assert cfg.learning_rate == 1e-4 and type(cfg.learning_rate) is float
