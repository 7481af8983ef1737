"""`skip_zero_advantage` (training/zero_advantage.py): the same gradient as TRL's loss over every row, from fewer rows.

Real parts: SmolLM2-135M with its LoRA adapter inside a real `trl.GRPOTrainer`; the micro-batch is real token ids of
the paper's step prompts with hand-set advantages, so each case is exact and fast (no sampling).
"""

from __future__ import annotations

import pytest
import torch

from training.config import load_config
from training.trainers import build_grpo_trainer, train
from training.zero_advantage import ZeroAdvantageSkip, kept_rows, select_rows

from .conftest import CPU_GRPO_RECIPE

EXACT = ["--beta", "0", "--entropy_coef", "0", "--gradient_checkpointing", "false", "--num_generations", "2",
         "--per_device_train_batch_size", "4", "--max_completion_length", "12", "--step_types", "null",
         "--save_strategy", "no"]  # fmt: skip


def recipe(steps_file, output_dir, *args: str):
    """The CPU smoke recipe on `steps_file`, with `args` (default EXACT: beta 0, no entropy bonus) as its flags."""
    flags = ["--train_file", str(steps_file), "--train_format", "steps", "--output_dir", str(output_dir)]
    return load_config("grpo", CPU_GRPO_RECIPE, [*flags, *(args or EXACT)])


@pytest.fixture(scope="module")
def trainer(smollm2_dir, short_steps_file, tmp_path_factory):
    cfg = recipe(short_steps_file, tmp_path_factory.mktemp("grpo"))
    trainer = build_grpo_trainer(cfg)
    assert isinstance(trainer, ZeroAdvantageSkip)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def micro_batch(trainer, advantages: list[float]) -> dict:
    """Four rows of real prompt and completion ids, completions of different lengths (right-padded as TRL pads)."""
    tok = trainer.processing_class
    prompts = ["Which KB holds tables?", "Who directed The French Connection?", "Is it true that 2 + 2 = 4?",
               "What is shown in the image?"]  # fmt: skip
    completions = ["<think>tables</think>", "<answer>William Friedkin</answer>", "<answer>yes</answer>",
                   "<think>a cat on a mat, two dogs</think>"]  # fmt: skip
    p = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    c = tok(completions, return_tensors="pt", padding=True, padding_side="right")
    return {
        "prompt_ids": p["input_ids"], "prompt_mask": p["attention_mask"],
        "completion_ids": c["input_ids"], "completion_mask": c["attention_mask"],
        "advantages": torch.tensor(advantages), "num_items_in_batch": c["attention_mask"].sum(),
    }  # fmt: skip


def gradient(trainer, loss_fn, inputs: dict) -> tuple[float, dict]:
    trainer.model.zero_grad(set_to_none=True)
    loss = loss_fn(trainer.model, inputs)
    loss.backward()
    loss = loss.detach()
    grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in trainer.model.named_parameters() if p.requires_grad}  # fmt: skip
    return loss.item(), grads


def full_loss(trainer):
    base = type(trainer).__mro__[2]  # the trainer class the mixin was put in front of
    return lambda model, inputs: base._compute_loss(trainer, model, inputs)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("advantages", [[0.0, 1.2, 0.0, -0.7], [0.9, -0.9, 1e-12, 0.0], [0.0, 0.0, 0.0, 0.0]])
def test_skipping_gives_the_full_loss_and_gradient(trainer, loss_type, advantages):
    trainer.loss_type = loss_type
    inputs = micro_batch(trainer, advantages)
    rows = []
    forward = trainer._get_per_token_logps_and_entropies

    def counting(model, ids, *args, **kwargs):  # noqa: ANN001, ANN202 - TRL's signature
        rows.append(len(ids))
        return forward(model, ids, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counting
    try:
        skipped_loss, skipped = gradient(trainer, trainer._compute_loss, inputs)
        full_rows = len(rows)
        full, grads = gradient(trainer, full_loss(trainer), inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies
    nonzero = sum(abs(a) > 1e-8 for a in advantages)
    assert rows[:full_rows] == ([nonzero] if nonzero else []), "the zero-advantage rows went through the forward"
    assert rows[full_rows:] == [4]
    assert skipped_loss == pytest.approx(full, abs=1e-6)
    assert any(g.abs().sum() > 0 for g in grads.values()) == bool(nonzero)
    for name, g in grads.items():  # a smaller batch sums in another order: float rounding, relative to the norm
        assert float((skipped[name] - g).norm()) <= 1e-4 * float(g.norm()) + 1e-9, name


def test_rows_are_kept_by_any_nonzero_advantage_and_scalars_pass_through():
    keep = kept_rows(torch.tensor([[0.0, 0.0], [0.0, 0.3], [1e-13, 0.0]]))
    assert keep.tolist() == [False, True, False]
    inputs = {"advantages": torch.tensor([[0.0, 0.0], [0.0, 0.3], [1e-13, 0.0]]), "num_items_in_batch": torch.tensor(7),
              "completion_ids": torch.arange(6).view(3, 2), "note": "kept"}  # fmt: skip
    sub = select_rows(inputs, keep)
    assert sub["completion_ids"].tolist() == [[2, 3]] and int(sub["num_items_in_batch"]) == 7 and sub["note"] == "kept"


def test_a_kl_term_keeps_every_row(smollm2_dir, short_steps_file, tmp_path, caplog):
    cfg = recipe(short_steps_file, tmp_path, "--max_steps", "1", *EXACT, "--beta", "0.04")  # the last flag wins
    assert cfg.beta == 0.04
    trainer = build_grpo_trainer(cfg)
    with caplog.at_level("INFO", logger="training.zero_advantage"):
        train(trainer, cfg)
    assert "skip_zero_advantage off: beta is 0.04" in caplog.text
    assert not any("frac_rows_skipped_zero_advantage" in h for h in trainer.state.log_history)


def test_training_with_the_skip_logs_the_share_it_skipped(smollm2_dir, short_steps_file, tmp_path):
    cfg = recipe(short_steps_file, tmp_path, "--max_steps", "2", *EXACT)
    trainer = build_grpo_trainer(cfg)
    train(trainer, cfg)
    assert trainer.state.global_step == 2
    shares = [h["frac_rows_skipped_zero_advantage"] for h in trainer.state.log_history
              if "frac_rows_skipped_zero_advantage" in h]  # fmt: skip
    zero_std = [h["frac_reward_zero_std"] for h in trainer.state.log_history if "frac_reward_zero_std" in h]
    assert len(shares) == 2 and all(0.0 <= s <= 1.0 for s in shares)
    # every row of a zero-std group has advantage 0, and only those (G = 2: the two rows differ or both are 0)
    assert shares == pytest.approx(zero_std)
