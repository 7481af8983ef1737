"""training/shared_prefill.share_training_prefixes: a batch's shared prefixes run once, with the same loss and grads."""

from __future__ import annotations

import pytest
import torch

from training import shared_prefill


def _tiny_lora_lm(dropout: float = 0.0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=2)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(model, lora).train()


def _sft_batch():
    """Right-padded rows: a 9-token prefix shared by rows 0-2, another by rows 3-4, then different tails."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randint(3, 300, (9,), generator=gen), torch.randint(3, 300, (9,), generator=gen)
    rows, lengths = [], [16, 13, 20, 18, 11]
    for i, n in enumerate(lengths):
        tail = torch.randint(3, 300, (n - 9,), generator=gen)
        rows.append(torch.cat([a if i < 3 else b, tail, torch.zeros(20 - n, dtype=torch.long)]))
    ids = torch.stack(rows)
    mask = (torch.arange(20)[None] < torch.tensor(lengths)[:, None]).long()
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :9] = -100  # the prompt
    return ids, mask, labels


def _grpo_batch():
    """Left-padded prompts, each repeated 3 times, with different completions (as TRL's log-prob forward sees them)."""
    gen = torch.Generator().manual_seed(2)
    short, long = torch.randint(3, 300, (6,), generator=gen), torch.randint(3, 300, (10,), generator=gen)
    prompts = torch.stack([torch.cat([torch.zeros(4, dtype=torch.long), short]), long]).repeat_interleave(3, 0)
    prompt_mask = (
        torch.stack([torch.cat([torch.zeros(4), torch.ones(6)]), torch.ones(10)]).long().repeat_interleave(3, 0)
    )
    ids = torch.cat([prompts, torch.randint(3, 300, (6, 5), generator=gen)], dim=1)
    mask = torch.cat([prompt_mask, torch.ones(6, 5, dtype=torch.long)], dim=1)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :10] = -100
    return ids, mask, labels


def _loss_and_grads(model, ids, mask, labels):
    model.zero_grad()
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


def _backbone_calls(model) -> list[tuple[int, int]]:
    """(rows, tokens) of every pass through the backbone, seen at its token embedding."""
    seen: list[tuple[int, int]] = []
    embed = model.get_base_model().model.embed_tokens
    embed.register_forward_pre_hook(lambda _m, args: seen.append(tuple(args[0].shape)))
    return seen


@pytest.mark.parametrize("make_batch", [_sft_batch, _grpo_batch])
def test_shared_prefix_gives_the_same_loss_and_gradients(monkeypatch, make_batch) -> None:
    monkeypatch.setattr(shared_prefill, "MIN_SAVED_TOKENS", 8)
    ids, mask, labels = make_batch()
    plain = _tiny_lora_lm()
    want_loss, want = _loss_and_grads(plain, ids, mask, labels)
    model = _tiny_lora_lm()
    assert shared_prefill.share_training_prefixes(model)
    seen = _backbone_calls(model)
    loss, got = _loss_and_grads(model, ids, mask, labels)
    assert len(seen) == 2 and seen[0][0] < ids.shape[0]  # the distinct prefixes, then every row's suffix
    assert seen[0][1] + seen[1][1] == ids.shape[1]
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    assert got.keys() == want.keys() and len(got) > 0
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_plan_picks_the_prefix_that_saves_most(monkeypatch) -> None:
    monkeypatch.setattr(shared_prefill, "MIN_SAVED_TOKENS", 8)
    ids, mask, _ = _sft_batch()
    length, first, inverse = shared_prefill.prefix_plan(ids, mask)
    assert length == 9  # two prefixes of 9 tokens: (5 - 2) x 9 saved; one of 0 would save nothing
    assert first[inverse].tolist() == [0, 0, 0, 3, 3]  # each row's prefix is run as the first row that has it
    ids, mask, _ = _grpo_batch()
    length, first, inverse = shared_prefill.prefix_plan(ids, mask)
    assert length == 10 and first[inverse].tolist() == [0, 0, 0, 3, 3, 3]  # whole prompts, pads and all
    different = torch.randint(3, 300, (4, 12), generator=torch.Generator().manual_seed(4))
    assert shared_prefill.prefix_plan(different, torch.ones_like(different)) is None


def test_active_dropout_and_the_switch_keep_the_plain_forward(monkeypatch) -> None:
    monkeypatch.setattr(shared_prefill, "MIN_SAVED_TOKENS", 8)
    ids, mask, labels = _sft_batch()
    model = _tiny_lora_lm(dropout=0.1)
    assert shared_prefill.share_training_prefixes(model)
    seen = _backbone_calls(model)
    model(input_ids=ids, attention_mask=mask, labels=labels)
    assert seen == [tuple(ids.shape)]  # dropout on: a shared prefix would share its dropout mask
    model.eval()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, labels=labels)
    assert len(seen) == 3  # eval: no dropout, the prefix is shared
    monkeypatch.setenv(shared_prefill.TRAIN_OFF_ENV, "0")
    assert not shared_prefill.share_training_prefixes(_tiny_lora_lm())
