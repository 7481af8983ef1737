"""End-to-end training on real parts: Step-GRPO and SFT of SmolLM2-135M on the paper's step prompts, Step-GRPO of a
tiny random Qwen2.5-VL with a real image, and resume at the same global step with the same data order."""

from __future__ import annotations

import json
import math

import pytest

from training.config import load_config
from training.trainers import build_grpo_trainer, build_sft_trainer, train

from .conftest import CPU_GRPO_RECIPE, CPU_SFT_RECIPE

# Tiny settings: 2 prompts x G=2 per step, 12 new tokens, entropy bonus so an all-zero-advantage batch still moves.
FAST_GRPO = ["--max_steps", "2", "--num_generations", "2", "--per_device_train_batch_size", "4",
             "--max_completion_length", "12", "--step_types", "null", "--save_strategy", "no", "--beta", "0.04",
             "--entropy_coef", "0.001", "--learning_rate", "1e-4"]  # fmt: skip
COMPONENTS = ["rewards/ask_reward/mean", "rewards/route_reward/mean", "rewards/answer_reward/mean",
              "rewards/format_reward/mean", "format/violation_rate", "kl", "completions/mean_length"]  # fmt: skip


def snapshot(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def changed(before: dict, model) -> list[str]:
    import torch

    return [n for n, p in model.named_parameters() if n in before and not torch.equal(before[n], p.detach())]


def finite_logs(history: list[dict], key: str) -> list[float]:
    # TRL logs None for a component that applied to no row of a logging step
    return [h[key] for h in history if isinstance(h.get(key), int | float) and not math.isnan(h[key])]


def test_step_grpo_smollm2_two_steps(smollm2_dir, short_steps_file, tmp_path):
    cfg = load_config("grpo", CPU_GRPO_RECIPE, ["--train_file", str(short_steps_file), "--train_format", "steps",
                                                 "--output_dir", str(tmp_path), *FAST_GRPO])  # fmt: skip
    trainer = build_grpo_trainer(cfg)
    from training.constrained_rollouts import free_rollout_func

    assert trainer.rollout_func is free_rollout_func  # a text policy: each distinct prompt prefilled once
    before = snapshot(trainer.model)
    train(trainer, cfg)
    assert trainer.state.global_step == 2
    assert changed(before, trainer.model), "no parameter changed after 2 GRPO steps"
    history = trainer.state.log_history
    for key in COMPONENTS:  # every reward component, format violations, KL and completion length were logged
        assert finite_logs(history, key), f"{key} never logged with a value: {history}"


def test_sft_smollm2_two_steps(smollm2_dir, short_steps_file, tmp_path):
    cfg = load_config("sft", CPU_SFT_RECIPE, ["--train_file", str(short_steps_file), "--train_format", "steps",
                                               "--step_types", "null", "--max_steps", "2", "--output_dir", str(tmp_path),
                                               "--save_strategy", "no", "--learning_rate", "1e-4"])  # fmt: skip
    trainer = build_sft_trainer(cfg)
    before = snapshot(trainer.model)
    train(trainer, cfg)
    assert trainer.state.global_step == 2
    assert changed(before, trainer.model)
    losses = finite_logs(trainer.state.log_history, "loss")
    assert losses and all(loss > 0 for loss in losses)


def test_step_grpo_tiny_qwen2_5_vl_with_image(tiny_vl_dir, coco_image, tmp_path):
    from agent.protocol import final_messages, plan_messages
    from training.step_data import StepRecord

    kbs = [("Image KB", "captioned photos"), ("Text KB", "Wikipedia")]
    records = [
        StepRecord("coco-1", "plan", plan_messages("What animal is in this picture?", [], kbs, [coco_image]),
                   {"sub_question": "what animal is shown?", "kb": "Image KB"}, (coco_image,), ("Image KB", "Text KB")),
        StepRecord("coco-1", "final", final_messages("What animal is in this picture?", [("what?", "a cat")],
                                                     [coco_image]), {"answers": ["cat"]}, (coco_image,)),
    ]  # fmt: skip
    path = tmp_path / "vl_steps.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    cfg = load_config("grpo", CPU_GRPO_RECIPE, ["--model_name_or_path", tiny_vl_dir, "--train_file", str(path),
                                                 "--train_format", "steps", "--use_images", "true",
                                                 "--output_dir", str(tmp_path / "out"), *FAST_GRPO])  # fmt: skip
    trainer = build_grpo_trainer(cfg)
    assert "images" in trainer.train_dataset.column_names
    assert trainer.rollout_func is None  # a vision-language policy keeps TRL's own rollout
    before = snapshot(trainer.model)
    train(trainer, cfg)
    assert trainer.state.global_step == 2
    moved = changed(before, trainer.model)
    assert any("visual" in n for n in moved), "the vision tower got no update: the image did not reach the model"
    for key in COMPONENTS:
        assert finite_logs(trainer.state.log_history, key), key


