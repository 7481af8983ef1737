"""The synthesis job: teacher trajectories through the step loop, judged, written, resumable (DESIGN §6).

Work plan, deterministic from the inputs and the recipe:

1. Read the inputs (`data_synthesis.inputs`); rows without gold, with a missing image, held out by `exclude_split`,
   ... are skipped and counted. With the annotation teacher (`teacher.backend: annotation`) every question is also
   planned from its own supervision (`data_synthesis.gold_plans`); a row lacking the fields its planner needs is a
   skip too.
2. Shard by id: question `q` belongs to shard `sha1(q.id) % num_shards`, whatever the file order or machine.
3. Cut the shard's questions, in input order, into batches of `questions_per_batch`; each batch runs all `m`
   samples of its questions in one lockstep `StepAgent.run_batch` (sample `k` of question `q` is the trajectory
   `q#k`), or, with the annotation teacher, one `AnnotationTeacher.run_batch` (one gold trajectory `q#0` each).
   Every sample of a question is in the same batch, so duplicates are dropped within the batch.
4. Seeds: batch `b` runs with `AgentConfig(seed=batch_seed(cfg.seed, first id of b))`. Its composition is fixed by
   rule 3, so a recomputed batch sees the same seeds and rows: outputs depend on (question ids, sample index, base
   seed) and not on when the job was (re)started. With a seeded backend (transformers with a fixed batch split,
   vLLM) a resumed run reproduces an uninterrupted one.

Crash safety (resume at batch granularity): each batch is committed by one line of `progress.jsonl`
(`data_synthesis.commit_log`); on restart the outputs are rolled back to the last commit, committed batches are
skipped and the rest recomputed. `manifest.json` pins the recipe's hash, so resuming into a folder made by another
recipe is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from agent.backends.base import Policy
from agent.kbs import KnowledgeBase
from agent.loop import StepAgent
from agent.types import Question
from data_synthesis.commit_log import MANIFEST, OUTPUTS, PROGRESS, SKIPPED, atomic_write, restore
from data_synthesis.config import ANNOTATION, SynthConfig
from data_synthesis.inputs import Skip, read_inputs
from data_synthesis.rejection import judge_group
from retrievers.jsonl import append_jsonl, write_jsonl_atomic

logger = logging.getLogger(__name__)


def shard_of(question_id: str, num_shards: int) -> int:
    """The shard a question belongs to: a stable hash of its id (same on every machine and Python run)."""
    return int(hashlib.sha1(question_id.encode()).hexdigest()[:12], 16) % num_shards


def batch_seed(base_seed: int, first_id: str) -> int:
    """The sampling seed of a batch, from the base seed and its first question id (sample 0)."""
    return int(hashlib.sha1(f"{base_seed}:{first_id}#0".encode()).hexdigest()[:8], 16) % (2**31 - 1)


def shard_dir(cfg: SynthConfig) -> Path:
    """Where this job writes: `output_dir` itself, or `output_dir/shards/IIIII-of-NNNNN` when sharded."""
    out = Path(cfg.output_dir)
    return out if cfg.num_shards == 1 else out / "shards" / f"{cfg.shard:05d}-of-{cfg.num_shards:05d}"


def plan_batches(questions: Sequence[Question], questions_per_batch: int) -> list[list[Question]]:
    return [list(questions[i : i + questions_per_batch]) for i in range(0, len(questions), questions_per_batch)]


def load_kbs(cfg: SynthConfig) -> dict[str, KnowledgeBase]:
    """The KBs of `cfg.kb_config` (built first when `build_kbs`), keyed by display name (`agent.kbs`' loader)."""
    from agent.kbs import load_knowledge_bases

    files = [cfg.kb_config] if isinstance(cfg.kb_config, str) else list(cfg.kb_config)
    if not any(files):
        raise ValueError("`kb_config` is empty; set e.g. `kb_config: ../kb/demo.yaml` in the recipe")
    return load_knowledge_bases(files, only=cfg.kbs, build=cfg.build_kbs)


def expand(batch: Sequence[Question], m: int) -> list[Question]:
    """The `m` samples of each question as separate agent questions `id#k`, keeping the source id in metadata."""
    return [replace(q, id=f"{q.id}#{k}", metadata={**q.metadata, "sample": k}) for q in batch for k in range(m)]


def prepare(cfg: SynthConfig) -> tuple[list[Question], list[Skip], dict]:
    """This shard's questions (input order), skipped rows and, for the annotation teacher, gold plans by id."""
    plans: dict = {}
    if cfg.teacher.backend == ANNOTATION:
        from data_synthesis.annotation import plan_questions

        questions, skips, plans = plan_questions(cfg)
    else:
        questions, skips = read_inputs(cfg.inputs)
    mine = [q for q in questions if shard_of(q.id, cfg.num_shards) == cfg.shard]
    my_skips = [s for s in skips if shard_of(s.id, cfg.num_shards) == cfg.shard]
    return mine, my_skips, plans


def run_synthesis(cfg: SynthConfig, policy: Policy | None = None, kbs: dict[str, KnowledgeBase] | None = None) -> dict:
    """Run (or resume) this shard of the job; returns its summary (also written to `summary.json`).

    Args:
        cfg: the recipe.
        policy: the teacher; default `teacher.build_teacher(cfg.teacher)`. Any other policy is wrapped in a
            `RetryingPolicy` with `cfg.teacher.retries` / `backoff_s` (unless it is one already). Unused by the
            annotation teacher.
        kbs: the KBs keyed by display name; default `load_kbs(cfg)`.
    """
    from data_synthesis.records import step_records
    from data_synthesis.summary import finalize

    folder = shard_dir(cfg)
    if cfg.num_shards == 1 and (folder / "shards").exists():
        raise ValueError(f"{folder} holds a sharded run (shards/); use its --num-shards, or a new `output_dir`")
    folder.mkdir(parents=True, exist_ok=True)
    questions, skips, plans = prepare(cfg)
    batches = plan_batches(questions, cfg.questions_per_batch)
    manifest = {"config_hash": cfg.result_hash(), "shard": cfg.shard, "num_shards": cfg.num_shards,
                "questions": len(questions), "batches": len(batches), "m": cfg.m}  # fmt: skip
    mpath = folder / MANIFEST
    if mpath.exists():
        old = json.loads(mpath.read_text())
        if old != manifest:
            diff = {k: (old.get(k), v) for k, v in manifest.items() if old.get(k) != v}
            raise ValueError(f"{folder} holds a run of another recipe or input set (differs in {diff}); resume "
                             "with the same recipe, or choose a new `output_dir`")  # fmt: skip
    else:
        atomic_write(mpath, json.dumps(manifest, indent=2))
        atomic_write(folder / "config.json", json.dumps(cfg.to_dict(), indent=2, default=str))
    write_jsonl_atomic(folder / SKIPPED, (s.to_dict() for s in skips))

    progress = restore(folder)
    for p in progress:
        if p["batch"] >= len(batches) or p["ids"] != [q.id for q in batches[p["batch"]]]:
            raise ValueError(f"{folder}: committed batch {p['batch']} holds other questions than the inputs give "
                             "now (were the input files edited?); use a new `output_dir`")  # fmt: skip
    done = {p["batch"] for p in progress}
    todo = [b for b in range(len(batches)) if b not in done]
    logger.info("shard %d/%d: %d questions in %d batches (%d done), m=%d, %d skipped rows -> %s", cfg.shard,
                cfg.num_shards, len(questions), len(batches), len(done), cfg.m, len(skips), folder)  # fmt: skip
    if todo:
        from data_synthesis.teacher import RetryingPolicy, build_teacher

        annotator = None
        kbs = kbs if kbs is not None else load_kbs(cfg)
        if cfg.teacher.backend == ANNOTATION:
            from data_synthesis.annotation import AnnotationTeacher

            annotator = AnnotationTeacher(kbs, plans, cfg.top_k_hits, cfg.max_steps)
        elif policy is None:
            policy = build_teacher(cfg.teacher)
        elif not isinstance(policy, RetryingPolicy):
            policy = RetryingPolicy(policy, retries=cfg.teacher.retries, backoff_s=cfg.teacher.backoff_s)
        kb_menu = [(kb.display_name, kb.description) for kb in kbs.values()]
        bar = _progress_bar(cfg, total=len(questions), initial=sum(len(batches[b]) for b in done))
        accepted = sum(p["accepted"] for p in progress)
        try:
            for b in todo:
                t0 = time.perf_counter()
                failures0 = policy.failures if annotator is None else 0
                if annotator is not None:
                    trajectories = annotator.run_batch(batches[b])
                else:
                    agent = StepAgent(policy, kbs, cfg.agent_config(batch_seed(cfg.seed, batches[b][0].id)))
                    trajectories = agent.run_batch(expand(batches[b], cfg.m))
                rows: dict[str, list[dict]] = {name: [] for name in OUTPUTS}
                n_acc = 0
                for start in range(0, len(trajectories), cfg.m):
                    for v in judge_group(trajectories[start : start + cfg.m], cfg.rejection):
                        traj = replace(v.trajectory, metadata={**v.trajectory.metadata, "score": v.score, "batch": b})
                        d = traj.to_dict()
                        if v.accepted:
                            n_acc += 1
                            rows["trajectories.jsonl"].append(d)
                            rows["steps.jsonl"] += step_records(traj, kb_menu, kbs.values(), cfg.step_prompt)
                        else:
                            rows["rejected.jsonl"].append({
                                "id": traj.id, "question_id": traj.metadata["question_id"],
                                "dataset": traj.metadata.get("dataset", ""), "sample": traj.metadata["sample"],
                                "reasons": list(v.reasons), "score": v.score, "trajectory": d,
                            })  # fmt: skip
                sizes = {name: append_jsonl(folder / name, rows[name]) for name in OUTPUTS}
                seconds = time.perf_counter() - t0
                commit = {"batch": b, "ids": [q.id for q in batches[b]], "trajectories": len(trajectories),
                          "accepted": n_acc, "seconds": round(seconds, 3), "sizes": sizes,
                          "teacher_failures": (policy.failures - failures0) if annotator is None else 0}  # fmt: skip
                append_jsonl(folder / PROGRESS, [commit])  # the commit point
                progress.append(commit)
                accepted += n_acc
                bar.set_postfix(accepted=accepted, traj_per_min=f"{60 * len(trajectories) / max(seconds, 1e-9):.1f}")
                bar.update(len(batches[b]))
        except KeyboardInterrupt as e:  # Ctrl-C: `kbrouter` prints what was kept
            bar.close()
            kept = sum(len(c["ids"]) for c in progress)
            e.args = (f"{kept} of {len(questions)} questions done (committed batches in {folder})",)
            raise
        bar.close()
    return finalize(folder, cfg.m, export_format=cfg.export_format if cfg.num_shards == 1 else "none")


def _progress_bar(cfg: SynthConfig, total: int, initial: int):  # noqa: ANN202 - tqdm's type
    from tqdm.auto import tqdm

    disable = not cfg.progress or logging.getLogger().getEffectiveLevel() > logging.INFO
    return tqdm(total=total, initial=initial, unit="q", desc=f"synth shard {cfg.shard}", disable=disable)
