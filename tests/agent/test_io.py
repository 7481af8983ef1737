"""Question files and JSONL writing: clear errors, no torn lines."""

import json

import pytest

from agent.io import read_questions
from retrievers.jsonl import JsonlWriter, read_jsonl, repair


def write(tmp_path, lines):
    p = tmp_path / "q.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_read_questions_keeps_extra_columns(tmp_path):
    p = write(tmp_path, [json.dumps({"id": 1, "question": " Who? ", "answers": "X", "dataset": "d"})])
    (q,) = read_questions(p)
    assert q.id == "1" and q.question == "Who?" and q.answers == ("X",) and q.metadata == {"dataset": "d"}


@pytest.mark.parametrize(
    "lines,match",
    [
        (['{"id": 1, "question": "a"}', "{broken"], "q.jsonl:2: not valid JSON"),  # names the line
        (['{"question": "a"}'], "q.jsonl:1: missing column 'id'"),  # missing id
        (['{"id": 1, "question": "   "}'], "empty question"),  # empty question
        (['{"id": 1, "question": "a"}', '{"id": 1, "question": "b"}'], "duplicate id"),  # duplicate ids
        (["[1, 2]"], "expected a JSON object"),  # wrong type
    ],
)
def test_read_questions_errors(tmp_path, lines, match):
    with pytest.raises(ValueError, match=match):
        read_questions(write(tmp_path, lines))


def test_missing_image_is_reported_with_question_id(tmp_path):
    p = write(tmp_path, [json.dumps({"id": "img1", "question": "what?", "image": "/nope.jpg"})])
    with pytest.raises(FileNotFoundError, match="img1"):
        read_questions(p)


def test_writer_repairs_a_torn_last_line(tmp_path):
    p = tmp_path / "out.jsonl"
    p.write_text('{"a": 1}\n{"a": 2')  # a crash mid-line
    assert repair(p) == len('{"a": 2')
    with JsonlWriter(p) as w:
        w.write({"a": 3})
    assert [r["a"] for r in read_jsonl(p)] == [1, 3]


def traj(id_: str, stop: str = "answered") -> dict:
    from agent.types import Trajectory

    return Trajectory(id=id_, question=f"q{id_}", final_answer="x", stop_reason=stop).to_dict()


def test_prepare_resume_drops_a_torn_tail_and_errored_records(tmp_path):
    from agent.io import prepare_resume

    p = tmp_path / "out.jsonl"
    p.write_text(
        "\n".join(json.dumps(r) for r in (traj("1"), traj("2", "backend_error"), traj("3"))) + '\n{"id": "4", "que'
    )
    assert prepare_resume(p) == ({"1", "3"}, 1)
    assert [r["id"] for r in read_jsonl(p)] == ["1", "3"]  # rewritten whole, torn tail gone
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_prepare_resume_keeps_errors_when_asked(tmp_path):
    from agent.io import prepare_resume

    p = tmp_path / "out.jsonl"
    p.write_text(json.dumps(traj("1", "backend_error")) + "\n")
    assert prepare_resume(p, retry_errors=False) == ({"1"}, 0)
    assert prepare_resume(tmp_path / "absent.jsonl") == (set(), 0)


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    """`kbrouter run` over a scripted policy and an in-memory KB; returns (argv, out path, questions asked)."""
    import agent.cli
    from agent.kbs import KnowledgeBase
    from agent.loop import AgentConfig, StepAgent
    from tests.fakes import FakeRetriever, ScriptedPolicy, last_user_text

    def script(conv):
        if "next step" in last_user_text(conv):
            return "<think>done</think><sub-question>None</sub-question><ret>None</ret>"
        return "<think>t</think><answer>Paris</answer>"

    asked: list[str] = []

    def setup(args, questions=None):
        kbs = {"Text Retriever": KnowledgeBase("text", "Text Retriever", FakeRetriever("text", ["paris"]), k=1)}
        agent = StepAgent(ScriptedPolicy(script), kbs, AgentConfig(max_steps=1, min_steps=0, few_shot=False))
        run = agent.run

        def recording_run(questions, **kw):
            asked.extend(q.id for q in questions)
            return run(questions, **kw)

        agent.run = recording_run
        return agent, None, None, None

    monkeypatch.setattr(agent.cli, "_setup", setup)
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": str(i), "question": f"q{i}"}) + "\n" for i in range(1, 5)))
    out = tmp_path / "out.jsonl"
    return ["--questions", str(questions), "--out", str(out)], out, asked


def test_run_resumes_past_a_torn_last_line(fake_run):
    from agent.cli import run_main

    argv, out, asked = fake_run
    out.write_text(json.dumps(traj("1")) + "\n" + json.dumps(traj("2"))[:25])  # killed mid-write
    assert run_main(argv) == 0
    assert asked == ["2", "3", "4"]
    assert sorted(r["id"] for r in read_jsonl(out)) == ["1", "2", "3", "4"]


def test_run_retries_errored_trajectories_unless_told_not_to(fake_run):
    from agent.cli import run_main

    argv, out, asked = fake_run
    out.write_text("".join(json.dumps(traj(i, "backend_error" if i == "2" else "answered")) + "\n" for i in "123"))
    assert run_main([*argv, "--no-retry-errors"]) == 0
    assert asked == ["4"]
    assert run_main(argv) == 0
    assert asked == ["4", "2"]
    records = list(read_jsonl(out))
    assert sorted(r["id"] for r in records) == ["1", "2", "3", "4"]  # the errored record was replaced, not doubled
    assert {r["id"]: r["stop_reason"] for r in records}["2"] == "answered"


@pytest.mark.parametrize(
    ("row", "error", "match"),
    [
        ({"id": "a", "question": "q", "images": "x.png"}, ValueError, r"`images` of question 'a' must be a list"),
        ({"id": "a", "question": "q", "image": 5}, ValueError, r"`images` of question 'a' must be a list"),
        ({"id": "a", "question": "q", "answers": {"x": 1}}, ValueError, r"`answers` of question 'a' must be a list"),
        ({"id": "a", "question": "q", "answers": [["x"]]}, ValueError, r"`answers` of question 'a' must be a list"),
    ],
)
def test_a_malformed_question_row_is_named(row: dict, error: type, match: str) -> None:
    from agent.io import question_from_row

    with pytest.raises(error, match=match):
        question_from_row(row, where="q.jsonl:3")


def test_a_numeric_answer_is_one_answer() -> None:
    from agent.io import question_from_row

    assert question_from_row({"id": "a", "question": "q", "answers": 5}).answers == ("5",)
