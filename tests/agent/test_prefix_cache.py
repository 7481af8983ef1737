"""Shared-prefix KV reuse (agent/backends/prefix_cache.py) and continuous batching in the transformers backends.

The main claim is that reuse changes nothing a caller sees: over batches of real step prompts (real questions, the
demo KB list, real Wikipedia passages as evidence) the real SmolLM2 writes token-for-token the same greedy replies with
the prefix cache on as with it off, free and grammar-constrained, batched and one at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent.backends.base import SamplingParams
from agent.backends.prefix_cache import (
    PrefixCache,
    batch_prefix_length,
    common_prefix_length,
    prefixed_batch,
    prefixed_layout,
)
from agent.protocol import (
    PromptSettings,
    answer_grammar,
    answer_messages,
    final_messages,
    parse_plan,
    plan_grammar,
    plan_messages,
)
from retrievers.types import Doc, Hit

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([[1, 2, 3, 4], [1, 2, 3, 5]], 3),  # differ at the last token
        ([[1, 2, 3], [1, 2, 3, 4, 5]], 2),  # one row is a prefix of the other: one token left for generate
        ([[7, 8, 9]], 2),  # a single row shares all but its last token with itself
        ([[1, 2], [3, 4]], 0),  # nothing shared
        ([[1, 2, 3, 4], [1, 2, 3, 4], [1, 9, 3, 4]], 1),  # the third row breaks it early
    ],
)
def test_batch_prefix_length(rows, expected):
    assert batch_prefix_length(rows) == expected


def test_common_prefix_length():
    assert common_prefix_length((1, 2, 3), (1, 2, 4, 5)) == 2
    assert common_prefix_length((), (1,)) == 0


def test_prefixed_layout_puts_padding_between_prefix_and_suffix():
    import torch

    rows = [[5, 6, 7, 1], [5, 6, 7, 2, 3, 4]]
    ids, mask = prefixed_batch(rows, 3, pad_id=0, device="cpu")
    assert ids.tolist() == [[5, 6, 7, 0, 0, 1], [5, 6, 7, 2, 3, 4]]
    assert mask.tolist() == [[1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1]]
    # the same from the left-padded tensors a processor returns (the VL backend's path)
    left = torch.tensor([[0, 0, 5, 6, 7, 1], [5, 6, 7, 2, 3, 4]])
    left_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    assert prefixed_layout(left, left_mask, 3, 0).tolist() == ids.tolist()
    assert prefixed_layout(left_mask, left_mask, 3, 0).tolist() == mask.tolist()


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    from agent.backends.hf import TransformersPolicy

    return TransformersPolicy(smollm2_dir, max_batch_size=8)


@pytest.fixture(scope="module")
def step_prompts(shared_data):
    """Real plan, answer and final step conversations: shared questions, the demo KB list, shared passages."""
    questions = [json.loads(line)["question"] for line in (shared_data / "text" / "questions.jsonl").open()][:4]
    passages = [json.loads(line) for line in (shared_data / "text" / "corpus.jsonl").open()][:12]
    kbs = yaml.safe_load((REPO / "configs" / "kb" / "demo.yaml").read_text())["knowledge_bases"]
    menu = [(k["display_name"], k["description"]) for k in kbs]
    hits = [
        [Hit(Doc(p["doc_id"], p["text"], p["title"]), 1.0 / (r + 1), r, "text") for r, p in enumerate(passages[i::4])]
        for i in range(4)
    ]
    shots = PromptSettings(few_shot=True, evidence_chars=300)
    return {
        "plan": [plan_messages(q, [], menu) for q in questions],
        "plan_few_shot": [
            plan_messages(q, [("Who wrote it?", "K. A. Applegate")], menu, (), shots) for q in questions
        ],
        "answer": [answer_messages(q, h, (), shots) for q, h in zip(questions, hits, strict=True)],
        "final": [final_messages(q, [("Who wrote it?", "K. A. Applegate")]) for q in questions],
        "menu": menu,
    }


def _with_and_without(policy, convs, params):
    """(replies with the prefix cache off, replies with it on) from the same loaded model."""
    policy.prefix_cache = None
    plain = policy.generate(convs, params)
    policy.prefix_cache = PrefixCache(256 * 2**20)
    reused = policy.generate(convs, params)
    return plain, reused


@pytest.mark.parametrize(
    ("step", "stop"),
    [
        ("plan", "</ret>"),  # short system prompt + KB list
        ("plan_few_shot", "</ret>"),  # ~600 shared tokens: the worked example
        ("answer", "</answer>"),  # shared instructions, then per-row evidence
        ("final", "</answer>"),
    ],
)
def test_greedy_replies_are_identical_with_prefix_reuse(smol, step_prompts, step, stop):
    params = SamplingParams(max_new_tokens=24, stop=(stop,))
    plain, reused = _with_and_without(smol, step_prompts[step], params)
    assert [c.text for c in reused] == [c.text for c in plain]
    assert [c.completion_tokens for c in reused] == [c.completion_tokens for c in plain]
    assert [c.prompt_tokens for c in reused] == [c.prompt_tokens for c in plain]
    stats = smol.prefix_cache.stats()
    assert stats["misses"] == 1 and stats["tokens_run"] > 32  # the prefix was built once and used


def test_prefix_is_reused_across_calls_and_one_at_a_time(smol, step_prompts):
    convs = step_prompts["plan_few_shot"]
    params = SamplingParams(max_new_tokens=16, stop=("</ret>",))
    smol.prefix_cache = None
    plain = [smol.generate([c], params)[0].text for c in convs]
    smol.prefix_cache = PrefixCache(256 * 2**20)
    batched = [c.text for c in smol.generate(convs, params)]
    single = [smol.generate([c], params)[0].text for c in convs]
    assert batched == plain and single == plain
    stats = smol.prefix_cache.stats()
    # one-at-a-time prompts start from a cropped copy of a kept prefix: the shared few-shot turns are not rerun
    assert stats["tokens_reused"] > stats["tokens_run"]


def test_constrained_replies_are_identical_with_prefix_reuse(smol, step_prompts):
    names = tuple(name for name, _ in step_prompts["menu"])
    params = SamplingParams(max_new_tokens=160, grammar=plan_grammar(names, 160).ebnf)
    plain, reused = _with_and_without(smol, step_prompts["plan"][:3], params)
    assert [c.text for c in reused] == [c.text for c in plain]
    assert all(parse_plan(c.text, names, require_think=False).ok for c in reused)  # still inside the grammar
    answer = SamplingParams(max_new_tokens=80, grammar=answer_grammar(80).ebnf)
    plain, reused = _with_and_without(smol, step_prompts["answer"][:3], answer)
    assert [c.text for c in reused] == [c.text for c in plain]


def _assert_equals_fresh(smol, cache, prefix) -> None:  # noqa: ANN001
    """`cache` holds `prefix`'s keys and values, as a cache computed afresh for it does."""
    import torch

    fresh = PrefixCache(64 * 2**20).get(smol.model, prefix)
    for a, b in zip(cache.layers, fresh.layers, strict=True):
        assert a.keys.shape[-2] == len(prefix)
        torch.testing.assert_close(a.keys, b.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.values, b.values, atol=1e-4, rtol=1e-4)


