"""Scene detection against PySceneDetect's own golden cut lists, and the scene -> clip rules."""

from __future__ import annotations

import json

import pytest

from retrievers.video import detect_cuts, scenes_to_clips

VIDEOS = ("pyscenedetect_testvideo.mp4", "pyscenedetect_fades.mp4", "pyscenedetect_counter.mp4")


def match_cuts(found: list[int], gold: list[int], tolerance: int = 1) -> int:
    """Greedy one-to-one matching of cut frames within `tolerance` frames; returns the number matched."""
    free = sorted(gold)
    matched = 0
    for f in sorted(found):
        near = [g for g in free if abs(g - f) <= tolerance]
        if near:
            free.remove(min(near, key=lambda g: abs(g - f)))
            matched += 1
    return matched


@pytest.mark.parametrize(
    "found,gold,expected",
    [
        ([30, 180], [30, 180], 2),  # exact
        ([31, 179], [30, 180], 2),  # off by one frame: still a match
        ([32], [30], 0),  # off by two: no match
        ([30, 30], [30], 1),  # one gold cut matches at most once
    ],
)
def test_match_cuts(found, gold, expected):
    assert match_cuts(found, gold) == expected


@pytest.mark.parametrize(
    "setting,threshold",
    [("default", 27.0), pytest.param("t30", 30.0, marks=pytest.mark.slow)],  # t30 gives the same cuts: slow tier
)
def test_content_detector_matches_goldens(shared_data, setting, threshold):
    tp = n_found = n_gold = 0
    for name in VIDEOS:
        gold = json.loads((shared_data / "video" / "goldens" / f"{name}.ContentDetector.{setting}.json").read_text())
        cuts = detect_cuts(shared_data / "video" / "videos" / name, threshold=threshold, min_scene_frames=15).frames
        tp += match_cuts(cuts, gold["cuts"])
        n_found += len(cuts)
        n_gold += len(gold["cuts"])
        print(f"{name} ContentDetector.{setting}: found {cuts} gold {gold['cuts']}")  # noqa: T201
    precision = tp / n_found if n_found else 1.0
    recall = tp / n_gold if n_gold else 1.0
    print(f"ContentDetector.{setting}: precision {precision:.2f} recall {recall:.2f} (+-1 frame, {n_gold} gold cuts)")  # noqa: T201
    assert n_gold == 3  # testvideo has 3 cuts; fades and counter have none for this detector
    assert (precision, recall) == (1.0, 1.0)


def test_skip_nonref_stays_close(shared_data):
    # Skipping non-reference frames halves decoding; cuts may move to a neighbouring reference frame.
    gold = [30, 180, 394]
    cuts = detect_cuts(shared_data / "video" / "videos" / "pyscenedetect_testvideo.mp4", skip_nonref=True).frames
    assert match_cuts(cuts, gold, tolerance=3) == len(gold)


@pytest.mark.parametrize(
    "cuts,duration,min_s,max_s,expected",
    [
        ([], 10.0, 2.0, 180.0, [(0.0, 10.0)]),  # no detected cut: one clip (documented fallback)
        ([4.0], 10.0, 2.0, 180.0, [(0.0, 4.0), (4.0, 10.0)]),  # plain cut
        ([1.0, 10.0], 20.0, 2.0, 8.0, [(0.0, 5.0), (5.0, 10.0), (10.0, 15.0), (15.0, 20.0)]),  # merge, then split
        ([5.0, 5.5], 10.0, 2.0, 180.0, [(0.0, 5.5), (5.5, 10.0)]),  # 0.5 s scene merged into the previous one
        ([0.0, 10.0, 12.0], 10.0, 2.0, 180.0, [(0.0, 10.0)]),  # cuts at/after the ends make no zero-length clip
        ([], 400.0, 2.0, 180.0, [(0.0, 133.333), (133.333, 266.667), (266.667, 400.0)]),  # long scene split evenly
        ([], 0.0, 2.0, 180.0, []),  # zero-length video: no clip (the build reports it)
    ],
)
def test_scenes_to_clips(cuts, duration, min_s, max_s, expected):
    clips = scenes_to_clips(cuts, duration, min_s, max_s)
    assert clips == expected
    assert all(b - a <= max_s + 1e-6 for a, b in clips)
