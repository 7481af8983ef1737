"""Offline against online Step-GRPO from the same SFT adapter, with the same CPU wall-clock budget each.

Offline: `configs/train/smollm2_router_grpo_lora_cpu.yaml` (step prompts on gold prefixes). Online:
`configs/train/smollm2_online_grpo_cpu.yaml` (live step trees over `configs/kb/eval_cpu.yaml`, G siblings per visited
step). Each trains until its budget of CPU seconds (process time, so other jobs on the machine do not change it) is
spent, checked after every optimizer step, so the last step may overrun; the CPU and wall seconds spent are printed. Then the SFT start and both results answer the same held-out step prompts
(`steps_heldout.jsonl`, trajectories no stage trained on) greedily and unconstrained, scored by the recipe rewards
(`benchmarks/router_stages.py`), plus the final answers' F1-recall and the first-step KB accuracy (constrained greedy,
stop removed). Paired differences (online - offline) carry their standard errors. Last, the three adapters run as
the agent (the shipped router's settings: constrained, no few-shot, min_steps 1) through `kbrouter eval` on a
scoreboard subset (`configs/eval/scoreboard_cpu.yaml`, the first `--scoreboard-limit` held-out questions of each
dataset): macro F1-recall, routing per step and the valid-step rate, as the eval report gives them.

    python benchmarks/online_vs_offline.py                        # 2 x 300 CPU s of training + ~5 min of scoring
    python benchmarks/online_vs_offline.py --budget-s 120 --limit 10 --synth runs/synth/annotation_cpu_v1
    python benchmarks/online_vs_offline.py --sft models/smollm2-kbrouter --scoreboard-limit 4   # from the shipped one
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "TRL_EXPERIMENTAL_SILENCE": "1"}.items():  # fmt: skip
    os.environ.setdefault(_k, _v)
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

OFFLINE = "configs/train/smollm2_router_grpo_lora_cpu.yaml"
ONLINE = "configs/train/smollm2_online_grpo_cpu.yaml"


def stop_after(seconds: float):
    from transformers import TrainerCallback

    class StopAfter(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.t0 = time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            if time.process_time() - self.t0 >= seconds:  # CPU seconds: fair on a machine shared with other jobs
                control.should_training_stop = True

    return StopAfter()


def run_training(kind: str, overrides: list[str], budget: float, out: Path) -> dict:
    """Train one method within `budget` seconds; returns its timing figures (the adapter is saved to `out`)."""
    from training.config import load_config
    from training.trainers import build_grpo_trainer

    recipe = OFFLINE if kind == "offline" else ONLINE
    cfg = load_config("grpo", REPO / recipe, [*overrides, "--output_dir", str(out), "--max_steps", "1000",
                                              "--save_strategy", "no", "--logging_steps", "1"])  # fmt: skip
    if kind == "online":
        from training.online_grpo import build_online_grpo_trainer

        trainer = build_online_grpo_trainer(cfg)
    else:
        trainer = build_grpo_trainer(cfg)
    trainer.add_callback(stop_after(budget))
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    trainer.save_model(str(out))
    logs = [h for h in trainer.state.log_history if "loss" in h]
    fig = {"steps": trainer.state.global_step, "train_cpu_s": cpu, "train_wall_s": wall}
    if kind == "online":
        rollout = sum(h["online/rollout_s"] for h in logs)
        trajectories = sum(h["online/rows"] + 1 for h in logs)  # siblings + the spine (one question per step)
        fig.update(rollout_wall_s=rollout, rollouts_per_cpu_s=trajectories / max(cpu, 1e-9),
                   rollouts_per_wall_s=trajectories / max(wall, 1e-9),
                   rollouts_per_rollout_s=trajectories / max(rollout, 1e-9),
                   branch_time_share=sum(h["online/branch_s"] for h in logs) / max(rollout, 1e-9),
                   anchors_per_question=sum(h["online/anchors_per_question"] for h in logs) / max(len(logs), 1),
                   rows=sum(h["online/rows"] for h in logs))  # fmt: skip
    else:
        n = cfg.per_device_train_batch_size * trainer.state.global_step
        fig.update(completions=n, completions_per_cpu_s=n / max(cpu, 1e-9), completions_per_wall_s=n / max(wall, 1e-9))
    del trainer
    gc.collect()
    return fig


def training_questions(synth: Path, tmp: Path) -> Path:
    """The synthesis run's trajectories minus the held-out ones (text only: the online loader skips images)."""
    held = {json.loads(line)["trajectory_id"] for line in (synth / "steps_heldout.jsonl").open() if line.strip()}
    rows = [line for line in (synth / "trajectories.jsonl").open() if line.strip()
            and json.loads(line)["id"] not in held]  # fmt: skip
    path = tmp / "train_trajectories.jsonl"
    path.write_text("".join(rows))
    return path


