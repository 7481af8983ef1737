"""Turn cached predictions into `results.json`, `report.md`, `predictions.jsonl` and PNG plots.

Everything here is computed from the cache records of the run's current datasets × methods, so a resumed run
writes the same report as an uninterrupted one (latency, a measurement, aside).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from agent.types import Trajectory
from eval.cache import cache_key
from eval.config import EvalConfig
from eval.datasets import LoadedDataset
from eval.methods import AGENT_METHODS, NON_RETRIEVING, ROUTING_METHODS
from eval.paired import paired_difference
from eval.scoring import macro_average, mean_scores, score_prediction, step_numbers
from retrievers.jsonl import dumps_line

logger = logging.getLogger(__name__)

QUALITY = (
    ("answer/f1_recall", "F1-R"),
    ("answer/em", "EM"),
    ("answer/token_f1", "F1"),
    ("answer/acc", "Acc"),
    ("retrieval/recall@k", "R@k"),
    ("routing/accuracy", "Route"),
)
COST = (
    ("cost/steps", "steps/q"),
    ("cost/searches", "searches/q"),
    ("cost/gen_tokens", "gen tok/q"),
    ("cost/latency_s", "latency s/q"),
    ("run/error", "errors"),
)
# the scoreboard: one table per dataset group and one macro-averaged over the groups
SCOREBOARD = (
    ("answer/f1_recall", "F1-R"),
    ("answer/em", "EM"),
    ("retrieval/recall@k", "R@k"),
    ("routing/step_accuracy", "Route/step"),
    ("format/valid_step_rate", "Valid steps"),
    ("cost/steps", "steps/q"),
    ("cost/searches", "searches/q"),
    ("cost/latency_s", "latency s/q"),
)
HIGHER_IS_BETTER = {k for k, _ in QUALITY} | {"routing/step_accuracy", "format/valid_step_rate"}
PERCENT = HIGHER_IS_BETTER | {"run/error"}


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}" if key in PERCENT else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def markdown_table(
    header: list[str],
    rows: list[list[str]],
    best: list[bool] | None = None,
    values: list[list[float | None]] | None = None,
) -> str:
    """A markdown table; where `best[j]`, the highest value of column j (from `values`) is bold."""
    rows = [list(r) for r in rows]
    if best and values:
        for j, is_best in enumerate(best):
            col = [v[j] for v in values if v[j] is not None]
            if is_best and col and min(col) < max(col):  # a column where all tie marks nothing
                top = max(col)
                for i, v in enumerate(values):
                    if v[j] is not None and abs(v[j] - top) < 1e-12:
                        rows[i][j + 1] = f"**{rows[i][j + 1]}**"
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


NO_KB = ("none", "format_error", "ended")  # routing-plot categories besides the KB names, drawn after them


def kb_choices(trajectories: list[Trajectory], max_steps: int) -> list[Counter]:
    """Per step index, how many trajectories searched each KB there (`none` = the plan stopped to answer,
    `format_error` = the plan was malformed, which also ends the trajectory, `ended` = the trajectory had no step
    there: it stopped earlier), so each step's counts add up to the trajectories. The one-shot router's decision
    not to search (`metadata.route`: `none` or `format_error`) is its step 1."""
    out = [Counter() for _ in range(max_steps)]
    for t in trajectories:
        for i in range(max_steps):
            s = t.steps[i] if i < len(t.steps) else None
            if s is None:
                route = t.metadata.get("route")
                out[i][route if i == 0 and route in ("none", "format_error") else "ended"] += 1
            else:
                out[i][s.kb if s.kb is not None else "format_error" if s.format_errors else "none"] += 1
    return out


def write_report(
    cfg: EvalConfig,
    loaded: list[LoadedDataset],
    methods: list[str],
    cache: dict[str, dict],
    kb_names: list[str],
    out_dir: Path,
    computed: int = 0,
) -> dict:
    """Score every (dataset, method, question), aggregate, and write the report files; returns the results."""
    base_of = {m: cfg.base_method(m) for m in methods}  # a variant scores as the built-in method it runs
    routing_methods = [m for m in methods if base_of[m] in ROUTING_METHODS]
    per_ds: dict[str, dict[str, dict]] = {}
    typed: dict[tuple[str, str, str], list[dict]] = {}  # (answer_type, dataset, method) -> per-question scores
    trajs: dict[tuple[str, str], list[Trajectory]] = {}
    predictions = []
    for ds in loaded:
        if ds.skipped:
            continue
        per_ds[ds.spec.name] = {}
        for m in methods:
            rows = []
            for q in ds.questions:
                rec = cache.get(cache_key(ds.spec.name, m, q.id))
                if rec is None:
                    continue
                scores = score_prediction(
                    rec,
                    kb_names,
                    routes=m in routing_methods,
                    retrieves=base_of[m] not in NON_RETRIEVING,
                    step_protocol=base_of[m] in AGENT_METHODS,
                    question=q,
                )
                rows.append(scores)
                if not rec.get("error"):
                    kind = str(q.metadata.get("answer_type") or "open")
                    typed.setdefault((kind, ds.spec.name, m), []).append(scores)
                traj = Trajectory.from_dict(rec["trajectory"])
                trajs.setdefault((ds.group, m), []).append(traj)
                predictions.append(
                    {
                        "dataset": ds.spec.name,
                        "method": m,
                        "qid": q.id,
                        "question": q.question,
                        "gold": list(q.answers or []),
                        "prediction": traj.final_answer,
                        "scores": scores,
                        "error": rec.get("error", ""),
                        "trajectory": rec["trajectory"],
                    }
                )
            per_ds[ds.spec.name][m] = mean_scores(rows)
    groups: dict[str, list[str]] = {}
    for ds in loaded:
        if not ds.skipped:
            groups.setdefault(ds.group, []).append(ds.spec.name)
    macro = {m: macro_average({d: per_ds[d][m] for d in per_ds}) for m in methods}
    by_group = {
        g: {m: macro_average({d: per_ds[d][m] for d in names}) for m in methods} for g, names in groups.items()
    }
    macro_groups = {m: macro_average({g: by_group[g][m] for g in groups}) for m in methods}
    steps_of = {m: 1 if base_of[m] == "router" else max(cfg.agent_config(m).max_steps, 1) for m in routing_methods}
    routing = {
        g: {m: [dict(c) for c in kb_choices(trajs.get((g, m), []), steps_of[m])] for m in routing_methods}
        for g in groups
    }
    results = {
        "name": cfg.name,
        "kbs": kb_names,
        "methods": methods,
        "routing_methods": routing_methods,
        "datasets": {
            ds.spec.name: {
                "group": ds.group,
                "n": len(ds.questions),
                "skipped": ds.skipped,
                "loader": ds.spec.loader,
                "split": ds.split,
                "qids": [q.id for q in ds.questions],
            }
            for ds in loaded
        },
        "per_dataset": per_ds,
        "per_group": by_group,
        "macro": macro,
        "macro_over_groups": macro_groups,
        "routing_by_step": routing,
        "by_answer_type": by_answer_type(typed, groups, methods),
        "paired": paired_against(
            cfg.plot_method, methods, predictions, {ds: g for g, names in groups.items() for ds in names}
        ),
        "config": {k: v for k, v in asdict(cfg).items() if k != "source_file"},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_text(out_dir / "results.json", json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    _write_text(out_dir / "predictions.jsonl", "".join(dumps_line(p, sort_keys=True) for p in predictions))
    plots = write_plots(results, groups, out_dir, cfg.plot_method)
    _write_text(out_dir / "report.md", render_markdown(results, loaded, groups, plots))
    logger.info("report written to %s (%d predictions computed this run)", out_dir / "report.md", computed)
    return results


PAIRED_METRIC = "answer/f1_recall"
ANSWER_TYPES = ("yesno", "open")


def by_answer_type(
    typed: dict[tuple[str, str, str], list[dict]], groups: dict[str, list[str]], methods: list[str]
) -> dict[str, dict[str, dict[str, float]]]:
    """`{answer_type: {method: {f1_recall, n}}}`: macro F1-recall (datasets -> groups -> mean, as the scoreboard)
    over the yes/no questions alone and over the open ones alone; a group with none of a type is left out of it."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in ANSWER_TYPES:
        for m in methods:
            rows = {d: typed.get((kind, d, m), []) for names in groups.values() for d in names}
            per_group = {g: macro_average({d: mean_scores(rows[d]) for d in names}) for g, names in groups.items()}
            macro = macro_average(per_group)  # a dataset or group with none of this type has no F1-R: left out
            if PAIRED_METRIC in macro:
                n = float(sum(len(r) for r in rows.values()))
                out.setdefault(kind, {})[m] = {"f1_recall": macro[PAIRED_METRIC], "n": n}
    return out


