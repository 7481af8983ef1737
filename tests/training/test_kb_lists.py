"""Varied KB lists and names for plan records (training/kb_lists.py) and the prompt round trip they rest on."""

from __future__ import annotations

from collections import Counter

import pytest

from agent.protocol import PromptSettings, parse_plan, plan_kb_list, plan_messages, with_kb_list
from agent.step_records import PLAN, StepRecord
from training.kb_lists import kb_renames, renamed_kbs, vary_kb_lists, vary_kb_names

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


ALIASES = {"Text Retriever": ["Wikipedia", "Documents"], "Table Retriever": ["Data Tables"]}


def test_renamed_lists_keep_descriptions_and_the_gold_follows_its_kb() -> None:
    golds = ["Text Retriever", "Table Retriever", None, "Clip Retriever"] * 50
    records = [_plan(i, g) for i, g in enumerate(golds)]
    renamed = vary_kb_names(records, share=1.0, aliases=ALIASES, opaque=0.3, seed=0)
    names: Counter = Counter()
    for before, after in zip(records, renamed, strict=True):
        listed = plan_kb_list(after.messages)
        assert [d for _, d in listed] == [d for _, d in KBS]  # same KBs, same order, same descriptions
        assert tuple(n for n, _ in listed) == after.kb_names and len(set(after.kb_names)) == len(KBS)
        old_to_new = {old: new for (old, _), (new, _) in zip(KBS, listed, strict=True)}
        assert after.gold == {**before.gold, "kb": old_to_new.get(before.gold["kb"])}
        assert after.messages[1] == before.messages[1]
        parsed = parse_plan(f"<think>t</think><sub-question>q?</sub-question><ret>{after.kb_names[0]}</ret>",
                            after.kb_names)  # fmt: skip
        assert parsed.kb == after.kb_names[0] and not parsed.errors
        names.update(old_to_new.items())
    # every alias drawn, opaque names for every KB, and a KB without aliases keeps its name otherwise
    text_names = {new for (old, new) in names if old == "Text Retriever"}
    assert {"Wikipedia", "Documents"} <= text_names and "Text Retriever" not in text_names
    assert "Image Retriever" in {new for (old, new) in names if old == "Image Retriever"}
    assert all(any(old == o and new.split()[0] in ("Collection", "Index", "KB", "Store", "Database")
                   for (o, new) in names) for old, _ in KBS)  # fmt: skip
    opaque = sum(n for (old, new), n in names.items() if new not in (old, *ALIASES.get(old, [])))
    assert 0.2 < opaque / names.total() < 0.4


def test_renaming_is_seeded_and_leaves_other_step_types_alone() -> None:
    records = [_plan(i, "Text Retriever") for i in range(20)]
    answer = StepRecord("a", "answer", [{"role": "user", "content": "x"}], {"answers": ["y"]})
    once = vary_kb_names([*records, answer], 0.5, ALIASES, seed=3)
    assert once == vary_kb_names([*records, answer], 0.5, ALIASES, seed=3) and once[-1] == answer
    assert once != vary_kb_names([*records, answer], 0.5, ALIASES, seed=4)
    assert vary_kb_names(records, 0.0, ALIASES) == records


@pytest.mark.parametrize(
    "aliases, match",
    [
        ({"Text Retriever": ["Wiki <b>"]}, "kb_name_aliases.Text Retriever"),
        ({"Text Retriever": ["Wiki: pages"]}, "may not hold ': '"),
        ({"Text Retriever": []}, "non-empty list"),
        ({"Text Retriever": ["None"]}, "reads as 'None'"),
    ],
)
def test_bad_aliases_are_named(aliases: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        vary_kb_names([_plan(0, "Text Retriever")], 1.0, aliases)


def test_kb_renames_match_two_kb_files_by_name(tmp_path) -> None:
    (tmp_path / "c.jsonl").write_text('{"id": "d1", "contents": "a doc"}\n')

    def kb_file(name: str, kbs: list[tuple[str, str]]):
        path = tmp_path / name
        path.write_text("knowledge_bases:\n" + "".join(
            f"  - {{name: {n}, display_name: {d}, kind: text, corpus: c.jsonl}}\n" for n, d in kbs))  # fmt: skip
        return path

    shown = kb_file(
        "shown.yaml", [("wiki", "Text Retriever"), ("clips", "Clip Retriever"), ("coco", "Image Retriever")]
    )
    renamed = kb_file("renamed.yaml", [("clips", "Film Archive"), ("wiki", "Encyclopedia Passages"), ("new", "Other")])
    names = kb_renames(shown, renamed)
    assert names == {"Text Retriever": "Encyclopedia Passages", "Clip Retriever": "Film Archive"}  # by `name`
    record = renamed_kbs(_plan(0, "Clip Retriever"), names)  # what benchmarks/router_stages.py --kb-names does
    assert record.gold["kb"] == "Film Archive" and "Clip Retriever" not in record.kb_names
    assert "Image Retriever" in record.kb_names  # a KB the other file lacks keeps its name
    with pytest.raises(ValueError, match="holds none of the KBs"):
        kb_renames(shown, kb_file("other.yaml", [("elsewhere", "Elsewhere")]))
