"""Held-out step reward of the router at each training stage: base SmolLM2, after SFT, after Step-GRPO.

The held-out steps are whole trajectories that no stage trained on (`scripts/split_steps.py`: steps_heldout.jsonl).
Every model answers every held-out plan and final step prompt greedily, *unconstrained* (so the format component
measures what the model learned, not what the grammar enforces), and is scored by the Step-GRPO recipe's rewards.
`--constrained` decodes each step under its grammar instead, as the agent does (`agent.constrained`): every step is
then well formed, and the reward measures the decisions and the answers the user gets.
Prints the mean and standard error of each component per stage, and the paired difference of the two `--pair`
stages (GRPO - SFT by default) with its standard error (paired over the same prompts).

    python benchmarks/router_stages.py                 # ~10 min on 2 cores (3 models x ~90 prompts)
    python benchmarks/router_stages.py --limit 40 --stages sft grpo
    python benchmarks/router_stages.py --constrained --stages sft=A hot=B --pair sft hot --scores-cache runs/bench/stages.json
    python benchmarks/router_stages.py --routing --stages sft1 sft grpo   # + first-step KB accuracy, constrained
    python benchmarks/router_stages.py --routing --vary-kb-lists 1.0 --stages sft   # routing over other KB lists
    python benchmarks/router_stages.py --constrained --limit 30 --stages base sft grpo   # as the agent decodes
    python benchmarks/router_stages.py --routing --limit 1 --kb-names configs/kb/eval_cpu_renamed.yaml \
        --stages grpo names=runs/train/smollm2_router_sft_names   # first-step routing under other KB names
    python benchmarks/router_stages.py --routing --recipe configs/train/smollm2_router_grpo_onestage_lora_cpu.yaml \
        --stages base sft=runs/train/smollm2_router_sft_onestage grpo=runs/train/smollm2_router_grpo_onestage
    python benchmarks/router_stages.py --constrained --step-types answer --recipe \
        configs/train/smollm2_router_grpo3_lora_cpu.yaml --heldout runs/synth/annotation_250/steps_heldout.jsonl \
        --stages grpo reader=runs/train/smollm2_router_sft_reader --pair grpo reader   # answer steps, stop 46

A stage is a name of STAGES below or NAME=ADAPTER_DIR. The step types scored are the recipe's `step_types` (plan and
final where it names none); intermediate-answer steps are scored by the recipe's answer reward.

`--routing` adds, per stage, the share of held-out *first* plan steps whose KB is the gold one, per dataset, under
constrained greedy decoding with the stop branch removed (as `kbrouter demo | ask | run` decode the first step).
`--kb-names FILE` lists the KBs of those prompts under FILE's display names, matched by KB `name` to `--kb-from` (the
KB file the held-out records were rendered from), descriptions kept: how a router routes KBs named unlike its own.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "TRL_EXPERIMENTAL_SILENCE": "1"}.items():  # fmt: skip
    os.environ.setdefault(_k, _v)
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STAGES = {
    "base": None,
    "sft1": "runs/train/chain/sft",
    "sft1b": "runs/train/chain/sft_decisions",
    "sft1c": "runs/train/chain/sft_routing",
    "sft": "runs/train/chain/sft_video",
    "grpo": "models/smollm2-kbrouter",
}  # the stages of `bash scripts/train_chain.sh` (stop 47): sft1: stage 1 alone; sft1b: + decision-weighted; sft1c: +
# varied KB lists, routing records; sft: + 1d (short clip questions), where Step-GRPO starts; grpo: the shipped router


def parse_stage(arg: str) -> tuple[str, str | None]:
    """`sft` (a name of STAGES) or `sft=runs/train/x` (any adapter folder, relative to the repository root)."""
    name, sep, path = arg.partition("=")
    if sep:
        if not name or not path:
            raise argparse.ArgumentTypeError(f"stage {arg!r}: write NAME=ADAPTER_DIR, e.g. sft=runs/train/my_sft")
        return name, path
    if name not in STAGES:
        raise argparse.ArgumentTypeError(f"unknown stage {name!r}: one of {', '.join(STAGES)}, or NAME=ADAPTER_DIR")
    return name, STAGES[name]


def mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    m = sum(xs) / n
    var = sum((x - m) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return m, math.sqrt(var / n)


def generate(policy, rows, step_type: str, budget: int, constrained: bool) -> list[str]:
    """Greedy completions of `rows` (one step type): free with a stop string, or under each row's step grammar."""
    from agent.backends.base import SamplingParams
    from training.constrained_rollouts import row_grammar

    prompts = [list(p) for p in rows["prompt"]]
    if not constrained:
        stop = "</ret>" if step_type == "plan" else "</answer>"
        return [o.text for o in policy.generate(prompts, SamplingParams(max_new_tokens=budget, stop=(stop,)))]
    # the agent's first step must search (`kbrouter demo | ask | run` default to min_steps 1): no stop branch there
    grammars = [row_grammar(step_type, kbs, {step_type: budget}, allow_stop=i > 0)
                for kbs, i in zip(rows["kb_names"], rows["step_index"], strict=True)]  # fmt: skip
    texts: list[str] = [""] * len(prompts)
    for g in dict.fromkeys(grammars):  # one generate call per grammar (KB list), order kept
        idx = [i for i, x in enumerate(grammars) if x == g]
        outs = policy.generate([prompts[i] for i in idx], SamplingParams(max_new_tokens=budget, grammar=g))
        for i, o in zip(idx, outs, strict=True):
            texts[i] = o.text
    return texts


