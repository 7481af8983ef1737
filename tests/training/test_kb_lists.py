"""Varied KB lists for plan records (training/kb_lists.py) and the prompt round trip they rest on."""

from __future__ import annotations

from collections import Counter

import pytest

from agent.protocol import PromptSettings, parse_plan, plan_kb_list, plan_messages, with_kb_list
from agent.step_records import PLAN, StepRecord
from training.kb_lists import vary_kb_lists

KBS = [
    ("Text Retriever", "Wikipedia paragraphs."),
    ("Table Retriever", "Wikipedia tables: results, awards, ..."),
    ("Image Retriever", "photographs: captions and objects"),
    ("Clip Retriever", ""),
]


def _plan(i: int, gold_kb: str | None) -> StepRecord:
    sub_q = None if gold_kb is None else f"question {i}?"
    return StepRecord(f"t{i}", PLAN, plan_messages(f"question {i}?", [], KBS), {"sub_question": sub_q, "kb": gold_kb},
                      kb_names=tuple(n for n, _ in KBS))  # fmt: skip


def test_plan_kb_list_inverts_the_rendered_list_including_colons_and_empty_descriptions() -> None:
    assert plan_kb_list(plan_messages("q?", [], KBS)) == KBS
    redone = with_kb_list(plan_messages("q?", [], KBS), KBS[::-1])
    assert plan_kb_list(redone) == KBS[::-1]
    assert redone == plan_messages("q?", [], KBS[::-1])  # byte for byte what the loop would show


def test_with_kb_list_refuses_prompts_it_did_not_write() -> None:
    with pytest.raises(ValueError, match="not a plan prompt"):
        with_kb_list([{"role": "system", "content": "You answer a question."}, {"role": "user", "content": "q"}], KBS)
    with pytest.raises(ValueError, match="few-shot"):
        with_kb_list(plan_messages("q?", [], KBS, settings=PromptSettings(few_shot=True)), KBS)


def test_varied_lists_keep_the_gold_kb_and_vary_order_and_size() -> None:
    golds = ["Text Retriever", "Clip Retriever", None, "Table Retriever"] * 50
    records = [_plan(i, g) for i, g in enumerate(golds)]
    varied = vary_kb_lists(records, share=1.0, min_kbs=2, seed=0)
    assert len(varied) == len(records)
    sizes, firsts = Counter(), Counter()
    for before, after in zip(records, varied, strict=True):
        listed = plan_kb_list(after.messages)
        assert tuple(n for n, _ in listed) == after.kb_names
        assert set(listed) <= set(KBS) and len(listed) >= 2
        if before.gold["kb"] is not None:
            assert before.gold["kb"] in after.kb_names
        assert after.messages[1] == before.messages[1] and after.gold == before.gold
        sizes[len(listed)] += 1
        firsts[listed[0][0]] += 1
    assert set(sizes) == {2, 3, 4} and len(firsts) == 4  # subsets of every size, every KB sometimes first


def test_share_zero_changes_nothing_and_other_step_types_pass_through() -> None:
    records = [_plan(i, "Text Retriever") for i in range(10)]
    answer = StepRecord("a", "answer", [{"role": "user", "content": "x"}], {"answers": ["y"]})
    assert vary_kb_lists([*records, answer], share=0.0) == [*records, answer]
    assert vary_kb_lists([answer], share=1.0) == [answer]
    half = vary_kb_lists(records * 20, share=0.5, seed=1)
    changed = sum(a.messages != b.messages for a, b in zip(records * 20, half, strict=True))
    assert 60 < changed < 140  # about half (a re-render may draw the original list back)


def test_a_varied_prompt_still_parses_and_routes_within_its_own_list() -> None:
    varied = vary_kb_lists([_plan(0, "Clip Retriever")], share=1.0, min_kbs=1, seed=5)[0]
    out = parse_plan("<think>t</think><sub-question>q?</sub-question><ret>Clip Retriever</ret>", varied.kb_names)
    assert out.kb == "Clip Retriever" and not out.errors


@pytest.mark.parametrize("share, min_kbs, match", [(1.5, 2, "kb_list_share"), (0.5, 0, "kb_list_min")])
def test_bad_settings_are_named(share: float, min_kbs: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        vary_kb_lists([_plan(0, "Text Retriever")], share=share, min_kbs=min_kbs)
