"""Clip and video KBs on real videos, including the bad-input cases: the build reports and goes on."""

from __future__ import annotations

import json

import pytest

from retrievers.kb import build_kb, load_kb, read_manifest

SRT = """1
00:00:01,000 --> 00:00:03,000
A green leaf sways in the wind.

2
00:00:08,000 --> 00:00:11,000
A deer looks up from the grass.
"""


@pytest.fixture
def corpus(tmp_path, shared_data):
    """A JSONL corpus mixing good videos and every kind of bad input."""
    videos = shared_data / "video" / "videos"
    (tmp_path / "testvideo.srt").write_text(SRT)
    data = (videos / "pyscenedetect_testvideo.mp4").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(data[: len(data) // 4])  # truncated MP4 (index lost)
    (tmp_path / "noise.mkv").write_bytes(b"\x1a\x45\xdf\xa3" + b"\x00" * 4000)  # EBML magic, no real content
    rows = [
        {"id": "testvideo", "video": str(videos / "pyscenedetect_testvideo.mp4"), "subtitles": "testvideo.srt"},
        {"id": "fades", "video": str(videos / "pyscenedetect_fades.mp4")},  # no ContentDetector cut: one clip
        {"id": "counter", "video": str(videos / "pyscenedetect_counter.mp4"), "subtitles": "missing.srt"},
        {"id": "cut", "video": "cut.mp4"},
        {"id": "noise", "video": "noise.mkv"},
        {"id": "gone", "video": "gone.webm"},
    ]
    path = tmp_path / "videos.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_clip_kb_build_reports_and_goes_on(kb_config, corpus):
    cfg = kb_config("clip", corpus, frames_per_clip=2, min_clip_s=2.0, max_clip_s=60.0, visual_weight=0.2)
    manifest = read_manifest(build_kb(cfg, progress=False))
    report = {s["id"]: s for s in manifest["skipped"]}
    assert {k for k, s in report.items() if s["action"] == "skipped"} == {"cut", "noise", "gone"}
    assert all(
        report[k]["reason"] and report[k]["source"].endswith(ext)
        for k, ext in (("cut", "cut.mp4"), ("noise", "noise.mkv"), ("gone", "gone.webm"))
    )
    assert report["counter"]["action"] == "indexed without transcript" and "missing.srt" in report["counter"]["reason"]
    assert "no scene change" in report["fades"]["reason"]
    kb = load_kb(cfg)
    by_video: dict[str, list] = {}
    for d in kb.docs:
        by_video.setdefault(d.metadata["video_id"], []).append(d)
    assert len(by_video["fades"]) == 1 and len(by_video["counter"]) == 1  # scene-less videos: one clip each
    clips = sorted(by_video["testvideo"], key=lambda d: d.media.start)
    assert len(clips) >= 2 and clips[0].media.start == 0.0  # cuts at frames 30, 180, 394 (short first scene merged)
    assert all(a.media.end == b.media.start for a, b in zip(clips, clips[1:], strict=False))  # contiguous spans
    assert all(d.media.end > d.media.start for d in kb.docs)  # no zero-length clip
    # the transcript is cut to each clip: the leaf line (1-3 s) and the deer line (8-11 s) go to different clips
    leaf = [d for d in clips if "leaf" in d.text]
    deer = [d for d in clips if "deer" in d.text]
    assert leaf and deer and leaf[0].id != deer[0].id
    hit = kb.search(["a deer looks up from the grass"], k=1)[0][0]
    assert hit.doc.id == deer[0].id and hit.doc.modality == "video"
    assert hit.doc.media.start < 11.0 and hit.doc.media.end > 8.0  # the hit's span holds (part of) the deer line


def test_video_kb_whole_videos(kb_config, corpus):
    cfg = kb_config("video", corpus, frames_per_video=4, visual_weight=0.2)
    manifest = read_manifest(build_kb(cfg, progress=False))
    assert manifest["doc_count"] == 3 and manifest["skipped_count"] == 3
    kb = load_kb(cfg)
    hit = kb.search(["a green leaf and a deer"], k=1)[0][0]
    assert hit.doc.id == "testvideo"
    assert "leaf" in hit.doc.text and "deer" in hit.doc.text  # the full transcript
    assert hit.doc.media.start is None and hit.doc.metadata["duration"] == pytest.approx(24.0, abs=0.1)


def test_no_usable_video_is_an_error(kb_config, tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "x", "video": "nope.mp4"}) + "\n")
    with pytest.raises(ValueError, match="yielded no documents.*nope.mp4"):
        build_kb(kb_config("video", tmp_path / "bad.jsonl"), progress=False)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"min_clip_s": 100.0, "max_clip_s": 60.0}, "max_clip_s"),  # cannot split without going under the minimum
        ({"frames_per_clip": 0}, "frames_per_clip"),
        ({"treshold": 30}, "treshold"),  # typo named, valid options listed
    ],
)
def test_bad_clip_options(kb_config, corpus, options, match):
    with pytest.raises(ValueError, match=match):
        build_kb(kb_config("clip", corpus, **options), progress=False)
