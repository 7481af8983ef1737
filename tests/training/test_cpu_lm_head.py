"""training/cpu_lm_head.py: on CPU, TRL's fused LM head projects only labelled positions, with the same loss and grads."""

from __future__ import annotations

import pytest
import torch
import trl.trainer.utils as trl_utils

from training import cpu_lm_head

_REAL_HEAD = trl_utils._ChunkedLogProbFunction  # taken before any test wraps it


@pytest.fixture
def trl_rule_after():
    yield
    cpu_lm_head.install(False)


def _tiny_lm():
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    add_fused_lm_head(model)
    return model


def _loss_grads_rows(model, monkeypatch) -> tuple[float, dict[str, torch.Tensor], list[int]]:
    """One forward + backward with labels on the last 5 of 24 positions (row 1: none); the rows the head projected."""
    rows: list[int] = []

    class Counting:
        @staticmethod
        def apply(hidden, *args):
            rows.append(hidden.shape[0])
            return _REAL_HEAD.apply(hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Counting)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (3, 24), generator=gen)
    labels = ids.clone()
    labels[:, :19] = -100
    labels[1] = -100  # a row with nothing to learn still gives a differentiable zero
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.item(), grads, rows


def test_cpu_scores_only_labelled_positions_with_the_same_loss_and_grads(monkeypatch, trl_rule_after) -> None:
    model = _tiny_lm()
    assert cpu_lm_head.install(False) is False
    full_loss, full_grads, full_rows = _loss_grads_rows(model, monkeypatch)
    assert cpu_lm_head.install(True) is True
    loss, grads, rows = _loss_grads_rows(model, monkeypatch)
    assert full_rows == [3 * 23]  # TRL's rule on CPU: every shifted position
    assert rows == [2 * 5]  # the 5 labelled positions of rows 0 and 2; row 1 has none
    assert loss == pytest.approx(full_loss, rel=1e-5)
    assert grads.keys() == full_grads.keys() and grads
    for name, g in grads.items():
        torch.testing.assert_close(g, full_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_switch_and_other_devices(monkeypatch, trl_rule_after) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setenv(cpu_lm_head.OFF_ENV, "0")
    assert cpu_lm_head.install() is False
    assert trl_utils._use_triton(cpu) is False  # TRL's own rule is back
    monkeypatch.setenv(cpu_lm_head.OFF_ENV, "1")
    assert cpu_lm_head.install() is True
    assert trl_utils._use_triton(cpu) is True
    meta = torch.device("meta")  # not a CPU: TRL decides, as before
    assert cpu_lm_head.compact_on(meta) is cpu_lm_head._TRL_CHOICE(meta) is False
