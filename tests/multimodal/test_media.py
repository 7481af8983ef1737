"""Media reading on real files: every shared video decodes, frames land at the asked times, subtitles parse and cut,
and bad files give a `MediaError` naming the path."""

from __future__ import annotations

import numpy as np
import pytest

from retrievers.media import (
    Cue,
    MediaError,
    cues_text,
    cut_cues,
    find_subtitles,
    fit_pixels,
    frames_at,
    load_image,
    parse_subtitles,
    probe_video,
    sample_frames,
    uniform_times,
)

# (file, codec, width, height, approximate duration in seconds): facts from ../shared/data/video/videos.jsonl
SHARED_VIDEOS = [
    ("popeye_sinbad_p1.mkv", "hevc", 1440, 1074, 62.2),  # MKV HEVC
    ("popeye_sinbad_p2.mkv", "hevc", 1440, 1074, 63.2),
    ("popeye_sinbad_p3.mkv", "hevc", 1440, 1074, 63.5),
    ("big_buck_bunny_0_30.webm", "vp8", 1280, 720, 30.0),  # WebM VP8
    ("pyscenedetect_testvideo.mp4", "h264", 1280, 720, 24.0),  # MP4 H.264
    ("pyscenedetect_fades.mp4", "mpeg4", 480, 320, 10.0),  # MPEG-4 part 2
    ("pyscenedetect_counter.mp4", "h264", 1920, 1080, 3.0),
]


@pytest.mark.parametrize("name,codec,width,height,duration", SHARED_VIDEOS)
def test_shared_videos_decode(shared_data, name, codec, width, height, duration):
    path = shared_data / "video" / "videos" / name
    info = probe_video(path)
    assert (info.codec, info.width, info.height) == (codec, width, height)
    assert info.duration == pytest.approx(duration, abs=0.6)
    # 4, not 3: fades.mp4 fades in and out every 3.33 s, so 3 uniform samples all land on the same phase
    frames = sample_frames(path, 4, max_side=128)
    assert len(frames) == 4
    assert all(max(f.size) == 128 for f in frames)
    # frames spread over a real video are not all the same picture
    arrays = [np.asarray(f, dtype=np.float32) for f in frames]
    assert max(np.abs(arrays[0] - a).mean() for a in arrays[1:]) > 1.0


def test_frames_at_hits_the_right_frame(shared_data):
    # counter.mp4 shows its frame number; frames at 0.1 s spacing must differ, and a repeated time gives the same
    # frame whatever the order of the request
    path = shared_data / "video" / "videos" / "pyscenedetect_counter.mp4"
    a, b, a2, end = frames_at(path, [0.05, 1.05, 0.05, 99.0], max_side=256)
    assert np.array_equal(np.asarray(a), np.asarray(a2))
    assert np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).mean() > 0.5
    last = frames_at(path, [2.95], max_side=256)[0]
    assert np.array_equal(np.asarray(end), np.asarray(last))  # past the end -> the last frame


@pytest.mark.parametrize(
    "start,end,n,expected",
    [
        (0.0, 10.0, 2, [2.5, 7.5]),  # midpoints of equal slices
        (4.0, 4.0, 3, [4.0]),  # zero-length span -> one timestamp, not a crash
        (0.0, 1.0, 1, [0.5]),
    ],
)
def test_uniform_times(start, end, n, expected):
    assert uniform_times(start, end, n) == pytest.approx(expected)


SRT = """1
00:00:01,000 --> 00:00:02,500
<i>Hello</i> there

2
00:00:05,000 --> 00:00:07,000
General
Kenobi
"""
VTT = """WEBVTT

00:01.000 --> 00:02.500 align:start
Hello there

intro
00:00:05.000 --> 00:00:07.000
General Kenobi
"""


@pytest.mark.parametrize("suffix,text", [(".srt", SRT), (".vtt", VTT)])  # same cues in both formats
def test_parse_subtitles(tmp_path, suffix, text):
    path = tmp_path / f"clip{suffix}"
    path.write_text(text)
    cues = parse_subtitles(path)
    assert cues == [Cue(1.0, 2.5, "Hello there"), Cue(5.0, 7.0, "General Kenobi")]


@pytest.mark.parametrize(
    "start,end,expected",
    [
        (0.0, 3.0, "Hello there"),  # first cue only
        (2.0, 5.5, "Hello there General Kenobi"),  # straddling cues go with the span
        (2.5, 5.0, ""),  # the gap between cues: no text
        (0.0, 100.0, "Hello there General Kenobi"),
    ],
)
def test_cut_cues(start, end, expected):
    cues = [Cue(1.0, 2.5, "Hello there"), Cue(5.0, 7.0, "General Kenobi")]
    assert cues_text(cut_cues(cues, start, end)) == expected


def test_shared_subtitles_and_lookup(shared_data):
    video = shared_data / "video" / "videos" / "popeye_sinbad_p1.mkv"
    subs = find_subtitles(video, [video.parent.parent / "subtitles"])
    assert subs is not None and subs.name == "popeye_sinbad_p1.eng.srt"
    text = cues_text(cut_cues(parse_subtitles(subs), 12.0, 21.0))
    assert "Sinbad the sailor" in text and "whale" in text


def test_fit_pixels(shared_data):
    image = load_image(next((shared_data / "image" / "coco" / "images").glob("*.jpg")))
    small = fit_pixels(image, max_pixels=100 * 100)
    assert small.size[0] * small.size[1] <= 100 * 100
    assert abs(small.size[0] / small.size[1] - image.size[0] / image.size[1]) < 0.05  # aspect kept
    assert fit_pixels(image, min_pixels=1, max_pixels=10**9) is image  # within budget: untouched


# -- bad input ----------------------------------------------------------------------------------------------------


def _truncated(src, dst, fraction):
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * fraction)])
    return dst


def test_bad_images(tmp_path, shared_data):
    jpg = next((shared_data / "image" / "coco" / "images").glob("*.jpg"))
    cases = [
        (tmp_path / "missing.jpg", FileNotFoundError),  # no such file
        (_truncated(jpg, tmp_path / "half.jpg", 0.5), MediaError),  # truncated JPEG: caught when pixels load
        (tmp_path / "text.jpg", MediaError),  # not an image at all
    ]
    (tmp_path / "text.jpg").write_text("not a jpeg")
    for path, error in cases:
        with pytest.raises(error, match=path.name):
            load_image(path)


def test_bad_videos(tmp_path, shared_data):
    mp4 = shared_data / "video" / "videos" / "pyscenedetect_testvideo.mp4"
    (tmp_path / "garbage.mp4").write_bytes(b"\x00" * 5000)
    cases = [
        tmp_path / "missing.mp4",  # no such file
        tmp_path / "garbage.mp4",  # not a video
        _truncated(mp4, tmp_path / "cut.mp4", 0.3),  # MP4 cut short: its index (moov atom) is at the end
    ]
    for path in cases:
        with pytest.raises(MediaError, match=path.name):
            sample_frames(path, 2)


def test_bad_subtitles(tmp_path):
    (tmp_path / "empty.srt").write_text("no cues in here\n")
    with pytest.raises(FileNotFoundError, match="nope.srt"):
        parse_subtitles(tmp_path / "nope.srt")
    with pytest.raises(MediaError, match="empty.srt"):
        parse_subtitles(tmp_path / "empty.srt")
