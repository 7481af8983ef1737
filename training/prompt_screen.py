"""Step-GRPO trains only on the prompts whose rewards differ under the starting policy (`screen_prompts`).

Why: a group whose G completions all earn the same reward has advantage 0 everywhere and moves nothing. In the
stop-52 chain, `frac_reward_zero_std` averaged 0.63 (stage 2) and 0.73 (stage 2c), and 8 of 2c's 32 steps had no
live group at all: about one prompt a step taught anything. DAPO's dynamic sampling refills each batch with live groups
as it trains. This is the same filter applied once, before training: each train prompt is rolled out G times by the
trainer's own generate-and-score path (its sampling, grammars, rewards and format gate), and only the prompts with
any non-zero advantage stay. The training steps then draw from live prompts only, repeating them over epochs where the
steps outnumber them.

The kept prompts are written to `<output_dir>/prompt_screen.json` so a resumed run trains on the same dataset
without screening again. The screen's own samples are not trained on, and its metrics are not logged as a step's.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from pathlib import Path

import torch

from training.zero_advantage import ZERO

logger = logging.getLogger(__name__)

SCREEN_FILE = "prompt_screen.json"


class NoLivePrompts(ValueError):
    """Every screened prompt gave its G completions the same reward: Step-GRPO would have nothing to learn from."""


def live_groups(advantages: torch.Tensor, generations: int) -> list[bool]:
    """For each group of `generations` consecutive rows, whether any row has a non-zero advantage."""
    per_row = advantages.abs() > ZERO
    if per_row.dim() > 1:  # token-level advantages
        per_row = per_row.any(dim=-1)
    return per_row.view(-1, generations).any(dim=1).tolist()


def _clear_logs(trainer) -> None:  # noqa: ANN001 - a trl.GRPOTrainer
    """Drop what the screen's generate-and-score calls buffered, so the first training step logs only itself."""
    for buffers in trainer._metrics.values():
        buffers.clear()
    for value in trainer._logs.values():
        value.clear()


def screen(trainer, prompts_per_call: int | None = None) -> dict:  # noqa: ANN001 - a trl.GRPOTrainer
    """Roll out every train prompt G times; return {kept, total, generations, seconds} (kept: dataset indices)."""
    dataset = trainer.train_dataset
    g = trainer.num_generations
    per_call = prompts_per_call or prompts_per_step(trainer)
    was_training = trainer.model.training
    trainer.model.train()  # TRL groups by `num_generations` (not the eval count) and samples as in training
    t0 = time.perf_counter()
    kept: list[int] = []
    try:
        for start in range(0, len(dataset), per_call):
            rows = [dataset[i] for i in range(start, min(start + per_call, len(dataset)))]
            out = trainer._generate_and_score_completions([row for row in rows for _ in range(g)])
            kept += [start + j for j, live in enumerate(live_groups(out["advantages"], g)) if live]
    finally:
        trainer.model.train(was_training)
        _clear_logs(trainer)
    return {"kept": kept, "total": len(dataset), "generations": g, "seconds": round(time.perf_counter() - t0, 1)}


def screen_prompts(trainer, output_dir: str | Path) -> dict:  # noqa: ANN001 - a trl.GRPOTrainer
    """Keep only the live train prompts in `trainer.train_dataset`; reuse `<output_dir>/prompt_screen.json` when it
    screened this same dataset (a resumed run). Returns the screen's record."""
    if trainer.accelerator.num_processes > 1:
        raise ValueError("screen_prompts runs on one process: each rank would screen and keep a different set. "
                         "Screen on one process first (its prompt_screen.json is then reused), or turn it off.")  # fmt: skip
    path = Path(output_dir) / SCREEN_FILE
    total = len(trainer.train_dataset)
    record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if record and record.get("total") == total and record.get("generations") == trainer.num_generations:
        logger.info("prompt screen: reusing %s (%d of %d prompts live)", path, len(record["kept"]), total)
    else:
        record = screen(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record) + "\n", encoding="utf-8")
        logger.info("prompt screen: %d of %d prompts live (G = %d, %.0f s); written to %s",
                    len(record["kept"]), total, record["generations"], record["seconds"], path)  # fmt: skip
    if not record["kept"]:
        raise NoLivePrompts(
            f"screen_prompts: none of the {total} train prompts got rewards that differ over {trainer.num_generations} "
            f"samples of the starting policy (it is sure of every one), so Step-GRPO has no gradient. Raise "
            f"`temperature` or `num_generations`, train on harder prompts, or set `screen_prompts: false`. ({path})"
        )
    trainer.train_dataset = trainer.train_dataset.select(fill_step(record["kept"], prompts_per_step(trainer)))
    _log_kept(trainer.train_dataset)
    return record


def prompts_per_step(trainer) -> int:  # noqa: ANN001 - a trl.GRPOTrainer
    return max(1, trainer.args.generation_batch_size // trainer.num_generations)


def fill_step(kept: list[int], per_step: int) -> list[int]:
    """`kept`, repeated in order up to `per_step` prompts when shorter: TRL's sampler drops an incomplete batch, so
    fewer live prompts than one step takes would train no step at all."""
    return [kept[i % len(kept)] for i in range(per_step)] if len(kept) < per_step else list(kept)


def _log_kept(dataset) -> None:  # noqa: ANN001 - a datasets.Dataset
    if "step_type" in dataset.column_names:
        logger.info("prompt screen: training on %s", dict(collections.Counter(dataset["step_type"])))
