"""Templated training questions over the clip KB's own shot notes and subtitles (routing data for the video KB).

Every video question of ../shared/data is held out for the scoreboard (data/splits/shared_heldout.json), so the
annotation teacher has no video question to train the router on, and a router that never saw one never picks the
clip KB. This script writes questions from the clip corpus itself, in the video QA format the annotation teacher
reads (`qid, video_id, question, answer, evidence_span_s`), each one answerable from one clip:
- "What happens in <video> between <s> and <e> seconds?" -> the shot note;
- "In <video>, what is seen at about <t> seconds?" -> the shot note;
- "In which part of the video does this happen: <note>?" -> "<s>-<e> s";
- "In <video>, what is said at about <t> seconds?" -> the subtitle line;
and, in the words people use for video questions ("the cartoon", "the clip", "the scene", "the song", "on screen"),
rotating those referents so no single template carries the routing cue:
- "What happens at the start / end of <referent>?" -> the first / last shot note of the video;
- "In <referent>, what happens right after / just before this: <note>?" -> the next / previous shot note;
- "What is on screen in <referent> while someone says "<line>"?" -> the shot note of that line;
- "In the song of <referent>, which words come after "<line>"?" -> the next subtitle line.
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


REFERENTS = ("the cartoon", "the clip", "the video", "the scene", "the film excerpt", "{title}")


def _referent(i: int, title: str) -> str:
    return REFERENTS[i % len(REFERENTS)].format(title=title)


def _lowered(note: str) -> str:
    return note[:1].lower() + note[1:].rstrip(".")


def natural_questions(clips: list[dict]) -> list[dict]:
    """Questions in the words of video QA, over consecutive shots of one video (see the module docstring)."""
    rows, n = [], 0
    by_video: dict[str, list[dict]] = {}
    for clip in clips:
        by_video.setdefault(clip["video_id"], []).append(clip)
    for video_id, shots in by_video.items():
        title = short_title(shots[0]["title"])
        notes = [c["text"].split(" Dialogue: ")[0].strip() for c in shots]

        def ask(qid: str, question: str, answer: str, clip: dict, kind: str = "visual", vid: str = video_id) -> None:
            rows.append({"qid": f"clipnote-{vid}-{qid}", "question": question, "answer": answer,
                         "video_id": vid, "evidence_span_s": [clip["start"], clip["end"]],
                         "evidence_type": kind,
                         "annotation": "templated from the clip KB's shot notes (scripts/make_clip_questions.py)"})  # fmt: skip

        if len(shots) > 1:
            ask("start", f"What happens at the start of {_referent(n, title)}?", notes[0], shots[0])
            ask("end", f"What is shown at the end of {_referent(n + 1, title)}?", notes[-1], shots[-1])
            n += 2
        for i in range(len(shots) - 1):
            ask(f"after{i}", f"In {_referent(n, title)}, what happens right after this: {_lowered(notes[i])}?",
                notes[i + 1], shots[i + 1])  # fmt: skip
            ask(f"before{i}", f"In {_referent(n + 1, title)}, what happens just before this: "
                f"{_lowered(notes[i + 1])}?", notes[i], shots[i])  # fmt: skip
            n += 2
        for i, clip in enumerate(shots):
            said = clip["text"].split(" Dialogue: ")[1] if " Dialogue: " in clip["text"] else ""
            words = [w for w in said.split() if not w.startswith("[")]
            if len(words) >= 8:
                line, rest = " ".join(words[:5]), " ".join(words[5:10])
                ask(f"said{i}", f"What is on screen in {_referent(n, title)} while someone says \"{line}\"?",
                    notes[i], clip)  # fmt: skip
                ask(f"song{i}", f"In the song of {_referent(n + 1, title)}, which words come after \"{line}\"?",
                    rest, clip, "subtitle")  # fmt: skip
                n += 2
    return rows


# Plain English words for what a shot shows; a question names one and the shot note is its answer. Generic on
# purpose (no video's own wording): the router should learn that short "what does the bird do?" questions can be
# about the clips, without a title or "the video" in them.
ACTORS = ("lion", "lions", "bird", "deer", "buck", "rabbit", "whale", "serpent", "dragon", "monster", "giant", "ship",
          "sailors")  # fmt: skip
PLACES = ("leaf", "rock", "stream", "flowers", "meadow", "tree", "sky", "archway", "cliff", "canyon", "hull",
          "burrow", "branch", "surface", "sea", "grass")  # fmt: skip
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh")
SHORT_REFERENTS = ("in the video", "in the clip", "in the cartoon", "on screen", "")


def _names(note: str) -> list[str]:
    """Capitalised words inside a note (characters: "Sinbad", "Popeye"), not its first word."""
    unquoted = " ".join(note.split('"')[::2])  # quoted on-screen text is not a character
    words = [w.strip('(),.;:!?"') for w in unquoted.split()[1:]]
    return sorted({w for w in words if len(w) > 2 and w[:1].isupper() and w[1:].islower()})


def short_questions(clips: list[dict]) -> list[dict]:
    """Short questions in the words people ask about a video: what a thing or a character does, what the n-th shot
    shows, what text is on screen and when. The answer is always a shot note (or its quoted text and time)."""
    rows, n = [], 0
    by_video: dict[str, list[dict]] = {}
    for clip in clips:
        by_video.setdefault(clip["video_id"], []).append(clip)
    for video_id, shots in by_video.items():
        for i, clip in enumerate(shots):
            note = clip["text"].split(" Dialogue: ")[0].strip()
            words = {w.strip('(),.;:!?"').lower() for w in note.split()}

            def ask(qid: str, question: str, answer: str = note, clip: dict = clip, video_id: str = video_id) -> None:
                nonlocal n
                where = SHORT_REFERENTS[n % len(SHORT_REFERENTS)]
                n += 1
                question = question.replace(" {where}", f" {where}" if where else "")
                rows.append({"qid": f"clipshort-{clip['id']}-{qid}", "question": question, "answer": answer,
                             "video_id": video_id, "evidence_span_s": [clip["start"], clip["end"]],
                             "evidence_type": "visual",
                             "annotation": "templated from the clip KB's shot notes (scripts/make_clip_questions.py)"})  # fmt: skip

            if i < len(ORDINALS) and len(shots) > 1 and len(note.split()) > 2:
                ask("ord", f"What is shown in the {ORDINALS[i]} shot {{where}}?")
            for thing in ACTORS:
                if thing in words:
                    plural = thing.endswith("s")
                    ask(f"do-{thing}", f"What {'do' if plural else 'does'} the {thing} do {{where}}?")
                    ask(f"where-{thing}", f"Where {'are' if plural else 'is'} the {thing} {{where}}?")
            for thing in PLACES:
                if thing in words:
                    ask(
                        f"on-{thing}",
                        f"What is {'in' if thing in ('sky', 'sea', 'stream') else 'on'} the {thing} {{where}}?",
                    )
            for name in _names(note):
                ask(f"name-{name}", f"What does {name} do {{where}}?")
                ask(f"next-{name}", f"What is next to {name} {{where}}?")
            if '"' in note:
                quoted = note.split('"')[1]
                ask("text", "What text appears {where}?", quoted)
                ask("when", f'At what time does "{quoted}" appear {{where}}?', f"{clip['start']:g}-{clip['end']:g} s")
    return rows


def clip_questions(shared: Path) -> list[dict]:
    rows = []
    clips = video_clip_rows(shared)
    for clip in clips:
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
    return rows + natural_questions(clips) + short_questions(clips)


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
