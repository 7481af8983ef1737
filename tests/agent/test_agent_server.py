"""`kbrouter serve-agent` through the official `openai` client on loopback, over the fake StepPolicy (no model):
streamed steps as reasoning deltas plus the `kbrouter` extension field, the answer as content, the trajectory read
back into a `Trajectory`, follow-up and image turns, /v1/models, and a cancelled stream that stops the agent."""

from __future__ import annotations

import base64
import threading
import time

import httpx
import pytest

from agent.agent_server import create_agent_app
from agent.types import Trajectory
from retrievers.service import serve_in_thread
from tests.agent.agent_setups import make_setups
from tests.fakes import StepPolicy

openai = pytest.importorskip("openai", reason="the client tests need the openai package (pip install -e '.[dev]')")


@pytest.fixture
def served(tmp_path):
    setups, media = make_setups(tmp_path)
    app = create_agent_app(setups, media_roots=[media])
    with serve_in_thread(app) as url:
        yield url, setups, media, app


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)


def data_url(path) -> str:  # noqa: ANN001
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def test_models_lists_the_setups_with_their_kbs(served):
    url, setups, *_ = served
    models = client(url).models.list().data
    assert [m.id for m in models] == ["kbrouter-demo", "kbrouter-vision"]
    info = models[0].model_extra["kbrouter"]
    assert [kb["display_name"] for kb in info["kbs"]] == ["Text KB", "Table KB", "Image KB", "Clip KB"]
    assert [kb["name"] for kb in info["kbs"]] == ["text", "table", "image", "clip"]
    assert info["vision"] is False and models[1].model_extra["kbrouter"]["vision"] is True


def test_non_streaming_answer_with_the_whole_trajectory(served):
    url, *_ = served
    r = client(url).chat.completions.create(
        model="kbrouter-demo", messages=[{"role": "user", "content": "Where was Marie Curie born?"}]
    )
    message = r.choices[0].message
    assert message.content.startswith("Marie Curie was born in Warsaw")
    assert "Sub-question: Where was Marie Curie born?" in message.model_extra["reasoning_content"]
    traj = Trajectory.from_dict(r.model_extra["kbrouter"]["trajectory"])
    assert traj.final_answer == message.content and traj.stop_reason == "answered"
    assert [s.kb for s in traj.steps] == ["text", None]  # searched the text KB, then stopped
    assert traj.steps[0].hits[0].doc.id == "marie" and traj.steps[0].hits[0].kb == "text"
    steps = r.model_extra["kbrouter"]["steps"]
    assert steps[0]["kb"] == "Text KB" and steps[0]["hits"][0]["title"] == "Marie Curie"
    assert r.usage.total_tokens > 0


def test_streaming_sends_each_step_then_the_answer(served):
    url, *_ = served
    stream = client(url).chat.completions.create(
        model="kbrouter-demo",
        messages=[{"role": "user", "content": "Which nation tops the medal table?"}],
        stream=True,
    )
    chunks = list(stream)
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    events = [c.model_extra["kbrouter"] for c in chunks if c.model_extra.get("kbrouter")]
    assert [e["event"] for e in events] == ["plan", "evidence", "answer", "plan", "final"]
    plan, evidence = events[0], events[1]
    assert plan["kb"] == "Table KB" and plan["kb_name"] == "table" and plan["sub_question"]
    card = evidence["hits"][0]
    assert {"id", "kb", "score", "title", "snippet", "media", "table"} <= set(card)
    assert card["table"]["header"] == ["nation", "gold"] and card["table"]["rows"][0] == ["Norway", "10"]
    assert "Knowledge base: Table KB" in reasoning and "Evidence from Table KB" in reasoning
    assert content == "Norway" and chunks[-1].choices[0].finish_reason == "stop"
    traj = Trajectory.from_dict(events[-1]["trajectory"])
    assert traj.final_answer == "Norway" and traj.steps[0].hits[0].doc.id == "medals"


def test_a_follow_up_turn_has_the_earlier_turns_as_context(served):
    url, setups, *_ = served
    r = client(url).chat.completions.create(
        model="kbrouter-demo",
        messages=[
            {"role": "user", "content": "Who was Marie Curie?"},
            {"role": "assistant", "content": "A physicist and chemist."},
            {"role": "user", "content": "And where was she born?"},
        ],
    )
    traj = Trajectory.from_dict(r.model_extra["kbrouter"]["trajectory"])
    assert 'Earlier question: "Who was Marie Curie?" answered "A physicist and chemist."' in traj.question
    assert traj.question.endswith("Now: And where was she born?")
    assert traj.steps[0].hits[0].doc.id == "marie"  # the context is what finds her
    assert any("Earlier question" in s for s in setups[0].policy.seen)


