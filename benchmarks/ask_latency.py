"""Where the time of one interactive `kbrouter ask` goes (issue 14, item 4): run it as a user does, in a fresh
process per repeat, and print each phase's median and min.

Phases come from the `KBROUTER_TIMINGS=PATH` lines the ask path appends (`agent.cli.mark`): interpreter start and
imports until `ask_main` runs, argument parsing and config, model load (policy construction), KB load (index
open), time to the first streamed step, the remaining steps, and exit. Wall time and the time to the first stdout
line and to the first `step` line are measured here, from stdout read line by line, so a checkout without the hook
(an older commit: `--repo /work/run16`) still reports those. What `ask` prints is never changed.

The KB's indexes must exist (`kbrouter index --kb configs/kb/demo.yaml`): this measures opening them, not building.
CPU only; on a busy machine the CPU seconds (`cpu` column) mean more than the wall ones.

    python benchmarks/ask_latency.py                       # this checkout, 3 repeats
    python benchmarks/ask_latency.py --repo /work/run16 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTION = "Who directed the film that won Best Picture in 1998?"  # the README's example
HERE = Path(__file__).resolve().parents[1]
# (row label, phase the interval starts at, phase it ends at); "spawn" is the process start (t = 0)
PHASES = [
    ("interpreter start + imports", "spawn", "ask_main"),
    ("args + config", "ask_main", "policy_start"),
    ("model load (policy)", "policy_start", "policy_loaded"),
    ("KB load (index open)", "policy_loaded", "kbs_loaded"),
    ("first streamed step", "kbs_loaded", "plan"),
    ("remaining steps", "plan", "done"),
]


def python_of(repo: Path) -> str:
    """The checkout's own venv interpreter, else this one."""
    venv = repo / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def check_imports_from(repo: Path, python: str, env: dict) -> None:
    """Raise unless `agent` resolves inside `repo` when run from there (an editable install of another checkout in
    its venv would otherwise measure that other code)."""
    code = "import importlib.util; print(importlib.util.find_spec('agent').origin)"
    origin = subprocess.run([python, "-c", code], cwd=repo, env=env, capture_output=True, text=True, check=True)
    path = Path(origin.stdout.strip()).resolve()
    if not path.is_relative_to(repo):
        raise ValueError(f"{python} run in {repo} imports agent from {path}, not from {repo}; check PYTHONPATH")


def one_run(repo: Path, python: str, kb: str, env: dict) -> dict:
    """One `kbrouter ask` in a fresh process: wall, first stdout line, first step line, and the hook's phases."""
    with tempfile.TemporaryDirectory() as tmp:
        timings = Path(tmp) / "timings.jsonl"
        cmd = [python, "-m", "kbrouter.cli", "ask", QUESTION, "--kb", kb]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=repo, env={**env, "KBROUTER_TIMINGS": str(timings)}, stdout=subprocess.PIPE, text=True
        )
        first_line = first_step = None
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter() - t0
            first_line = first_line if first_line is not None else now
            if first_step is None and line.startswith("step "):
                first_step = now
            lines.append(line)
        rc = proc.wait()
        wall = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` in {repo} exited {rc}; its output:\n{''.join(lines)}")
        marks = {}
        for row in map(json.loads, timings.read_text().splitlines() if timings.exists() else []):
            marks.setdefault(row["phase"], row)  # the first of each: the first `plan` is the first step
    return {"wall": wall, "first_line": first_line, "first_step": first_step, "marks": marks, "output": "".join(lines)}


def fmt(values: list[float | None]) -> str:
    vals = [v for v in values if v is not None]
    return f"{statistics.median(vals):8.2f} {min(vals):8.2f}" if vals else f"{'-':>8} {'-':>8}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=str(HERE), help="checkout to measure (default: this one)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kb", default="configs/kb/demo.yaml", help="KB YAML, relative to --repo; its indexes must exist")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    repo = Path(args.repo).resolve()
    if not (repo / "kbrouter" / "cli.py").is_file():
        ap.error(f"--repo {repo} is not a kbrouter checkout (no kbrouter/cli.py)")
    python = python_of(repo)
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    check_imports_from(repo, python, env)
    print(
        f"repo {repo} ({python}), {args.repeats} repeats, load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs"
    )
    runs = []
    for i in range(args.repeats):
        runs.append(one_run(repo, python, args.kb, env))
        print(f"  run {i + 1}: {runs[-1]['wall']:.1f} s wall", flush=True)
    if len({r["output"] for r in runs}) != 1:
        print("warning: the repeats printed different outputs (is the policy greedy?)")
    hooked = all(r["marks"] for r in runs)

    print(f"\n{'phase':<30} {'median':>8} {'min':>8}   {'cpu med':>8}   (seconds)")
    if hooked:
        for label, start, end in PHASES:
            wall = [r["marks"][end]["t"] - (r["marks"][start]["t"] if start != "spawn" else 0.0) for r in runs]
            cpu = [r["marks"][end]["cpu"] - (r["marks"][start]["cpu"] if start != "spawn" else 0.0) for r in runs]
            print(f"{label:<30} {fmt(wall)}   {statistics.median(cpu):8.2f}")
        print(f"{'exit':<30} {fmt([r['wall'] - r['marks']['done']['t'] for r in runs])}")
    else:
        print("(no KBROUTER_TIMINGS hook in this checkout: only what stdout shows)")
    print(f"{'time to first stdout line':<30} {fmt([r['first_line'] for r in runs])}")
    print(f"{'time to first step line':<30} {fmt([r['first_step'] for r in runs])}")
    print(f"{'total wall':<30} {fmt([r['wall'] for r in runs])}")
    if hooked:
        print(f"{'total cpu (to done)':<30} {fmt([r['marks']['done']['cpu'] for r in runs])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