def test_a_prefix_grown_from_a_kept_one_equals_one_computed_afresh(smol):
    ids = smol.tokenizer("Knowledge bases you can search: " * 20, add_special_tokens=False)["input_ids"]
    grown = PrefixCache(64 * 2**20)
    grown.get(smol.model, ids[:60])
    cache = grown.get(smol.model, ids[:100])
    assert grown.stats()["tokens_run"] == 100 and grown.stats()["tokens_reused"] == 60
    _assert_equals_fresh(smol, cache, ids[:100])
    assert grown.get(smol.model, ids[:100]) is cache and grown.stats()["hits"] == 1


def test_a_prefix_of_a_kept_one_is_cut_from_it_and_equals_one_computed_afresh(smol):
    """A batch whose shared prefix is shorter than a kept one (IRCoT's growing prompts): the kept cache is cropped
    and its last token run again; before, the empty remainder went to the model as a float tensor and failed."""
    ids = smol.tokenizer("Knowledge bases you can search: " * 20, add_special_tokens=False)["input_ids"]
    cut = PrefixCache(64 * 2**20)
    cut.get(smol.model, ids[:100])
    cache = cut.get(smol.model, ids[:60])
    assert cut.stats()["tokens_run"] == 101 and cut.stats()["tokens_reused"] == 59
    _assert_equals_fresh(smol, cache, ids[:60])


