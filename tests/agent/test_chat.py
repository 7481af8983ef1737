"""Chat turns into agent questions, hits into cards, trajectories without server paths (agent/chat.py)."""

from __future__ import annotations

import pytest

from agent.chat import Turn, hit_card, latest_images, public_trajectory, question_text, table_rows
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
