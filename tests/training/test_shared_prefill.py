"""training/shared_prefill.py: a GRPO batch's duplicate prompts are prefilled once, and generate gives the same tokens."""

from __future__ import annotations

import functools

import pytest
import torch

from training import shared_prefill


def _tiny_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=2)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def _group_batch(g: int = 3):
    """Two left-padded prompts of different lengths, each repeated g times in a row (as TRL's sampler lays them)."""
    gen = torch.Generator().manual_seed(3)
    short, long = torch.randint(3, 300, (7,), generator=gen), torch.randint(3, 300, (12,), generator=gen)
    ids = torch.stack([torch.cat([torch.zeros(5, dtype=torch.long), short]), long]).repeat_interleave(g, 0)
    mask = torch.stack([torch.cat([torch.zeros(5), torch.ones(7)]), torch.ones(12)]).long().repeat_interleave(g, 0)
    return ids, mask


def _counting_forward(model, monkeypatch) -> list[tuple[int, int]]:
    """(rows, tokens) of every forward the model runs."""
    seen: list[tuple[int, int]] = []
    real = model.forward

    @functools.wraps(real)  # `generate` reads the signature (position_ids) through `__wrapped__`
    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        seen.append(tuple(ids.shape) if ids is not None else (0, 0))
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    return seen


@pytest.mark.parametrize("sample", [False, True])
def test_duplicate_prompts_are_prefilled_once_with_the_same_tokens(monkeypatch, sample) -> None:
    model = _tiny_lm()
    ids, mask = _group_batch()
    kwargs = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": sample, "top_k": 0, "pad_token_id": 0,
              "output_logits": True, "return_dict_in_generate": True}  # fmt: skip
    monkeypatch.setenv(shared_prefill.OFF_ENV, "0")
    torch.manual_seed(5)
    plain = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    monkeypatch.setenv(shared_prefill.OFF_ENV, "1")
    seen = _counting_forward(model, monkeypatch)
    torch.manual_seed(5)
    shared = shared_prefill.generate(model, ids, mask, **kwargs)
    assert seen[0] == (2, 11)  # the 2 distinct prompts, all but their last token, once
    assert seen[1] == (6, 1)  # then every row from its last prompt token on
    assert torch.equal(shared.sequences, plain.sequences)
    for step, (got, want) in enumerate(zip(shared.logits, plain.logits, strict=True)):  # positions and keys alike
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"new token {step}")


def test_distinct_rows_or_off_generate_as_before(monkeypatch) -> None:
    model = _tiny_lm()
    ids, mask = _group_batch(g=1)
    seen = _counting_forward(model, monkeypatch)
    shared_prefill.generate(model, ids, mask, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert seen[0] == (2, 12)  # no duplicates: the usual full prefill
    ids, mask = _group_batch(g=2)
    monkeypatch.setenv(shared_prefill.OFF_ENV, "0")
    seen.clear()
    shared_prefill.generate(model, ids, mask, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert seen[0] == (4, 12)
