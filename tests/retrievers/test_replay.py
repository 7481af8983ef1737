"""Replayable retrieval: record (query -> hits) to a snapshot and replay it bit-for-bit, in-process, through the
service, and under a whole agent run on the real demo KB."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agent.backends.base import Completion, SamplingParams
from agent.kbs import KnowledgeBase
from agent.loop import AgentConfig, StepAgent
from agent.types import Question
from retrievers.remote import RemoteRetriever
from retrievers.replay import Recording, Replay, read_snapshot, recording_kbs, replay_kbs
from retrievers.service import create_app, serve_in_thread
from retrievers.types import Doc, Hit, Query, as_queries


class CountingRetriever:
    """A fake KB whose hits depend on the query text, k and image; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def search(self, queries, k=None):
        self.calls += 1
        out = []
        for q in as_queries(queries):
            base = f"{q.text}|{q.image}"
            out.append(
                [
                    Hit(Doc(id=f"{base}#{r}", text=base, metadata={"r": r}), 1 / (r + 3), r, "fake")
                    for r in range(k or 2)
                ]
            )
        return out


QUERIES = [Query("who wrote Dune?"), Query("who wrote Dune?", image="cover.jpg"), Query("naïve café ünïcode")]


def test_replay_returns_recorded_hits_exactly(tmp_path):
    snap = tmp_path / "snap.jsonl"
    rec = Recording(CountingRetriever(), snap, "fake")
    want3 = rec.search(QUERIES, 3)
    want_default = rec.search(["who wrote Dune?"])  # k=None is its own key
    replay = Replay(snap, "fake")
    # same hits, same scores (float round-trip), same metadata, per k
    assert replay.search(QUERIES, 3) == want3
    assert [h.score for h in replay.search(QUERIES, 3)[0]] == [h.score for h in want3[0]]
    assert replay.search(QUERIES, 3)[0][1].doc.metadata == {"r": 1}
    assert replay.search(["who wrote Dune?"]) == want_default
    assert len(replay) == 4


@pytest.mark.parametrize(
    "query,k",
    [
        (Query("who wrote Dune?"), 5),  # recorded text, other k
        (Query("who wrote Dune?", image="other.jpg"), 3),  # recorded text, other image
        (Query("never asked"), 3),  # unseen text
    ],
)
def test_replay_miss_names_query_and_snapshot(tmp_path, query, k):
    snap = tmp_path / "snap.jsonl"
    Recording(CountingRetriever(), snap, "fake").search(QUERIES, 3)
    with pytest.raises(KeyError, match=re.escape(query.text) + ".*" + re.escape(str(snap))):
        Replay(snap, "fake").search([query], k)


def test_snapshot_holds_several_kbs_and_survives_a_torn_line(tmp_path):
    snap = tmp_path / "snap.jsonl"
    kbs = recording_kbs({"a": CountingRetriever(), "b": CountingRetriever()}, snap)
    a, b = kbs["a"].search(["q"], 2), kbs["b"].search(["q"], 1)
    with snap.open("a") as f:
        f.write('{"kb": "a", "text": "torn')  # a crash mid-write leaves half a line
    replays = replay_kbs(snap, ["a", "b"])
    assert replays["a"].search(["q"], 2) == a and replays["b"].search(["q"], 1) == b
    # a KB's replay holds only its own answers
    with pytest.raises(KeyError, match="'b'"):
        replays["b"].search(["q"], 2)
    with pytest.raises(FileNotFoundError, match="record one"):
        read_snapshot(tmp_path / "missing.jsonl")


def test_recording_after_a_killed_recorder_starts_on_a_fresh_line(tmp_path):
    # the torn line is cut before the next answers are appended; they used to run on after it (`{"kb": "a", "te{...}`),
    # a broken middle line that made the whole snapshot unreadable
    snap = tmp_path / "snap.jsonl"
    first = Recording(CountingRetriever(), snap, "a").search(["q1"], 2)
    with snap.open("a") as f:
        f.write('{"kb": "a", "te')
    second = Recording(CountingRetriever(), snap, "a").search(["q2"], 2)
    replay = Replay(snap, "a")
    assert len(replay) == 2 and replay.search(["q1", "q2"], 2) == first + second


def test_service_records_and_replay_matches(demo_text_kb, tmp_path):
    _, kb = demo_text_kb
    snap = tmp_path / "service.jsonl"
    questions = ["Who formed the boy group?", "Which station opened first?"]
    with serve_in_thread(create_app({"text": Recording(kb, snap, "text")})) as url:
        remote = RemoteRetriever(url, "text").search(questions, 4)
    replayed = Replay(snap, "text").search(questions, 4)
    # what the service answered, what it recorded and what in-process search returns are the same hits
    assert replayed == remote
    assert [[h.doc.id for h in hits] for hits in replayed] == [
        [h.doc.id for h in hits] for hits in kb.search(questions, 4)
    ]
    assert all(json.loads(line)["kb"] == "text" for line in snap.open())


