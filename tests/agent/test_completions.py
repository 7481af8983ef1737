"""The agent's chat-completion payloads (agent/completions.py): each step's KB by display name (`kb`) and by name
(`kb_name`), for known KBs, a KB the server no longer serves, and the stop step; the streamed plan and evidence
events, an evidence event without hits included."""

from __future__ import annotations

import asyncio
import json
import threading

from agent.completions import completion, step_cards, stream_chunks
from agent.kbs import KnowledgeBase
from agent.types import Step, Trajectory
from retrievers.security import MediaRoots
from retrievers.types import Doc, Hit

# display names unlike their names, so a name rendered where a display name belongs (or the reverse) shows
KBS = {
    "Encyclopedia": KnowledgeBase("wiki", "Encyclopedia", retriever=None),
    "Stats Tables": KnowledgeBase("tables", "Stats Tables", retriever=None),
}
MEDIA = MediaRoots([])


def hit(doc_id: str, kb: str) -> Hit:
    return Hit(Doc(doc_id, f"text of {doc_id}", doc_id.title()), 0.5, 0, kb)


TRAJ = Trajectory(
    "q",
    "Who won?",
    steps=(
        Step(0, "t0", "Who won the most golds?", "tables", (hit("medals", "tables"),), answer="Norway"),
        Step(1, "t1", "Where is Norway?", "wiki", (hit("norway", "wiki"),), answer="Europe"),
        Step(2, "t2", "And its flag?", "atlas", (), answer="red"),  # a KB this server does not serve (an old run)
        Step(3, "enough"),  # the stop: no KB
    ),
    final_answer="Norway",
)


def test_step_cards_name_each_kb_both_ways_and_an_unknown_one_as_given():
    cards = step_cards(TRAJ, MEDIA, KBS)
    assert [(c["kb"], c["kb_name"]) for c in cards] == [
        ("Stats Tables", "tables"),
        ("Encyclopedia", "wiki"),
        ("atlas", "atlas"),  # rendered, not a 500
        (None, None),
    ]
    assert [c["hits"][0]["kb"] for c in cards[:2]] == ["tables", "wiki"]  # a card names its KB as the hit does


def test_completion_reasoning_names_kbs_by_display_name():
    payload = completion("c1", 0, "m", TRAJ, MEDIA, KBS)
    reasoning = payload["choices"][0]["message"]["reasoning_content"].splitlines()
    assert [line for line in reasoning if line.startswith("Knowledge base:")] == [
        "Knowledge base: Stats Tables",
        "Knowledge base: Encyclopedia",
        "Knowledge base: atlas",
    ]
    assert [line.split(":")[0] for line in reasoning if line.startswith("Evidence from")] == [
        "Evidence from Stats Tables",
        "Evidence from Encyclopedia",
        "Evidence from atlas",
    ]
    assert [s["kb"] for s in payload["kbrouter"]["steps"]] == ["Stats Tables", "Encyclopedia", "atlas", None]


def stream_events(events: list[tuple[str, dict]], traj: Trajectory) -> list[dict]:
    """The `kbrouter` objects of the chunks `stream_chunks` sends for these loop events and this finished run."""

    async def go() -> list[str]:
        queue: asyncio.Queue = asyncio.Queue()
        for e in events:
            queue.put_nowait(e)
        run = asyncio.get_running_loop().create_future()
        run.set_result(traj)
        stats = {"errors": 0, "cancelled": 0}
        return [c async for c in stream_chunks(run, threading.Event(), queue, "m", "c1", 0, MEDIA, KBS, stats)]

    out = []
    for c in asyncio.run(go()):
        body = c.removeprefix("data: ").strip()
        if body != "[DONE]":
            out.append(json.loads(body).get("kbrouter"))
    return [e for e in out if e is not None]


def test_stream_events_name_the_kb_both_ways_even_without_hits():
    events = [
        ("plan", {"step": 0, "think": "t", "sub_question": "Who won?", "kb": "Stats Tables", "errors": []}),
        ("evidence", {"step": 0, "kb": "Stats Tables", "hits": [hit("medals", "tables")]}),
        ("answer", {"step": 0, "answer": "Norway", "errors": []}),
        ("plan", {"step": 1, "think": "t", "sub_question": "Where?", "kb": "Encyclopedia", "errors": []}),
        ("evidence", {"step": 1, "kb": "Encyclopedia", "hits": []}),  # the search found nothing
        ("answer", {"step": 1, "answer": "unknown", "errors": []}),
        ("plan", {"step": 2, "think": "t", "sub_question": None, "kb": None, "errors": []}),  # the stop
    ]
    got = stream_events(events, TRAJ)
    assert [(e["event"], e.get("kb"), e.get("kb_name")) for e in got] == [
        ("plan", "Stats Tables", "tables"),
        ("evidence", "Stats Tables", "tables"),
        ("answer", None, None),
        ("plan", "Encyclopedia", "wiki"),
        ("evidence", "Encyclopedia", "wiki"),  # named though no card carries it
        ("answer", None, None),
        ("plan", None, None),
        ("final", None, None),
    ]
    assert [(s["kb"], s["kb_name"]) for s in got[-1]["steps"]][:2] == [
        ("Stats Tables", "tables"),
        ("Encyclopedia", "wiki"),
    ]