def paired_against(reference: str, methods: list[str], predictions: list[dict], group_of: dict[str, str]) -> dict:
    """Macro F1-recall of `reference` minus each other method, paired by question, with its bootstrap s.e.
    (`eval.paired`); empty when `reference` did not run."""
    scores: dict[str, dict[tuple[str, str], float]] = {}
    for p in predictions:
        if not p["error"] and PAIRED_METRIC in p["scores"]:
            scores.setdefault(p["method"], {})[(p["dataset"], p["qid"])] = float(p["scores"][PAIRED_METRIC])
    if reference not in methods or reference not in scores:
        return {}
    vs = {m: paired_difference(scores[reference], scores.get(m, {}), group_of) for m in methods if m != reference}
    return {"reference": reference, "metric": PAIRED_METRIC, "vs": {m: r for m, r in vs.items() if r is not None}}


def render_markdown(results: dict, loaded: list[LoadedDataset], groups: dict[str, list[str]], plots: list[str]) -> str:
    """The report: a macro-average table, one table per dataset group, a cost table, the plots."""
    methods, per_ds, macro = results["methods"], results["per_dataset"], results["macro"]
    out = [
        f"# Evaluation: {results['name']}",
        "",
        f"KBs: {', '.join(results['kbs'])}. Scores ×100; **bold** = best in the column. F1-R = F1-recall (the "
        "paper's metric), EM / F1 = SQuAD exact match / token F1, Acc = yes/no accuracy on yes/no sets and "
        "F1-recall = 1 elsewhere, R@k = gold evidence found among the retrieved hits, Route = share of a question's "
        "retrieval steps sent to the gold KB (0 if never looked up), Route/step = retrieval steps sent to the gold "
        "KB, pooled over steps, Valid steps = generated plan/answer/final outputs that parsed with no format error "
        "(the baselines: their tagged answer only; see `eval.scoring`). Errors = questions whose prediction failed "
        "(a backend or retrieval error): they are left out of every other figure and recomputed on the next run.",
        "",
    ]
    out += ["| dataset | group | loader | questions | questions from | status |", "|---|---|---|---:|---|---|"]
    for ds in loaded:
        out.append(
            f"| {ds.spec.name} | {ds.group} | {ds.spec.loader} | {len(ds.questions)} | "
            f"{ds.split or 'the whole file'} | {'skipped: ' + ds.skipped if ds.skipped else 'run'} |"
        )
    out += render_scoreboard(results, groups)
    names = list(per_ds)
    out += ["", "## Main table (macro average over datasets)", ""]
    keys = [("answer/f1_recall", d) for d in names]
    header = [
        "method",
        *[f"{d} F1-R" for d in names],
        "avg F1-R",
        "avg EM",
        "avg F1",
        "avg Acc",
        "avg R@k",
        "avg Route",
    ]
    summary = [
        "answer/f1_recall",
        "answer/em",
        "answer/token_f1",
        "answer/acc",
        "retrieval/recall@k",
        "routing/accuracy",
    ]
    values = [[per_ds[d][m].get(k) for k, d in keys] + [macro[m].get(k) for k in summary] for m in methods]
    rows = [[m, *[_fmt("answer/f1_recall", v) for v in vals]] for m, vals in zip(methods, values, strict=True)]
    out.append(markdown_table(header, rows, [True] * len(values[0]), values) if methods else "(no methods)")
    for group, ds_names in groups.items():
        out += ["", f"## {group}", ""]
        cols = [(d, k, label) for d in ds_names for k, label in QUALITY if any(k in per_ds[d][m] for m in methods)]
        header = ["method", *[f"{d} {label}" for d, _, label in cols]]
        values = [[per_ds[d][m].get(k) for d, k, _ in cols] for m in methods]
        rows = [
            [m, *[_fmt(k, v) for (_, k, _), v in zip(cols, vals, strict=True)]]
            for m, vals in zip(methods, values, strict=True)
        ]
        out.append(markdown_table(header, rows, [True] * len(cols), values))
    out += ["", "## Cost per question (macro average; latency = lockstep batch wall time ÷ batch size)", ""]
    values = [[macro[m].get(k) for k, _ in COST] for m in methods]
    rows = [
        [m, *[_fmt(k, v) for (k, _), v in zip(COST, vals, strict=True)]]
        for m, vals in zip(methods, values, strict=True)
    ]
    out.append(markdown_table(["method", *[label for _, label in COST]], rows))
    if plots:
        out += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    out += [
        "",
        "Per-question predictions with their trajectories: `predictions.jsonl`; all figures: `results.json`.",
        "",
    ]
    return "\n".join(out)


