"""The lockstep loop with a scripted policy and in-memory KBs: batching, stop reasons, re-asking, errors."""

import json

import pytest

from agent.kbs import KnowledgeBase
from agent.loop import AgentConfig, StepAgent
from agent.types import Question, Trajectory
from tests.fakes import FakeRetriever, ScriptedPolicy, last_user_text, system_text

TEXT = FakeRetriever("text", ["paris is the capital of france", "berlin is the capital of germany"])
TABLE = FakeRetriever("table", ["country | population\nfrance | 68 million"])


def kbs():
    return {
        "Text Retriever": KnowledgeBase("text", "Text Retriever", TEXT, k=5),
        "Table Retriever": KnowledgeBase("table", "Table Retriever", TABLE, k=5),
    }


def two_hop_script(conv):
    """Plans two sub-questions (text, then table) and stops; answers from the first evidence line."""
    sys, user = system_text(conv), last_user_text(conv)
    if "next step" in user:
        n = user.count("Sub-question ")
        if n == 0:
            return "<think>need capital</think><sub-question>capital of france</sub-question><ret>Text Retriever</ret>"
        if n == 1:
            return (
                "<think>need size</think><sub-question>population of france</sub-question><ret>table retriever</ret>"
            )
        return "<think>done</think><sub-question>None</sub-question><ret>None</ret>"
    if sys.startswith("You answer a question using the evidence"):
        return "<think>from evidence</think><answer>" + user.split(": ", 1)[1].split("\n")[0][:20] + "</answer>"
    return "<think>combine</think><answer>Paris</answer>"


def test_two_hop_trajectory_and_lockstep_batching():
    policy = ScriptedPolicy(two_hop_script)
    agent = StepAgent(policy, kbs(), AgentConfig(max_steps=3, few_shot=False))
    qs = [Question(id=str(i), question=f"q{i}", answers=("Paris",)) for i in range(5)]
    trajs = agent.run_batch(qs)
    assert [t.id for t in trajs] == [str(i) for i in range(5)]
    t = trajs[0]
    assert t.stop_reason == "answered" and t.final_answer == "Paris"
    assert [s.kb for s in t.steps] == ["text", "table", None]  # KB ids, not display names, in the record
    assert t.steps[0].hits[0].kb == "text" and t.steps[0].hits[0].doc.id == "text-0"
    assert t.steps[1].hits[0].kb == "table"
    # lockstep: every generate call carried all 5 questions (3 plans, 2 answers, 1 final)
    assert policy.calls == [5, 5, 5, 5, 5, 5]
    # one search per KB per step, all queries in it
    assert [len(b) for b in TEXT.batches[-1:]] == [5]


def test_max_steps_reached():
    script = lambda c: (  # noqa: E731 — always asks for more
        "<think>more</think><sub-question>capital of france</sub-question><ret>Text Retriever</ret>"
        if "next step" in last_user_text(c)
        else "<think>x</think><answer>Paris</answer>"
    )
    t = StepAgent(ScriptedPolicy(script), kbs(), AgentConfig(max_steps=2, few_shot=False)).run_batch(
        [Question(id="a", question="q")]
    )[0]
    assert t.stop_reason == "max_steps" and len(t.steps) == 2 and t.final_answer == "Paris"


def test_format_error_is_reasked_a_bounded_number_of_times_then_recorded():
    policy = ScriptedPolicy(
        lambda c: (
            "I refuse to use tags"
            if "next step" in last_user_text(c) or "did not follow" in last_user_text(c)
            else "<think>x</think><answer>y</answer>"
        )
    )
    t = StepAgent(policy, kbs(), AgentConfig(max_retries=2, few_shot=False)).run_batch(
        [Question(id="a", question="q")]
    )[0]
    assert t.stop_reason == "format_error"
    assert len(t.steps[0].raw) == 3  # first try + 2 re-asks, all kept
    assert set(t.steps[0].format_errors) == {"missing_think", "missing_sub_question", "missing_ret"}
    assert policy.calls == [1, 1, 1, 1]  # 3 plan attempts + final


def test_reask_can_recover():
    seen = {"n": 0}

    def script(c):
        if "next step" in last_user_text(c):
            return "<sub-question>q</sub-question>"  # malformed first
        if "did not follow" in last_user_text(c):
            return "<think>ok</think><sub-question>None</sub-question><ret>None</ret>"
        seen["n"] += 1
        return "<think>x</think><answer>y</answer>"

    t = StepAgent(ScriptedPolicy(script), kbs(), AgentConfig(max_retries=1, few_shot=False)).run_batch(
        [Question(id="a", question="q")]
    )[0]
    assert t.stop_reason == "answered" and t.steps[0].format_errors == () and len(t.steps[0].raw) == 2


