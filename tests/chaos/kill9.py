"""kill -9 at seeded random moments in `kbrouter index | run | synth | eval | train`, then compare with a clean run.

For each job: run it once uninterrupted (the reference); then, in a fresh folder, start it and SIGKILL it at a
random moment N times (each restart resumes from what the last one left), and finally let it finish. The final
outputs are read back as keyed records and compared with the reference: records lost, duplicated and different
(timings left out) must all be 0, and the finishing run must exit 0.

The model-path jobs (`run`, `synth`, `eval`) talk to a `kbrouter serve` endpoint in this process over a
deterministic fake step policy (`tests/fakes.py` StepPolicy, a delay per call so kills land mid-batch): the
job's resume machinery is under test, and greedy real-model outputs are not guaranteed bitwise equal across batch
compositions. `index` builds two real BM25 KBs (5,812 shared paragraphs, the 300 demo passages) and `train` runs
real SFT steps of SmolLM2-135M-Instruct with LoRA, resumed by `--resume_from_checkpoint true`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "demo"
SHARED_QUESTIONS = REPO.parent / "shared" / "data" / "text" / "questions.jsonl"
VOLATILE = ("_s", "latency", "seconds", "created", "time", "elapsed", "runtime", "per_second")


def stable(x: object) -> object:
    """`x` without timing fields (keys ending `_s` or naming a time), so two runs' records compare equal."""
    if isinstance(x, dict):
        return {k: stable(v) for k, v in x.items() if not any(v_ in k for v_ in VOLATILE)}
    if isinstance(x, list):
        return [stable(v) for v in x]
    return x


