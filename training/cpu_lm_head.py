"""On CPU, TRL's fused LM head scores every position; make it score only the positions that have a label.

TRL's SFT and GRPO trainers compute the loss through `trl.trainer.utils.add_fused_lm_head`: the backbone's hidden
states go through the LM head in tiles and come back as per-token log-probs. On CUDA/XPU it projects only the
positions whose label is not -100 (`compact`); elsewhere it projects all of them, because on Neuron/XLA a row count
that changes every batch recompiles the graph. A CPU recompiles nothing, so there the full projection is pure waste:
a router SFT row is ~450 prompt tokens and ~70-250 target tokens, and SmolLM2's head (49,152 x 576, float32) over all
of them costs as much as the rest of the step. Measured on a 2-core AMD EPYC with AVX2 (stop 53, SmolLM2-135M + LoRA
r16 all-linear, batch 8 x 512, 120 labelled tokens a row, float32): one forward + backward took 37.9 s scoring every
position and 21.5 s scoring the labelled ones, with the same loss; `benchmarks/cpu_train_speed.py --compare lm_head`
times whole training steps.

Both paths give the same loss and gradients (the unlabelled positions are masked to 0 either way); only the work
differs. TRL makes the choice by calling `trl.trainer.utils._use_triton(device)`, so `install` rebinds that one name
to also answer True for a CPU: the Triton kernels themselves are picked by `trl.kernels.chunked_logprob`'s own
binding, which is untouched, so a CPU still runs TRL's PyTorch tiles. Off with `KBROUTER_COMPACT_LM_HEAD=0`.
"""

from __future__ import annotations

import logging
import os

import torch
import trl.trainer.utils as trl_utils

logger = logging.getLogger(__name__)

OFF_ENV = "KBROUTER_COMPACT_LM_HEAD"
_TRL_CHOICE = getattr(trl_utils, "_use_triton", None)  # TRL's own rule, kept to restore and to defer to


def compact_on(device: torch.device) -> bool:
    """Score only labelled positions on `device`: always on a CPU, else as TRL decides."""
    return device.type == "cpu" or bool(_TRL_CHOICE and _TRL_CHOICE(device))


def install(enabled: bool | None = None) -> bool:
    """Make TRL's fused LM head compact on CPU (or restore TRL's rule with `enabled=False`); whether it is on now.

    `enabled=None` reads `KBROUTER_COMPACT_LM_HEAD` (on unless it is `0`). A TRL without the hook is left alone, with
    a warning: training still runs, at TRL's speed.
    """
    if enabled is None:
        enabled = os.environ.get(OFF_ENV, "1").strip() != "0"
    if _TRL_CHOICE is None:
        logger.warning("this TRL has no `trl.trainer.utils._use_triton`: its fused LM head runs as TRL ships it")
        return False
    trl_utils._use_triton = compact_on if enabled else _TRL_CHOICE
    return enabled