def test_an_image_turn_gives_the_question_image_and_image_cards(served):
    url, setups, media, _ = served
    content = [
        {"type": "text", "text": "Which image shows these horses?"},
        {"type": "image_url", "image_url": {"url": data_url(media / "horses.png")}},
    ]
    r = client(url).chat.completions.create(model="kbrouter-vision", messages=[{"role": "user", "content": content}])
    query = setups[1].kbs["Image KB"].retriever.queries[-1]
    assert query.image is not None and open(query.image, "rb").read() == (media / "horses.png").read_bytes()
    card = r.model_extra["kbrouter"]["steps"][0]["hits"][0]
    assert card["modality"] == "image" and card["media"]["kind"] == "image"
    got = httpx.get(url + card["media"]["url"], timeout=10)  # the signed link serves the file itself
    assert got.status_code == 200 and got.content == (media / "horses.png").read_bytes()
    traj = r.model_extra["kbrouter"]["trajectory"]
    assert str(media) not in str(traj), "no server path leaves the server"
    assert Trajectory.from_dict(traj).images[0].startswith("upload:")
    # a text-only model refuses the same turn, clearly
    with pytest.raises(openai.BadRequestError, match="text-only policy"):
        client(url).chat.completions.create(model="kbrouter-demo", messages=[{"role": "user", "content": content}])


def test_a_clip_card_links_the_video_with_its_time_span(served):
    url, *_ = served
    r = client(url).chat.completions.create(
        model="kbrouter-demo", messages=[{"role": "user", "content": "In which clip does Popeye sing?"}]
    )
    card = r.model_extra["kbrouter"]["steps"][0]["hits"][0]
    assert card["media"]["kind"] == "video" and (card["media"]["start"], card["media"]["end"]) == (12.5, 20.0)
    assert httpx.get(url + card["media"]["url"], headers={"range": "bytes=0-7"}, timeout=10).status_code == 206


@pytest.mark.parametrize("kbs", [["text"], ["Text KB"], ["text kb", "text"]])  # a name, a display name, both
def test_a_request_narrows_its_kbs_by_name_or_display_name(served, kbs):
    url, setups, *_ = served
    r = client(url).chat.completions.create(
        model="kbrouter-demo",
        messages=[{"role": "user", "content": "Which nation tops the medal table?"}],  # Table KB, unless narrowed
        extra_body={"kbrouter": {"kbs": kbs}},
    )
    step = r.model_extra["kbrouter"]["steps"][0]
    assert (step["kb"], step["kb_name"]) == ("Text KB", "text")
    assert "Knowledge base: Text KB" in r.choices[0].message.model_extra["reasoning_content"]
    assert setups[0].kbs["Table KB"].retriever.queries == []  # the KB left out was not searched


@pytest.mark.parametrize(
    "body,status,match",
    [
        ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "not served here"),
        ({"model": "kbrouter-demo", "messages": []}, 400, "messages"),
        ({"model": "kbrouter-demo", "messages": [{"role": "user", "content": "   "}]}, 400, "no text"),
        ({"model": "kbrouter-demo", "messages": [{"role": "assistant", "content": "hi"}]}, 400, "last message"),
        ({"model": "kbrouter-demo", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
        ({"model": "kbrouter-demo", "messages": [{"role": "user", "content": "hi"}], "kbrouter": {"kbs": ["x"]}},
         400, "unknown KB"),
    ],
)  # fmt: skip
def test_bad_requests_get_a_4xx_with_a_message(served, body, status, match):
    url, *_ = served
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == status and match in r.json()["error"]["message"]


def test_a_cancelled_stream_stops_the_agent_and_frees_its_slot(tmp_path):
    gate = threading.Event()
    policy = StepPolicy(gate=gate)
    setups, media = make_setups(tmp_path, policy, max_steps=6)
    app = create_agent_app(setups, media_roots=[media])
    with serve_in_thread(app) as url:
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            json={
                "model": "kbrouter-demo",
                "stream": True,
                "messages": [{"role": "user", "content": "Who is Marie?"}],
            },
            timeout=10,
        ) as s:
            lines = s.iter_lines()
            assert next(lines).startswith("data: ")  # the role chunk: the agent is running, held at its first plan
        # the client has gone; let the held generation finish
        time.sleep(0.5)
        gate.set()
        time.sleep(1.0)
        calls = len(policy.seen)
        health = httpx.get(url + "/health", timeout=10).json()
        ok = client(url).chat.completions.create(model="kbrouter-demo", messages=[{"role": "user", "content": "hi"}])
    assert calls <= 2, f"the agent went on after its client left ({calls} generations)"
    assert health["cancelled"] == 1 and app.in_flight == 0
    assert ok.choices[0].message.content