@pytest.mark.slow  # ~1-3 min: two trainers, three steps and a checkpoint
def test_resume_continues_at_same_step_with_same_data(tiny_vl_dir, short_steps_file, tmp_path, monkeypatch):
    """Run 3 steps saving at step 2; a restarted run from checkpoint-2 sees the same prompts at step 3."""
    from training import rewards

    seen: list[tuple[int, str]] = []

    class Spy:
        __name__ = "spy_reward"

        def __call__(self, completions, **kw):
            seen.extend((kw["trainer_state"].global_step, f"{t}/{s}") for t, s in
                        zip(kw["trajectory_id"], kw["step_index"], strict=True))  # fmt: skip
            return [0.0] * len(completions)

    monkeypatch.setitem(rewards.REWARDS, "spy", lambda: Spy())
    args = ["--model_name_or_path", tiny_vl_dir, "--train_file", str(short_steps_file), "--train_format", "steps",
            *FAST_GRPO, "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "2",
            "--rewards", "[{name: spy}, {name: format, weight: 0.0}]"]  # fmt: skip
    cfg = load_config("grpo", CPU_GRPO_RECIPE, [*args, "--output_dir", str(tmp_path / "a")])
    train(build_grpo_trainer(cfg), cfg)
    uninterrupted = [x for x in seen if x[0] == 2]  # prompts scored during the third step (global_step 2 -> 3)
    seen.clear()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    assert checkpoint.is_dir()
    cfg_b = load_config("grpo", CPU_GRPO_RECIPE, [*args, "--output_dir", str(tmp_path / "b"),
                                                   "--resume_from_checkpoint", str(checkpoint)])  # fmt: skip
    trainer_b = build_grpo_trainer(cfg_b)
    train(trainer_b, cfg_b)
    assert trainer_b.state.global_step == 3
    assert {x[0] for x in seen} == {2}, f"resumed run re-did earlier steps: {seen}"
    assert sorted(seen) == sorted(uninterrupted)


def test_decision_weight_adds_the_decision_tokens_loss(smollm2_dir, short_steps_file, tmp_path):
    """The same batch and weights: w = 4 adds exactly 3x the decision tokens' loss to plain SFT's loss (w = 1)."""
    import torch

    from training.decision_loss import decision_mask

    args = ["--train_file", str(short_steps_file), "--train_format", "steps", "--step_types", "null",
            "--max_steps", "1", "--output_dir", str(tmp_path), "--save_strategy", "no", "--lora", "null",
            "--bf16", "false"]  # fmt: skip
    trainer = build_sft_trainer(load_config("sft", CPU_SFT_RECIPE, [*args, "--decision_weight", "4"]))
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(2)]))
    mask = decision_mask(batch["labels"], *trainer._tags)
    assert mask.sum() >= 2  # the plan record's first sub-question token and its KB name
    trainer.model.train()
    with torch.no_grad():
        weighted = trainer.compute_loss(trainer.model, dict(batch)).item()
        trainer.decision_weight = 1.0
        plain = trainer.compute_loss(trainer.model, dict(batch)).item()
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp = logits[:, :-1].log_softmax(-1).gather(-1, batch["labels"][:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    n = (batch["labels"][:, 1:] != -100).sum()
    decision_loss = -(logp * mask[:, 1:]).sum() / n
    assert weighted > plain
    assert weighted == pytest.approx(plain + 3 * decision_loss.item(), rel=1e-3)


def test_a_lora_run_writes_the_kb_names_its_plans_trained_on(smollm2_dir, short_steps_file, tmp_path):
    """`kbrouter_router.json` next to the adapter: what `agent.route_prior: auto` reads to tell its names from others."""
    from agent.backends.models import adapter_kb_names
    from training.step_data import load_step_records

    cfg = load_config("sft", CPU_SFT_RECIPE, ["--train_file", str(short_steps_file), "--train_format", "steps",
                                               "--step_types", "null", "--max_steps", "1", "--output_dir", str(tmp_path),
                                               "--save_strategy", "no", "--lora", "{r: 4, alpha: 8}"])  # fmt: skip
    train(build_sft_trainer(cfg), cfg)
    plans = [r for r in load_step_records(str(short_steps_file), "steps") if r.step_type == "plan"]
    assert plans and adapter_kb_names(tmp_path) == {n for r in plans for n in r.kb_names}
