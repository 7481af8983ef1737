"""`agent.answer_samples`: self-consistency for answer and final steps.

Each step decodes n answers (the first as configured, n - 1 sampled in one extra call) and keeps the well-formed one
with the highest summed token F1 against the others. The scripted tests fix the candidates; the last test runs the
real SmolLM2 inside the step grammars.
"""

import pytest

from agent.kbs import KnowledgeBase
from agent.loop import AgentConfig, StepAgent
from agent.types import Question, Step, Trajectory
from eval.config import agent_fingerprint_fields
from tests.fakes import FakeRetriever, RecordsParams, ScriptedPolicy

DOCS = ["Rose McGowan is best known for Charmed", "Charmed is a WB supernatural drama series"]
Q = "What WB drama was Rose McGowan best known for?"


def _kb() -> dict[str, KnowledgeBase]:
    return {
        "Text Retriever": KnowledgeBase(
            name="text", display_name="Text Retriever", retriever=FakeRetriever("text", DOCS)
        )
    }


class _Policy(RecordsParams, ScriptedPolicy):
    pass


def _router(answers: list[str], finals: list[str] = ("FINAL",), fail_samples: bool = False) -> _Policy:
    """One search with the question itself, then a stop plan. The answer steps' replies are `answers` in the order
    the calls ask for them (the first decode, then the samples), and the final steps' `finals`, the last repeated."""
    queue = {"answer": list(answers), "final": list(finals)}

    def script(conv):
        user = str(conv[-1]["content"])
        if "next step" in user:
            if "\nAnswer " in user:
                return "<think>t</think>\n<sub-question>None</sub-question>\n<ret>None</ret>"
            return f"<think>t</think>\n<sub-question>{Q}</sub-question>\n<ret>Text Retriever</ret>"
        todo = queue["final" if "Now give the final answer" in user else "answer"]
        reply = todo.pop(0) if len(todo) > 1 else todo[0]
        return reply if reply.startswith("<") else f"<think>t</think>\n<answer>{reply}</answer>"

    def answer_sample(conv) -> bool:  # an answer step's conversation after its first decode
        user = str(conv[-1]["content"])
        return len(queue["answer"]) == 1 and "next step" not in user and "Now give the final answer" not in user

    fail = answer_sample if fail_samples else None
    return _Policy(script, fail_on=fail)


def _run(policy, **cfg) -> Trajectory:
    config = AgentConfig(max_steps=2, top_k=1, few_shot=False, max_retries=0, **cfg)
    [t] = StepAgent(policy, _kb(), config).run_batch([Question(id="a", question=Q, answers=("Charmed",))])
    return t


def test_the_answer_most_others_agree_with_is_kept():
    policy = _router(["Jawbreaker", "Charmed", "the series Charmed", "Charmed"])
    t = _run(policy, answer_samples=4)
    [step] = t.retrieval_steps
    assert step.answer == "Charmed"
    assert step.votes["answers"] == ["Jawbreaker", "Charmed", "the series Charmed", "Charmed"]
    assert step.votes["kept"] == 1  # "Charmed" agrees with both others (1 + 0.67); the first decode with none
    assert step.votes["agreement"][0] == 0.0
    assert step.votes["agreement"][1] == pytest.approx(1 + 2 / 3)  # "series charmed" once normalized: F1 2/3
    assert step.raw[-1] == "<think>t</think>\n<answer>Charmed</answer>" and len(step.raw) == 2  # plan, kept answer
    # the samples were asked in one call at the answer temperature, after the first decode at the configured one
    answer_calls = [p for p in policy.params if p.step == "answer"]
    assert [p.temperature for p in answer_calls] == [0.0, 0.7]
    assert policy.calls == [1, 1, 3, 1, 1, 3]  # plan, answer, its samples, stop plan, final, its samples
    # every decode's tokens count: plan, 4 answers, the stop plan, 4 finals (5 completion tokens each)
    assert t.metadata["completion_tokens"] == 5 * 10
    assert t.metadata["render"]["answer_samples"] == 4


def test_ties_keep_the_first_decode_and_malformed_samples_get_no_vote():
    t = _run(_router(["Charmed", "Jawbreaker", "<think>t</think> no tags", "Scream"]), answer_samples=4)
    [step] = t.retrieval_steps
    assert step.answer == "Charmed" and step.votes["kept"] == 0
    assert step.votes["answers"][2] is None and step.votes["agreement"][2] is None


def test_a_malformed_first_decode_gives_way_to_a_well_formed_sample():
    t = _run(_router(["<think>t</think> Charmed, no tags", "Charmed"]), answer_samples=2)
    [step] = t.retrieval_steps
    assert (step.answer, step.format_errors, step.votes["kept"]) == ("Charmed", (), 1)


