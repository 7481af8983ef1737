"""The shipped multimodal demo config parses into all five KB kinds, and its media files are the attributed ones."""

from __future__ import annotations

import json

from retrievers.config import load_kb_configs

from .conftest import DEMO, ROOT


def test_demo_multimodal_config_parses():
    configs = load_kb_configs(ROOT / "configs" / "kb" / "demo_multimodal.yaml")
    assert [(c.name, c.display_name, c.kind) for c in configs] == [
        ("text", "Text Retriever", "text"),
        ("table", "WikiTable Retriever", "table"),
        ("image", "Image Retriever", "image"),
        ("clip", "Clip Retriever", "clip"),
        ("video", "Video Retriever", "video"),
    ]


def test_demo_media_are_attributed():
    attribution = (DEMO / "ATTRIBUTION-media.md").read_text()
    rows = [json.loads(line) for line in (DEMO / "images" / "images.jsonl").open()]
    assert 1 <= len(rows) <= 8
    for row in rows:
        assert (DEMO / "images" / row["image"]).is_file()
        assert row["license"] in ("Attribution License", "Attribution-ShareAlike License")  # CC BY / CC BY-SA only
        assert f"data/demo/images/{row['image']}" in attribution
    for video in (DEMO / "videos").iterdir():
        assert video.name in attribution