def render_scoreboard(results: dict, groups: dict[str, list[str]]) -> list[str]:
    """Markdown lines: the scoreboard (macro over groups, then each group) and routing accuracy at each step."""
    methods = results["methods"]
    tables = [("macro average over groups", results["macro_over_groups"])]
    tables += [
        (f"{g} ({', '.join(names)})", {m: results["per_group"][g][m] for m in methods}) for g, names in groups.items()
    ]
    out = [
        "",
        "## Scoreboard",
        "",
        "Each group is the macro average of its datasets; the first table averages the "
        "groups. Valid steps and Route/step are pooled over steps within a dataset, then averaged like the rest.",
    ]
    for title, figures in tables:
        values = [[figures[m].get(k) for k, _ in SCOREBOARD] for m in methods]
        rows = [
            [m, *[_fmt(k, v) for (k, _), v in zip(SCOREBOARD, vals, strict=True)]]
            for m, vals in zip(methods, values, strict=True)
        ]
        out += [
            "",
            f"### {title}",
            "",
            markdown_table(
                ["method", *[label for _, label in SCOREBOARD]],
                rows,
                [k in HIGHER_IS_BETTER for k, _ in SCOREBOARD],
                values,
            ),
        ]
    out += render_paired(results.get("paired") or {})
    out += render_answer_types(results.get("by_answer_type") or {}, methods)
    routing = results["routing_methods"]
    cols = [
        (g, i)
        for g in groups
        for i in step_numbers({k for m in routing for k in results["per_group"][g][m]}, "routing/accuracy@step")
    ]
    if routing and cols:
        out += [
            "",
            "### Routing accuracy at each step",
            "",
            "Of the questions that retrieved at step i, the share sent to the gold KB (per group).",
        ]
        values = [[results["per_group"][g][m].get(f"routing/accuracy@step{i}") for g, i in cols] for m in routing]
        rows = [
            [m, *[_fmt("routing/step_accuracy", v) for v in vals]] for m, vals in zip(routing, values, strict=True)
        ]
        out += ["", markdown_table(["method", *[f"{g} step {i}" for g, i in cols]], rows, [True] * len(cols), values)]
    return out


