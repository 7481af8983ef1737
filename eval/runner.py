"""Run datasets × methods with one policy over one KB set, caching every prediction as it is made.

The cache is `<output_dir>/cache.jsonl`, one record per (dataset, method, question) appended as each lockstep batch
finishes; a rerun (after an interruption, or with more datasets, methods or questions) reads it and computes only
what is missing. A cached record is reused only while everything its prediction depends on is unchanged:

- `fingerprint` (`EvalConfig.fingerprint`): the method, its policy settings and weights (files' sizes and mtimes),
  its loop, prompt and sampling settings;
- `inputs` (`prediction_inputs`): the question row as the method sees it (wording, images, non-gold columns), the
  KBs' identities (their manifests: corpus hash, build time, document count) and the seed.

A record that ended in an error (a backend or retrieval failure) is recomputed on the next run. The gold answers,
gold KB and gold evidence are not part of either: scoring always reads them from the current dataset, so a fixed
gold re-scores the cached predictions without recomputing them. Records written before `inputs` existed are reused
when their fingerprint and question wording match (the log counts them).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.backends.base import Policy
from agent.kbs import KnowledgeBase
from agent.types import Question, Trajectory
from eval.cache import cache_key, read_cache
from eval.config import EvalConfig
from eval.datasets import LoadedDataset, load_dataset
from eval.methods import MethodContext, MethodFn, available_methods, resolve_methods
from eval.scoring import GOLD_COLUMNS
from retrievers.jsonl import JsonlWriter

logger = logging.getLogger(__name__)

CACHE_FILE = "cache.jsonl"
# Called with each prediction record right after it is cached (progress display; tests inject interruptions).
PredictionHook = Callable[[dict], None]


def make_policy(settings: dict | str, where: str = "policy") -> Policy:
    """A policy from a `policy:` mapping (`agent.backends.factory.PolicyConfig` keys) or a bare model path."""
    from agent.backends.factory import PolicyConfig
    from agent.backends.factory import make_policy as build

    return build(PolicyConfig.from_dict({"model": settings} if isinstance(settings, str) else settings, where))


# Builds a policy from its resolved settings and where they come from (for error messages); tests pass a fake.
PolicyFactory = Callable[[dict, str], Policy]


def release_policy() -> None:
    """Return the memory of a policy whose last reference was just dropped (CPU RAM now, GPU memory if used)."""
    gc.collect()
    torch = sys.modules.get("torch")  # only a policy that imported torch can hold its memory
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_order(cfg: EvalConfig, methods: Sequence[str]) -> list[list[str]]:
    """Methods grouped by the policy they run with, groups in order of first use: each policy loads once."""
    groups: dict[str, list[str]] = {}
    for m in methods:
        groups.setdefault(cfg.policy_key(m), []).append(m)
    return list(groups.values())


def row_digest(q: Question) -> str:
    """Hash of a question row as a method sees it: wording, images and the non-gold columns."""
    meta = {k: v for k, v in q.metadata.items() if k not in GOLD_COLUMNS}
    blob = json.dumps(
        {"question": q.question, "images": list(q.images), "metadata": meta}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def kb_digest(kbs: dict[str, KnowledgeBase], kb_config: Path | None) -> str:
    """Hash of the KBs' identities: names, `k` and, for KBs of a config file, their index manifests' corpus hash,
    build time and document count (a rebuilt or changed KB makes the cached predictions stale)."""
    manifests: dict[str, dict] = {}
    if kb_config is not None and kb_config.is_file():
        from retrievers.config import load_kb_configs
        from retrievers.kb import read_manifest

        for c in load_kb_configs(kb_config):
            try:
                m = read_manifest(Path(c.index_dir)) or {}
            except (OSError, ValueError):
                m = {}
            keys = ("corpus_sha256", "created", "doc_count", "search", "encoder", "index", "remote")
            manifests[c.name] = {k: m.get(k) for k in keys} | {"remote": c.options.get("remote")}
    kb_ids = sorted((kb.name, name, kb.k, manifests.get(kb.name)) for name, kb in kbs.items())
    return hashlib.sha256(json.dumps(kb_ids, default=str).encode()).hexdigest()[:16]


def prediction_inputs(q: Question, kbs: str, seed: int) -> dict:
    """What a cached prediction depends on besides its method's fingerprint (see the module docstring)."""
    return {"row": row_digest(q), "kbs": kbs, "seed": seed}


def is_error(record: dict) -> bool:
    """A prediction that failed (method raised, backend or retrieval error) rather than answered."""
    return bool(record.get("error")) or record.get("trajectory", {}).get("stop_reason") == "backend_error"