def score(policy, dataset, reward_funcs, weights, tokens: dict, step_types=("plan", "final"),
          constrained: bool = False) -> dict[str, list]:  # fmt: skip
    """Per-prompt reward components (None where a component does not apply) and the weighted total."""
    out: dict[str, list] = {f.__name__: [] for f in reward_funcs}
    out["reward"] = []
    columns = [c for c in dataset.column_names if c not in ("prompt", "completion")]
    for step_type in step_types:
        rows = dataset.filter(lambda r, t=step_type: r["step_type"] == t)
        if len(rows) == 0:
            continue
        texts = generate(policy, rows, step_type, tokens[step_type], constrained)
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        kwargs = {c: rows[c] for c in columns}
        scores = [f(completions, **kwargs) for f in reward_funcs]
        for f, s in zip(reward_funcs, scores, strict=True):
            out[f.__name__] += s
        for j in range(len(completions)):
            out["reward"].append(sum(w * s[j] for w, s in zip(weights, scores, strict=True) if s[j] is not None))
    return out


def first_step_routing(policy, records, budget: int) -> dict[str, tuple[int, int]]:
    """{dataset: (right, asked)} for the first plan step of each held-out trajectory, constrained and greedy."""
    from agent.backends.base import SamplingParams
    from agent.protocol import parse_plan, plan_grammar

    firsts = [r for r in records if r.step_type == "plan" and r.step_index == 0]
    out: dict[str, tuple[int, int]] = {}
    for kb_names in sorted({tuple(r.kb_names) for r in firsts}):
        group = [r for r in firsts if tuple(r.kb_names) == kb_names]
        grammar = plan_grammar(kb_names, budget, allow_stop=False).ebnf
        outs = policy.generate(
            [list(r.messages) for r in group], SamplingParams(max_new_tokens=budget, grammar=grammar)
        )
        for r, o in zip(group, outs, strict=True):
            name = r.metadata.get("dataset", "?")
            right, asked = out.get(name, (0, 0))
            out[name] = (right + int(parse_plan(o.text, kb_names).kb == r.gold["kb"]), asked + 1)
    return out


def print_paired(results: dict[str, dict[str, list]], keys: list[str], first: str, then: str) -> None:
    """`then` - `first` per component, paired over the prompts both scored, with its verdict against 2 s.e."""
    for k in keys:
        pairs = [(a, b) for a, b in zip(results[first][k], results[then][k], strict=True)
                 if a is not None and b is not None]  # fmt: skip
        m, se = mean_se([b - a for a, b in pairs])
        print(f"{then} - {first} {k:18s} {m:+.3f} ± {se:.3f} (paired, n={len(pairs)}): "
              f"{pair_verdict(first, then, m, se)}", flush=True)  # fmt: skip