def test_the_final_step_votes_too_and_the_votes_round_trip():
    t = _run(_router(["Charmed"], finals=["Scream", "Charmed", "Charmed"]), answer_samples=3)
    assert t.final_answer == "Charmed"
    assert t.metadata["final_votes"] == {
        "answers": ["Scream", "Charmed", "Charmed"],
        "agreement": [0.0, 1.0, 1.0],
        "kept": 1,
    }
    again = Trajectory.from_dict(t.to_dict())
    assert again.retrieval_steps[0].votes == t.retrieval_steps[0].votes
    assert again.metadata["final_votes"] == t.metadata["final_votes"]


def test_one_sample_is_the_agent_as_before():
    policy = _router(["Charmed"])
    t = _run(policy)
    assert policy.calls == [1, 1, 1, 1]  # plan, answer, stop plan, final: no extra call
    assert "votes" not in t.retrieval_steps[0].to_dict() and "final_votes" not in t.metadata
    assert "answer_samples" not in t.metadata["render"]
    # the default leaves eval fingerprints as they were before the setting, so cached predictions stay valid
    assert "answer_samples" not in agent_fingerprint_fields(AgentConfig())
    assert "answer_temperature" not in agent_fingerprint_fields(AgentConfig(answer_temperature=1.0))
    assert agent_fingerprint_fields(AgentConfig(answer_samples=3))["answer_temperature"] == 0.7


def test_a_backend_error_in_the_samples_keeps_the_first_decodes(caplog):
    t = _run(_router(["Charmed", "Scream"], fail_samples=True), answer_samples=3)
    assert t.stop_reason == "answered" and t.retrieval_steps[0].answer == "Charmed"
    assert not t.retrieval_steps[0].votes
    assert "the first decodes stand" in caplog.text


@pytest.mark.parametrize(("key", "value"), [("answer_samples", 0), ("answer_temperature", 0.0)])
def test_bad_settings_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"agent.{key}"):
        AgentConfig(**{key: value})


def test_step_without_votes_reads_as_before():
    d = Step(index=0, sub_question="q", kb="text", answer="a").to_dict()
    assert "votes" not in d and Step.from_dict(d).votes == {}


def test_smollm2_votes_inside_the_step_grammars(smollm2_dir):
    """Real SmolLM2 under the answer grammar: every decode is a well-formed candidate, the kept one is the step's
    answer, and a seeded run repeats its samples."""
    from agent.backends.hf import TransformersPolicy

    policy = TransformersPolicy(smollm2_dir)
    config = AgentConfig(max_steps=1, top_k=2, min_steps=1, constrained="on", answer_samples=3, seed=0,
                         answer_tokens=96, final_tokens=96, plan_tokens=160)  # fmt: skip
    question = Question(id="a", question=Q)
    runs = [StepAgent(policy, _kb(), config).run_batch([question])[0] for _ in range(2)]
    for t in runs:
        [step] = t.retrieval_steps
        assert len(step.votes["answers"]) == 3 and None not in step.votes["answers"]
        assert step.answer == step.votes["answers"][step.votes["kept"]]
        assert len(t.metadata["final_votes"]["answers"]) == 3
    assert runs[0].retrieval_steps[0].votes == runs[1].retrieval_steps[0].votes


def test_the_display_says_how_many_answers_agree():
    from rich.console import Console

    from agent.display import StepPrinter, print_trajectory, vote_note

    assert vote_note({}) == "" and vote_note(None) == ""
    assert vote_note({"answers": ["Charmed", None, "charmed", "Scream"], "kept": 0}).endswith(
        "(2 of 4 answers agree)[/dim]"
    )
    console = Console(record=True, width=200)
    t = _run(_router(["Jawbreaker", "Charmed", "Charmed"], finals=["Scream", "Charmed", "Charmed"]), answer_samples=3)
    print_trajectory(t, console)
    text = console.export_text()
    assert "intermediate answer: Charmed (2 of 3 answers agree)" in text
    assert "final answer: Charmed  (answered) (2 of 3 answers agree)" in text
    live = Console(record=True, width=200)  # the live display gets the same from the loop's events
    config = AgentConfig(max_steps=2, top_k=1, few_shot=False, max_retries=0, answer_samples=3)
    StepAgent(_router(["Jawbreaker", "Charmed", "Charmed"]), _kb(), config).run_batch(
        [Question(id="a", question=Q)], StepPrinter(live)
    )
    assert "intermediate answer: Charmed (2 of 3 answers agree)" in live.export_text()
