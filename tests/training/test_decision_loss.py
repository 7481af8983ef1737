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
