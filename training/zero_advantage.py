"""Step-GRPO skips the rows whose advantage is zero before the loss's forward and backward (`skip_zero_advantage`).

Why: a group whose G completions all earn the same reward gives each of them advantage 0. With `beta: 0`, every
GRPO-family loss term is a product with the advantage, so such a row adds exactly nothing to the gradient, yet TRL
still runs its forward and backward. In the stop-47 chain, 59 % (stage 2) and 67 % (stage 2c) of the groups had a
zero reward std (TRL's `frac_reward_zero_std`): most of each step's training compute moved nothing.

The skip is exact up to float rounding. A micro-batch loses its zero rows and the loss is rescaled, so it is the same
number as over the full micro-batch: `grpo`, `sapo`, `dr_grpo` and `luspo` average over rows (× kept/all rows),
`bnpo` over the micro-batch's tokens (× kept/all tokens), and `dapo`, `cispo` and `vespo` divide by the generation
batch's token count, which the subset leaves as it is. A micro-batch with no row left returns a zero loss with no
graph. TRL's per-micro-batch logs (entropy, clip ratios) then cover the kept rows only. The share skipped is logged
as `frac_rows_skipped_zero_advantage`.

It is off, with the reason logged once, wherever a zero row still counts: a KL term (`beta > 0`), an entropy bonus
or entropy mask (batch-wide statistics), an MoE auxiliary loss, image inputs (their tensors are not one row per
completion), or more than one process (DDP and DeepSpeed reduce gradients in every backward, so every rank must run
one).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

ZERO = 1e-8  # |advantage| below this counts as zero: equal rewards leave ~1e-12 after TRL's (r - mean) / (std + 1e-4)
ROW_MEAN_LOSSES = frozenset({"grpo", "sapo", "dr_grpo", "luspo"})
TOKEN_MEAN_LOSSES = frozenset({"bnpo"})
BATCH_NORMALISED_LOSSES = frozenset({"dapo", "cispo", "vespo"})


def skip_blocker(trainer) -> str | None:  # noqa: ANN001 - a trl.GRPOTrainer
    """Why zero-advantage rows must be kept for this trainer, or None when skipping them is exact."""
    if trainer.beta != 0.0:
        return f"beta is {trainer.beta}: the KL term trains zero-advantage rows too"
    if getattr(trainer, "_entropy_bonus_enabled", False):
        return "an entropy bonus trains zero-advantage rows too"
    if getattr(trainer, "top_entropy_quantile", 1.0) < 1.0:
        return "top_entropy_quantile < 1 masks tokens by a quantile over the whole micro-batch"
    if getattr(trainer, "aux_loss_enabled", False):
        return "the MoE auxiliary loss is over every row"
    if trainer.accelerator.num_processes > 1:
        return f"{trainer.accelerator.num_processes} processes: every rank must run each backward (DDP, DeepSpeed)"
    if trainer.loss_type not in ROW_MEAN_LOSSES | TOKEN_MEAN_LOSSES | BATCH_NORMALISED_LOSSES:
        return f"loss_type {trainer.loss_type!r} has no known normalisation"
    return None


def kept_rows(advantages: torch.Tensor) -> torch.Tensor:
    """Bool (B,): the rows with any non-zero advantage (advantages are (B,) or, in subclasses, (B, T))."""
    nonzero = advantages.abs() > ZERO
    return nonzero if nonzero.dim() == 1 else nonzero.any(dim=-1)


def select_rows(inputs: dict, keep: torch.Tensor) -> dict:
    """The micro-batch with only the `keep` rows: every tensor with one row per completion is indexed; the rest (the
    generation batch's `num_items_in_batch`, non-tensors) pass as they are."""
    n = keep.numel()
    return {
        key: value[keep] if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n else value
        for key, value in inputs.items()
    }


def loss_scale(loss_type: str, inputs: dict, keep: torch.Tensor) -> float:
    """What turns the kept rows' loss into the full micro-batch's (see the module docstring)."""
    if loss_type in ROW_MEAN_LOSSES:
        return int(keep.sum()) / keep.numel()
    if loss_type in TOKEN_MEAN_LOSSES:
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        return float(mask[keep].sum().clamp(min=1.0) / mask.sum().clamp(min=1.0))
    return 1.0


class ZeroAdvantageSkip:
    """Mixin for `trl.GRPOTrainer` subclasses: `_compute_loss` over the rows with a non-zero advantage only."""

    _skip_checked: bool = False
    _skip_reason: str | None = None

    def _skip_allowed(self, inputs: dict) -> bool:
        if not self._skip_checked:
            self._skip_checked = True
            self._skip_reason = skip_blocker(self)
            if self._skip_reason:
                logger.info("skip_zero_advantage off: %s", self._skip_reason)
        if self._skip_reason or not self.model.training:
            return False
        return "pixel_values" not in inputs  # image tensors are per image, not per completion

    def _compute_loss(self, model, inputs):  # noqa: ANN001 - TRL's signature
        if not self._skip_allowed(inputs):
            return super()._compute_loss(model, inputs)
        keep = kept_rows(inputs["advantages"])
        kept = int(keep.sum())
        self._metrics["train"]["frac_rows_skipped_zero_advantage"].append(1.0 - kept / keep.numel())
        if kept == keep.numel():
            return super()._compute_loss(model, inputs)
        if kept == 0:
            device = inputs["completion_ids"].device
            return torch.zeros((), device=device, requires_grad=True)  # backward adds nothing to any parameter
        loss = super()._compute_loss(model, select_rows(inputs, keep))
        return loss * loss_scale(self.loss_type, inputs, keep)


def with_zero_advantage_skip(trainer_cls: type) -> type:
    """`trainer_cls` (a `trl.GRPOTrainer` or subclass) with `ZeroAdvantageSkip` in front of it."""
    return type(trainer_cls.__name__, (ZeroAdvantageSkip, trainer_cls), {"__doc__": trainer_cls.__doc__})