def pair_verdict(first: str, then: str, m: float, se: float) -> str:
    """Which stage is ahead by more than 2 s.e., named in words: stops 47 and 48 each gave `--pair` in the other order
    and read a bare "does NOT beat" the wrong way round."""
    z = m / se if se else (0.0 if m == 0 else math.copysign(math.inf, m))
    if z > 2:
        return f"{then} above {first} by > 2 s.e. ({z:.1f})"
    if z < -2:
        return f"{first} above {then} by > 2 s.e. ({-z:.1f})"
    return f"neither is ahead by > 2 s.e. ({then} - {first} = {z:+.1f} s.e.)"


class ScoresCache:
    """Per-prompt scores of earlier runs, keyed by the adapter's file (path, size, mtime) and every scoring option."""

    OPTIONS = ("heldout", "recipe", "limit", "constrained", "vary_kb_lists", "kb_names", "kb_from")

    def __init__(self, path: Path | None) -> None:
        import json

        self.path = path
        self.data: dict = json.loads(path.read_text()) if path and path.is_file() else {}

    def key(self, adapter: str | None, args: argparse.Namespace, step_types: tuple) -> str:
        import json

        weights = REPO / adapter / "adapter_model.safetensors" if adapter else None
        stamp = [str(weights.resolve()), weights.stat().st_size, weights.stat().st_mtime_ns] if weights else None
        return json.dumps([stamp, list(step_types), *(getattr(args, k) for k in self.OPTIONS)])

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def __getitem__(self, key: str) -> dict:
        return self.data[key]

    def __setitem__(self, key: str, scores: dict) -> None:
        import json

        self.data[key] = scores
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heldout", default="runs/synth/annotation_cpu/steps_heldout.jsonl")
    ap.add_argument("--recipe", default="configs/train/smollm2_router_grpo_lora_cpu.yaml")
    stage_help = "a name of STAGES or NAME=ADAPTER_DIR; the two stages of --pair are compared paired"
    ap.add_argument("--stages", nargs="+", default=list(STAGES.items()), type=parse_stage, help=stage_help)
    ap.add_argument("--pair", nargs=2, default=["sft", "grpo"], metavar=("FIRST", "THEN"),
                    help="the two stages compared paired, THEN - FIRST (default: sft grpo)")  # fmt: skip
    ap.add_argument("--step-types", nargs="+", default=None, choices=["plan", "answer", "final"],
                    help="the step types scored (default: the recipe's `step_types`, else plan and final)")  # fmt: skip
    ap.add_argument("--limit", type=int, default=None, help="at most N prompts per step type")
    ap.add_argument("--routing", action="store_true", help="also first-step KB accuracy (constrained, see above)")
    ap.add_argument("--constrained", action="store_true",
                    help="decode every step under its grammar, as the agent does (the format component is then 1)")  # fmt: skip
    ap.add_argument("--vary-kb-lists", type=float, default=0.0, metavar="SHARE",
                    help="re-render SHARE of the routing prompts with a shuffled subset of the KB list (seed 123)")  # fmt: skip
    ap.add_argument("--kb-names", default=None, metavar="KB_YAML",
                    help="rename the routing prompts' KBs to this file's display names (matched by KB name)")  # fmt: skip
    ap.add_argument("--kb-from", default="configs/kb/eval_cpu.yaml", metavar="KB_YAML",
                    help="the KB file the held-out records were rendered from (for --kb-names)")  # fmt: skip
    ap.add_argument("--scores-cache", default=None, metavar="JSON",
                    help="reuse a stage's per-prompt scores from this file when its adapter and every scoring "
                         "option are unchanged (an SFT compared again with a new GRPO: ~5 min saved a stage)")  # fmt: skip
    args = ap.parse_args()

    from agent.backends.hf import TransformersPolicy
    from training.config import RewardSpec, read_recipe
    from training.rewards import build_reward
    from training.step_data import load_step_records
    from training.step_dataset import build_step_dataset

    recipe = read_recipe(REPO / args.recipe)  # the recipes' own dialect (`1e-4` a float), `base:` applied
    specs = [RewardSpec.from_dict(d) for d in recipe["rewards"]]
    funcs = [build_reward(s.name, **{**s.kwargs, "gate": True} if s.name != "format" else s.kwargs) for s in specs]
    weights = [s.weight for s in specs]
    step_types = tuple(args.step_types or recipe.get("step_types") or ("plan", "final"))
    records = [r for r in load_step_records(str(REPO / args.heldout), "steps") if r.step_type in step_types]
    if args.limit:
        kept, seen = [], {}
        for r in records:
            seen[r.step_type] = seen.get(r.step_type, 0) + 1
            if seen[r.step_type] <= args.limit:
                kept.append(r)
        records = kept
    grammar_tokens = recipe["grammar_tokens"]
    tokens = {t: grammar_tokens[t] for t in step_types}
    results: dict[str, dict[str, list]] = {}
    routing: dict[str, dict[str, tuple[int, int]]] = {}
    all_records = load_step_records(str(REPO / args.heldout), "steps")
    if args.vary_kb_lists:
        from training.kb_lists import vary_kb_lists

        all_records = vary_kb_lists(all_records, args.vary_kb_lists, min_kbs=2, seed=123)
    if args.kb_names:
        from training.kb_lists import kb_renames, renamed_kbs

        names = kb_renames(REPO / args.kb_from, REPO / args.kb_names)
        print(f"KB names: {names}", flush=True)
        all_records = [renamed_kbs(r, names) if r.step_type == "plan" else r for r in all_records]
    stages = dict(args.stages)
    keys = ["reward"] + [f.__name__ for f in funcs]
    cache = ScoresCache(REPO / args.scores_cache if args.scores_cache else None)
    for stage, adapter in stages.items():
        key = cache.key(adapter, args, step_types)
        policy = TransformersPolicy("smollm2", adapter=str(REPO / adapter) if adapter else None, max_batch_size=16)
        if key in cache:
            results[stage] = cache[key]
            print(f"[{stage}] scores reused from {args.scores_cache}", flush=True)
        else:
            ds = build_step_dataset(records, tokenizer=policy.tokenizer, max_prompt_tokens=recipe["max_prompt_tokens"],
                                    grammar_tokens=grammar_tokens)  # fmt: skip
            results[stage] = cache[key] = score(policy, ds, funcs, weights, tokens, step_types, args.constrained)
        done = "  ".join("{} {:.3f} ± {:.3f}".format(k, *mean_se([x for x in v if x is not None]))
                         for k, v in results[stage].items())  # fmt: skip
        print(f"[{stage}] {done}", flush=True)  # a stage's figures as soon as it is scored: a long run can be cut
        if args.routing:
            routing[stage] = first_step_routing(policy, all_records, grammar_tokens["plan"])
            right, asked = (sum(v[i] for v in routing[stage].values()) for i in (0, 1))
            print(f"[{stage}] first-step KB accuracy {right}/{asked}", flush=True)
        del policy
        if stage in args.pair and set(args.pair) <= set(results):
            print_paired(results, keys, *args.pair)  # printed once, as soon as both are scored
    counts = " + ".join(f"{sum(r.step_type == t for r in records)} {t}" for t in step_types)
    decoding = "constrained by the step grammars" if args.constrained else "unconstrained"
    print(f"held-out steps: {counts} prompts from {args.heldout} (greedy, {decoding})")
    print("stages: " + ", ".join(f"{k} = {v or 'base SmolLM2'}" for k, v in stages.items()))
    print(f"{'mean ± s.e.':24s}" + "".join(f"{s:>18s}" for s in stages))
    for k in keys:
        cells = []
        for stage in stages:
            m, se = mean_se([x for x in results[stage][k] if x is not None])
            cells.append(f"{m:8.3f} ± {se:5.3f}")
        print(f"{k:24s}" + "".join(f"{c:>18s}" for c in cells))

    if routing:
        print("first-step KB accuracy (constrained greedy, stop branch removed), right/asked per dataset:")
        names = sorted({d for r in routing.values() for d in r})
        print(f"{'dataset':24s}" + "".join(f"{s:>18s}" for s in routing))
        for d in [*names, "all"]:
            cells = []
            for r in routing.values():
                right, asked = (
                    (sum(v[0] for v in r.values()), sum(v[1] for v in r.values())) if d == "all" else r.get(d, (0, 0))
                )
                cells.append(f"{right}/{asked} ({right / max(asked, 1):.2f})")
            print(f"{d:24s}" + "".join(f"{c:>18s}" for c in cells))


if __name__ == "__main__":
    main()
