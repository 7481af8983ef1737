"""`kbrouter demo | ask | run`: answer questions step by step over configured knowledge bases.

CPU: `kbrouter demo` (SmolLM2-135M-Instruct over the embedded demo KB). GPU: pass `--backend vllm --model
Qwen/Qwen2.5-VL-7B-Instruct`, or point `--backend openai --base-url http://HOST:PORT/v1` at a vLLM/SGLang server.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.backends.factory import PolicyConfig
from agent.loop import AgentConfig
from retrievers.jsonl import append_jsonl

REPO = Path(__file__).resolve().parent.parent
DEMO_KB = REPO / "configs" / "kb" / "demo.yaml"
DEMO_QUESTIONS = REPO / "data" / "demo" / "questions.jsonl"
DEFAULT_MODEL = "smollm2-kbrouter"
TIMINGS_ENV = "KBROUTER_TIMINGS"  # a file path: the ask/run/demo path appends one JSON line per phase to it


@functools.cache  # once per process: every mark is measured from the same start
def _process_start() -> float:
    """When this process started, on the `time.perf_counter()` clock: from /proc/self/stat (Linux), so the interpreter
    start and the imports before `main` count; elsewhere, the first call."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        age = 0.0
    return time.perf_counter() - age


def mark(phase: str, **extra: object) -> None:
    """Append `{"phase", "t", "cpu", ...extra}` to the file `$KBROUTER_TIMINGS` names; nothing when it is unset.

    `t` is seconds since the process started, `cpu` the process's CPU seconds so far (the figure that still means
    something on a busy machine). `benchmarks/ask_latency.py` reads these lines; what the command prints is unchanged.

    Raises:
        ValueError: the file cannot be appended to (named, with the fix).
    """
    path = os.environ.get(TIMINGS_ENV)
    if not path:
        return
    line = {
        "phase": phase,
        "t": round(time.perf_counter() - _process_start(), 4),
        "cpu": round(time.process_time(), 4),
        **extra,
    }
    try:
        append_jsonl(path, [line], fsync=False)
    except OSError as e:
        raise ValueError(
            f"{TIMINGS_ENV}={path!r}: cannot append timings there ({e}); point it at a writable file or unset it"
        ) from e


def add_common_args(ap: argparse.ArgumentParser, kb_default: str | None = None) -> None:
    ap.add_argument("--kb", default=kb_default, help="KB YAML file (configs/kb/*.yaml)")
    ap.add_argument(
        "--config",
        help="YAML with `policy:`, `agent:` and `kb:` sections; flags override it, and so do `--policy.KEY value` / "
        "`--agent.KEY value` overrides (e.g. `--agent.evidence_chars 400`)",
    )
    ap.add_argument("--backend", choices=["transformers", "vl", "openai", "vllm"], help="policy backend")
    ap.add_argument(
        "--model",
        help="model name/path; `smollm2-kbrouter` (default: SmolLM2 + the shipped router "
        "adapter) or `smollm2` (the packaged base SmolLM2-135M-Instruct)",
    )
    ap.add_argument("--adapter", help="a peft (LoRA) adapter folder to load onto --model (transformers backend)")
    ap.add_argument("--base-url", help="openai backend: server URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument(
        "--max-steps",
        type=int,
        help="retrieval steps before the final answer (default 3; the shipped router: 2, from its kbrouter_router.json)",
    )
    ap.add_argument(
        "--min-steps",
        type=int,
        help="searches before the agent may stop (default 1: the shipped router otherwise stops at once "
        "on KB sets it was not trained on; 0 lets it answer without retrieval)",
    )
    ap.add_argument(
        "--top-k",
        type=int,
        help="hits per retrieval (default 5; the shipped router: 3, from its kbrouter_router.json)",
    )
    ap.add_argument(
        "--route-prior",
        type=float,
        help="weight of the route prior (agent/routing.py): a search goes to the KB maximising the policy's "
        "log-prob of it + W x the KB's affinity (its best text similarity with the sub-question, less a size term: "
        "`agent.route_prior_size` in --config) (default: 10 where the policy can score KB names; by the affinity "
        "alone where a KB's name is not one the router trained on; 0 = the policy alone)",
    )
    ap.add_argument("--temperature", type=float, help="0 = greedy (default)")
    ap.add_argument("--seed", type=int)
    ap.add_argument(
        "--few-shot",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a worked example before each step (helps an untrained model; default: off)",
    )
    ap.add_argument(
        "--constrained",
        choices=["auto", "on", "off"],
        help="decode inside the step grammar (default auto: on where the backend supports it)",
    )
    ap.add_argument(
        "--allow-text-only",
        action="store_true",
        help="let a text-only policy (the transformers backend) answer questions that have images, without them "
        "(a warning; else it is an error)",
    )
    ap.add_argument("-v", "--verbose", action="store_true")


