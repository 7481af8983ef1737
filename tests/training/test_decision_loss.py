"""Decision-weighted SFT: which label tokens count as the plan's decisions, and that the weight moves the loss."""

from __future__ import annotations

import pytest
import torch

from training.decision_loss import decision_mask


@pytest.fixture(scope="module")
def tok(smollm2_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def _labels(tok, prompt: str, completion: str) -> tuple[torch.Tensor, list[int]]:
    p = tok(prompt, add_special_tokens=False).input_ids
    c = tok(completion, add_special_tokens=False).input_ids
    return torch.tensor([[-100] * len(p) + c]), c


def _tags(tok) -> tuple[list[int], ...]:
    ids = lambda s: tok(s, add_special_tokens=False).input_ids  # noqa: E731
    return ids("<sub-question>"), ids("<ret>"), ids("</ret>")


@pytest.mark.parametrize(
    ("completion", "decided"),
    [
        ("<think>I need this.</think>\n<sub-question>Is it true?</sub-question>\n<ret>WikiTable Retriever</ret>",
         "IsWikiTable Retriever"),
        ("<think>I know enough.</think>\n<sub-question>None</sub-question>\n<ret>None</ret>", "NoneNone"),
    ],
)  # fmt: skip
def test_the_decision_tokens_are_the_first_asked_token_and_the_kb(tok, completion: str, decided: str) -> None:
    # the prompt holds the same tags (the format instructions): only trained positions may match
    prompt = "Reply as <sub-question>one question</sub-question>\n<ret>a knowledge base</ret>\n"
    labels, completion_ids = _labels(tok, prompt, completion)
    mask = decision_mask(labels, *_tags(tok))
    picked = [t for t, m in zip(labels[0].tolist(), mask[0].tolist(), strict=True) if m]
    assert tok.decode(picked) == decided
    assert mask[0, : labels.shape[1] - len(completion_ids)].sum() == 0


def test_an_answer_step_has_no_decision_tokens(tok) -> None:
    labels, _ = _labels(tok, "Evidence: ...\n", "<think>wiki-0 says so</think>\n<answer>Paris</answer>")
    assert decision_mask(labels, *_tags(tok)).sum() == 0


def test_a_truncated_ret_marks_to_the_end(tok) -> None:
    labels, _ = _labels(tok, "Q\n", "<think>t</think>\n<sub-question>Who?</sub-question>\n<ret>Text Retr")
    mask = decision_mask(labels, *_tags(tok))
    assert mask[0, -1] == 1 and tok.decode(
        [t for t, m in zip(labels[0].tolist(), mask[0].tolist(), strict=True) if m]
    ) == ("WhoText Retr")


def test_decision_weight_must_be_positive() -> None:
    from pathlib import Path

    from training.config import load_config

    recipe = Path(__file__).resolve().parents[2] / "configs" / "train" / "smollm2_router_sft_decisions_lora_cpu.yaml"
    assert load_config("sft", recipe).decision_weight == 10.0
    with pytest.raises(ValueError, match="decision_weight"):
        load_config("sft", recipe, ["--decision_weight", "0"])


# Pinned loss values on a hand-written input: vocabulary of 6 ids, tags one id each.
ASK, RET_OPEN, RET_CLOSE = [1], [2], [3]
# prompt (1 id, untrained), then <sub-question> 4 <ret> 5 </ret>: the decisions are 4 (first asked) and 5 (the KB)
LABELS = [[-100, 1, 4, 2, 5, 3]]
# LOGITS[t] scores LABELS[t + 1] (the causal shift): 5 positions x 6 ids, written by hand
LOGITS = [
    [0.0, 2.0, 0.0, 0.0, 0.0, 0.0],  # -> 1 <sub-question>
    [0.5, 0.0, 0.0, 0.0, 1.0, 0.0],  # -> 4 (decision: search)
    [0.0, 0.0, 3.0, 1.0, 0.0, 0.0],  # -> 2 <ret>
    [0.0, 0.0, 0.0, 0.0, 2.0, 1.0],  # -> 5 (decision: which KB), the model prefers 4
    [0.0, 0.0, 0.0, 1.0, 0.0, 0.0],  # -> 3 </ret>
]


def _nll(row: list[float], target: int) -> float:
    """-log softmax(row)[target], by the formula."""
    import math

    return math.log(sum(math.exp(x) for x in row)) - row[target]


class _HandLogits(torch.nn.Module):
    """Stands in for the model's fused LM head: per-token log-probs of the labels, and which tokens are trained."""

    def forward(self, labels: torch.Tensor, **_):  # noqa: ANN003, ANN202
        from types import SimpleNamespace

        target = labels[:, 1:]
        label_mask = target != -100
        logp = torch.log_softmax(torch.tensor([LOGITS]), -1).gather(-1, target.clamp(min=0).unsqueeze(-1))
        return SimpleNamespace(log_probs=logp.squeeze(-1) * label_mask, label_mask=label_mask)


def _plain_sft_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001, ANN202
    """TRL's SFT loss: the mean token NLL over trained tokens (or over `num_items_in_batch`)."""
    out = model(**inputs)
    n = out.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
    loss = -out.log_probs.sum() / n
    return (loss, out) if return_outputs else loss


@pytest.mark.parametrize(
    ("weight", "num_items"),
    [
        (3.0, None),  # decisions weigh 3x, mean over the 5 trained tokens of the batch
        (3.0, 8),  # gradient accumulation: TRL divides by the items of all micro-batches, so do the decisions
        (1.0, None),  # w = 1 is plain SFT
    ],
)
def test_the_decision_weighted_loss_is_the_weighted_cross_entropy(monkeypatch, weight, num_items) -> None:
    from trl import SFTTrainer

    from training.decision_loss import DecisionWeightedSFTTrainer

    monkeypatch.setattr(SFTTrainer, "compute_loss", _plain_sft_loss)
    trainer = DecisionWeightedSFTTrainer.__new__(DecisionWeightedSFTTrainer)  # no model load: only the loss runs
    trainer.decision_weight, trainer._tags = weight, (ASK, RET_OPEN, RET_CLOSE)
    nlls = [_nll(LOGITS[t], LABELS[0][t + 1]) for t in range(5)]
    weights = [1.0, weight, 1.0, weight, 1.0]  # positions 1 and 3 score the decision labels 4 and 5
    expected = sum(w * x for w, x in zip(weights, nlls, strict=True)) / (num_items or 5)
    loss = trainer.compute_loss(_HandLogits(), {"labels": torch.tensor(LABELS)}, num_items_in_batch=num_items)
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=loss.dtype))
    # the figures: NLLs 0.5168, 1.1243, 0.2885, 1.6467, 1.0436 -> (sum + 2 x (1.1243 + 1.6467)) / 5 = 2.0324 at w = 3,
    # sum / 5 = 0.9240 at w = 1
    pinned = {(3.0, None): 2.0324, (3.0, 8): 2.0324 * 5 / 8, (1.0, None): 0.9240}[(weight, num_items)]
    assert abs(float(loss) - pinned) < 1e-4
