"""Fixtures for the retriever tests: offline settings, the demo corpus and a session-built demo text KB."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "data" / "demo"


@pytest.fixture(scope="session")
def demo_text_kb(tmp_path_factory):
    """The demo text KB (300 real paragraphs, real MiniLM, hybrid, flat) built once: (cfg, retriever)."""
    from retrievers.config import KBConfig
    from retrievers.kb import build_kb, load_kb

    cfg = KBConfig(
        name="text",
        display_name="Text Retriever",
        kind="text",
        corpus=DEMO / "passages.jsonl",
        index_dir=tmp_path_factory.mktemp("index") / "text",
    )
    build_kb(cfg, progress=False)
    return cfg, load_kb(cfg)
