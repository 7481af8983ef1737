"""Chat turns into agent questions, hits into cards, trajectories without server paths, KBs shown by display name
(agent/chat.py)."""

from __future__ import annotations

import pytest

from agent.chat import (
    Turn,
    hit_card,
    kb_label,
    latest_images,
    public_trajectory,
    question_text,
    reasoning_of,
    table_rows,
)
from agent.kbs import KnowledgeBase
from agent.types import Step, Trajectory
from retrievers.security import MediaRoots
from retrievers.types import Doc, Hit, Media

U, A = "user", "assistant"


@pytest.mark.parametrize(
    "turns,expected",
    [
        # one turn: the question as asked, whitespace collapsed
        ([Turn(U, "  Who wrote\nHamlet? ")], "Who wrote Hamlet?"),
        # a follow-up: the earlier exchange is context
        ([Turn(U, "Who wrote Hamlet?"), Turn(A, "Shakespeare"), Turn(U, "Where was he born?")],
         'Earlier question: "Who wrote Hamlet?" answered "Shakespeare". Now: Where was he born?'),
        # system turns are not context (the agent has its own prompts)
        ([Turn("system", "be nice"), Turn(U, "Q?")], "Q?"),
        # two user turns in a row: the first is context without an answer
        ([Turn(U, "first?"), Turn(U, "second?")], 'Earlier question: "first?". Now: second?'),
    ],
)  # fmt: skip
def test_question_text(turns, expected):
    assert question_text(turns) == expected


def test_only_the_last_few_turns_are_context():
    turns = [t for i in range(10) for t in (Turn(U, f"q{i}"), Turn(A, f"a{i}"))] + [Turn(U, "now?")]
    text = question_text(turns, max_context_turns=2)
    assert '"q8"' in text and '"q9"' in text and '"q7"' not in text


@pytest.mark.parametrize(
    "turns,match",
    [([Turn(A, "hi")], "last message"), ([Turn(U, "  ", ("data:x",))], "no text"), ([], "last message")],
)
def test_a_question_needs_a_last_user_turn_with_text(turns, match):
    with pytest.raises(ValueError, match=match):
        question_text(turns)


def test_a_follow_up_keeps_the_latest_image():
    turns = [Turn(U, "what is this?", ("img1",)), Turn(A, "a horse"), Turn(U, "what colour is it?")]
    assert latest_images(turns) == ("img1",)
    assert latest_images([Turn(U, "q")]) == ()


def test_table_rows_and_cards(tmp_path):
    assert table_rows("Title: T\n| a | b |\n| 1 | 2 |") == {"header": ["a", "b"], "rows": [["1", "2"]]}
    assert table_rows("no table here") is None
    photo = tmp_path / "p.png"
    photo.write_bytes(b"x")
    media = MediaRoots([tmp_path])
    hit = Hit(Doc("d", "word " * 200, "T", "image", "image", Media(str(photo))), 0.123456, 0, "image")
    card = hit_card(hit, media)
    assert card["score"] == 0.1235 and len(card["snippet"]) == 300 and card["snippet"].endswith("…")
    assert card["media"]["url"].startswith("/media/0/p.png?sig=") and card["media"]["kind"] == "image"
    outside = Hit(Doc("e", "t", modality="image", media=Media("/etc/hostname")), 1.0, 0, "image")
    assert hit_card(outside, media)["media"]["url"] is None  # never linked outside the media folders


def test_public_trajectory_has_no_server_paths(tmp_path):
    photo = tmp_path / "p.png"
    photo.write_bytes(b"x")
    hit = Hit(Doc("d", "t", "T", "image", "image", Media(str(photo)), {"path": str(photo)}), 1.0, 0, "image")
    traj = Trajectory("q", "Q?", images=(str(tmp_path / "upload.png"),), steps=(Step(0, "t", "s", "image", (hit,)),))
    d = public_trajectory(traj, MediaRoots([tmp_path]))
    assert str(tmp_path) not in str(d) and d["images"] == ["upload:upload.png"]
    back = Trajectory.from_dict(d)
    assert back.steps[0].hits[0].doc.media.path.startswith("/media/0/p.png")


# display names unlike their names in more than case, so a name rendered where a display name belongs shows
KBS = [KnowledgeBase("wiki", "Encyclopedia", retriever=None), KnowledgeBase("tables", "Stats Tables", retriever=None)]


@pytest.mark.parametrize(
    "kb,to,expected",
    [
        ("wiki", "display_name", "Encyclopedia"),  # a step's KB name -> what the policy wrote
        ("tables", "display_name", "Stats Tables"),
        (
            "stats tables",
            "display_name",
            "Stats Tables",
        ),  # a display name as the parser reads it comes back configured
        ("Stats Tables", "name", "tables"),  # a plan event's display name -> the KB name (kb_name)
        ("gone", "display_name", "gone"),  # a KB this server does not serve (an old trajectory): shown as given
        ("gone", "name", "gone"),
        (None, "display_name", None),  # a step that did not search
        (None, "name", None),
    ],
)
def test_kb_label_maps_known_kbs_and_shows_unknown_ones_as_given(kb, to, expected):
    assert kb_label(kb, KBS, to) == expected


def test_kb_label_shows_an_ambiguous_kb_as_given():
    # "wiki" is the first KB's name and the second's display name: kb_id refuses it, rendering must not fail
    kbs = [KnowledgeBase("wiki", "Encyclopedia", retriever=None), KnowledgeBase("w2", "Wiki", retriever=None)]
    assert kb_label("wiki", kbs) == "wiki"


def test_reasoning_names_each_step_s_kb_by_display_name():
    hit = Hit(Doc("d1", "Norway won ten golds.", "Medals"), 0.5, 0, "tables")
    traj = Trajectory(
        "q",
        "Who won?",
        steps=(
            Step(0, "look it up", "Who won the most golds?", "tables", (hit,), answer="Norway"),
            Step(1, "once more", "Where is Norway?", "atlas", (), answer="Europe"),  # a KB no longer served
            Step(2, "enough"),  # the stop
        ),
        final_answer="Norway",
    )
    lines = reasoning_of(traj, iter(KBS)).splitlines()  # any iterable of KBs, read once
    assert lines == [
        "Step 1. Thought: look it up",
        "Sub-question: Who won the most golds?",
        "Knowledge base: Stats Tables",
        "Evidence from Stats Tables: 1 hits; best 'Medals' (score 0.50): Norway won ten golds.",
        "Answer 1: Norway",
        "Step 2. Thought: once more",
        "Sub-question: Where is Norway?",
        "Knowledge base: atlas",
        "Evidence from atlas: nothing found.",
        "Answer 2: Europe",
        "Step 3. Thought: enough",
        "Enough is known to answer.",
    ]
