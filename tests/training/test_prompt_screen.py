"""`screen_prompts` (training/prompt_screen.py): Step-GRPO keeps the prompts whose rewards differ under the starting
policy, screens once, and a resumed run reuses the screen.

Real parts: SmolLM2-135M with a LoRA adapter inside a real `trl.GRPOTrainer` on the paper's step prompts; one test
runs the real rollouts and rewards, the others set each group's advantages by hand so the expected set is exact.
"""

from __future__ import annotations

import json

import pytest
import torch

from training import prompt_screen
from training.config import load_config
from training.prompt_screen import SCREEN_FILE, NoLivePrompts, fill_step, live_groups, screen, screen_prompts
from training.trainers import build_grpo_trainer, train

from .conftest import CPU_GRPO_RECIPE

FLAGS = ["--num_generations", "2", "--per_device_train_batch_size", "4", "--max_completion_length", "12",
         "--step_types", "null", "--save_strategy", "no", "--gradient_checkpointing", "false"]  # fmt: skip


def recipe(steps_file, output_dir, *args: str):
    flags = ["--train_file", str(steps_file), "--train_format", "steps", "--output_dir", str(output_dir)]
    return load_config("grpo", CPU_GRPO_RECIPE, [*flags, *FLAGS, *args])


def fake_scores(trainer, advantages_by_prompt: list[list[float]], calls: list):  # noqa: ANN001
    """Replace the trainer's generate-and-score with one returning each prompt's hand-set advantages, in call order."""
    queue = list(advantages_by_prompt)

    def generate_and_score(inputs):  # noqa: ANN001, ANN202
        calls.append(len(inputs))
        n = len(inputs) // trainer.num_generations
        groups, queue[:n] = queue[:n], []
        trainer._metrics["train"]["reward"].append(0.5)  # what TRL buffers on every call
        return {"advantages": torch.tensor([a for group in groups for a in group])}

    trainer._generate_and_score_completions = generate_and_score


def test_a_group_is_live_when_any_row_has_a_nonzero_advantage():
    adv = torch.tensor([0.0, 0.0, 0.5, -0.5, 1e-12, 0.0, 0.0, 2.0])
    assert live_groups(adv, 2) == [False, True, False, True]
    token_level = torch.tensor([[0.0, 0.0], [0.0, 0.1], [0.0, 0.0], [0.0, 0.0]])
    assert live_groups(token_level, 2) == [True, False]


def test_the_screen_keeps_live_prompts_and_a_resume_reuses_it(smollm2_dir, short_steps_file, tmp_path):
    cfg = recipe(short_steps_file, tmp_path)
    trainer = build_grpo_trainer(cfg)
    assert len(trainer.train_dataset) == 2
    first_prompt = trainer.train_dataset[1]["prompt"]
    calls: list = []
    fake_scores(trainer, [[0.0, 0.0], [0.7, -0.7]], calls)
    record = screen_prompts(trainer, tmp_path)
    assert record["kept"] == [1] and record["total"] == 2 and record["generations"] == 2
    assert calls == [4]  # both prompts in one call (generation batch 4 = 2 prompts x G 2), each G times
    # one live prompt, two a step: repeated so the step is whole (TRL's sampler drops an incomplete batch)
    assert trainer.train_dataset["prompt"] == [first_prompt, first_prompt]
    assert not trainer._metrics["train"]  # the screen's buffered metrics are not the first step's
    assert json.loads((tmp_path / SCREEN_FILE).read_text())["kept"] == [1]

    again = build_grpo_trainer(cfg)  # a resumed run: same dataset, the file is reused, nothing is sampled
    calls.clear()
    fake_scores(again, [], calls)
    assert screen_prompts(again, tmp_path)["kept"] == [1] and calls == []
    assert again.train_dataset["prompt"] == [first_prompt, first_prompt]


def test_a_short_screen_fills_one_step_and_a_long_one_is_kept_whole():
    assert fill_step([3], 4) == [3, 3, 3, 3] and fill_step([1, 5], 3) == [1, 5, 1]
    assert fill_step([0, 2, 4, 6, 8], 4) == [0, 2, 4, 6, 8]


def test_no_live_prompt_is_one_clear_error(smollm2_dir, short_steps_file, tmp_path):
    trainer = build_grpo_trainer(recipe(short_steps_file, tmp_path))
    fake_scores(trainer, [[0.0, 0.0], [0.0, 0.0]], [])
    with pytest.raises(NoLivePrompts, match=r"none of the 2 train prompts.*temperature.*screen_prompts: false"):
        screen_prompts(trainer, tmp_path)


def test_the_real_screen_keeps_exactly_the_groups_whose_advantages_differ(smollm2_dir, short_steps_file, tmp_path):
    trainer = build_grpo_trainer(recipe(short_steps_file, tmp_path, "--temperature", "1.0"))
    real = trainer._generate_and_score_completions
    seen: list[torch.Tensor] = []

    def recording(inputs):  # noqa: ANN001, ANN202
        out = real(inputs)
        seen.append(out["advantages"].detach().clone())
        return out

    trainer._generate_and_score_completions = recording
    was = trainer.model.training
    record = screen(trainer, prompts_per_call=1)
    assert len(seen) == 2 and all(a.shape == (2,) for a in seen)  # one prompt a call, its G = 2 rows
    assert record["kept"] == [i for i, a in enumerate(seen) if bool((a.abs() > 1e-8).any())]
    assert trainer.model.training == was and not any(trainer._metrics[m] for m in trainer._metrics)


def test_training_runs_on_the_screened_prompts(smollm2_dir, short_steps_file, tmp_path, monkeypatch):
    cfg = recipe(short_steps_file, tmp_path, "--screen_prompts", "true", "--max_steps", "1")
    assert cfg.screen_prompts is True
    trainer = build_grpo_trainer(cfg)
    monkeypatch.setattr(prompt_screen, "screen", lambda t: {"kept": [0], "total": 2, "generations": 2, "seconds": 0})
    train(trainer, cfg)
    assert trainer.state.global_step == 1 and len(trainer.train_dataset) == 2  # prompt 0, twice: one whole step
    assert json.loads((tmp_path / SCREEN_FILE).read_text())["kept"] == [0]
    assert sum("reward" in h for h in trainer.state.log_history) == 1  # the step's own log, not the screen's
