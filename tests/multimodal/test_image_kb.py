"""Image KB on the real demo COCO photos: search by text and by image, fusion weights, bad images skipped."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from retrievers.kb import build_kb, load_kb, read_manifest
from retrievers.media_retriever import MediaRetriever
from retrievers.types import Doc, Query

from .conftest import DEMO, TINY_CLIP

IMAGES = DEMO / "images" / "images.jsonl"


@pytest.fixture(scope="module")
def rows():
    return [json.loads(line) for line in IMAGES.open()]


@pytest.fixture(scope="module")
def caption_kb(tmp_path_factory):
    from retrievers.config import KBConfig

    cfg = KBConfig(
        name="image",
        kind="image",
        corpus=IMAGES,
        search="dense",
        index_dir=tmp_path_factory.mktemp("index") / "image",
        options={**TINY_CLIP, "visual_weight": 0.0},
    )  # caption similarity only: a real MiniLM signal
    build_kb(cfg, progress=False)
    return load_kb(cfg)


def reweighted(kb: MediaRetriever, weight: float) -> MediaRetriever:
    """The same index searched with another visual weight (a query-time setting)."""
    return MediaRetriever(kb.cfg, kb.docs, kb.visual, kb.text, kb.clip, weight)


@pytest.mark.parametrize(
    "query,expected",
    [
        ("a cat looking at its reflection in a mirror", "coco-358083"),  # paraphrase of its captions
        ("a red stop sign beside a bush with red flowers", "coco-525891"),
        ("a bear in the grass with vultures around it", "coco-229997"),
    ],
)
def test_search_by_text(caption_kb, query, expected):
    hits = caption_kb.search([query], k=3)[0]
    assert hits[0].doc.id == expected
    top = hits[0].doc
    assert top.modality == "image" and top.media is not None and top.media.path.endswith(".jpg")
    assert top.media.start is None
    assert [h.rank for h in hits] == [0, 1, 2] and hits[0].score >= hits[1].score >= hits[2].score


def test_search_by_image(caption_kb, rows):
    # CLIP only (visual_weight 1): the query image is one of the indexed photos, so it must be its own best match
    # (cosine 1) even with random CLIP weights; the text part of the query is empty
    kb = reweighted(caption_kb, 1.0)
    for row in rows[:4]:
        path = str(IMAGES.parent / row["image"])
        hit = kb.search([Query(text="", image=path)], k=1)[0][0]
        assert hit.doc.id == row["id"]
        assert hit.score == pytest.approx(1.0, abs=1e-4)


def test_fusion_is_the_weighted_sum(caption_kb):
    # score(w) = w * visual + (1 - w) * caption, checked by recovering both parts from w = 0 and w = 1
    scores = {w: reweighted(caption_kb, w).scores(["a bus driving down the road"])[0] for w in (0.0, 1.0, 0.8)}
    np.testing.assert_allclose(scores[0.8], 0.8 * scores[1.0] + 0.2 * scores[0.0], atol=1e-5)


def test_empty_query_and_bad_query_image(caption_kb, tmp_path):
    assert caption_kb.search([""], k=3) == [[]]  # no text, no image: nothing to search
    hits = caption_kb.search([Query("a bus on a road", image=str(tmp_path / "missing.jpg"))], k=1)[0]
    assert hits[0].doc.id == "coco-252639"  # the bad query image is ignored, the text still works


def test_bad_images_are_skipped_and_reported(kb_config, tmp_path, rows):
    folder = tmp_path / "corpus"
    folder.mkdir()
    good = rows[:3]
    for row in good:
        shutil.copy(IMAGES.parent / row["image"], folder / row["image"])
    data = (IMAGES.parent / rows[3]["image"]).read_bytes()
    (folder / "truncated.jpg").write_bytes(data[: len(data) // 3])
    lines = [
        *good,
        {"id": "cut", "image": "truncated.jpg", "caption": "half a file"},
        {"id": "gone", "image": "missing.jpg", "caption": "no file"},
    ]
    (folder / "images.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = kb_config("image", folder / "images.jsonl")
    manifest = read_manifest(build_kb(cfg, progress=False))
    assert manifest["doc_count"] == 3
    assert sorted(s["id"] for s in manifest["skipped"]) == ["cut", "gone"]
    assert all(s["reason"] for s in manifest["skipped"])
    assert len(load_kb(cfg).search(["a horse"], k=10)[0]) == 3


def test_nothing_usable_is_an_error(kb_config, tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "x", "image": "nope.jpg", "caption": "c"}) + "\n")
    with pytest.raises(ValueError, match="yielded no documents"):
        build_kb(kb_config("image", tmp_path / "bad.jsonl"), progress=False)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"visual_weight": 1.5}, "visual_weight"),  # out of [0, 1]
        ({"clip_modle": "ViT-B-32"}, "clip_modle"),  # typo: unknown option named, valid ones listed
    ],
)
def test_bad_options(kb_config, options, match):
    with pytest.raises(ValueError, match=match):
        build_kb(kb_config("image", IMAGES, **options), progress=False)


def test_hits_round_trip(caption_kb):
    hit = caption_kb.search(["horses on a hill"], k=1)[0][0]
    assert Doc.from_dict(json.loads(json.dumps(hit.doc.to_dict()))) == hit.doc