@dataclass
class RunFile:
    """The `--config` YAML of run / ask / demo / serve (read by `retrievers.config_file`; `kb` resolves against the
    YAML's folder). Flags override it, and so do `--policy.KEY value` / `--agent.KEY value` overrides."""

    policy: dict = field(default_factory=dict, metadata={"help": "agent.backends.factory.PolicyConfig fields"})
    agent: dict = field(default_factory=dict, metadata={"help": "agent.loop.AgentConfig fields"})
    kb: str = field(default="", metadata={"help": "KB YAML file (configs/kb/*.yaml)"})


def resolve_configs(args: argparse.Namespace) -> tuple[PolicyConfig, AgentConfig, str]:
    """YAML (optional) + `--a.b value` overrides (`args.overrides`, optional) + flags → (policy config, agent config,
    KB file).

    Raises:
        FileNotFoundError: the `--config` file does not exist.
        ValueError: malformed YAML or override, or an unknown key (named, with the file).
    """
    from retrievers.config_file import check_keys, read_config

    where = args.config or "the overrides"
    raw = read_config(RunFile, args.config, getattr(args, "overrides", None) or [], path_keys=("kb",))
    for key in ("policy", "agent"):
        if not isinstance(raw.get(key) or {}, dict):
            raise ValueError(f"{where}: `{key}` must be a mapping of settings, got {raw[key]!r}")
    check_keys(PolicyConfig, raw.get("policy") or {}, f"{where}: policy")
    check_keys(AgentConfig, raw.get("agent") or {}, f"{where}: agent")
    pol = dict(raw.get("policy") or {})
    agent = dict(raw.get("agent") or {})
    for flag, key in (("backend", "backend"), ("model", "model"), ("base_url", "base_url"), ("adapter", "adapter")):
        if getattr(args, flag) is not None:
            pol[key] = getattr(args, flag)
    for key in ("max_steps", "min_steps", "top_k", "temperature", "seed", "few_shot", "constrained", "route_prior"):
        if getattr(args, key) is not None:
            agent[key] = getattr(args, key)
    if pol.get("backend", "transformers") == "transformers" and not pol.get("model") and not pol.get("adapter"):
        pol["model"] = DEFAULT_MODEL  # the shipped router; `--model smollm2` is the base model
    # what the router's figures were measured with (its kbrouter_router.json), where the user sets none
    for key, value in router_agent_settings(pol).items():
        agent.setdefault(key, value)
    agent.setdefault("route_prior", None)  # auto: on where the policy can score KB names (agent/routing.py)
    # the shipped router otherwise stops at once on KB sets it was not trained on (the demo's two)
    agent.setdefault("min_steps", min(1, agent.get("max_steps", AgentConfig.max_steps)))
    kb = args.kb or raw.get("kb")
    if not kb:
        raise ValueError("no knowledge bases given: pass --kb configs/kb/NAME.yaml (or `kb:` in --config)")
    return PolicyConfig(**pol), AgentConfig(**agent), kb


def router_agent_settings(pol: dict) -> dict:
    """The agent settings that the policy's adapter folder records (`"agent"` in its `kbrouter_router.json`: the
    shipped router's are those of its scoreboard row), checked against `AgentConfig`; {} for a policy without one."""
    from agent.backends.models import ROUTER_CARD, adapter_agent_settings, resolve_policy_model
    from retrievers.config_file import check_keys

    _, adapter = resolve_policy_model(str(pol.get("model") or ""), pol.get("adapter"))
    if not adapter or not Path(adapter).is_dir():
        return {}
    settings = adapter_agent_settings(adapter)
    check_keys(AgentConfig, settings, f"{Path(adapter) / ROUTER_CARD}: agent")
    return settings