def evaluate(adapter: str, records, all_records, funcs, weights, recipe: dict) -> dict:
    from router_stages import first_step_routing, score

    from agent.backends.hf import TransformersPolicy
    from agent.metrics import f1_recall
    from agent.protocol import parse_answer
    from training.step_dataset import build_step_dataset

    policy = TransformersPolicy("smollm2", adapter=adapter, max_batch_size=16)
    tokens = {"plan": recipe["grammar_tokens"]["plan"], "final": recipe["grammar_tokens"]["final"]}
    ds = build_step_dataset(records, tokenizer=policy.tokenizer, max_prompt_tokens=recipe["max_prompt_tokens"],
                            grammar_tokens=recipe["grammar_tokens"])  # fmt: skip
    result = score(policy, ds, funcs, weights, tokens)
    finals = ds.filter(lambda r: r["step_type"] == "final")
    from agent.backends.base import SamplingParams

    outs = policy.generate([list(p) for p in finals["prompt"]],
                           SamplingParams(max_new_tokens=tokens["final"], stop=("</answer>",)))  # fmt: skip
    result["final_f1_recall"] = [f1_recall(parse_answer(o.text).answer or "", list(g)).recall
                                 for o, g in zip(outs, finals["gold_answers"], strict=True)]  # fmt: skip
    ids = {r.trajectory_id for r in records}
    result["routing"] = first_step_routing(policy, [r for r in all_records if r.trajectory_id in ids],
                                           recipe["grammar_tokens"]["plan"])  # fmt: skip
    del policy
    gc.collect()
    return result


SCOREBOARD = "configs/eval/scoreboard_cpu.yaml"


