"""Resume picks the newest complete checkpoint: a half-written newer one (killed while saving) is skipped. Fake
checkpoint folders, no model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from training.trainers import checkpoint_problems, resume_checkpoint


def _checkpoint(root: Path, step: int) -> Path:
    """A checkpoint folder as the Trainer writes one: weights, optimizer/scheduler/RNG archives, then the state."""
    import torch
    from safetensors.numpy import save_file

    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    save_file({"lora_A": np.ones((4, 8), dtype=np.float32)}, str(path / "adapter_model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"step": step}, path / name)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def _cfg(output_dir: Path, value: str = "true") -> SimpleNamespace:
    return SimpleNamespace(resume_from_checkpoint=value, output_dir=str(output_dir))


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda p: (p / "trainer_state.json").unlink(), "no trainer_state.json"),
        (lambda p: (p / "trainer_state.json").write_text('{"global_st'), "trainer_state.json is unreadable"),
        (lambda p: _cut(p / "adapter_model.safetensors", 20), "adapter_model.safetensors is truncated"),
        (lambda p: _cut(p / "optimizer.pt", 30), "optimizer.pt is truncated"),
        (lambda p: (p / "adapter_model.safetensors").unlink(), "no weights"),
    ],
)
def test_a_half_written_latest_checkpoint_falls_back_to_the_newest_complete_one(
    tmp_path: Path, damage, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    _checkpoint(tmp_path, 10)
    assert checkpoint_problems(tmp_path / "checkpoint-10") == []
    latest = _checkpoint(tmp_path, 20)
    damage(latest)
    assert any(problem in p for p in checkpoint_problems(latest)), checkpoint_problems(latest)
    assert resume_checkpoint(_cfg(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert "skipping incomplete checkpoint" in caplog.text and problem in caplog.text
    # named explicitly, the incomplete one is refused with the alternative
    with pytest.raises(ValueError, match=rf"{latest} is incomplete \(.*{problem}.*\); resume from .*checkpoint-10"):
        resume_checkpoint(_cfg(tmp_path, str(latest)))


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_the_newest_complete_checkpoint_wins_and_none_means_from_scratch(tmp_path: Path) -> None:
    assert resume_checkpoint(_cfg(tmp_path)) is None
    _checkpoint(tmp_path, 9)
    _checkpoint(tmp_path, 100)  # numeric order, not string order
    assert resume_checkpoint(_cfg(tmp_path)) == str(tmp_path / "checkpoint-100")
    assert resume_checkpoint(_cfg(tmp_path, "false")) is None


def test_a_checkpoint_at_the_last_step_is_finished_not_trained_on(tmp_path: Path) -> None:
    # Trainer.train resumed at global_step == max_steps trains one step more (chaos_kill9: 7 steps for max_steps 6)
    import json

    from training.trainers import finished_at

    ckpt = tmp_path / "checkpoint-6"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 6, "max_steps": 6}))
    assert finished_at(ckpt, 6) == 6
    assert finished_at(ckpt, -1) == 6  # epoch-based run: the step count it had planned
    assert finished_at(ckpt, 10) is None  # the recipe now asks for more steps: train on
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 5, "max_steps": 6}))
    assert finished_at(ckpt, -1) is None
