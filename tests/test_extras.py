"""Every `kbrouter[extra]` that an error message or the README tells a user to install is an extra pyproject defines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "retrievers", "data_synthesis", "eval", "training", "ingest", "kbrouter", "benchmarks", "scripts")
EXTRA = re.compile(r"kbrouter\[([A-Za-z0-9_,\- ]+)\]")


def defined_extras(pyproject: str) -> set[str]:
    """The keys of `[project.optional-dependencies]` (read by hand: `tomllib` is Python >= 3.11, we support 3.10)."""
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.MULTILINE))


def named_extras(text: str) -> set[str]:
    return {name.strip() for group in EXTRA.findall(text) for name in group.split(",")}


def test_named_extras_are_parsed_from_install_hints():
    assert named_extras("pip install 'kbrouter[image]' or 'kbrouter[train, vllm]'") == {"image", "train", "vllm"}


def test_every_named_extra_exists():
    defined = defined_extras((ROOT / "pyproject.toml").read_text())
    assert {"image", "video", "train"} <= defined
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "README.md"]
    wrong = {
        f"{p.relative_to(ROOT)}: kbrouter[{name}]"
        for p in files
        for name in named_extras(p.read_text(encoding="utf-8"))
        if name not in defined
    }
    assert len(files) > 50
    assert not wrong, f"no such extra (defined: {sorted(defined)}): {sorted(wrong)}"