def is_stale(record: dict | None, fingerprint: str, q: Question, inputs: dict) -> bool:
    """Whether a cached record must be recomputed: absent, errored, or made from other settings or inputs."""
    if not record or is_error(record) or record.get("fingerprint") != fingerprint:
        return True
    traj = record["trajectory"]
    if traj.get("question") != q.question or list(traj.get("images") or []) != list(q.images):
        return True  # a loader that rewords a question invalidates its predictions (legacy records too)
    return "inputs" in record and record["inputs"] != inputs


def error_trajectory(q: Question, message: str) -> Trajectory:
    """The placeholder trajectory of a question whose method raised."""
    return Trajectory(
        id=q.id,
        question=q.question,
        images=q.images,
        stop_reason="backend_error",
        gold=q.answers,
        metadata={**q.metadata, "error": message},
    )


def run_questions(fn: MethodFn, questions: Sequence[Question], ctx: MethodContext) -> list[tuple[Trajectory, str]]:
    """Run a method on a batch; if the batch raises, run its questions one by one and record each failure.

    Returns:
        `(trajectory, error message or "")` per question, in order.
    """
    try:
        return [(t, _error_of(t)) for t in fn(questions, ctx)]
    except Exception as e:  # a failing question must not end the run; it is retried alone below
        if len(questions) == 1:
            logger.warning("question %s failed: %s", questions[0].id, e)
            return [(error_trajectory(questions[0], f"{type(e).__name__}: {e}"), f"{type(e).__name__}: {e}")]
        logger.warning("a batch of %d failed (%s); retrying its questions one by one", len(questions), e)
        return [pair for q in questions for pair in run_questions(fn, [q], ctx)]


def _error_of(t: Trajectory) -> str:
    """The error message of a trajectory that ended in a backend or retrieval error ("" otherwise)."""
    if t.stop_reason != "backend_error":
        return ""
    return t.metadata.get("error") or "backend_error: the policy backend failed (no reply)"


