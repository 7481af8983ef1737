"""`kbrouter ask` latency (issue 14, item 4): it starts without the heavy packages it does not use, and its
`KBROUTER_TIMINGS` hook (read by `benchmarks/ask_latency.py`) writes one line per phase.

Each case imports what the ask path imports before the model loads, in a fresh interpreter, and lists the heavy
top-level packages that came with it. torch, transformers and the retrieval libraries load later, inside the policy
and KB constructors that need them; training / serving / dataset packages never belong on this path. A top-level
`import torch` (or `trl`, `datasets`, ...) added to any of these modules makes the case fail and name the package.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# never needed to answer a question from the CLI: training, serving engines, dataframes, web UIs, image models
NEVER = ["trl", "deepspeed", "vllm", "datasets", "gradio", "pandas", "open_clip", "peft", "accelerate", "pyarrow"]
# needed, but only once the policy / KBs are constructed (inside `make_policy` and `load_knowledge_bases`)
LATER = ["torch", "transformers", "sentence_transformers", "faiss", "bm25s", "tokenizers", "cv2", "PIL", "sklearn"]

CASES = [
    # the console script's dispatcher: `kbrouter --help` and every subcommand pass through it
    ["kbrouter.cli"],
    # what `kbrouter ask` imports before `_setup` constructs anything (agent.cli, then ask_main's own imports)
    ["agent.cli", "agent.display", "agent.io", "rich.console"],
    # what `_setup` imports before it calls make_policy / load_knowledge_bases
    ["agent.backends.factory", "agent.kbs", "agent.loop", "retrievers.config_file", "retrievers.kb"],
    # the policy and KB modules themselves: their heavy imports stay inside the classes and functions
    ["agent.backends.hf", "agent.backends.models", "retrievers.store", "retrievers.encoders", "retrievers.dense"],
]


def heavy_after_import(modules: list[str], watch: list[str] = NEVER + LATER) -> list[str]:
    """The `watch` packages in `sys.modules` after a fresh interpreter imports `modules`."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(json.dumps([p for p in {watch!r} if p in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_probe_reports_what_came_in():
    # retrievers.store imports numpy at the top and torch nowhere: a probe watching both must name numpy alone
    assert heavy_after_import(["retrievers.store"], watch=["numpy", "torch"]) == ["numpy"]


@pytest.mark.parametrize("modules", CASES, ids=lambda m: m[0])
def test_ask_path_imports_no_heavy_package(modules: list[str]):
    loaded = heavy_after_import(modules)
    assert loaded == [], (
        f"importing {modules} also imports {loaded}: move that import inside the function or class that needs it "
        "(STYLE.md 20, 27), so `kbrouter ask` does not pay for it at start"
    )


def test_timings_hook_appends_one_line_per_phase(tmp_path, monkeypatch):
    from agent.cli import TIMINGS_ENV, mark

    path = tmp_path / "t.jsonl"
    mark("unset")  # no env var: nothing is written anywhere
    monkeypatch.setenv(TIMINGS_ENV, str(path))
    mark("a")
    sum(range(200_000))  # some CPU between the two marks
    mark("b", step=0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["a", "b"]
    assert rows[1]["step"] == 0 and "step" not in rows[0]
    # t counts from the process start (this pytest process started well before its tests ran), and grows
    assert 0 < rows[0]["t"] <= rows[1]["t"]
    assert rows[0]["t"] > 0.05, rows
    assert rows[0]["cpu"] <= rows[1]["cpu"]


def test_timings_hook_names_an_unwritable_path(tmp_path, monkeypatch):
    from agent.cli import TIMINGS_ENV, mark

    bad = tmp_path / "no-such-dir" / "t.jsonl"
    monkeypatch.setenv(TIMINGS_ENV, str(bad))
    with pytest.raises(ValueError, match=r"KBROUTER_TIMINGS=.*no-such-dir.*unset it"):
        mark("a")
