"""Templated training questions over the clip KB's own shot notes and subtitles (routing data for the video KB).

Every video question of ../shared/data is held out for the scoreboard (data/splits/shared_heldout.json), so the
annotation teacher has no video question to train the router on, and a router that never saw one never picks the
clip KB. This script writes questions from the clip corpus itself, in the video QA format the annotation teacher
reads (`qid, video_id, question, answer, evidence_span_s`), each one answerable from one clip:
- "What happens in <video> between <s> and <e> seconds?" -> the shot note;
- "In <video>, what is seen at about <t> seconds?" -> the shot note;
- "In which part of the video does this happen: <note>?" -> "<s>-<e> s";
- "In <video>, what is said at about <t> seconds?" -> the subtitle line.
No scored question is read. The notes are the same text the clip KB indexes, so the answer and final steps of these
trajectories would teach the clips' content; `scripts/split_steps.py --plan-only clip_notes` keeps only their plan
steps (routing and phrasing a clip question), and the model card says so.

Run: python scripts/make_clip_questions.py --shared ../shared/data --out data/synth/clip_note_questions.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eval.corpora import parse_srt, video_clip_rows


def short_title(title: str) -> str:
    return title.split(" (")[0].split(",")[0].strip()


def clip_questions(shared: Path) -> list[dict]:
    rows = []
    for clip in video_clip_rows(shared):
        title, s, e = short_title(clip["title"]), clip["start"], clip["end"]
        note = clip["text"].split(" Dialogue: ")[0].strip()
        base = {"video_id": clip["video_id"], "evidence_span_s": [s, e], "evidence_type": "visual",
                "annotation": "templated from the clip KB's shot note (scripts/make_clip_questions.py)"}  # fmt: skip
        mid = round((s + e) / 2)
        lowered = note[:1].lower() + note[1:].rstrip(".")
        asks = [
            (f"What happens in {title} between {s:g} and {e:g} seconds?", note),
            (f"In {title}, what is seen at about {mid} seconds?", note),
            (f"In which part of the video does this happen: {lowered}?", f"{s:g}-{e:g} s"),
        ]
        for i, (question, answer) in enumerate(asks):
            rows.append({"qid": f"clipnote-{clip['id']}-{i}", "question": question, "answer": answer, **base})
    root = shared / "video"
    for line in (root / "videos.jsonl").read_text(encoding="utf-8").splitlines():
        video = json.loads(line) if line.strip() else None
        if not video or not video.get("subtitle_file"):
            continue
        for j, (s, e, text) in enumerate(parse_srt(root / video["subtitle_file"])):
            if len(text.split()) < 3:  # "[barking and roaring]"-sized cues say too little to ask about
                continue
            rows.append({"qid": f"clipnote-{video['video_id']}-sub{j}", "video_id": video["video_id"],
                         "question": f"In {short_title(video['source_title'])}, what is said at about {round(s)} seconds?",
                         "answer": text, "evidence_span_s": [s, e], "evidence_type": "subtitle",
                         "annotation": "templated from the video's subtitles (scripts/make_clip_questions.py)"})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default="../shared/data")
    ap.add_argument("--out", default="data/synth/clip_note_questions.jsonl")
    args = ap.parse_args()
    rows = clip_questions(Path(args.shared))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.rename(out)
    print(f"{out}: {len(rows)} questions")


if __name__ == "__main__":
    main()