def render_answer_types(typed: dict, methods: list[str]) -> list[str]:
    """Markdown lines: macro F1-recall on the yes/no questions and on the open ones, each method (none if no types)."""
    kinds = [k for k in ANSWER_TYPES if typed.get(k)]
    if not kinds:
        return []
    values = [[typed[k].get(m, {}).get("f1_recall") for k in kinds] for m in methods]
    rows = [
        [
            m,
            *[
                f"{_fmt(PAIRED_METRIC, v)} ({int(typed[k].get(m, {}).get('n', 0))})"
                for k, v in zip(kinds, vals, strict=True)
            ],
        ]
        for m, vals in zip(methods, values, strict=True)
    ]
    labels = {"yesno": "yes/no F1-R (questions)", "open": "open F1-R (questions)"}
    return [
        "",
        "### F1-recall by answer type",
        "",
        "Macro as above, over the yes/no questions alone and over the open ones alone. On yes/no questions a constant "
        "earns the share of its word (`always_no`, `always_yes`); on open ones it earns nothing.",
        "",
        markdown_table(["method", *[labels[k] for k in kinds]], rows, [True] * len(kinds), values),
    ]


def render_paired(paired: dict) -> list[str]:
    """Markdown lines: the reference method minus each other one, with its standard error (none without runs)."""
    if not paired.get("vs"):
        return []
    ref = paired["reference"]
    rows = [
        [m, f"{100 * r['diff']:+.1f}", f"{100 * r['se']:.1f}", f"{r['diff'] / r['se']:+.2f}" if r["se"] else "–",
         str(r["n"])]
        for m, r in paired["vs"].items()
    ]  # fmt: skip
    return [
        "",
        f"### Paired difference: {ref} − each method (macro F1-R)",
        "",
        "Over the questions both answered, macro as above; s.e. = bootstrap over questions resampled within each "
        "dataset (2,000 draws). A difference under 2 s.e. is within the noise of a scoreboard this size. Any two "
        "methods: `python scripts/paired_bootstrap.py <output_dir> A B`.",
        "",
        "| method | difference ×100 | s.e. | difference / s.e. | questions |",
        "|---|---:|---:|---:|---:|",
        *["| " + " | ".join(r) + " |" for r in rows],
    ]