def run_eval(
    cfg: EvalConfig,
    policy: Policy | None = None,
    kbs: dict[str, KnowledgeBase] | None = None,
    policy_factory: PolicyFactory | None = None,
    on_prediction: PredictionHook | None = None,
    compute: bool = True,
) -> dict:
    """Compute every missing prediction, then write the report (see `eval.report.write_report`).

    Methods run grouped by their policy settings (agent variants may name their own): each distinct policy is
    loaded once, before its first method with missing predictions, and released after its last one.

    Args:
        cfg: the eval config.
        policy: the policy of every method that runs with the config's own `policy` settings (tests pass a fake).
        kbs: KBs (by display name) instead of loading `cfg.kb_config`.
        policy_factory: builds the other policies from their settings (default: `make_policy`).
        on_prediction: called with each record after it is cached.
        compute: False writes the report from the cache alone (missing predictions are left out): nothing else is
            written (no corpora, no index, no change to the cache).

    Returns:
        The results dict written to `results.json`.
    """
    from eval.report import write_report

    out_dir = Path(cfg.output_dir)
    if compute:
        out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.prepare_corpora and compute:
        from eval.corpora import prepare_corpora

        prepare_corpora(cfg.prepare_corpora, cfg.path("shared_data"), cfg.path("corpora_dir"))
    # datasets first: a malformed file fails before the (slow) KB build
    loaded: list[LoadedDataset] = [load_dataset(spec, cfg.path("shared_data")) for spec in cfg.dataset_specs()]
    variants = cfg.variant_methods()
    if kbs is not None:
        kb_names = [kb.name for kb in kbs.values()]
    else:
        from agent.kbs import kb_configs, load_knowledge_bases

        if not cfg.kb_config:
            raise ValueError("`kb_config` is not set; point it at a KB YAML, e.g. `kb_config: ../kb/eval_cpu.yaml`")
        if compute:
            kbs = load_knowledge_bases(cfg.path("kb_config"))
            kb_names = [kb.name for kb in kbs.values()]
        else:  # the report needs only the KB names: no index is built or loaded, and no method runs
            kbs = {}
            kb_names = [c.name for c in kb_configs(cfg.path("kb_config"))]
    methods = resolve_methods(cfg.methods, kb_names, variants)
    table = available_methods(kb_names, variants)
    cache_path = out_dir / CACHE_FILE
    cache = read_cache(cache_path, repair_tail=compute)
    build = policy_factory or make_policy
    default_key = cfg.policy_key("")
    kbs_id = kb_digest(kbs, cfg.path("kb_config") if cfg.kb_config else None) if compute else ""

    def missing_of(method: str) -> list[tuple[str, Question]]:
        fingerprint = cfg.fingerprint(method)
        out = []
        for ds in loaded:
            for q in ds.questions:
                rec = cache.get(cache_key(ds.spec.name, method, q.id))
                if is_stale(rec, fingerprint, q, prediction_inputs(q, kbs_id, cfg.seed)):
                    out.append((ds.spec.name, q))
        return out

    # what each policy group has to compute; a missing checkpoint fails here, before the first method runs
    plan = [
        (group, todo)
        for group in (run_order(cfg, methods) if compute else [])
        if (todo := [(m, missing) for m in group if (missing := missing_of(m))])
    ]
    for group, _ in plan:
        if policy is None or cfg.policy_key(group[0]) != default_key:
            check_policy_paths(cfg.policy_settings(group[0]), _where(cfg, group[0], default_key))
    if not compute:
        return write_report(cfg, loaded, methods, cache, kb_names, out_dir, computed=0)
    computed = 0
    try:
        with JsonlWriter(cache_path) as writer:
            for group, todo in plan:
                # all datasets' missing questions of a method go through it together, in lockstep batches
                if policy is not None and cfg.policy_key(group[0]) == default_key:
                    current = policy
                else:
                    settings = cfg.policy_settings(group[0])
                    logger.info("loading the policy of %s: %s", ", ".join(m for m, _ in todo), settings)
                    current = build(settings, _where(cfg, group[0], default_key))
                for method, missing in todo:
                    fingerprint = cfg.fingerprint(method)
                    logger.info("%s: %d questions to run", method, len(missing))
                    ctx = MethodContext(current, kbs, cfg.agent_config(method), cfg.seed, cfg.k_per_kb)
                    for start in range(0, len(missing), cfg.batch_size):
                        batch = missing[start : start + cfg.batch_size]
                        t0 = time.perf_counter()
                        results = run_questions(table[method], [q for _, q in batch], ctx)
                        latency = (time.perf_counter() - t0) / len(batch)  # lockstep: the batch's wall time, amortised
                        for (dataset, q), (traj, error) in zip(batch, results, strict=True):
                            record = {
                                "dataset": dataset,
                                "method": method,
                                "qid": q.id,
                                "fingerprint": fingerprint,
                                "inputs": prediction_inputs(q, kbs_id, cfg.seed),
                                "latency_s": latency,
                                "error": error,
                                "trajectory": traj.to_dict(),
                            }
                            writer.write(record)
                            cache[cache_key(dataset, method, q.id)] = record
                            computed += 1
                            if on_prediction is not None:
                                on_prediction(record)
                del ctx, current  # this group's policy is not needed again: free it before the next one loads
                release_policy()
    except KeyboardInterrupt as e:  # Ctrl-C: `kbrouter` prints what was kept
        e.args = (f"{computed} predictions computed this run; {len(cache)} cached in {cache_path}",)
        raise
    legacy = sum(1 for r in cache.values() if "inputs" not in r)
    logger.info(
        "computed %d predictions (%d cached, %d of them from before inputs were recorded)",
        computed,
        len(cache) - computed,
        legacy,
    )
    return write_report(cfg, loaded, methods, cache, kb_names, out_dir, computed=computed)


def _where(cfg: EvalConfig, method: str, default_key: str) -> str:
    if cfg.policy_key(method) == default_key:
        return "policy"
    return f"checkpoints.{method}" if method in cfg.checkpoints else f"agent_variants.{method}.policy"


def check_policy_paths(settings: dict, where: str) -> None:
    """A policy's adapter (given, or brought by a model alias such as `smollm2-kbrouter`) is a local folder written by
    peft: a missing or unfinished one fails before any policy loads, with the fix.

    Raises:
        FileNotFoundError: the adapter folder, or its `adapter_config.json`, does not exist.
    """
    from eval.config import resolved_adapter

    given, adapter = settings.get("adapter"), resolved_adapter(settings)
    if not adapter:
        return
    what = f"adapter {adapter!r}" + ("" if given else f" of model {settings.get('model')!r}")
    if not Path(adapter).exists():
        problem = "does not exist (relative paths are tried against the YAML's folder, then the working directory)"
    elif Path(adapter).is_dir() and not (Path(adapter) / "adapter_config.json").is_file():
        problem = "has no adapter_config.json (is its training still running?)"
    else:
        return
    raise FileNotFoundError(
        f"{where}.adapter: {what} {problem}; train it first, or leave the method out with --methods"
    )