def check_images_readable(pol_cfg: PolicyConfig, questions: list, allow_text_only: bool) -> None:
    """A text-only policy would drop the questions' images: an error, or a warning with `--allow-text-only`.

    Raises:
        ValueError: some question has an image and the policy reads text only.
    """
    with_images = [q.id for q in questions if q.images]
    if not with_images or pol_cfg.backend != "transformers":
        return
    what = f"{len(with_images)} question(s) have an image (e.g. {with_images[0]!r})"
    if allow_text_only:
        logging.getLogger(__name__).warning("%s; the text-only policy answers without it", what)
        return
    raise ValueError(
        f"{what}, but the transformers backend reads text only and would drop it: use a vision-language policy "
        "(`--backend vl --model tiny-qwen2.5-vl` offline, or a local Qwen2.5-VL folder), or pass --allow-text-only"
    )


def backend_errors(trajs: list) -> int:
    """How many trajectories ended in a backend (or retrieval) error."""
    return sum(t.stop_reason == "backend_error" for t in trajs)


def _setup(args: argparse.Namespace, questions: list | None = None):  # noqa: ANN202
    from agent.backends.factory import make_policy
    from agent.kbs import load_knowledge_bases
    from agent.loop import StepAgent

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    pol_cfg, agent_cfg, kb_file = resolve_configs(args)
    check_images_readable(pol_cfg, questions or [], args.allow_text_only)  # before anything loads
    mark("policy_start")
    policy = make_policy(pol_cfg)  # first: a model that is not here fails before the KBs spend seconds loading
    mark("policy_loaded")
    kbs = load_knowledge_bases(kb_file)
    mark("kbs_loaded")
    return StepAgent(policy, kbs, agent_cfg), pol_cfg, agent_cfg, kb_file


def ask_main(argv: list[str] | None = None) -> int:
    """Ask one question and watch the steps stream by."""
    mark("ask_main")
    from rich.console import Console

    from agent.display import StepPrinter
    from agent.io import question_from_row

    ap = argparse.ArgumentParser(
        prog="kbrouter ask", description="Ask one question; each step is shown as it happens."
    )
    ap.add_argument("question", help="the question")
    ap.add_argument("--image", help="path of an image that goes with the question (needs a VL policy: --backend vl)")
    ap.add_argument("--out", help="append the trajectory to this JSONL file")
    add_common_args(ap, kb_default=str(DEMO_KB))
    args, args.overrides = ap.parse_known_args(argv)  # the rest: `--policy.KEY value` / `--agent.KEY value`
    q = question_from_row(
        {"id": "ask", "question": args.question, **({"image": args.image} if args.image else {})}, where="question"
    )
    agent, *_ = _setup(args, [q])
    console = Console()
    console.print(f"[bold]question:[/bold] {q.question}")
    on_event = StepPrinter(console)
    if os.environ.get(TIMINGS_ENV):
        printer = on_event

        def on_event(qid: str, event: str, payload: dict) -> None:
            printer(qid, event, payload)
            mark(event, step=payload.get("step"))  # after the print: the user has seen the line

    traj = agent.run_batch([q], on_event=on_event)[0]
    mark("done")
    if args.out:
        from retrievers.jsonl import JsonlWriter

        with JsonlWriter(args.out) as w:
            w.write(traj.to_dict())
    if traj.stop_reason == "backend_error":
        error = traj.metadata.get("error") or "the policy backend gave no reply"
        print(f"kbrouter ask: error: the backend failed ({error}); the answer above is not one", file=sys.stderr)
        return 1
    return 0