class ScriptedPolicy:
    """A fake policy whose choices depend on the evidence it reads, so different hits change the trajectory.

    Plan: ask the question itself, then a follow-up built from the first answer, then stop. Answer: the first
    words of the top evidence line. Final: the last intermediate answer.
    """

    name = "scripted"

    def generate(self, conversations, params: SamplingParams):
        out = []
        for conv in conversations:
            last = conv[-1]["content"]
            if "</ret>" in params.stop:
                answers = re.findall(r"Answer \d+: (.*)", last)
                question = re.search(r"Original question: (.*)", last).group(1)
                if not answers:
                    text = f"<think>look it up</think><sub-question>{question}</sub-question><ret>Text Retriever</ret>"
                elif len(answers) == 1:
                    text = (
                        f"<think>follow up</think><sub-question>What else about {answers[0]}?</sub-question>"
                        "<ret>Text Retriever</ret>"
                    )
                else:
                    text = "<think>enough</think><sub-question>None</sub-question><ret>None</ret>"
            else:
                evidence = re.search(r"^\w+-0: (.*)", last, re.MULTILINE)
                answers = re.findall(r"Answer \d+: (.*)", last)
                if evidence:
                    answer = " ".join(evidence.group(1).split()[:4])
                else:
                    answer = answers[-1] if answers else "unknown"
                text = f"<think>read it</think><answer>{answer}</answer>"
            out.append(Completion(text=text, prompt_tokens=10, completion_tokens=10))
        return out


def test_agent_run_replays_to_identical_trajectories(demo_text_kb, tmp_path):
    cfg, kb = demo_text_kb
    snap = tmp_path / "run.jsonl"
    questions = [
        Question(id="q1", question="Who formed the boy group behind 2014 S/S?"),
        Question(id="q2", question="When did the station open?"),
        Question(id="q3", question="Which award did the film win?"),
    ]
    config = AgentConfig(max_steps=3, top_k=3)

    def agent(retriever):
        return StepAgent(
            ScriptedPolicy(), {"Text Retriever": KnowledgeBase("text", "Text Retriever", retriever, 3)}, config
        )

    live = agent(Recording(kb, snap, "text")).run_batch(questions)
    replayed = agent(Replay(snap, "text")).run_batch(questions)
    # the live run really retrieved: two steps each, evidence from the real KB, follow-ups built from it
    searched = [[s for s in t.steps if s.sub_question] for t in live]
    assert all(len(steps) == 2 for steps in searched) and all(t.stop_reason == "answered" for t in live)
    assert all(len(s.hits) == 3 and s.hits[0].kb == "text" for steps in searched for s in steps)
    assert len({t.steps[1].sub_question for t in live}) == 3
    # identical trajectories, hit scores included (timings are not compared)
    assert replayed == live

    def strip(d: dict) -> dict:
        return {**d, "metadata": {}, "steps": [{**s, "timings": {}} for s in d["steps"]]}

    assert [strip(t.to_dict()) for t in replayed] == [strip(t.to_dict()) for t in live]
    # a question the recording never saw is a replay miss, reported in the trajectory, not silently answered
    (miss,) = agent(Replay(snap, "text")).run_batch([Question(id="q4", question="Something never asked?")])
    assert miss.stop_reason == "backend_error" and "replay miss" in miss.metadata["error"]


def test_serve_retrieval_replays_a_snapshot_without_indexes(tmp_path):
    """`python -m retrievers.service --replay` serves recorded answers; nothing is built or loaded."""
    snap = tmp_path / "snap.jsonl"
    recorded = Recording(CountingRetriever(), snap, "text").search(["who wrote Dune?", "capital?"], 3)
    demo = Path(__file__).resolve().parents[2] / "data" / "demo" / "passages.jsonl"
    kb_yaml = tmp_path / "kb.yaml"
    kb_yaml.write_text(f"knowledge_bases:\n  - name: text\n    kind: text\n    corpus: {demo}\n    k: 3\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "retrievers.service",
        "--kb",
        str(kb_yaml),
        "--replay",
        str(snap),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2])
    url = f"http://127.0.0.1:{port}"
    try:
        client = RemoteRetriever(url, "text", retries=8, backoff=0.5)  # retries while the service starts
        # recorded queries come back exactly; the KB listing shows the YAML's default k
        assert client.search(["who wrote Dune?", "capital?"], 3) == recorded
        assert httpx.get(url + "/kbs").json()["kbs"][0]["k"] == 3
        # an unrecorded query is a server-side replay miss, reported as a 500 naming the query
        with pytest.raises(RuntimeError, match="replay miss.*never asked"):
            client.search(["never asked"], 3)
    finally:
        proc.terminate()
        proc.wait(30)
