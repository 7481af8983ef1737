"""CPU training with and without transparent huge pages for malloc (kbrouter/hugepages.py), side by side.

Runs the same short SFT twice, in one run, on the same data and seed: once with `KBROUTER_HUGEPAGES=0` (glibc's
default malloc) and once as `kbrouter` runs by default (`glibc.malloc.hugetlb=1`). Prints, per run: wall seconds,
the mean of the logged step times after the first (the first holds warm-up), user and kernel CPU seconds, minor page
faults of the child, then the ratios.

    python benchmarks/malloc_hugepages.py --config configs/train/smollm2_router_sft_budget_lora_cpu.yaml --steps 10

Each run writes its adapter under a temporary folder that is removed afterwards. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_RE = re.compile(r"step (\d+) took ([0-9.]+) s")


def run_sft(config: str, steps: int, hugepages: bool, workdir: Path) -> dict[str, float]:
    """One `kbrouter train sft` of `steps` steps; its wall time, step times and child resource usage."""
    env = {**os.environ, "KBROUTER_HUGEPAGES": "1" if hugepages else "0"}
    env.pop("GLIBC_TUNABLES", None)  # each run chooses its own malloc setting
    name = "hugepages" if hugepages else "default_malloc"
    log = workdir / f"{name}.log"
    train = ["--config", config, "--max_steps", str(steps), "--save_steps", "1000000", "--logging_steps", str(steps)]
    cmd = [sys.executable, "-m", "kbrouter.cli", "train", "sft", *train, "--output_dir", str(workdir / name)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        raise SystemExit(f"{name}: `{' '.join(cmd)}` exited {rc}; see the tail of {log}:\n{log.read_text()[-2000:]}")
    step_s = {int(k): float(v) for k, v in STEP_RE.findall(log.read_text())}
    later = [v for k, v in step_s.items() if k > 1]
    return {
        "wall_s": wall,
        "step_s": sum(later) / len(later) if later else float("nan"),
        "user_s": after.ru_utime - before.ru_utime,
        "kernel_s": after.ru_stime - before.ru_stime,
        "minor_faults_M": (after.ru_minflt - before.ru_minflt) / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/train/smollm2_router_sft_budget_lora_cpu.yaml")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kbrouter_hugepages_") as tmp:
        rows = {
            "default malloc": run_sft(args.config, args.steps, False, Path(tmp)),
            "huge pages": run_sft(args.config, args.steps, True, Path(tmp)),
        }
    keys = list(next(iter(rows.values())))
    print(f"{args.steps} SFT steps of {args.config}")
    print(f"{'':16}" + "".join(f"{k:>16}" for k in keys))
    for name, row in rows.items():
        print(f"{name:16}" + "".join(f"{row[k]:16.2f}" for k in keys))
    base, huge = rows["default malloc"], rows["huge pages"]
    print(
        f"{'ratio default/huge':16}" + "".join(f"{base[k] / huge[k]:16.2f}" if huge[k] else f"{'-':>16}" for k in keys)
    )


if __name__ == "__main__":
    main()
