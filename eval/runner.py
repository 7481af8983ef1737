"""Run datasets × methods with one policy over one KB set, caching every prediction as it is made.

The cache is `<output_dir>/cache.jsonl`, one record per (dataset, method, question) appended as each lockstep batch
finishes; a rerun (after an interruption, or with more datasets, methods or questions) reads it and computes only
what is missing. A cached record made under other settings (its `fingerprint` differs) is recomputed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.backends.base import Policy
from agent.kbs import KnowledgeBase
from agent.loop import Question
from agent.types import Trajectory
from eval.config import EvalConfig
from eval.datasets import LoadedDataset, load_dataset
from eval.methods import MethodContext, MethodFn, available_methods, resolve_methods

logger = logging.getLogger(__name__)

CACHE_FILE = "cache.jsonl"
# Called with each prediction record right after it is cached (progress display; tests inject interruptions).
PredictionHook = Callable[[dict], None]


def make_policy(settings: dict | str, where: str = "policy") -> Policy:
    """A policy from a `policy:` mapping (`agent.backends.factory.PolicyConfig` keys) or a bare model path."""
    from agent.backends.factory import PolicyConfig
    from agent.backends.factory import make_policy as build

    return build(PolicyConfig.from_dict({"model": settings} if isinstance(settings, str) else settings, where))


def cache_key(dataset: str, method: str, qid: str) -> str:
    return f"{dataset}\t{method}\t{qid}"


def read_cache(path: Path) -> dict[str, dict]:
    """Cached records by key; a later record of the same key wins. A torn last line is dropped."""
    from agent.io import iter_jsonl, repair

    if not path.exists():
        return {}
    dropped = repair(path)
    if dropped:
        logger.warning("dropped a torn last line (%d bytes) of %s", dropped, path)
    return {cache_key(r["dataset"], r["method"], r["qid"]): r for r in iter_jsonl(path)}


def error_trajectory(q: Question, message: str) -> Trajectory:
    """The placeholder trajectory of a question whose method raised."""
    return Trajectory(id=q.id, question=q.question, images=q.images, stop_reason="backend_error", gold=q.answers,
                      metadata={**q.metadata, "error": message})


def run_questions(fn: MethodFn, questions: Sequence[Question], ctx: MethodContext) -> list[tuple[Trajectory, str]]:
    """Run a method on a batch; if the batch raises, run its questions one by one and record each failure.

    Returns:
        `(trajectory, error message or "")` per question, in order.
    """
    try:
        return [(t, t.metadata.get("error", "") if t.stop_reason == "backend_error" else "")
                for t in fn(questions, ctx)]
    except Exception as e:  # a failing question must not end the run; it is retried alone below
        if len(questions) == 1:
            logger.warning("question %s failed: %s", questions[0].id, e)
            return [(error_trajectory(questions[0], f"{type(e).__name__}: {e}"), f"{type(e).__name__}: {e}")]
        logger.warning("a batch of %d failed (%s); retrying its questions one by one", len(questions), e)
        return [pair for q in questions for pair in run_questions(fn, [q], ctx)]


def run_eval(
    cfg: EvalConfig,
    policy: Policy | None = None,
    kbs: dict[str, KnowledgeBase] | None = None,
    checkpoint_policies: dict[str, Policy] | None = None,
    on_prediction: PredictionHook | None = None,
    compute: bool = True,
) -> dict:
    """Compute every missing prediction, then write the report (see `eval.report.write_report`).

    Args:
        cfg: the eval config.
        policy: the policy to use instead of building `cfg.policy` (tests pass a fake).
        kbs: KBs (by display name) instead of loading `cfg.kb_config`.
        checkpoint_policies: policies of the checkpoint methods instead of loading `cfg.checkpoints`.
        on_prediction: called with each record after it is cached.
        compute: False writes the report from the cache alone (missing predictions are left out).

    Returns:
        The results dict written to `results.json`.
    """
    from agent.io import JsonlWriter
    from eval.report import write_report

    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.prepare_corpora:
        from eval.corpora import prepare_corpora

        prepare_corpora(cfg.prepare_corpora, cfg.path("shared_data"), cfg.path("corpora_dir"))
    # datasets first: a malformed file fails before the (slow) KB build
    loaded: list[LoadedDataset] = [load_dataset(spec, cfg.path("shared_data")) for spec in cfg.dataset_specs()]
    if kbs is None:
        from agent.kbs import load_knowledge_bases

        if not cfg.kb_config:
            raise ValueError("`kb_config` is not set; point it at a KB YAML, e.g. `kb_config: ../kb/eval_cpu.yaml`")
        if compute:
            kbs = load_knowledge_bases(str(cfg.path("kb_config")))
        else:  # the report needs only the KB names: no index is built or loaded
            from retrievers.config import load_kb_configs

            kbs = {c.display_name: KnowledgeBase(c.name, c.display_name, None, c.k)  # type: ignore[arg-type]
                   for c in load_kb_configs(cfg.path("kb_config"))}
    kb_names = [kb.name for kb in kbs.values()]
    methods = resolve_methods(cfg.methods, kb_names, list(cfg.checkpoints))
    table = available_methods(kb_names, list(cfg.checkpoints))
    cache_path = out_dir / CACHE_FILE
    cache = read_cache(cache_path)
    policies: dict[str, Policy] = dict(checkpoint_policies or {})
    if policy is not None:
        policies["_main"] = policy

    def policy_for(method: str) -> Policy:
        key = method if method in cfg.checkpoints else "_main"
        if key not in policies:
            ckpt = cfg.checkpoints.get(method)
            # a bare path inherits the `policy` settings; `${VAR}` in it is expanded
            settings = {**cfg.policy, "model": os.path.expandvars(ckpt)} if isinstance(ckpt, str) else ckpt
            policies[key] = make_policy(settings if key == method else cfg.policy,
                                         f"checkpoints.{method}" if key == method else "policy")
        return policies[key]

    computed = 0
    with JsonlWriter(cache_path) as writer:
        for method in methods:
            fingerprint = cfg.fingerprint(method)
            # all datasets' missing questions of a method go through it together, in lockstep batches
            missing = [(ds.spec.name, q) for ds in loaded for q in ds.questions
                       if cache.get(cache_key(ds.spec.name, method, q.id), {}).get("fingerprint") != fingerprint]
            if not missing or not compute:
                continue
            logger.info("%s: %d questions to run", method, len(missing))
            ctx = MethodContext(policy_for(method), kbs, cfg.agent_config(), cfg.seed, cfg.k_per_kb)
            for start in range(0, len(missing), cfg.batch_size):
                batch = missing[start : start + cfg.batch_size]
                t0 = time.perf_counter()
                results = run_questions(table[method], [q for _, q in batch], ctx)
                latency = (time.perf_counter() - t0) / len(batch)  # lockstep: the batch's wall time, amortised
                for (dataset, q), (traj, error) in zip(batch, results, strict=True):
                    record = {"dataset": dataset, "method": method, "qid": q.id, "fingerprint": fingerprint,
                              "latency_s": latency, "error": error, "trajectory": traj.to_dict()}
                    writer.write(record)
                    cache[cache_key(dataset, method, q.id)] = record
                    computed += 1
                    if on_prediction is not None:
                        on_prediction(record)
    logger.info("computed %d predictions (%d cached)", computed, len(cache) - computed)
    return write_report(cfg, loaded, methods, cache, kb_names, out_dir, computed=computed)