def fmt(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def scoreboard_subset(adapters: dict[str, str], limit: int, out: Path) -> dict:
    """Each adapter as the agent on the first `limit` held-out questions per scoreboard dataset, via `kbrouter eval`.

    Returns per method: macro F1-recall over groups, routing per step and the valid-step rate (eval's own figures)."""
    import subprocess

    import yaml

    from retrievers.config_file import load_yaml

    base = REPO / SCOREBOARD
    cfg = load_yaml(base)
    here = base.parent
    for key in ("kb_config", "shared_data", "corpora_dir"):
        cfg[key] = str((here / cfg[key]).resolve())
    cfg["dataset_defaults"]["split_file"] = str((here / cfg["dataset_defaults"]["split_file"]).resolve())
    agent = cfg["agent_variants"]["agent_grpo"]["agent"]  # the shipped router's settings
    cfg["agent_variants"] = {name: {"policy": {"model": "smollm2", "adapter": path}, "agent": dict(agent)}
                             for name, path in adapters.items()}  # fmt: skip
    cfg.update(name="online_vs_offline", output_dir=str(out), methods=list(adapters), plot_method=next(iter(adapters)))
    path = out.parent / "online_vs_offline_eval.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [sys.executable, "-m", "eval.cli", "--config", str(path), "--limit", str(limit), "--quiet"]
    subprocess.run(
        cmd, cwd=REPO, check=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    )
    results = json.loads((out / "results.json").read_text())
    figs = {}
    for m in adapters:
        macro = results["macro_over_groups"][m]
        figs[m] = {"f1_recall": macro.get("answer/f1_recall"), "route_step": macro.get("routing/step_accuracy"),
                   "valid": macro.get("format/valid_step_rate")}  # fmt: skip
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft", default="runs/train/smollm2_router_sft_decisions", help="the SFT adapter both start from")
    ap.add_argument("--synth", default="runs/synth/annotation_cpu", help="synthesis run: trajectories + step splits")
    ap.add_argument("--budget-s", type=float, default=300.0, help="training CPU seconds per method (process time)")
    ap.add_argument("--limit", type=int, default=20, help="held-out prompts per step type (plan, final)")
    ap.add_argument("--scoreboard-limit", type=int, default=4, help="scoreboard questions per dataset (0: skip)")
    args = ap.parse_args()

    from router_stages import mean_se

    from training.config import RewardSpec, read_recipe
    from training.rewards import build_reward
    from training.step_data import load_step_records

    synth = REPO / args.synth
    recipe = read_recipe(REPO / OFFLINE)
    tmp = Path(tempfile.mkdtemp(prefix="online_vs_offline_"))
    start = ["--init_adapter", str(REPO / args.sft)]
    figs = {
        "offline": run_training("offline", [*start, "--train_file", str(synth / "steps_train.jsonl"),
                                            "--per_device_train_batch_size", "8"],  # 2 prompts x G 4: fits in memory
                                args.budget_s, tmp / "offline"),
        "online": run_training("online", [*start, "--train_file", str(training_questions(synth, tmp))],
                               args.budget_s, tmp / "online"),
    }  # fmt: skip

    specs = [RewardSpec.from_dict(d) for d in recipe["rewards"]]
    funcs = [build_reward(s.name, **{**s.kwargs, "gate": True} if s.name != "format" else s.kwargs) for s in specs]
    weights = [s.weight for s in specs]
    all_records = load_step_records(str(synth / "steps_heldout.jsonl"), "steps")
    kept, seen = [], {}
    for r in all_records:
        if r.step_type in ("plan", "final"):
            seen[r.step_type] = seen.get(r.step_type, 0) + 1
            if seen[r.step_type] <= args.limit:
                kept.append(r)
    models = {"sft": str(REPO / args.sft), "offline": str(tmp / "offline"), "online": str(tmp / "online")}
    t0 = time.perf_counter()
    results = {name: evaluate(path, kept, all_records, funcs, weights, recipe) for name, path in models.items()}
    eval_s = time.perf_counter() - t0

    import torch

    print(f"budget: {args.budget_s:.0f} CPU s of training per method (process time, {torch.get_num_threads()} torch "
          f"threads, {os.cpu_count()} CPUs), from {args.sft}; scoring took {eval_s:.0f} s")  # fmt: skip
    for name, f in figs.items():
        print(f"{name:8s} " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in f.items()))
    n = {t: sum(r.step_type == t for r in kept) for t in ("plan", "final")}
    print(f"held-out: {n['plan']} plan + {n['final']} final step prompts of {synth / 'steps_heldout.jsonl'}")
    keys = ["reward", *[f.__name__ for f in funcs], "final_f1_recall"]
    print(f"{'mean ± s.e.':22s}" + "".join(f"{m:>18s}" for m in models) + f"{'online - offline (paired)':>30s}")
    for k in keys:
        cells = []
        for m in models:
            mu, se = mean_se([x for x in results[m][k] if x is not None])
            cells.append(f"{mu:8.3f} ± {se:5.3f}")
        pairs = [(a, b) for a, b in zip(results["offline"][k], results["online"][k], strict=True)
                 if a is not None and b is not None]  # fmt: skip
        d, dse = mean_se([b - a for a, b in pairs])
        print(f"{k:22s}" + "".join(f"{c:>18s}" for c in cells) + f"{d:+15.3f} ± {dse:.3f} (n={len(pairs)})")
    print("first-step KB accuracy (constrained greedy, stop removed), right/asked:")
    for m in models:
        r = results[m]["routing"]
        right, asked = sum(v[0] for v in r.values()), sum(v[1] for v in r.values())
        per = ", ".join(f"{d} {a}/{b}" for d, (a, b) in sorted(r.items()))
        print(f"  {m:8s} {right}/{asked} ({right / max(asked, 1):.2f})   {per}")
    d, dse = mean_se([b - a for a, b in zip(results["offline"]["reward"], results["online"]["reward"], strict=True)])
    winner = "online" if d > 2 * dse else "offline" if d < -2 * dse else "neither (|diff| < 2 s.e.)"
    print(f"held-out step reward, online - offline: {d:+.3f} ± {dse:.3f} -> wins: {winner}")
    if args.scoreboard_limit:
        t0 = time.perf_counter()
        board = scoreboard_subset({"start": models["sft"], "offline": models["offline"], "online": models["online"]},
                                  args.scoreboard_limit, tmp / "scoreboard")  # fmt: skip
        print(
            f"scoreboard subset ({args.scoreboard_limit} held-out questions per dataset of {SCOREBOARD}, "
            f"the agent constrained, {time.perf_counter() - t0:.0f} s; report: {tmp / 'scoreboard' / 'report.md'}):"
        )
        for m in ("start", "offline", "online"):
            f = board[m]
            print(
                f"  {m:8s} macro F1-recall {fmt(f['f1_recall'])}   routing per step {fmt(f['route_step'])}   "
                f"valid steps {fmt(f['valid'])}"
            )


if __name__ == "__main__":
    main()
