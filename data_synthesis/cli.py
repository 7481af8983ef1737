"""`kbrouter synth` and `kbrouter synth-merge`: teacher trajectories filtered by rejection sampling.

CPU (here: SmolLM2-135M teacher, a few dozen shared questions, minutes):
    kbrouter synth --config configs/synth/smollm2_cpu.yaml
    kbrouter synth --config configs/synth/smollm2_cpu.yaml --m 1 --output_dir runs/synth/try1

Annotation teacher (no model: gold steps from each dataset's own supervision, evidence from the real KBs, minutes):
    kbrouter synth --config configs/synth/annotation_cpu.yaml

GPU cluster (vLLM teacher), one job per shard, then merge:
    kbrouter synth --config configs/synth/paper_r1_32b_vllm.yaml --shard 3 --num-shards 16
    kbrouter synth-merge --output_dir runs/synth/paper_r1_32b

Re-running the same command resumes: finished batches are skipped, an interrupted one is recomputed.
Outputs: trajectories.jsonl, rejected.jsonl, steps.jsonl, skipped.jsonl, summary.json, summary.md, export/.
"""

from __future__ import annotations

import argparse
import json
import logging

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Parse `--config FILE [--key value ...] [--shard i --num-shards N]`, run (or resume) the job."""
    parser = argparse.ArgumentParser(prog="kbrouter synth", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--config", required=True, help="YAML recipe (configs/synth/*.yaml)")
    parser.add_argument("--shard", type=int, default=None, help="this job's shard, 0-based")
    parser.add_argument("--num-shards", type=int, default=None, help="number of shards")
    args, overrides = parser.parse_known_args(argv)
    if args.shard is not None:
        overrides += ["--shard", str(args.shard)]
    if args.num_shards is not None:
        overrides += ["--num_shards", str(args.num_shards)]

    from data_synthesis.config import load_config
    from data_synthesis.job import run_synthesis, shard_dir

    cfg = load_config(args.config, overrides)
    logging.basicConfig(level=cfg.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.info("resolved synth config:\n%s", json.dumps(cfg.to_dict(), indent=2, default=str))
    summary = run_synthesis(cfg)
    print(f"synth shard {cfg.shard}/{cfg.num_shards}: {summary['accepted']}/{summary['trajectories']} trajectories "
          f"accepted ({100 * summary['acceptance_rate']:.1f}%) over {summary['questions_asked']} questions, "
          f"{summary['skipped']} rows skipped -> {shard_dir(cfg)}")  # fmt: skip
    if cfg.num_shards > 1:
        print(f"when every shard is done: kbrouter synth-merge --output_dir {cfg.output_dir}")
    return 0


def merge_main(argv: list[str] | None = None) -> int:
    """`kbrouter synth-merge --output_dir DIR [--allow-partial] [--export_format parquet|disk|none]`."""
    parser = argparse.ArgumentParser(prog="kbrouter synth-merge", description="Join the shards of a synth job.")
    parser.add_argument("--output_dir", required=True, help="the job's output_dir (holding shards/)")
    parser.add_argument("--allow-partial", action="store_true", help="merge shards that are not finished")
    parser.add_argument("--export_format", default="parquet", choices=["parquet", "disk", "none"])
    parser.add_argument("--log_level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from data_synthesis.merge import merge_shards

    summary = merge_shards(args.output_dir, allow_partial=args.allow_partial, export_format=args.export_format)
    print(f"merged: {summary['accepted']}/{summary['trajectories']} trajectories accepted "
          f"({100 * summary['acceptance_rate']:.1f}%) over {summary['questions_asked']} questions -> "
          f"{args.output_dir}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
