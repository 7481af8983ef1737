"""Offline settings and shared-data helpers for the synthesis tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHARED = Path(os.environ.get("KBROUTER_SHARED_DATA", ROOT.parent / "shared" / "data"))
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # for `scripted`


@pytest.fixture
def shared_path():
    """Return a function giving a path under ../shared/data that skips the test when that data is absent."""

    def get(*parts: str) -> Path:
        path = SHARED.joinpath(*parts)
        if not path.exists():
            pytest.skip(f"shared data {path} is absent (set KBROUTER_SHARED_DATA to its folder)")
        return path

    return get