def run_main(argv: list[str] | None = None) -> int:
    """Run a question file in lockstep batches; trajectories stream to JSONL one finished record at a time."""
    from rich.progress import Progress

    from agent.io import prepare_resume, read_questions
    from retrievers.jsonl import JsonlWriter

    ap = argparse.ArgumentParser(prog="kbrouter run", description=run_main.__doc__)
    ap.add_argument("--questions", required=True, help="JSONL: id, question, optional image/answers")
    ap.add_argument("--out", required=True, help="trajectories JSONL (appended; finished ids are skipped on rerun)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--limit", type=int, help="only the first N questions")
    ap.add_argument(
        "--retry-errors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on rerun, run again the questions whose trajectory ended in an error such as backend_error "
        "(default: on; --no-retry-errors keeps them as done)",
    )
    add_common_args(ap)
    args, args.overrides = ap.parse_known_args(argv)  # the rest: `--policy.KEY value` / `--agent.KEY value`
    if args.batch_size < 1:
        ap.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.limit is not None and args.limit < 0:
        ap.error(f"--limit must be >= 0, got {args.limit}")
    questions = read_questions(args.questions)[: args.limit]
    done, retried = prepare_resume(args.out, retry_errors=args.retry_errors)
    todo = [q for q in questions if q.id not in done]
    agent, *_ = _setup(args, todo)
    t0 = time.perf_counter()
    written = 0
    try:
        with JsonlWriter(args.out) as w, Progress() as progress:
            task = progress.add_task("questions", total=len(todo))

            def write(t) -> None:  # noqa: ANN001
                nonlocal written
                w.write(t.to_dict())
                written += 1
                progress.advance(task)

            trajs = agent.run(todo, batch_size=args.batch_size, on_trajectory=write)
    except KeyboardInterrupt as e:
        e.args = (f"{len(done) + written} of {len(questions)} done, in {args.out}",)
        raise
    stops: dict[str, int] = {}
    for t in trajs:
        stops[t.stop_reason] = stops.get(t.stop_reason, 0) + 1
    dt = time.perf_counter() - t0
    print(
        f"wrote {len(trajs)} trajectories to {args.out} ({len(done)} already there, {retried} errored ones run "
        f"again) in {dt:.1f} s; stop reasons {stops}"
    )
    if errors := backend_errors(trajs):
        print(
            f"kbrouter run: error: {errors} trajectories ended in backend_error; rerun the same command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0


def demo_main(argv: list[str] | None = None) -> int:
    """Build the embedded demo KB (cached), answer the demo questions with SmolLM2, show every step."""
    from rich.console import Console

    from agent.display import StepPrinter, print_summary
    from agent.io import read_questions, write_trajectories

    ap = argparse.ArgumentParser(prog="kbrouter demo", description=demo_main.__doc__)
    ap.add_argument("--out", default="outputs/demo/trajectories.jsonl", help="where the trajectories go")
    ap.add_argument("--questions", default=str(DEMO_QUESTIONS))
    ap.add_argument("--limit", type=int, default=None)
    add_common_args(ap, kb_default=str(DEMO_KB))
    args, args.overrides = ap.parse_known_args(argv)  # the rest: `--policy.KEY value` / `--agent.KEY value`
    console = Console()
    console.print("[bold]kbrouter demo[/bold]: building/loading the demo KBs (cached after the first run) …")
    questions = read_questions(args.questions)[: args.limit]
    agent, pol_cfg, agent_cfg, kb_file = _setup(args, questions)
    console.print(
        f"KBs: {', '.join(agent.kbs)} | policy: {pol_cfg.model} ({pol_cfg.backend}) | "
        f"{len(questions)} questions, n = {agent_cfg.max_steps}, k = {agent_cfg.top_k}; answering in one "
        "lockstep batch; each step is shown as the batch reaches it …"
    )
    t0 = time.perf_counter()
    trajs = agent.run_batch(questions, on_event=StepPrinter(console, show_id=True))
    dt = time.perf_counter() - t0
    print_summary(trajs, console)
    write_trajectories(args.out, trajs, overwrite=True)  # this run's trajectories replace the last run's
    summary = {r: sum(t.stop_reason == r for t in trajs) for r in {t.stop_reason for t in trajs}}
    console.print(
        f"\n[bold]wrote {len(trajs)} trajectories to {args.out}[/bold] in {dt:.1f} s; stop reasons "
        f"{json.dumps(summary)}"
    )
    return 1 if backend_errors(trajs) else 0
