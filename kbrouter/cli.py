"""The `kbrouter` console script: one subcommand per job, each a `main(argv)` in its own module."""

from __future__ import annotations

import importlib
import os
import sys

# subcommand -> (module, function, one-line help); imported only when chosen, so `kbrouter --help` is instant
COMMANDS = {
    "demo": ("agent.cli", "demo_main", "build the demo KB and watch SmolLM2 answer demo questions step by step"),
    "ask": ("agent.cli", "ask_main", "ask one question (optionally with --image) and stream the steps"),
    "run": ("agent.cli", "run_main", "run a question file in lockstep batches, trajectories to JSONL"),
    "index": ("retrievers.build", "main", "build the indexes of a KB YAML file (reuses what is up to date)"),
    "serve": ("agent.server", "main", "serve a policy as an OpenAI-compatible chat-completions endpoint"),
    "serve-agent": ("agent.agent_server", "main", "serve the agent as an OpenAI-compatible model, with a web page"),
    "serve-retrieval": ("retrievers.service", "main", "serve KBs over HTTP (batch search, metrics)"),
    "synth": ("data_synthesis.cli", "main", "synthesise trajectories with rejection sampling"),
    "synth-merge": ("data_synthesis.cli", "merge_main", "merge the shards of a synthesis run"),
    "train": ("training.cli", "main", "SFT or Step-GRPO training on step records (`train sft|grpo --config`)"),
    "eval": ("eval.cli", "main", "evaluate methods on benchmarks; writes report.md, results.json, plots"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "usage: kbrouter COMMAND [--help] [ARGS]\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"kbrouter: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    module, func, _ = COMMANDS[name]
    try:
        fn = getattr(importlib.import_module(module), func)
    except ImportError as e:
        print(f"kbrouter {name}: {e}", file=sys.stderr)
        return 1
    try:
        return int(fn(rest) or 0)
    except (ValueError, FileNotFoundError, KeyError) as e:  # bad input: one clear message, no traceback
        print(f"kbrouter {name}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