def lines(path: Path) -> int:
    """Complete lines of a file (0 when absent)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def jsonl_records(path: Path, key: Callable[[dict], str]) -> list[tuple[str, object]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            out.append((key(d), stable(d)))
    return out


@dataclass
class Job:
    """One chaos job: its `kbrouter` arguments for an output folder, and how to read the folder back as records."""

    name: str
    argv: Callable[[Path], list[str]]
    records: Callable[[Path], list[tuple[str, object]]]
    prepare: Callable[[Path], None] = lambda folder: None
    progress: Callable[[Path], int] = lambda folder: 0  # units of work on disk (lines, checkpoints), read cheaply


@dataclass
class Outcome:
    job: str
    kills: int = 0  # SIGKILLs that landed while the job ran
    finished_early: int = 0  # planned kills that found the job already done
    records_at_kill: list[int] = field(default_factory=list)
    reference_records: int = 0
    lost: int = 0
    duplicated: int = 0
    different: int = 0
    final_rc: int | None = None
    clean_s: float = 0.0
    examples: list = field(default_factory=list)


def grammar_blind_step_policy(delay_s: float):  # noqa: ANN201
    """The fake step policy `kbrouter serve` serves to the jobs; it accepts the step grammar the jobs send and
    ignores it (its replies follow the protocol anyway)."""
    from tests.fakes import StepPolicy

    class GrammarBlindStepPolicy(StepPolicy):
        supports_grammar = True

    return GrammarBlindStepPolicy(delay=delay_s)


def kbrouter(argv: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        ["nice", "-n", "19", sys.executable, "-m", "kbrouter.cli", *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # SIGKILL the whole job (nice and python) at once
    )


def job_env() -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", TRL_EXPERIMENTAL_SILENCE="1", PYTHONPATH=str(REPO))  # fmt: skip
    return env


def finish(job: Job, folder: Path, env: dict, timeout_s: float) -> tuple[int, str]:
    p = kbrouter(job.argv(folder), env)
    try:
        _, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        return 124, "timed out"
    return p.returncode, err


def compare(reference: list[tuple[str, object]], final: list[tuple[str, object]], outcome: Outcome) -> None:
    want = dict(reference)
    counts = Counter(k for k, _ in final)
    got = dict(final)
    outcome.reference_records = len(want)
    outcome.lost = sum(1 for k in want if k not in got)
    outcome.duplicated = sum(n - 1 for n in counts.values() if n > 1)
    diff = [k for k in want if k in got and got[k] != want[k]]
    outcome.different = len(diff) + sum(1 for k in got if k not in want)
    outcome.examples = diff[:3]


def chaos(job: Job, work: Path, kills: int, rng: random.Random, timeout_s: float = 900) -> Outcome:
    """Run `job` clean, then killed `kills` times at random moments and finished; compare the two outputs."""
    env = job_env()
    out = Outcome(job.name)
    clean, killed = work / job.name / "clean", work / job.name / "killed"
    for folder in (clean, killed):
        folder.mkdir(parents=True, exist_ok=True)
        job.prepare(folder)
    t0 = time.monotonic()
    rc, err = finish(job, clean, env, timeout_s)
    out.clean_s = time.monotonic() - t0
    if rc != 0:
        raise RuntimeError(f"{job.name}: the clean run failed (rc {rc}): {err[-2000:]}")
    reference = job.records(clean)
    total = job.progress(clean)
    for _ in range(kills):
        p = kbrouter(job.argv(killed), env)
        # kill once a random number of the work units still to do are on disk, plus a random delay (so the kill
        # lands anywhere in the next unit: mid-batch, mid-write); without units, at a random time of a clean run
        done = job.progress(killed)
        target = done + rng.randint(1, max(1, total - done - 1)) if total > done + 1 else None
        jitter = rng.uniform(0.0, 1.5)
        deadline = time.monotonic() + (out.clean_s if target else rng.uniform(0.25, 1.0) * out.clean_s)
        while p.poll() is None and time.monotonic() < deadline and (target is None or job.progress(killed) < target):
            time.sleep(0.05)
        if target is not None:
            time.sleep(jitter)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            out.kills += 1
            out.records_at_kill.append(job.progress(killed))
        else:
            p.communicate()
            out.finished_early += 1
    out.final_rc, err = finish(job, killed, env, timeout_s)
    if out.final_rc != 0:
        out.examples = [err[-1000:]]
    compare(reference, job.records(killed), out)
    return out


# ---------------------------------------------------------------- the five jobs


def write_questions(folder: Path, n: int) -> Path:
    """The first `n` shared HotpotQA dev questions as {id, question, answers} (real questions, a real corpus)."""
    rows = [json.loads(line) for line in SHARED_QUESTIONS.open(encoding="utf-8")][:n]
    path = folder / "questions.jsonl"
    path.write_text("".join(json.dumps({"id": r["qid"], "question": r["question"], "answers": r["answers"]}) + "\n"
                            for r in rows))  # fmt: skip
    return path


def write_bm25_kb(folder: Path) -> Path:
    path = folder / "kb_bm25.yaml"
    path.write_text(
        "knowledge_bases:\n"
        "  - name: text\n    display_name: Text Retriever\n    kind: text\n    granularity: paragraph\n"
        f"    corpus: {DEMO / 'passages.jsonl'}\n    search: bm25\n    index_dir: {folder / 'index_bm25'}\n    k: 3\n"
    )
    return path


def index_job() -> Job:
    def prepare(folder: Path) -> None:
        # two BM25 KBs over real paragraphs (5,812 shared HotpotQA/MuSiQue contexts, 300 demo passages): a dense
        # MiniLM build takes a quarter of an hour on a busy 2-core machine at nice 19, too long to kill repeatedly
        # the small one first, so a kill after it (plus jitter) lands in the large build
        (folder / "kb.yaml").write_text(
            "knowledge_bases:\n"
            "  - name: words\n    display_name: Word Retriever\n    kind: text\n    granularity: paragraph\n"
            f"    corpus: {DEMO / 'passages.jsonl'}\n    search: bm25\n    index_dir: {folder / 'index_bm25'}\n"
            "  - name: text\n    display_name: Text Retriever\n    kind: text\n    granularity: paragraph\n"
            f"    corpus: {SHARED_QUESTIONS.parent / 'corpus.jsonl'}\n    search: bm25\n    chunk_words: 100\n"
            f"    index_dir: {folder / 'index'}\n    k: 5\n"
        )

    def records(folder: Path) -> list[tuple[str, object]]:
        # each KB's documents, and the hits of a fixed set of questions searched on the loaded index
        from retrievers.config import load_kb_configs
        from retrievers.kb import load_kb

        if not (folder / "index_bm25").exists():
            return []
        out = []
        questions = [json.loads(line)["question"] for line in (DEMO / "questions.jsonl").open()][:20]
        for cfg in load_kb_configs(folder / "kb.yaml"):
            try:
                kb = load_kb(cfg)
            except (FileNotFoundError, ValueError):  # not built (yet): its records are missing
                continue
            out += jsonl_records(cfg.index_dir / "docs.jsonl", lambda d, n=cfg.name: f"{n}/doc/{d['id']}")
            for q, hits in zip(questions, kb.search(questions, 3), strict=True):
                out.append((f"{cfg.name}/hits/{q}", [(h.doc.id, round(h.score, 4)) for h in hits]))
        return out

    def progress(folder: Path) -> int:
        return sum(1 for d in ("index", "index_bm25") if (folder / d / "manifest.json").exists())

    return Job("index", lambda f: ["index", "--kb", str(f / "kb.yaml")], records, prepare, progress)


def run_job(base_url: str, limit: int = 40) -> Job:
    def argv(folder: Path) -> list[str]:
        return ["run", "--questions", str(folder / "questions.jsonl"), "--out", str(folder / "trajectories.jsonl"),
                "--backend", "openai", "--base-url", base_url, "--model", "step-policy", "--kb",
                str(folder / "kb_bm25.yaml"), "--batch-size", "4", "--limit", str(limit), "--no-few-shot", "--constrained", "off"]  # fmt: skip

    def prepare(folder: Path) -> None:
        write_bm25_kb(folder)
        write_questions(folder, limit)

    return Job("run", argv, lambda f: jsonl_records(f / "trajectories.jsonl", lambda d: d["id"]), prepare,
               lambda f: lines(f / "trajectories.jsonl"))  # fmt: skip


def synth_job(base_url: str, limit: int = 24) -> Job:
    def prepare(folder: Path) -> None:
        write_bm25_kb(folder)
        write_questions(folder, limit)
        (folder / "synth.yaml").write_text(
            f"inputs:\n  - path: {folder / 'questions.jsonl'}\n    format: generic\n"
            f"kb_config: {folder / 'kb_bm25.yaml'}\n"
            f"teacher:\n  backend: openai\n  model: step-policy\n  kwargs: {{base_url: {base_url}}}\n  retries: 0\n"
            f"m: 2\ntemperature: 0.7\nmax_steps: 2\nquestions_per_batch: 4\nseed: 0\n"
            f"output_dir: {folder / 'synth'}\nexport_format: none\n"
        )

    def records(folder: Path) -> list[tuple[str, object]]:
        out = []
        for name in ("trajectories.jsonl", "rejected.jsonl", "steps.jsonl"):
            path = folder / "synth" / name
            if not path.exists():
                continue
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
                d = json.loads(line)
                key = d.get("id") or d.get("trajectory_id") or str(i)
                out.append((f"{name}/{key}/{d.get('step_type', '')}/{d.get('step_index', d.get('candidate', ''))}",
                            stable(d)))  # fmt: skip
        return out

    return Job("synth", lambda f: ["synth", "--config", str(f / "synth.yaml")], records, prepare,
               lambda f: lines(f / "synth" / "progress.jsonl"))  # fmt: skip


def eval_job(base_url: str, limit: int = 20) -> Job:
    def prepare(folder: Path) -> None:
        write_bm25_kb(folder)
        write_questions(folder, limit)
        (folder / "eval.yaml").write_text(
            f"name: chaos\noutput_dir: {folder / 'eval'}\nkb_config: {folder / 'kb_bm25.yaml'}\n"
            f"policy:\n  backend: openai\n  model: step-policy\n  base_url: {base_url}\n"
            'agent:\n  max_steps: 2\n  few_shot: false\n  constrained: "off"\nmethods: [agent, no_retrieval, rag_all]\nbatch_size: 4\n'
            f"datasets:\n  - name: hotpotqa\n    loader: jsonl\n    path: {folder / 'questions.jsonl'}\n"
        )

    def records(folder: Path) -> list[tuple[str, object]]:
        key = lambda d: f"{d['dataset']}/{d['method']}/{d['qid']}"  # noqa: E731
        # a cache record's fingerprint and KB digest name its own folder's config and index build, which differ
        # between the clean and the killed folder by design; the rest must be equal
        return jsonl_records(folder / "eval" / "predictions.jsonl", key) + [
            (f"cache/{k}", {**d, "fingerprint": "", "inputs": {**d["inputs"], "kbs": ""}})
            for k, d in jsonl_records(folder / "eval" / "cache.jsonl", key)
        ]

    return Job("eval", lambda f: ["eval", "--config", str(f / "eval.yaml")], records, prepare,
               lambda f: lines(f / "eval" / "cache.jsonl"))  # fmt: skip


def train_job(steps: int = 6) -> Job:
    """LoRA SFT of SmolLM2 on the paper's step records, a checkpoint every step; records: the losses per step and
    the final adapter's weights (the sum of |w| per tensor)."""
    data = REPO.parent / "shared" / "data" / "r1router" / "stepgrpo_valid.jsonl"

    def prepare(folder: Path) -> None:
        (folder / "train.yaml").write_text(
            f"model_name_or_path: smollm2\nmodel_dtype: float32\ntrain_file: {data}\ntrain_format: paper\n"
            "step_types: [plan, final]\nmax_prompt_tokens: 320\nmax_length: 384\n"
            "lora: {r: 8, alpha: 16, dropout: 0.0, target_modules: all-linear}\n"
            f"output_dir: {folder / 'train'}\nper_device_train_batch_size: 1\ngradient_accumulation_steps: 1\n"
            f"learning_rate: 3.0e-4\nmax_steps: {steps}\nuse_cpu: true\nbf16: false\nlogging_steps: 1\n"
            f"report_to: none\nsave_strategy: steps\nsave_steps: 1\nsave_total_limit: {steps + 1}\nseed: 0\n"
        )

    def argv(folder: Path) -> list[str]:
        resume = ["--resume_from_checkpoint", "true"] if any((folder / "train").glob("checkpoint-*")) else []
        return ["train", "sft", "--config", str(folder / "train.yaml"), *resume]

    def records(folder: Path) -> list[tuple[str, object]]:
        states = sorted(
            (folder / "train").glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name[11:])
        )
        if not states:
            return []
        history = json.loads(states[-1].read_text())["log_history"]
        out = [(f"step/{h['step']}", round(h["loss"], 4)) for h in history if "loss" in h]
        final = folder / "train" / "adapter_model.safetensors"
        if final.exists():
            from safetensors.numpy import load_file

            out += [(f"weight/{k}", round(float(abs(v).sum()), 3)) for k, v in sorted(load_file(final).items())]
        return out

    def progress(folder: Path) -> int:
        return len(list((folder / "train").glob("checkpoint-*/trainer_state.json")))

    return Job("train", argv, records, prepare, progress)


JOBS = {
    "index": lambda url: index_job(),
    "run": run_job,
    "synth": synth_job,
    "eval": eval_job,
    "train": lambda url: train_job(),
}
