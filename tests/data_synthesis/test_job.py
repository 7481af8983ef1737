"""The synthesis job with a scripted teacher: acceptance, every rejection reason, dedupe, skips, step records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.protocol import answer_messages, final_messages, plan_messages
from data_synthesis.config import SynthConfig
from data_synthesis.job import run_synthesis
from data_synthesis.rejection import REASONS
from retrievers.types import Doc, Hit
from tests.fakes import TEACHER_EVIDENCE, TEACHER_KB, case_teacher, teacher_kbs, teacher_questions

STRICT = {"require_no_format_errors": True, "require_evidence_overlap": True, "max_steps": 2}
SKIP_ROWS = [
    {"id": "nogold", "question": "What is this?"},  # no answers column
    {"id": "emptygold", "question": "What is that?", "answers": []},  # empty list
    {"id": "blank", "question": "  ", "answers": ["x"]},  # empty question
    {"id": "q-ok", "question": "[ok] again?", "answers": ["Paris"]},  # duplicate id
    {"id": "img", "question": "What is shown?", "answers": ["a dog"], "image": "/no/such/image.jpg"},
]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def strict_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strict")
    qfile = teacher_questions(tmp / "q.jsonl", extra=SKIP_ROWS)
    cfg = SynthConfig(inputs=[{"path": str(qfile), "dataset": "toy"}], m=2, max_steps=3, questions_per_batch=4,
                      output_dir=str(tmp / "out"), rejection=STRICT, teacher={"retries": 2, "backoff_s": 0},
                      progress=False)  # fmt: skip
    policy = case_teacher()
    summary = run_synthesis(cfg, policy=policy, kbs=teacher_kbs())
    return tmp / "out", summary, policy


def verdicts(out: Path) -> dict[str, tuple[str, ...]]:
    got = {t["id"]: () for t in read(out / "trajectories.jsonl")}
    got.update({r["id"]: tuple(r["reasons"]) for r in read(out / "rejected.jsonl")})
    return got


@pytest.mark.parametrize(
    ("trajectory", "reasons"),
    [
        ("q-ok#0", ()),  # right answer, well formed: kept
        ("q-ok#1", ("duplicate",)),  # same steps and answer as q-ok#0: dropped as a duplicate
        ("q-vary#0", ()),  # two different correct trajectories of one question: both kept
        ("q-vary#1", ()),
        ("q-wrong#0", ("wrong_answer",)),  # London vs gold Paris
        ("q-empty#0", ("empty_answer", "format_error")),  # empty final reply: no answer, and malformed
        ("q-format#0", ("format_error",)),  # malformed first plan, fixed by the re-ask: strict rule rejects it
        ("q-unsupported#0", ("unsupported_answer",)),  # 'Zanzibar' is not in its evidence
        ("q-long#0", ("too_many_steps",)),  # 3 retrieval steps > rejection.max_steps 2
        # empty intermediate reply: malformed, no overlap with evidence, and no training target
        ("q-emptymid#0", ("format_error", "unsupported_answer", "empty_intermediate_answer")),
        ("q-backend#1", ("backend_error",)),  # backend keeps failing on this question after retries
    ],
)
def test_verdict_per_case(strict_run, trajectory, reasons):
    out, _, _ = strict_run
    assert verdicts(out)[trajectory] == reasons


def test_every_rejection_reason_is_exercised(strict_run):
    out, _, _ = strict_run
    seen = {r for reasons in verdicts(out).values() for r in reasons}
    assert seen == set(REASONS)


def test_accounting_and_summary(strict_run):
    out, summary, _ = strict_run
    assert summary["questions_asked"] == 9 and summary["trajectories"] == 18
    assert summary["accepted"] + summary["rejected"] == 9 * 2 and summary["accounted"]
    assert summary["accepted"] == 3
    assert summary["skipped_by_reason"] == {"no_gold": 2, "empty_question": 1, "duplicate_id": 1, "missing_image": 1}
    assert summary["by_dataset"]["toy"]["questions_with_accepted"] == 2
    assert summary["by_num_steps"]["3"] == {"trajectories": 2, "accepted": 0, "acceptance_rate": 0.0}
    assert summary["kb_usage_per_step_accepted"] == {"0": {"text": 3}}
    assert summary["stop_reasons"]["backend_error"] == 2
    skipped = {s["id"]: s for s in read(out / "skipped.jsonl")}
    assert skipped["img"]["reason"] == "missing_image" and "/no/such/image.jpg" in skipped["img"]["detail"]
    assert json.loads((out / "summary.json").read_text()) == summary
    assert "| toy | 9 | 18 | 3 |" in (out / "summary.md").read_text()


def test_backend_errors_are_retried_then_recorded(strict_run):
    _, summary, policy = strict_run
    # the batch holding q-backend fails 3 times (1 + 2 retries), then each of its 2 conversations 3 times alone
    assert policy.backend_raises == 3 + 2 * 3
    assert summary["teacher_failures"] == policy.backend_raises


def test_default_rules_accept_what_only_strict_rules_reject(tmp_path):
    qfile = teacher_questions(tmp_path / "q.jsonl", cases=("format", "unsupported", "long"))
    cfg = SynthConfig(inputs=[{"path": str(qfile)}], m=1, temperature=0.0, output_dir=str(tmp_path / "out"),
                      progress=False, export_format="none")  # fmt: skip
    summary = run_synthesis(cfg, policy=case_teacher(), kbs=teacher_kbs())
    assert summary["accepted"] == 3 and summary["rejected"] == 0


def test_step_records_field_by_field(strict_run):
    out, _, _ = strict_run
    records = [r for r in read(out / "steps.jsonl") if r["trajectory_id"] == "q-ok#0"]
    question, sub_q = "[ok] In which city is the Eiffel Tower?", "[ok] What city is the Eiffel Tower in?"
    kbs = [(TEACHER_KB, "test passages")]
    hits = [Hit(Doc("d0", TEACHER_EVIDENCE, "Eiffel Tower", "text"), 1.0, 0, "text"),
            Hit(Doc("d1", "Paris has many museums.", "Paris", "text"), 0.5, 1, "text")]  # fmt: skip
    history = [(sub_q, "Paris")]
    meta = {"source": "toy", "dataset": "toy", "question_id": "q-ok", "sample": 0}
    expected = [
        # plan 1: the question alone; gold = the teacher's sub-question and the KB's display name
        {"trajectory_id": "q-ok#0", "step_type": "plan", "step_index": 0, "messages": plan_messages(question, [], kbs),
         "images": [], "kb_names": [TEACHER_KB], "gold": {"sub_question": sub_q, "kb": TEACHER_KB, "think": "I need the city."},
         "metadata": meta},
        # answer 1: sub-question + its evidence; gold = the teacher's intermediate answer
        {"trajectory_id": "q-ok#0", "step_type": "answer", "step_index": 1, "messages": answer_messages(sub_q, hits),
         "images": [], "kb_names": [], "gold": {"answers": ["Paris"], "think": "The evidence says so."},
         "metadata": meta},
        # plan 2: with the history; gold = stop (None, None)
        {"trajectory_id": "q-ok#0", "step_type": "plan", "step_index": 2,
         "messages": plan_messages(question, history, kbs), "images": [], "kb_names": [TEACHER_KB],
         "gold": {"sub_question": None, "kb": None, "think": "I know enough."}, "metadata": meta},
        # final: with the history; gold = the dataset's gold answers (not the teacher's words)
        {"trajectory_id": "q-ok#0", "step_type": "final", "step_index": 3,
         "messages": final_messages(question, history), "images": [], "kb_names": [],
         "gold": {"answers": ["Paris"], "think": "It is in Paris."}, "metadata": meta},
    ]  # fmt: skip
    assert len(records) == len(expected)
    for got, want in zip(records, expected, strict=True):
        for key in want:
            assert got[key] == want[key], (got["step_index"], key)
        # rendered without the worked example, although the teacher (few_shot: true) was shown it
        assert set(got) == set(want) | {"prompt_settings"} and got["prompt_settings"]["few_shot"] is False
    # only accepted trajectories are exported; none of the rejected ones
    exported = {r["trajectory_id"] for r in read(out / "steps.jsonl")}
    assert exported == {"q-ok#0", "q-vary#0", "q-vary#1"}


def test_step_records_load_in_training_and_export_in_datasets(strict_run):
    import datasets

    from training.step_data import load_step_records

    out, _, _ = strict_run
    records = load_step_records(out / "steps.jsonl", "steps")
    assert [r.step_type for r in records[:4]] == ["plan", "answer", "plan", "final"]
    steps = datasets.load_dataset("parquet", data_files=str(out / "export" / "steps.parquet"), split="train")
    trajs = datasets.load_dataset("parquet", data_files=str(out / "export" / "trajectories.parquet"), split="train")
    assert len(steps) == len(records) == 12 and len(trajs) == 3
    assert steps[0]["gold"]["kb"] == TEACHER_KB and steps[0]["messages"][1]["content"][0]["type"] == "text"
    assert sorted(trajs["id"]) == ["q-ok#0", "q-vary#0", "q-vary#1"] and trajs[0]["num_steps"] == 1


def test_resume_refuses_another_recipe(strict_run, tmp_path):
    out, _, _ = strict_run
    cfg = json.loads((out / "config.json").read_text())
    cfg["m"] = 3
    with pytest.raises(ValueError, match="another recipe"):
        run_synthesis(SynthConfig(**cfg), policy=case_teacher(), kbs=teacher_kbs())


class GrammarTeacher:
    """The case-scripted teacher as a backend with structured output: it records the grammar of every call."""

    name = "scripted-grammar"
    supports_grammar = True

    def __init__(self) -> None:
        self.inner, self.grammars = case_teacher(), []

    def generate(self, conversations, params):
        self.grammars.append(params.grammar)
        return self.inner.generate(conversations, params)


def test_the_teacher_runs_with_the_recipes_agent_settings(tmp_path):
    """Self-distillation: a router as its own teacher, constrained and with the evidence length it is run with.

    Before stop 32 the retry wrapper hid the backend's structured output, so `constrained: on` failed before any
    generation and `auto` silently decoded free; and step records re-rendered evidence at 1,200 characters whatever
    the teacher had read.
    """
    qfile = teacher_questions(tmp_path / "q.jsonl", cases=("ok",))
    cfg = SynthConfig(inputs=[{"path": str(qfile), "dataset": "toy"}], m=1, temperature=0.0, max_steps=2,
                      output_dir=str(tmp_path / "out"), constrained="on", min_steps=1, evidence_chars=20,
                      few_shot=False, teacher={"retries": 0}, progress=False, export_format="none")  # fmt: skip
    teacher = GrammarTeacher()
    summary = run_synthesis(cfg, policy=teacher, kbs=teacher_kbs())
    assert summary["accepted"] == 1
    assert teacher.grammars and all(g for g in teacher.grammars)  # every step decoded inside a grammar
    records = read(tmp_path / "out" / "steps.jsonl")
    assert {r["prompt_settings"]["evidence_chars"] for r in records} == {20}
    answer = next(r for r in records if r["step_type"] == "answer")
    evidence = answer["messages"][-1]["content"]
    assert TEACHER_EVIDENCE[:20].rstrip() + " …" in evidence and TEACHER_EVIDENCE not in evidence
