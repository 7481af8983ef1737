"""Fixtures of the ingest tests: the real shared documents (../shared/data/docs) and their parses, made once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SHARED

ROOT = Path(__file__).resolve().parents[2]
DOCS = SHARED / "docs"


@pytest.fixture(scope="session")
def docs() -> Path:
    """The shared real documents; tests that need them skip when the folder is absent."""
    if not (DOCS / "qa.jsonl").is_file():
        pytest.skip(f"shared documents not found at {DOCS} (set KBROUTER_SHARED_DATA to the shared data folder)")
    return DOCS


@pytest.fixture(scope="session")
def parse_doc(docs, tmp_path_factory):
    """`parse_doc(name)` -> the `Parsed` of one shared document (figures under a session folder), parsed once."""
    from ingest.job import PARSERS
    from ingest.units import Limits

    out = tmp_path_factory.mktemp("parsed")
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            path = docs / name
            cache[name] = PARSERS[path.suffix.lower()](path, name, out / path.stem, f"figures/{path.stem}", out,
                                                       Limits(), "")  # fmt: skip
        return cache[name], out

    return get
