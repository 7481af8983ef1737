"""`agent.reuse_answer`: a trajectory whose only search asked the question itself ends with that search's answer.

The final step would then be asked the same question again, with no new evidence; the shipped router rewrote right
answers there ("Charmed" -> "Jawbreaker star Rose Mcgowan best known for being in", docs/stop45).
"""

import pytest

from agent.kbs import KnowledgeBase
from agent.loop import AgentConfig, StepAgent
from agent.types import Question
from eval.scoring import output_validity
from tests.fakes import FakeRetriever, ScriptedPolicy

DOCS = ["Rose McGowan is best known for Charmed", "Charmed is a WB supernatural drama series"]


def _kb() -> dict[str, KnowledgeBase]:
    return {
        "Text Retriever": KnowledgeBase(
            name="text", display_name="Text Retriever", retriever=FakeRetriever("text", DOCS)
        )
    }


def _router(subs: dict[str, list[str]], answer: str = "Charmed"):
    """Searches with the question's scripted sub-questions in turn, then stops; every answer step says `answer`, and
    every final step says `FINAL`."""

    def script(conv):
        user = str(conv[-1]["content"])
        if "next step" in user:
            question = user.split("Original question: ", 1)[1].split("\n", 1)[0].strip()
            todo = subs[question][user.count("\nAnswer ") :]
            if not todo:
                return "<think>t</think>\n<sub-question>None</sub-question>\n<ret>None</ret>"
            return f"<think>t</think>\n<sub-question>{todo[0]}</sub-question>\n<ret>Text Retriever</ret>"
        if "Now give the final answer" in user:
            return "<think>t</think>\n<answer>FINAL</answer>"
        return f"<think>t</think>\n<answer>{answer}</answer>"

    return ScriptedPolicy(script)


Q = "What WB drama was Rose McGowan best known for?"


@pytest.mark.parametrize(
    ("subs", "reused"),
    [
        ([Q], True),  # the question itself
        (["what WB drama was rose mcgowan best known for"], True),  # the same words once normalized
        (["Who is Rose McGowan?"], False),  # another question: its answer is a step, not the answer
        ([Q, "Which network aired Charmed?"], False),  # two searches: the final step combines them
    ],
)
def test_the_final_step_is_skipped_only_after_one_search_that_asked_the_question(subs, reused):
    policy = _router({Q: subs})
    agent = StepAgent(policy, _kb(), AgentConfig(max_steps=3, top_k=1, few_shot=False, reuse_answer=True))
    [t] = agent.run_batch([Question(id="a", question=Q, answers=("Charmed",))])
    assert t.stop_reason == "answered" and len(t.retrieval_steps) == len(subs)
    if reused:
        assert (t.final_answer, t.final_think, t.final_raw) == ("Charmed", "", ())
        assert t.metadata["final_from_step"] == 0 and t.metadata["render"]["reuse_answer"] is True
        assert t.metadata["final_s"] == 0.0
    else:
        assert t.final_answer == "FINAL" and "final_from_step" not in t.metadata
    valid, total = output_validity(t, step_protocol=True)
    assert valid == total == 2 * len(subs) + 1 + (not reused)  # plans, answers, the stop plan, the final if asked


def test_off_by_default_and_in_a_mixed_batch_only_the_redundant_finals_are_skipped():
    other = "Which network aired Charmed?"
    subs = {Q: [Q], other: ["Who made Charmed?"]}
    questions = [Question(id="a", question=Q), Question(id="b", question=other)]
    policy = _router(subs)
    trajs = StepAgent(policy, _kb(), AgentConfig(max_steps=2, top_k=1)).run_batch(questions)
    assert [t.final_answer for t in trajs] == ["FINAL", "FINAL"]  # off: the final step always runs
    assert all("reuse_answer" not in t.metadata["render"] for t in trajs)  # records read as before the setting
    policy = _router(subs)
    trajs = StepAgent(policy, _kb(), AgentConfig(max_steps=2, top_k=1, reuse_answer=True)).run_batch(questions)
    assert [t.final_answer for t in trajs] == ["Charmed", "FINAL"]
    assert policy.calls[-1] == 1  # the last generate call is b's final step alone


def test_an_empty_answer_is_not_reused():
    policy = _router({Q: [Q]}, answer=" ")
    agent = StepAgent(policy, _kb(), AgentConfig(max_steps=2, top_k=1, reuse_answer=True, max_retries=0))
    [t] = agent.run_batch([Question(id="a", question=Q)])
    assert t.final_answer == "FINAL" and "final_from_step" not in t.metadata


def test_every_final_reused_makes_no_final_call():
    policy = _router({Q: [Q]})
    agent = StepAgent(policy, _kb(), AgentConfig(max_steps=1, top_k=1, reuse_answer=True))
    [t] = agent.run_batch([Question(id="a", question=Q)])
    assert t.final_answer == "Charmed" and t.stop_reason == "max_steps"
    assert len(policy.calls) == 2  # the plan and the answer: no empty final call reaches the backend


def test_reuse_answer_enters_the_eval_fingerprint_only_when_on():
    from eval.config import agent_fingerprint_fields

    assert "reuse_answer" not in agent_fingerprint_fields(AgentConfig())  # cached predictions stay valid
    assert agent_fingerprint_fields(AgentConfig(reuse_answer=True))["reuse_answer"] is True


def test_the_stream_and_the_replay_say_where_a_reused_answer_came_from():
    from rich.console import Console

    from agent.display import StepPrinter, print_trajectory

    events = []
    agent = StepAgent(_router({Q: [Q]}), _kb(), AgentConfig(max_steps=2, top_k=1, reuse_answer=True))
    [t] = agent.run_batch([Question(id="a", question=Q)], on_event=lambda *e: events.append(e))
    assert events[-1] == ("a", "final", {"answer": "Charmed", "stop_reason": "answered", "from_step": 0})
    console = Console(record=True, width=200)
    StepPrinter(console)(*events[-1])
    print_trajectory(t, console)
    assert console.export_text().count("final answer: Charmed  (step 1's answer, answered)") == 2
