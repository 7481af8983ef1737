"""training/merged_rollouts.py: Step-GRPO samples with the LoRA adapter merged, the same tokens, the weights restored."""

from __future__ import annotations

import pytest
import torch

from training import merged_rollouts
from training.merged_rollouts import can_merge, merged_lora


def _tiny_lora(dropout: float = 0.0):
    """A tiny Llama with LoRA on every linear layer, its B matrices random (peft starts them at 0: a no-op merge)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=2)  # fmt: skip
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                             lora_dropout=dropout))  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return model


def _base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def _generate(model, seed: int = 7) -> torch.Tensor:
    ids = torch.randint(3, 300, (4, 9), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(seed)
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                          do_sample=True, top_k=0, pad_token_id=0)  # fmt: skip


def test_merged_sampling_gives_the_same_tokens_and_restores_the_weights() -> None:
    model = _tiny_lora()
    model.train()  # as TRL samples: training mode, dropout 0
    before = _base_weights(model)
    with torch.no_grad():
        plain = _generate(model)
        ids = torch.randint(3, 300, (2, 6))
        logits = model(input_ids=ids).logits
        with merged_lora(model) as merged:
            assert merged
            merged_weights = _base_weights(model)
            assert any(not torch.equal(merged_weights[n], before[n]) for n in before)  # the adapter is in W now
            fast = _generate(model)
            merged_logits = model(input_ids=ids).logits
    assert torch.equal(plain, fast)
    torch.testing.assert_close(merged_logits, logits, rtol=1e-5, atol=1e-5)
    after = _base_weights(model)
    for n, w in before.items():
        torch.testing.assert_close(after[n], w, rtol=0, atol=1e-6)
    assert can_merge(model)  # unmerged again: every LoRA layer computes W x + s B A x


def test_the_adapter_is_unmerged_when_sampling_fails() -> None:
    model = _tiny_lora()
    before = _base_weights(model)
    with pytest.raises(RuntimeError, match="boom"), merged_lora(model):
        raise RuntimeError("boom")
    for n, w in before.items():
        torch.testing.assert_close(_base_weights(model)[n], w, rtol=0, atol=1e-6)
    assert can_merge(model)  # merged no more, so it could merge again


def test_it_stays_unmerged_where_merging_would_change_the_samples(monkeypatch) -> None:
    dropping = _tiny_lora(dropout=0.1)
    dropping.train()
    assert not can_merge(dropping)  # an active LoRA dropout: merged weights would apply none
    dropping.eval()
    assert can_merge(dropping)  # dropout inactive in eval mode
    model = _tiny_lora()
    with merged_lora(model, sharded=True) as merged:  # ZeRO-3 / FSDP shards
        assert not merged
    monkeypatch.setenv(merged_rollouts.OFF_ENV, "0")
    assert not can_merge(model)
    monkeypatch.delenv(merged_rollouts.OFF_ENV)
    with merged_lora(model), merged_lora(model) as again:  # merged already: the inner block leaves it alone
        assert not again
    from transformers import LlamaConfig, LlamaForCausalLM

    assert not can_merge(LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
                                                      num_hidden_layers=1, num_attention_heads=2)))  # fmt: skip


def test_step_grpo_rollouts_merge_once_and_sample_the_same(smollm2_dir, short_steps_file, tmp_path, monkeypatch):
    """A real LoRA Step-GRPO trainer's rollout (`constrained_rollouts.sample`): one merge and one unmerge around the
    generation, and the same completions as with the adapter unmerged."""
    from training.config import load_config
    from training.constrained_rollouts import sample
    from training.trainers import build_grpo_trainer

    from .conftest import CPU_GRPO_RECIPE

    cfg = load_config("grpo", CPU_GRPO_RECIPE, [
        "--train_file", str(short_steps_file), "--train_format", "steps", "--output_dir", str(tmp_path),
        "--num_generations", "2", "--per_device_train_batch_size", "4", "--max_completion_length", "12",
        "--step_types", "null", "--save_strategy", "no", "--lora", "{r: 4, alpha: 8, dropout: 0}"])  # fmt: skip
    trainer = build_grpo_trainer(cfg)
    model = trainer.model
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    model.train()
    rows = [trainer.train_dataset[i]["prompt"] for i in range(2)]
    prompt_ids = trainer._tokenize_prompts([r for r in rows for _ in range(2)])[0]
    calls: list[str] = []
    for method in ("merge_adapter", "unmerge_adapter"):
        real = getattr(model, method)
        monkeypatch.setattr(model, method, lambda real=real, method=method: (calls.append(method), real())[1])
    before = _base_weights(model)

    def rollout(off: str) -> list[list[int]]:
        monkeypatch.setenv(merged_rollouts.OFF_ENV, off)
        torch.manual_seed(11)
        return sample(trainer, prompt_ids, None)

    unmerged = rollout("0")
    assert calls == []
    merged = rollout("1")
    assert calls == ["merge_adapter", "unmerge_adapter"]
    assert merged == unmerged
    for n, w in before.items():
        torch.testing.assert_close(_base_weights(model)[n], w, rtol=0, atol=1e-6)
