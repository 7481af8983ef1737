"""kill -9 chaos for the long jobs: `index`, `run`, `synth`, `eval`, `train` killed at seeded random moments.

    python benchmarks/chaos_kill9.py                           # 3 kills per job, seed 0 (about 15 min on 2 cores)
    python benchmarks/chaos_kill9.py --jobs run eval --kills 5 --seed 1

Each job runs once clean, then is SIGKILLed N times and finished in a second folder (`tests/chaos/kill9.py`).
Prints per job: kills that landed (and how many records were on disk at each), records of the clean run, and
records lost / duplicated / different in the killed run (all must be 0), the finishing run's exit status and the
clean run's time. Exit status 1 when any figure is not 0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    from tests.chaos.kill9 import JOBS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    ap.add_argument("--kills", type=int, default=3, help="SIGKILLs per job")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy-delay", type=float, default=0.15, help="seconds per fake generate call")
    ap.add_argument("--work", help="folder for the runs (default: a temporary one)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    outcomes = run(args.jobs, args.kills, args.seed, args.policy_delay, args.work)
    print(f"{'job':<6} {'kills':>5} {'records at each kill':<24} {'records':>7} {'lost':>4} {'dup':>4} {'diff':>4} "
          f"{'rc':>3} {'clean s':>7}")  # fmt: skip
    for o in outcomes:
        print(f"{o.job:<6} {o.kills:>5} {str(o.records_at_kill):<24} {o.reference_records:>7} {o.lost:>4} "
              f"{o.duplicated:>4} {o.different:>4} {o.final_rc:>3} {o.clean_s:>7.1f}")  # fmt: skip
        for e in o.examples:
            print(f"       e.g. {str(e)[:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=2, default=str))
    bad = [o for o in outcomes if o.lost or o.duplicated or o.different or o.final_rc != 0]
    return 1 if bad else 0


def run(jobs: list[str], kills: int, seed: int, policy_delay: float, work: str | None = None) -> list:
    from agent.server import create_app
    from retrievers.service import serve_in_thread
    from tests.chaos.kill9 import JOBS, chaos, grammar_blind_step_policy

    rng = random.Random(seed)
    policy = grammar_blind_step_policy(policy_delay)
    with tempfile.TemporaryDirectory() as tmp, serve_in_thread(create_app(policy)) as url:
        folder = Path(work or tmp)
        return [chaos(JOBS[name](url + "/v1"), folder, kills, rng) for name in jobs]


if __name__ == "__main__":
    raise SystemExit(main())