def test_backend_error_ends_only_the_affected_call():
    policy = ScriptedPolicy(two_hop_script, fail_on=lambda c: "population" in last_user_text(c))
    t = StepAgent(policy, kbs(), AgentConfig(few_shot=False)).run_batch([Question(id="a", question="q")])[0]
    assert t.stop_reason == "backend_error"
    assert "scripted failure" in t.metadata["error"]
    assert [s.kb for s in t.steps] == ["text"]  # the finished step is kept


def test_failing_kb_becomes_backend_error_not_a_crash():
    class Broken:
        def search(self, queries, k):
            raise RuntimeError("index file corrupt")

    bad = {"Text Retriever": KnowledgeBase("text", "Text Retriever", Broken())}
    t = StepAgent(ScriptedPolicy(two_hop_script), bad, AgentConfig(few_shot=False)).run_batch(
        [Question(id="a", question="q")]
    )[0]
    assert t.stop_reason == "backend_error" and "index file corrupt" in t.metadata["error"]


def test_trajectory_json_round_trip():
    t = StepAgent(ScriptedPolicy(two_hop_script), kbs(), AgentConfig(few_shot=False)).run_batch(
        [Question(id="a", question="q", answers=("Paris",), metadata={"dataset": "x"})]
    )[0]
    again = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again == t
    assert again.metadata["dataset"] == "x"


def test_retrieval_steps_leave_out_the_stop_plan():
    t = StepAgent(ScriptedPolicy(two_hop_script), kbs(), AgentConfig(few_shot=False)).run_batch(
        [Question(id="a", question="q", answers=("Paris",))]
    )[0]
    assert t.steps[-1].sub_question is None  # the plan that stopped
    assert [s.index for s in t.retrieval_steps] == [0, 1] and len(t.steps) == 3
    assert [s.kb for s in t.retrieval_steps] == ["text", "table"] and all(s.hits for s in t.retrieval_steps)


def test_prompts_list_configured_kbs_and_few_shot_uses_them():
    convs = []
    policy = ScriptedPolicy(lambda c: convs.append(c) or two_hop_script(c))
    StepAgent(policy, kbs(), AgentConfig(few_shot=True)).run_batch([Question(id="a", question="q")])
    system = convs[0][0]["content"]
    assert "- Text Retriever" in system and "- Table Retriever" in system
    assert "<ret>Text Retriever</ret>" in convs[0][2]["content"]  # the worked example routes to a configured KB


@pytest.mark.parametrize("bad", [dict(max_steps=-1), dict(top_k=0), dict(max_retries=-2)])
def test_agent_config_validation(bad):
    with pytest.raises(ValueError):
        AgentConfig(**bad)


def test_evidence_images_reach_the_answer_step(tmp_path):
    from PIL import Image

    from retrievers.types import Doc, Hit, Media

    img = tmp_path / "cat.png"
    Image.new("RGB", (8, 8), "red").save(img)

    class ImageKB:
        def search(self, queries, k):
            return [
                [
                    Hit(
                        Doc(id="i0", text="a red square", kb="image", modality="image", media=Media(str(img))),
                        1.0,
                        0,
                        "image",
                    )
                ]
                for _ in queries
            ]

    seen = []

    def script(conv):
        seen.append(conv)
        if "next step" in last_user_text(conv):
            if "Sub-question 1" in last_user_text(conv):
                return "<think>done</think><sub-question>None</sub-question><ret>None</ret>"
            return "<think>look</think><sub-question>what colour?</sub-question><ret>Image Retriever</ret>"
        return "<think>x</think><answer>red</answer>"

    kb = {"Image Retriever": KnowledgeBase("image", "Image Retriever", ImageKB())}
    t = StepAgent(ScriptedPolicy(script), kb, AgentConfig(few_shot=False, evidence_images=1)).run_batch(
        [Question(id="a", question="q")]
    )[0]
    answer_conv = next(c for c in seen if "Evidence:" in last_user_text(c))
    parts = answer_conv[-1]["content"]
    assert {"type": "image", "image": str(img)} in parts  # the hit's pixels, referenced by path
    assert t.steps[0].hits[0].doc.media.path == str(img)