def write_plots(results: dict, groups: dict[str, list[str]], out_dir: Path, plot_method: str) -> list[str]:
    """KB chosen per step per group (the paper's fig. 3), steps per question, accuracy vs retrievals."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed; no plots (pip install matplotlib)")
        return []
    macro = results["macro"]
    methods = [m for m in results["methods"] if "answer/f1_recall" in macro[m]]  # methods with predictions
    written = []
    routing = results["routing_by_step"]
    # one row per method that routes (the agent variants, the agent, the router), `plot_method` first
    shown = sorted((m for m in results["routing_methods"] if m in methods), key=lambda m: m != plot_method)
    if shown and groups:
        written.append(plot_routing(plt, routing, shown, list(groups), out_dir / "routing_by_step.png"))
    if methods and groups:
        fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(methods) * max(1, len(groups)) / 2), 3.8))
        width = 0.8 / len(groups)
        for gi, group in enumerate(groups):
            vals = [results["per_group"][group][m].get("cost/steps", 0.0) for m in methods]
            ax.bar([i + gi * width for i in range(len(methods))], vals, width, label=group)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(methods))])
        ax.set_xticklabels(methods, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("retrieval steps / question")
        ax.set_title("Steps per question, by method and dataset group")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "steps_per_question.png", dpi=110)
        plt.close(fig)
        written.append("steps_per_question.png")
        fig, ax = plt.subplots(figsize=(6, 4.2))
        points: dict[tuple[float, float], list[str]] = {}
        for m in methods:
            xy = (macro[m].get("cost/searches", 0.0), 100 * macro[m].get("answer/f1_recall", 0.0))
            points.setdefault((round(xy[0], 2), round(xy[1], 1)), []).append(m)
        for i, ((x, y), names) in enumerate(points.items()):
            ax.scatter([x], [y], s=40)
            # one label per point (methods that tie share it), staggered so neighbouring labels stay readable
            ax.annotate(", ".join(names), (x, y), fontsize=7, xytext=(4, 4 - 9 * (i % 3)), textcoords="offset points")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("KB searches / question (macro average)")
        ax.set_ylabel("F1-recall ×100 (macro average)")
        ax.set_title("Accuracy vs number of retrievals")
        fig.tight_layout()
        fig.savefig(out_dir / "accuracy_vs_retrievals.png", dpi=110)
        plt.close(fig)
        written.append("accuracy_vs_retrievals.png")
    return written


def plot_routing(plt, routing: dict, methods: list[str], groups: list[str], path: Path) -> str:  # noqa: ANN001
    """A grid of stacked bars, a row per method and a column per group: the share of questions whose step i
    searched each KB, stopped (`none`), was malformed (`format_error`, its own colour) or did not happen (`ended`)."""
    fig, axes = plt.subplots(
        len(methods),
        len(groups),
        figsize=(3.4 * len(groups) + 1.6, 2.5 * len(methods) + 0.8),
        squeeze=False,
        sharey=True,
    )
    kbs = sorted({kb for g in groups for m in methods for step in routing[g].get(m, []) for kb in step} - set(NO_KB))
    colors = {kb: plt.cm.tab10(i % 10) for i, kb in enumerate(kbs)}
    colors.update({"none": "0.65", "format_error": "crimson", "ended": "0.93"})
    for r, method in enumerate(methods):
        for c, group in enumerate(groups):
            ax = axes[r][c]
            steps = routing[group].get(method, [])
            n = sum(steps[0].values()) if steps else 0
            bottom = [0.0] * len(steps)
            for kb in [*kbs, *NO_KB]:
                vals = [100 * s.get(kb, 0) / max(n, 1) for s in steps]
                ax.bar(
                    range(1, len(steps) + 1),
                    vals,
                    bottom=bottom,
                    label=kb,
                    color=colors[kb],
                    edgecolor="0.5",
                    linewidth=0.3,
                )
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
            ax.set_xticks(range(1, len(steps) + 1))
            ax.set_title(f"{method} · {group} ({n} q)", fontsize=8)
            if c == 0:
                ax.set_ylabel("% of questions", fontsize=8)
            if r == len(methods) - 1:
                ax.set_xlabel("step", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in [*kbs, *NO_KB]]
    fig.legend(handles, [*kbs, *NO_KB], loc="center right", fontsize=7)
    fig.suptitle(
        "KB chosen at each step, per method; none = stopped to answer, format_error = malformed plan, "
        "ended = no such step",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1 - 1.4 / (3.4 * len(groups) + 1.6), 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name
