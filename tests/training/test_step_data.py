"""Tests for training/step_data.py and training/step_dataset.py: formats, gold prefixes, length rule, bad input."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from agent.types import Step, Trajectory
from retrievers.types import Doc, Hit
from training.step_data import StepRecord, load_step_records, records_from_trajectory, resolve_images
from training.step_dataset import build_step_dataset, fit_prompt, prompt_length_stats, target_text

KBS = [("Text KB", "Wikipedia paragraphs"), ("Table KB", "Wikipedia tables")]


def hit(i: int, text: str) -> Hit:
    return Hit(Doc(id=f"d{i}", text=text, kb="text"), score=1.0 - i / 10, rank=i, kb="text")


def make_traj(stop_reason: str = "answered", with_stop_plan: bool = True, gold=("9 December 1899",)) -> Trajectory:
    steps = [
        Step(0, think="need director", sub_question="Who directed Strangler of the Swamp?", kb="Text KB",
             hits=(hit(0, "Frank Wisbar directed it."),), answer_think="evidence says", answer="Frank Wisbar"),
        Step(1, think="need birth date", sub_question="When was Frank Wisbar born?", kb="Text KB",
             hits=(hit(0, "Wisbar was born 9 December 1899."),), answer="9 December 1899"),
    ]  # fmt: skip
    if with_stop_plan:
        steps.append(Step(2, think="enough", sub_question=None, kb=None))
    return Trajectory(id="t1", question="When was the director of Strangler of the Swamp born?", steps=tuple(steps),
                      final_think="so", final_answer="9 December 1899", stop_reason=stop_reason, gold=gold)  # fmt: skip


def test_paper_release_loads_as_758_step_prompts(paper_steps):
    records = load_step_records(paper_steps)  # format detected from the first row
    assert len({r.trajectory_id for r in records}) == 119
    assert len(records) == 758
    assert Counter(r.step_type for r in records) == {"plan": 346, "answer": 293, "final": 119}
    assert sum(r.step_type == "plan" and r.gold["sub_question"] is None for r in records) == 53
    # a 'none' query always goes with a 'none' retriever, and an image record's marker leaves the text
    assert all((r.gold["sub_question"] is None) == (r.gold["kb"] is None) for r in records if r.step_type == "plan")
    assert not any("<image>" in r.messages[-1]["content"] for r in records)
    ds = build_step_dataset(records)
    assert len(ds) == 758 and ds.column_names.count("prompt") == 1 and "images" not in ds.column_names


def test_trajectory_is_cut_into_steps_on_the_gold_prefix():
    records = records_from_trajectory(make_traj(), KBS)
    assert [r.step_type for r in records] == ["plan", "answer", "plan", "answer", "plan", "final"]
    plan2 = records[2].messages[-1]["content"]
    assert "Who directed Strangler of the Swamp?" in plan2 and "Frank Wisbar" in plan2  # gold prefix in history
    assert "Who directed" not in records[0].messages[-1]["content"]  # the first plan has no history
    assert "Text KB" in records[0].messages[0]["content"]  # KB list from config in the plan system prompt
    assert records[4].gold == {"sub_question": None, "kb": None, "think": "enough"}  # the stop step
    assert records[3].gold["answers"] == ["9 December 1899"]
    assert "Wisbar was born" in records[3].messages[-1]["content"]  # the answer step sees its evidence
    assert records[5].gold["answers"] == ["9 December 1899"]
    assert "When was Frank Wisbar born?" in records[5].messages[-1]["content"]  # final sees the whole history


def test_max_steps_trajectory_has_no_stop_plan():
    records = records_from_trajectory(make_traj("max_steps", with_stop_plan=False), KBS)
    assert [r.step_type for r in records] == ["plan", "answer", "plan", "answer", "final"]


def test_trajectory_file_roundtrip_and_skips_unanswered(tmp_path):
    path = tmp_path / "traj.jsonl"
    rows = [make_traj().to_dict(), make_traj("format_error").to_dict()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(load_step_records(path, kbs=KBS)) == 6  # the format_error trajectory is skipped
    with pytest.raises(ValueError, match="KB list"):
        load_step_records(path)  # trajectories need the KB list for plan prompts


def test_step_record_roundtrip(tmp_path):
    records = records_from_trajectory(make_traj(), KBS)
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    assert load_step_records(path) == records


@pytest.mark.parametrize(
    "row, match",
    [
        ({"trajectory_id": "t", "step_type": "final", "messages": [{"role": "user", "content": "q"}]}, "gold"),  # no gold
        ({"trajectory_id": "t", "step_type": "final", "messages": [{"role": "user", "content": "q"}],
          "gold": {"answers": []}}, "non-empty"),  # empty gold answers
        ({"trajectory_id": "t", "step_type": "plan", "messages": [{"role": "user", "content": "q"}],
          "gold": {"sub_question": "x"}, "kb_names": ["A"]}, "sub_question"),  # plan gold without kb
        ({"trajectory_id": "t", "step_type": "retrieve", "messages": [{"role": "user", "content": "q"}],
          "gold": {"answers": ["x"]}}, "step_type"),  # unknown step type
    ],
)  # fmt: skip
def test_step_record_without_gold_target_is_an_error(tmp_path, row, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=match):
        load_step_records(path, "steps")


def test_trajectory_without_gold_is_an_error():
    with pytest.raises(ValueError, match="no gold"):
        records_from_trajectory(make_traj(gold=None), KBS)


def test_missing_images_raise_naming_them(tmp_path, coco_image):
    rec = StepRecord("t", "final", [{"role": "user", "content": "q"}], {"answers": ["x"]}, images=("/nope/a.jpg",))
    with pytest.raises(FileNotFoundError, match="a.jpg"):
        resolve_images([rec])
    # found again by basename under image_root
    rec2 = StepRecord("t", "final", [{"role": "user", "content": "q"}], {"answers": ["x"]},
                      images=("/elsewhere/" + coco_image.rsplit("/", 1)[1],))  # fmt: skip
    assert resolve_images([rec2], image_root=coco_image.rsplit("/", 1)[0])[0].images == (coco_image,)


@pytest.mark.parametrize(
    "step_type, gold, expected",
    [
        ("plan", {"sub_question": "who?", "kb": "Text KB"}, "<sub-question>who?</sub-question>\n<ret>Text KB</ret>"),
        ("plan", {"sub_question": None, "kb": None}, "<sub-question>None</sub-question>\n<ret>None</ret>"),  # stop
        ("final", {"answers": ["Paris", "paris"]}, "<answer>Paris</answer>"),  # the first gold is the target
    ],
)
def test_sft_targets_parse_with_the_protocol(step_type, gold, expected):
    from agent.protocol import parse_answer, parse_plan

    rec = StepRecord("t", step_type, [{"role": "user", "content": "q"}], gold, kb_names=("Text KB",))
    text = target_text(rec)
    assert expected in text
    assert (parse_plan(text, ["Text KB"]) if step_type == "plan" else parse_answer(text)).ok


def test_over_long_prompts_lose_whole_lines_never_the_header(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    evidence = "\n".join(f"text-{i}: " + "lorem ipsum " * 30 for i in range(8))
    answer = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": f"Evidence:\n{evidence}\nQuestion: Q?"},
    ]
    fitted = fit_prompt(answer, "answer", tok, 400)
    lines = fitted[-1]["content"].split("\n")
    assert lines[0] == "Evidence:" and lines[-1] == "Question: Q?"  # question line and instruction kept
    assert "text-0:" in fitted[-1]["content"] and "text-7:" not in fitted[-1]["content"]  # lowest-ranked dropped
    n = len(tok.apply_chat_template(fitted, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert n <= 400
    history = "\n".join(f"Sub-question {i}: " + "why " * 40 for i in range(6))
    plan = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"Q\n{history}\nNext?"}]
    kept = fit_prompt(plan, "plan", tok, 250)[-1]["content"]
    assert "Sub-question 5" in kept and "Sub-question 0" not in kept  # plan steps lose the oldest history
    assert fit_prompt(plan, "plan", tok, 8) is None  # cannot fit even with the middle gone: skipped


def test_dataset_budget_counts_shortened_and_skipped(paper_steps, smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    records = [r for r in load_step_records(paper_steps) if r.step_type == "answer"][:40]
    ds = build_step_dataset(records, tok, max_prompt_tokens=600)
    stats = prompt_length_stats(ds, tok, limit=600)
    assert stats["all"]["max"] <= 600 and stats["all"]["over_limit"] == 0
    assert "shortened={'answer'" in ds.info.description
    full = prompt_length_stats(build_step_dataset(records), tok, limit=600)
    assert full["answer"]["over_limit"] > 0  # the budget did bite


def test_dataset_columns_and_images(coco_image):
    rec = StepRecord("t", "plan", [{"role": "system", "content": "s"},
                                   {"role": "user", "content": [{"type": "image", "image": coco_image},
                                                                {"type": "text", "text": "What is this?"}]}],
                     {"sub_question": "q", "kb": "Image KB"}, images=(coco_image,), kb_names=("Image KB",))  # fmt: skip
    ds = build_step_dataset([rec], use_images=True)
    row = ds[0]
    assert row["prompt"][1] == {"role": "user", "content": "What is this?"}  # image part moved to the column
    assert row["images"][0].size[0] > 0  # decoded as a PIL image
    assert (row["step_type"], row["gold_sub_question"], row["gold_kb"]) == ("plan", "q", "Image KB")
    assert "images" not in build_step_dataset([rec], use_images=False).column_names