def test_cli_help_exits_zero(capsys):
    from agent.agent_server import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--api-key" in capsys.readouterr().out


def test_setups_from_flags_share_equal_policies_and_kb_sets(tmp_path):
    import argparse

    from agent.agent_server import load_setups
    from agent.cli import add_common_args

    kb_file = tmp_path / "kbs.yaml"
    kb_file.write_text("knowledge_bases: []\n")
    same = tmp_path / "same.yaml"
    same.write_text(f"kb: {kb_file}\npolicy: {{backend: transformers, model: smollm2}}\nagent: {{max_steps: 1}}\n")
    vl = tmp_path / "vl.yaml"
    vl.write_text(f"kb: {kb_file}\npolicy: {{backend: vl, model: tiny-vl}}\n")
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    ap.add_argument("--name")
    ap.add_argument("--setup", action="append", default=[])
    ap.add_argument("--vision", default=None)
    args = ap.parse_args(
        ["--kb", str(kb_file), "--model", "smollm2", "--setup", f"short={same}", "--setup", f"eyes={vl}"]
    )
    made, loaded = [], []

    def make_policy(cfg):  # noqa: ANN001, ANN202
        made.append(cfg)
        return StepPolicy()

    setups, kb_files = load_setups(args, make_policy, lambda f: loaded.append(f) or {})
    assert [s.name for s in setups] == ["kbrouter-kbs", "short", "eyes"]
    assert [s.vision for s in setups] == [False, False, True]
    assert [s.config.max_steps for s in setups] == [3, 1, 3]
    assert len(made) == 2 and setups[0].policy is setups[1].policy  # one SmolLM2 for both text setups
    assert loaded == [str(kb_file)] and kb_files == [str(kb_file)]
    with pytest.raises(ValueError, match="NAME=CONFIG_YAML"):
        load_setups(ap.parse_args(["--kb", str(kb_file), "--setup", "nameless"]), make_policy, lambda f: {})


def test_a_non_streaming_client_that_leaves_stops_the_agent(tmp_path):
    gate = threading.Event()
    policy = StepPolicy(gate=gate)
    setups, media = make_setups(tmp_path, policy, max_steps=6)
    app = create_agent_app(setups, media_roots=[media])
    with serve_in_thread(app) as url:
        body = {"model": "kbrouter-demo", "messages": [{"role": "user", "content": "Who is Marie?"}]}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/v1/chat/completions", json=body, timeout=0.5)
        time.sleep(0.5)  # the server notices the disconnect
        gate.set()
        time.sleep(1.0)
        health = httpx.get(url + "/health", timeout=10).json()
    assert len(policy.seen) == 1, "the agent went on after its client left"
    assert health["cancelled"] == 1 and app.in_flight == 0


def test_per_question_answer_grammars_batch_by_grammar_through_the_server(tmp_path):
    """`agent.answer_words: shown` sends one grammar per conversation; the server's batcher keys work by its
    SamplingParams, so each answer conversation goes in with its own grammar, never a tuple cut to another batch."""
    from dataclasses import replace

    from agent.loop import AgentConfig

    class Grammared(StepPolicy):
        supports_grammar = True

        def __init__(self) -> None:
            super().__init__()
            self.grammars = []

        def generate(self, conversations, params):
            self.grammars.append((len(conversations), params.step, params.grammar))
            return super().generate(conversations, params)

    policy = Grammared()
    setups, media = make_setups(tmp_path, policy=policy)
    setups = [replace(s, config=AgentConfig(max_steps=2, constrained="on", answer_words="shown")) for s in setups]
    with serve_in_thread(create_agent_app(setups, media_roots=[media])) as url:
        r = client(url).chat.completions.create(
            model="kbrouter-demo", messages=[{"role": "user", "content": "Where was Marie Curie born?"}]
        )
    assert r.choices[0].message.content.startswith("Marie Curie was born in Warsaw")  # the fake ignores grammars
    answers = [(n, g) for n, step, g in policy.grammars if step in ("answer", "final")]
    assert answers and all(n == 1 and isinstance(g, str) and '"Warsaw"' in g for n, g in answers)
