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

Training forwards have the same waste, with gradients: every router prompt opens with the same system text (192
tokens of a ~390-token plan record), and the log-prob forwards of Step-GRPO hold G copies of each whole prompt.
`share_training_prefixes` wraps a text backbone's `forward` so that a batch's rows run their longest shared prefix
once: it picks the prefix length P that saves the most tokens, runs the U distinct P-token prefixes (ids, mask and
positions all equal) as U rows into a `DynamicCache`, copies cache rows and hidden states to the B rows (indexing,
so gradients flow back and add up), then runs the B suffixes against that cache. Keys, values, masks and positions
are those of the full forward, so the loss and its gradients are equal up to float rounding. Only where that holds:
no active dropout (a shared prefix would share its dropout mask), no gradient checkpointing, no cache, no extra
per-token inputs (images, embeddings). Off with `KBROUTER_SHARED_PREFIX=0`.
"""

from __future__ import annotations

import os

OFF_ENV = "KBROUTER_SHARED_PREFILL"
TRAIN_OFF_ENV = "KBROUTER_SHARED_PREFIX"
MIN_SAVED_TOKENS = 64  # below this the second, short call costs more than it saves


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


def share_training_prefixes(model) -> bool:  # noqa: ANN001 - a (peft-wrapped) causal LM
    """Wrap `model`'s text backbone so its training forwards run shared prefixes once (module docstring); whether it
    did. Vision-language models and MoE routers (their aux loss counts every token) are left as they are."""
    if os.environ.get(TRAIN_OFF_ENV, "1").strip() == "0":
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    if config.get_text_config() is not config or getattr(config, "output_router_logits", False):
        return False
    backbone = getattr(base, base.base_model_prefix, None)
    if backbone is None or getattr(backbone.forward, "_kbrouter_shared_prefix", False):
        return backbone is not None
    import functools
    import inspect

    if "cache" not in inspect.signature(backbone.forward).parameters:  # a backbone that takes no prefilled cache
        return False

    import torch

    dropouts = [m for m in backbone.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    checkpointed = [m for m in backbone.modules() if hasattr(m, "gradient_checkpointing")]
    attention_dropout = float(getattr(config, "attention_dropout", 0.0) or 0.0)
    original = backbone.forward

    @functools.wraps(original)
    def forward(input_ids=None, attention_mask=None, position_ids=None, **kwargs):  # noqa: ANN001, ANN202
        usable = (
            input_ids is not None
            and attention_mask is not None
            and input_ids.dim() == 2
            and {k for k, v in kwargs.items() if v is not None} <= {"use_cache", "return_dict"}
            and not any(m.gradient_checkpointing for m in checkpointed)
            and not (backbone.training and (attention_dropout > 0 or any(m.training for m in dropouts)))
        )
        if usable:
            plan = prefix_plan(input_ids, attention_mask, position_ids)
            if plan is not None:
                return _forward_with_prefix(original, config, input_ids, attention_mask, position_ids, *plan)
        return original(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)

    forward._kbrouter_shared_prefix = True
    backbone.forward = forward
    return True


def prefix_plan(input_ids, attention_mask, position_ids=None):  # noqa: ANN001, ANN201 - torch tensors
    """(P, unique row indices, inverse) for the prefix length P that saves the most token-forwards, (B - U) x P with
    U distinct P-token prefixes; None when no P saves `MIN_SAVED_TOKENS`. Rows agree on a prefix only where their
    ids, mask and positions all do. P stops one token short of the width, so every row keeps a suffix."""
    import torch

    rows, width = input_ids.shape
    if rows < 2 or width < 2:
        return None
    keys = torch.stack([input_ids, attention_mask.to(input_ids.dtype)], dim=-1)
    if position_ids is not None:
        keys = torch.cat([keys, position_ids.expand(rows, -1).unsqueeze(-1).to(input_ids.dtype)], dim=-1)
    same = (keys[:, None] == keys[None, :]).all(-1)  # [B, B, width]
    common = same.long().cumprod(-1).sum(-1)  # the shared prefix length of each pair of rows
    pairs = common[torch.triu_indices(rows, rows, 1).unbind()]
    lengths = sorted({min(int(n), width - 1) for n in pairs if n > 0})
    best, best_saved = None, MIN_SAVED_TOKENS - 1
    for length in lengths:
        flat = keys[:, :length].reshape(rows, -1)
        unique, inverse = torch.unique(flat, dim=0, return_inverse=True)
        saved = (rows - unique.shape[0]) * length
        if saved > best_saved:
            first = torch.full((unique.shape[0],), rows, dtype=torch.long)
            first = first.scatter_reduce(0, inverse, torch.arange(rows), reduce="amin")
            best, best_saved = (length, first, inverse), saved
    return best


def _forward_with_prefix(forward, config, input_ids, attention_mask, position_ids, length, first, inverse):  # noqa: ANN001, ANN202
    """The backbone's output for the whole batch, the distinct prefixes run once (module docstring)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    positions = None if position_ids is None else position_ids.expand(input_ids.shape[0], -1)
    head = forward(input_ids=input_ids[first, :length], attention_mask=attention_mask[first, :length],
                   position_ids=None if positions is None else positions[first, :length], cache=cache,
                   use_cache=True)  # fmt: skip
    cache.batch_select_indices(inverse)
    tail = forward(input_ids=input_ids[:, length:], attention_mask=attention_mask,
                   position_ids=None if positions is None else positions[:, length:], cache=cache,
                   use_cache=True)  # fmt: skip
    tail.last_hidden_state = torch.cat([head.last_hidden_state[inverse], tail.last_hidden_state], dim=1)
    tail.cache = None
    return tail
