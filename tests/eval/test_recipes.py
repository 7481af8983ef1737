"""Every eval recipe parses into its dataclass, and the CPU recipe runs on the real parts (slow)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eval.config import load_eval_config
from tests.conftest import SHARED

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "configs" / "eval").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_parses(path: Path) -> None:
    cfg = load_eval_config(path)
    specs = cfg.dataset_specs()
    assert specs and cfg.methods  # line 1 (the command): tests/test_configs.py
    kb = cfg.path("kb_config")
    if not kb.is_file():  # a KB set a documented command writes first (`kbrouter ingest ... --out <it>`)
        made = (ROOT / cfg.kb_config.removeprefix("../../")).resolve() == kb.resolve()
        header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
        assert made and f"--out {cfg.kb_config.removeprefix('../../')}" in header, (
            f"{path.name}: kb_config {kb} does not exist and no header line writes it"
        )


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data folder {SHARED} is absent")
def test_cpu_recipe_end_to_end_on_real_parts(tmp_path: Path) -> None:
    """SmolLM2-135M + MiniLM KBs, two shared sets, three methods, two questions each (a few minutes on CPU)."""
    from eval.cli import main

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    code = main(
        [
            "--config",
            str(ROOT / "configs" / "eval" / "smollm2_cpu.yaml"),
            "--output_dir",
            str(tmp_path),
            "--datasets",
            "hotpotqa",
            "tabfact",
            "--limit",
            "2",
            "--methods",
            "no_retrieval",
            "rag_wiki",
            "agent",
            "--quiet",
        ]
    )
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["per_dataset"]) == {"hotpotqa", "tabfact"}
    assert results["per_dataset"]["hotpotqa"]["rag_wiki"]["n"] == 2
    assert "retrieval/recall@k" in results["per_dataset"]["hotpotqa"]["rag_wiki"]
    assert (tmp_path / "routing_by_step.png").stat().st_size > 0
