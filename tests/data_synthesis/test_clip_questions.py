"""The templated clip-KB training questions (scripts/make_clip_questions.py): real clips, none a scored question."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_clip_questions_name_real_spans_and_never_a_scored_question(shared_data: Path, load_script) -> None:
    from eval.corpora import video_clip_rows

    rows = load_script("scripts/make_clip_questions.py").clip_questions(shared_data)
    clips = {(c["video_id"], c["start"], c["end"]): c for c in video_clip_rows(shared_data)}
    scored = [json.loads(line) for line in (shared_data / "video" / "qa.jsonl").read_text().splitlines() if line]
    assert len({r["qid"] for r in rows}) == len(rows) > 50
    assert not {r["question"].lower() for r in rows} & {q["question"].lower() for q in scored}
    assert not {r["qid"] for r in rows} & {q["qid"] for q in scored}
    for r in rows:
        s, e = r["evidence_span_s"]
        overlapping = [c for (v, cs, ce), c in clips.items() if v == r["video_id"] and cs < e and ce > s]
        assert overlapping, r  # every question is about a span some clip of the KB covers
        if r["evidence_type"] == "visual" and not r["answer"].endswith(" s"):
            assert any(r["answer"] in c["text"] for c in overlapping)  # that clip's note (or its on-screen text)
    short = [r for r in rows if r["qid"].startswith("clipshort-")]
    assert len(short) > 50 and max(len(r["question"].split()) for r in short) <= 12  # short, as video QA asks


def test_committed_clip_questions_are_the_scripts_output(shared_data: Path, load_script) -> None:
    committed = REPO / "data" / "synth" / "clip_note_questions.jsonl"
    rows = [json.loads(line) for line in committed.read_text(encoding="utf-8").splitlines()]
    assert rows == load_script("scripts/make_clip_questions.py").clip_questions(shared_data)
