"""Decision-weighted SFT: the few tokens where a plan step decides weigh more in the loss.

A plan target is ~70 tokens, and nearly all of them copy the question (think, sub-question). The two decisions, search
or stop (the first token of the sub-question: `None` or text) and which KB (the `<ret>` content), are 3-6 tokens.
Measured on the shipped recipe's stage 1 (117 steps, token accuracy 0.97): teacher-forced, the KB token stayed near
uniform (log-prob -1.0 to -2.5 for each of 5 KBs) even on training records, so the router copied well and routed by
its prior. `decision_weight: w` multiplies the loss of those tokens by w (w = 1: plain SFT).

It subclasses `trl.SFTTrainer` as TRL asks (its `compute_loss_func` is deprecated): TRL's own loss and metrics are
computed first, and the extra (w - 1) x decision-token loss is added from the same forward's per-token log-probs
(TRL's fused LM head builds no logits; a forward hook catches its output).
"""

from __future__ import annotations

import torch
from trl import SFTTrainer

from agent.protocol.tags import RET, SUB_QUESTION


def _find(row: list[int], pattern: list[int], start: int = 0) -> int:
    """Index just after the first occurrence of `pattern` in `row` at or after `start`; -1 when absent."""
    n = len(pattern)
    for i in range(start, len(row) - n + 1):
        if row[i : i + n] == pattern:
            return i + n
    return -1


def decision_mask(
    labels: torch.Tensor, ask_open: list[int], ret_open: list[int], ret_close: list[int]
) -> torch.Tensor:
    """1.0 on the label tokens that decide: the first sub-question token and the `<ret>` content; else 0.

    Only trained positions (label != -100) are searched, so tags in the prompt never match.
    """
    mask = torch.zeros(labels.shape, dtype=torch.float32)
    for b, row in enumerate(labels.tolist()):
        first = next((i for i, t in enumerate(row) if t != -100), len(row))
        ask = _find(row, ask_open, first)
        if 0 <= ask < len(row):
            mask[b, ask] = 1.0
        start = _find(row, ret_open, first)
        if start < 0:
            continue
        end = _find(row, ret_close, start)
        end = len(row) if end < 0 else end - len(ret_close)
        mask[b, start:end] = 1.0
    return mask * (labels != -100)


class DecisionWeightedSFTTrainer(SFTTrainer):
    """`SFTTrainer` whose loss weighs the plan's decision tokens `decision_weight` times (see the module docstring)."""

    def __init__(self, *args, decision_weight: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        tok = getattr(self.processing_class, "tokenizer", self.processing_class)
        ids = lambda s: tok(s, add_special_tokens=False).input_ids  # noqa: E731
        self.decision_weight = float(decision_weight)
        self._tags = (ids(f"<{SUB_QUESTION}>"), ids(f"<{RET}>"), ids(f"</{RET}>"))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001
        if self.decision_weight == 1.0 or not model.training or return_outputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # TRL's fused LM head returns per-token log-probs but no logits; catch that forward's output (same graph)
        caught: list = []
        handle = model.register_forward_hook(lambda _m, _a, out: caught.append(out))
        try:
            loss = super().compute_loss(model, inputs, False, num_items_in_batch)
        finally:
            handle.remove()
        out = caught[0]
        # log_probs[:, t] scores labels[:, t + 1] (the head shifts by one)
        mask = decision_mask(inputs["labels"], *self._tags)[:, 1:].to(out.log_probs.device)
        n = out.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        extra = -(out.log_probs * mask).sum() / torch.as_tensor(n).clamp(min=1)
        return loss + (self.decision_weight - 1.0) * extra
