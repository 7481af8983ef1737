"""Step-by-step display of trajectories in the terminal (rich)."""

from __future__ import annotations

from agent.metrics import normalize_answer
from agent.protocol.evidence import focused_text
from agent.types import Trajectory
from retrievers.provenance import provenance_label


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


class StepPrinter:
    """An `on_event` callback that prints each step as it happens (interactive mode)."""

    def __init__(self, console=None, hits_shown: int = 3, show_id: bool = False) -> None:  # noqa: ANN001
        from rich.console import Console

        self.console = console or Console()
        self.hits_shown = hits_shown
        self.show_id = show_id  # prefix lines with the question id when a batch's steps interleave

    def __call__(self, qid: str, event: str, payload: dict) -> None:
        c = self.console
        if self.show_id:
            c.print(f"[bold blue]\\[{qid}][/bold blue]", end=" ")
        if event == "plan":
            step = payload["step"] + 1
            if payload["errors"]:
                c.print(f"[red]step {step} plan: format error {payload['errors']}[/red]")
                return
            c.print(f"[bold cyan]step {step}[/bold cyan] [dim]think:[/dim] {_short(payload['think'] or '')}")
            if payload["sub_question"] is None:
                c.print("  [green]enough to answer: no more retrieval[/green]")
            else:
                route = payload.get("route") or {}
                moved = (
                    f" [dim](the route prior moved it from {route['policy_kb']})[/dim]"
                    if route.get("policy_kb", route.get("kb")) != route.get("kb")
                    else ""
                )
                c.print(
                    f"  [bold]sub-question:[/bold] {payload['sub_question']}  [magenta]→ {payload['kb']}[/magenta]{moved}"
                )
        elif event == "evidence":
            query, mode, chars = payload.get("sub_question"), payload.get("focus", "head"), payload.get("chars", 0)
            for i, h in enumerate(payload["hits"][: self.hits_shown]):
                source = provenance_label(h.doc.metadata)  # shown first: the 140-character cut never hides it
                where = f" \\[{source}]" if source else ""  # `\[`: a literal bracket, not rich markup
                text, width = h.doc.text, 140
                focused = focused_text(text, h.doc.modality, chars, query, mode)  # the rows the reader was shown
                if focused is not None:
                    text, width = focused, chars + len(h.doc.title) + 2
                c.print(
                    f"    [dim]{h.kb}-{i} ({h.score:.3f}){where}:[/dim] {_short(h.doc.title + ': ' + text, width)}"
                )
        elif event == "answer":
            err = f" [red]{payload['errors']}[/red]" if payload["errors"] else ""
            c.print(f"  [bold]intermediate answer:[/bold] {payload['answer']}{err}{vote_note(payload.get('votes'))}")
        elif event == "final":
            # a reused answer (agent.reuse_answer): the only search asked the question itself
            source = f"step {payload['from_step'] + 1}'s answer, " if "from_step" in payload else ""
            c.print(
                f"[bold green]final answer:[/bold green] {payload['answer']}  "
                f"[dim]({source}{payload['stop_reason']})[/dim]{vote_note(payload.get('votes'))}"
            )


def vote_note(votes: dict | None) -> str:
    """For a step that voted (`agent.answer_samples`): how many of its answers wrote the kept one, once normalised."""
    if not votes:
        return ""
    kept = normalize_answer(votes["answers"][votes["kept"]])
    same = sum(a is not None and normalize_answer(a) == kept for a in votes["answers"])
    return f" [dim]({same} of {len(votes['answers'])} answers agree)[/dim]"


def print_trajectory(traj: Trajectory, console=None) -> None:  # noqa: ANN001
    """Replay a finished trajectory through the same step display."""
    from rich.console import Console
    from rich.rule import Rule

    console = console or Console()
    printer = StepPrinter(console)
    console.print(Rule(f"[bold]{traj.id}[/bold]: {traj.question}"))
    for s in traj.steps:
        printer(
            traj.id,
            "plan",
            {
                "step": s.index,
                "think": s.think,
                "sub_question": s.sub_question,
                "kb": s.kb,
                "errors": list(s.format_errors) if s.sub_question is None else [],
            },
        )
        if s.sub_question is not None:
            printer(traj.id, "evidence", {"hits": list(s.hits)})
            printer(traj.id, "answer", {"answer": s.answer, "errors": list(s.format_errors), "votes": s.votes})
    reused = {"from_step": traj.metadata["final_from_step"]} if "final_from_step" in traj.metadata else {}
    voted = {"votes": traj.metadata["final_votes"]} if "final_votes" in traj.metadata else {}
    printer(traj.id, "final", {"answer": traj.final_answer, "stop_reason": traj.stop_reason, **reused, **voted})
    if traj.gold:
        console.print(f"[dim]gold: {list(traj.gold)}[/dim]")


def print_summary(trajectories: list[Trajectory], console=None) -> None:  # noqa: ANN001
    """One row per trajectory: final answer, gold, steps, KBs used, stop reason."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="trajectories")
    for col in ("id", "final answer", "gold", "steps", "KBs", "stop"):
        table.add_column(col)
    for t in trajectories:
        kbs = " → ".join(s.kb for s in t.steps if s.kb) or "-"
        table.add_row(
            t.id,
            _short(t.final_answer, 40),
            _short(", ".join(t.gold or ()), 30),
            str(len(t.steps)),
            kbs,
            t.stop_reason,
        )
    (console or Console()).print(table)
