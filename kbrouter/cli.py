"""The `kbrouter` console script: one subcommand per job, each a `main(argv)` in its own module.

Expected errors (bad input: a missing file, a malformed YAML or JSONL line, a non-UTF-8 file, an invalid config
value) print one line naming the file, line or key and the fix, and exit 2; `--debug` (or `KBROUTER_DEBUG=1`) shows
the traceback instead. Ctrl-C prints what was kept and exits 130.
"""

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
    "ingest": ("ingest.cli", "main", "turn PDFs, web pages, office files, images, videos into KB corpora + a KB YAML"),
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
    return (
        "usage: kbrouter [--debug] COMMAND [--help] [ARGS]\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n--debug: show the traceback of an error (else one line naming the file, line or key and the fix)"
    )


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean bad input, not a bug in kbrouter."""
    types: list[type[BaseException]] = [ValueError, FileNotFoundError, KeyError, OSError]  # UnicodeDecodeError too
    yaml = sys.modules.get("yaml")
    if yaml is not None:
        types.append(yaml.YAMLError)
    datasets_exc = sys.modules.get("datasets.exceptions")
    if datasets_exc is not None and hasattr(datasets_exc, "DatasetGenerationError"):
        types.append(datasets_exc.DatasetGenerationError)
    return tuple(types)


def error_message(e: BaseException) -> str:
    """One message for an expected error: its own text, or for a wrapper (datasets' `DatasetGenerationError`)
    the text of the error that caused it."""
    while type(e).__name__ == "DatasetGenerationError" and e.__cause__ is not None:
        e = e.__cause__
    if isinstance(e, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8"
    if isinstance(e, KeyError):
        return f"missing key {e.args[0]!r}" if e.args else "missing key"
    if isinstance(e, OSError) and not isinstance(e, FileNotFoundError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    text = str(e).strip()
    return text if text else type(e).__name__


def main(argv: list[str] | None = None) -> int:
    from_console = argv is None  # `main([...])` from Python never re-executes the process
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("KBROUTER_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"kbrouter: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if from_console:  # a job from the console: malloc with huge pages (kbrouter/hugepages.py)
        from kbrouter.hugepages import reexec_with_hugepages

        reexec_with_hugepages()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    module, func, _ = COMMANDS[name]
    try:
        fn = getattr(importlib.import_module(module), func)
    except ImportError as e:
        print(f"kbrouter {name}: {e}", file=sys.stderr)
        return 1
    try:
        return int(fn(rest) or 0)
    except KeyboardInterrupt as e:  # Ctrl-C: say what was kept (commands put it in the exception's args)
        if debug:
            raise
        kept = str(e.args[0]) if e.args else "what was already written is kept"
        how = "" if "rerun" in kept else "; rerun the same command to resume"
        print(f"\nkbrouter {name}: interrupted: {kept}{how}", file=sys.stderr)
        return 130
    except Exception as e:
        if debug or not isinstance(e, _expected_errors()):
            raise
        print(f"kbrouter {name}: error: {error_message(e)}  (--debug shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
