"""`scripts/train_chain.sh`: trains recipes in order, logs each stage's time, skips finished stages when rerun, and
names a bad argument. Two real one-step LoRA SFT stages on SmolLM2, the second continuing the first's adapter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .conftest import CPU_SFT_RECIPE, REPO

SCRIPT = REPO / "scripts" / "train_chain.sh"


def _run(args: list[str], times: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "CHAIN_TIMES": str(times)}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=900)


def test_a_chain_trains_in_order_then_skips_what_is_done(smollm2_dir, short_steps_file, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    common = (f"base: {CPU_SFT_RECIPE}\ntrain_file: {short_steps_file}\ntrain_format: steps\nstep_types: null\n"
              "max_steps: 1\nsave_strategy: no\ngradient_checkpointing: false\n")  # fmt: skip
    (tmp_path / "a.yaml").write_text(
        common + f"output_dir: {first}\nlora: {{r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj]}}\n"
    )
    (tmp_path / "b.yaml").write_text(common + f"output_dir: {second}\ninit_adapter: {first}\n")
    times = tmp_path / "times.tsv"
    stages = [f"sft:{tmp_path / 'a.yaml'}", f"sft:{tmp_path / 'b.yaml'}"]

    done = _run(stages, times)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (first / "adapter_model.safetensors").is_file() and (second / "adapter_model.safetensors").is_file()
    rows = [line.split("\t") for line in times.read_text().splitlines()]
    assert [r[1] for r in rows] == [str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]
    assert all(r[4] == "0" and int(r[2]) >= 0 and int(r[3]) > 0 for r in rows), rows  # exit 0, seconds, peak RSS KiB

    again = _run(stages, times)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("done already") == 2
    assert len(times.read_text().splitlines()) == 2  # nothing retrained


def test_a_bad_stage_is_named_before_anything_trains(tmp_path: Path) -> None:
    bad = _run([f"dpo:{CPU_SFT_RECIPE}"], tmp_path / "times.tsv")
    assert bad.returncode == 2
    assert f"'dpo:{CPU_SFT_RECIPE}' is not STAGE:RECIPE" in bad.stderr
    # a bad second item stops the chain before the good first one trains
    missing = _run([f"sft:{CPU_SFT_RECIPE}", f"sft:{tmp_path / 'nope.yaml'}"], tmp_path / "times.tsv")
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr and "train_chain: sft" not in missing.stdout
    assert not (tmp_path / "times.tsv").exists()
