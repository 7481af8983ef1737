"""`kbrouter eval`: run benchmarks × methods and write report.md, results.json, plots and predictions.

CPU (SmolLM2-135M + MiniLM, small subsets of the shared sets, every method; < 15 min on 2 cores):

    kbrouter eval --config configs/eval/smollm2_cpu.yaml
    kbrouter eval --config configs/eval/smollm2_cpu.yaml --limit 2 --methods no_retrieval agent --agent.max_steps 2

Any config key is overridden by `--key value`, dots reaching nested keys (`--agent.max_steps 2 --batch_size 8
--agent_variants.agent_sft.policy.adapter runs/other_sft`); values are YAML (`true`, `3`, `[a, b]`). The old
`key=value` form is an error that gives the new one.

GPU (the paper's setting, vLLM):

    kbrouter eval --config configs/eval/paper_full_vllm.yaml

Predictions are cached in `<output_dir>/cache.jsonl`: rerunning after an interruption, or with more datasets,
methods or questions, computes only what is missing (and what failed, or was made from other settings, rows or KB
indexes). Scores always use the current gold. `--report_only` reads the cache and writes only the report.
"""

from __future__ import annotations

import argparse
import json
import logging


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the evaluation, print where the report is; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="kbrouter eval",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument("--config", required=True, help="an eval YAML (configs/eval/*.yaml)")
    parser.add_argument("--output_dir", "--output-dir", help="override `output_dir`")
    parser.add_argument("--limit", type=int, help="at most this many questions per dataset")
    parser.add_argument("--methods", nargs="+", help="override the method list")
    parser.add_argument("--datasets", nargs="+", help="run only these datasets (by name)")
    parser.add_argument(
        "--report_only",
        "--report-only",
        action="store_true",
        help="write the report from the cached predictions only (compute nothing)",
    )
    parser.add_argument("--quiet", action="store_true", help="warnings only")
    args, overrides = parser.parse_known_args(argv)  # the rest: `--key value` overrides of the YAML
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    from eval.config import load_eval_config
    from eval.runner import run_eval
    from retrievers.config_file import parse_overrides

    values = []  # the flags, as typed (dotted key, value) pairs applied after the overrides
    if args.output_dir:
        values.append(("output_dir", args.output_dir))
    if args.limit is not None:
        values.append(("dataset_defaults.limit", args.limit))
    if args.methods:
        values.append(("methods", list(args.methods)))
    try:
        for name in ("methods", "datasets"):  # argparse hands an old-style `key=value` after them to the list
            parse_overrides([v for v in getattr(args, name) or [] if "=" in v])  # raises, giving the new form
        cfg = load_eval_config(args.config, overrides, values)
        if args.datasets:
            names = [d.get("name") for d in cfg.datasets]
            unknown = sorted(set(args.datasets) - set(names))
            if unknown:
                parser.error(f"--datasets: unknown dataset(s) {unknown}; {args.config} has {names}")
            cfg.datasets = [d for d in cfg.datasets if d.get("name") in args.datasets]
        if args.limit is not None:  # the flag wins over per-dataset limits too
            cfg.datasets = [{**d, "limit": args.limit} for d in cfg.datasets]
        logging.getLogger(__name__).info("config: %s", json.dumps(cfg.__dict__, default=str))
        results = run_eval(cfg, compute=not args.report_only)
    except (ValueError, FileNotFoundError) as e:
        print(f"kbrouter eval: error: {e}")  # noqa: T201 (CLI output)
        return 2
    skipped = [n for n, d in results["datasets"].items() if d["skipped"]]
    print(f"report: {cfg.output_dir}/report.md")  # noqa: T201
    print(
        f"methods: {len(results['methods'])}, datasets run: {len(results['per_dataset'])}, "  # noqa: T201
        f"skipped: {skipped or 'none'}"
    )
    for line in summary_lines(results):
        print(line)  # noqa: T201
    return 0


def summary_lines(results: dict) -> list[str]:
    """One line per method with the scoreboard's headline figures: report.md's first table, the macro average over
    dataset groups (each group the mean of its datasets), not the plain mean over datasets (`results["macro"]`)."""
    lines = ["macro average over groups (report.md's first table):"]
    for m in results["methods"]:
        r = results["macro_over_groups"][m]
        if "run/error" not in r:
            lines.append(f"  {m:<22} (no predictions yet)")
            continue
        lines.append(
            f"  {m:<22} F1-R {100 * r.get('answer/f1_recall', 0):5.1f}  EM {100 * r.get('answer/em', 0):5.1f}  "
            f"steps {r.get('cost/steps', 0):.2f}  tok {r.get('cost/gen_tokens', 0):.0f}"
            + (
                f"  errors {100 * r['run/error']:.1f}% (left out of the scores; rerun to retry them)"
                if r["run/error"]
                else ""
            )
        )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
