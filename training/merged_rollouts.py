"""Step-GRPO rollouts sample from the LoRA policy with its adapter merged into the base weights.

Why: a peft LoRA layer runs its base matmul and then its own dropout, A, B and scale, at every one of the ~96 decode
steps of a rollout, for the 7 adapted layers of each block. Merged, each layer is one matmul. SmolLM2 with the chain's
adapter, 16 rows (4 prompts x 4) of 456 prompt tokens and 96 sampled tokens, prefilled once a prompt
(training/shared_prefill.py), on 2 AVX2 cores in float32: 50.5 s unmerged against 45.1 s merged (1.12x, stop 56).
TRL's own vLLM path merges and unmerges the adapter the same way (`merge_adapter`, `unmerge_adapter`) each time it
syncs weights.

What changes: nothing the loss sees. The samples come from the same distribution: the merged layer computes
W x + s B A x as (W + s B A) x, equal up to float rounding. After sampling the adapter is unmerged (W - s B A), which
restores W up to one rounding of each weight. Where the two would differ, the adapter stays unmerged:
- an active LoRA dropout (merged weights apply none, so the samples would come from another distribution);
- parameters sharded by DeepSpeed ZeRO-3 or FSDP (the caller says so), or a quantized base model;
- an adapter other than LoRA, or one merged already.
Off with `KBROUTER_MERGED_ROLLOUTS=0`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

OFF_ENV = "KBROUTER_MERGED_ROLLOUTS"


def can_merge(model) -> bool:  # noqa: ANN001 - a (peft-wrapped) causal LM
    """Whether sampling from `model` with its LoRA adapter merged gives the same distribution (module docstring)."""
    if os.environ.get(OFF_ENV, "1").strip() == "0" or not hasattr(model, "merge_adapter"):
        return False
    config = getattr(model, "active_peft_config", None)
    if config is None or getattr(config, "peft_type", None) != "LORA":  # PeftType is a str enum
        return False
    if getattr(model.get_base_model(), "hf_quantizer", None) is not None:  # merging into 4/8-bit weights loses bits
        return False
    import torch
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    if not layers or any(layer.merged for layer in layers):
        return False
    return not any(
        isinstance(drop, torch.nn.Dropout) and drop.p > 0 and drop.training
        for layer in layers
        for drop in layer.lora_dropout.values()
    )


@contextlib.contextmanager
def merged_lora(model, sharded: bool = False) -> Iterator[bool]:  # noqa: ANN001 - a (peft-wrapped) causal LM
    """Inside the block `model`'s LoRA adapter is merged where that changes nothing but speed (`can_merge`, and not
    `sharded`); it is unmerged on the way out, errors included. Yields whether it merged."""
    import torch

    merge = not sharded and can_merge(model)
    if merge:
        with torch.no_grad():
            model.merge_adapter()
    try:
        yield merge
    finally:
        if merge:
            with torch.no_grad():
                model.unmerge_adapter()
