"""Step-GRPO rollouts: each distinct prompt is prefilled once, not once per completion of its group.

A GRPO generation batch holds G copies of every prompt (TRL's `RepeatSampler`). `model.generate` prefills every row,
so G rows of ~450 identical tokens go through the model G times. On CPU the prefill is most of the rollout:
SmolLM2 + the shipped adapter, 16 rows (4 prompts x 4) of 450 tokens, took 30.1 s to prefill against 6.3 s for the 4
distinct rows, and 47.5 s to generate 90 tokens a row with its prefill (stop 53, 2-core AVX2, float32). vLLM does
this by itself (prefix caching); the transformers path does not.

`generate` prefills the distinct rows (all but each row's last token) into a `DynamicCache`, copies each cached row
to its duplicates (`Cache.batch_select_indices`), and hands the cache to `model.generate`, which then runs only the
last prompt token and the new ones (the documented prefix-cache use of `cache`, formerly `past_key_values`). Positions
are those `generate` itself gives (`_positions_as_generate`), so the rows see the same keys, values and positions as
before: the same distribution, the same random draws, equal up to float rounding.
Off with `KBROUTER_SHARED_PREFILL=0` (free Step-GRPO rollouts are then TRL's own again); a batch without duplicate
rows, or a vision-language model (its multimodal positions are its own), generates as before.
"""

from __future__ import annotations

import os

OFF_ENV = "KBROUTER_SHARED_PREFILL"


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "1").strip() != "0"


def generate(model, input_ids, attention_mask, **kwargs):  # noqa: ANN001, ANN201 - torch tensors in and out
    """`model.generate(input_ids=..., attention_mask=..., **kwargs)`, each distinct (row, mask) prefilled once."""
    import torch

    rows = torch.cat([input_ids, attention_mask], dim=1)
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    vision = getattr(model.config, "vision_config", None) is not None  # multimodal rope: positions of its own
    if (
        not enabled()
        or vision
        or unique.shape[0] == rows.shape[0]
        or input_ids.shape[1] < 2
        or {"cache", "past_key_values"} & kwargs.keys()
    ):
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    from transformers import DynamicCache

    width = input_ids.shape[1]
    ids, mask = unique[:, :width], unique[:, width:]
    prefix, prefix_mask = ids[:, :-1], mask[:, :-1]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prefix, attention_mask=prefix_mask, cache=cache, use_cache=True, logits_to_keep=1,
              **_positions_as_generate(model, prefix_mask))  # fmt: skip
    cache.batch_select_indices(inverse)
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, cache=cache, **kwargs)


def _positions_as_generate(model, mask) -> dict:  # noqa: ANN001 - a (peft-wrapped) causal LM and its prompt mask
    """`position_ids` as `generate` gives them: the mask's running count where the generating model's `forward` takes
    `position_ids` (then a left-padded row starts at 0), else none (the model counts from the cache)."""
    import inspect

    generating = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft delegates `generate`
    if "position_ids" not in inspect.signature(generating.forward).parameters:
        return {}
    return {"position_ids": (mask.long().cumsum(-1) - 1).clamp(min=0)}