def test_prefix_cache_stays_within_its_memory_bound(smol):
    ids = smol.tokenizer("alpha beta gamma delta " * 30, add_special_tokens=False)["input_ids"]
    probe = PrefixCache(2**30)
    one = probe.get(smol.model, ids[:80])
    per_entry = sum(t.numel() * t.element_size() for layer in one.layers for t in (layer.keys, layer.values))
    bounded = PrefixCache(int(per_entry * 1.5))
    for start in (0, 1, 2):  # three prefixes sharing nothing at their start
        bounded.get(smol.model, ids[start : start + 80])
    assert len(bounded) == 1 and bounded.nbytes <= bounded.max_bytes
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(0)


def test_negative_prefix_cache_size_is_rejected_naming_the_key():
    from agent.backends.factory import PolicyConfig

    with pytest.raises(ValueError, match="policy.prefix_cache_mb"):
        PolicyConfig(prefix_cache_mb=-1)


def test_continuous_batching_writes_what_generate_writes(smol, step_prompts):
    params = SamplingParams(max_new_tokens=12, stop=("</ret>",))
    smol.prefix_cache = None
    convs = step_prompts["plan"][:2]
    plain = smol.generate(convs, params)
    smol.continuous_batching = True
    try:
        continuous = smol.generate(convs, params)
        # constrained steps keep generate (continuous batching has no grammar support)
        grammar = plan_grammar(tuple(n for n, _ in step_prompts["menu"]), 160).ebnf
        constrained = smol.generate(convs[:1], SamplingParams(max_new_tokens=160, grammar=grammar))
    finally:
        smol.continuous_batching = False
    assert [c.text for c in continuous] == [c.text for c in plain]
    assert constrained[0].text.lstrip().lower().startswith("<think>")


def test_vl_prefix_reuse_before_the_image_keeps_replies(shared_data):
    from agent.backends.hf_vl import TINY_VL, VisionLanguagePolicy

    policy = VisionLanguagePolicy(TINY_VL)
    photos = sorted((shared_data / "image" / "coco" / "images").glob("*.jpg"))[:3]
    system = {"role": "system", "content": "You answer questions about photos in one short sentence. " * 4}
    convs = [
        [system, {"role": "user", "content": [{"type": "image", "image": str(p)}, {"type": "text", "text": q}]}]
        for p, q in zip(photos, ("What is shown?", "How many people?", "What colour is it?"), strict=True)
    ]
    convs.append([system, {"role": "user", "content": "No photo here: what is a horse?"}])  # a text-only row too
    params = SamplingParams(max_new_tokens=8)
    plain = policy.generate(convs, params)
    policy.prefix_cache = PrefixCache(64 * 2**20)
    reused = policy.generate(convs, params)
    again = policy.generate(convs[::-1], params)  # rope offsets of the last call must not leak into this one
    assert [c.text for c in reused] == [c.text for c in plain]
    assert [c.text for c in again] == [c.text for c in plain][::-1]
    stats = policy.prefix_cache.stats()
    assert stats["hits"] >= 1 and stats["tokens_run"] >= 32
