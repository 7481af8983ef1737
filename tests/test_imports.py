"""Imports flow one way: retrievers <- agent <- training | eval | data_synthesis; ingest uses retrievers only.

Every module of every package is parsed with `ast` and each of its imports (lazy ones inside functions too) is checked
against the order. Nothing imports `training`; `eval` and `data_synthesis` do not import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> the packages of ours it may import (besides itself)
ALLOWED = {
    "retrievers": set(),
    "agent": {"retrievers"},
    "ingest": {"retrievers"},
    "data_synthesis": {"agent", "retrievers"},
    "eval": {"agent", "retrievers"},
    "training": {"agent", "retrievers"},
    "kbrouter": {"agent", "retrievers", "ingest", "data_synthesis", "eval", "training"},  # the console script
}


def imported_modules(source: str) -> list[tuple[int, str]]:
    """`(line, module)` of every absolute import in `source`, at any depth (function-level imports included)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def rule_breaks(package: str, rel_path: str, source: str) -> list[str]:
    """The imports of one module of `package` that go against the order, as `path:line imports module`."""
    return [
        f"{rel_path}:{line} imports {module}"
        for line, module in imported_modules(source)
        if (top := module.split(".")[0]) in ALLOWED and top != package and top not in ALLOWED[package]
    ]


def test_the_rule_catches_an_upward_import_even_inside_a_function():
    src = "import json\nfrom agent.types import Step\n\ndef f():\n    from eval.metrics import f1_recall\n"
    assert rule_breaks("data_synthesis", "data_synthesis/x.py", src) == ["data_synthesis/x.py:5 imports eval.metrics"]
    assert rule_breaks("retrievers", "retrievers/x.py", "import agent.loop\n") == [
        "retrievers/x.py:1 imports agent.loop"
    ]
    assert rule_breaks("eval", "eval/x.py", src) == []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_is_below_it(package: str):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no modules under {package}/"
    breaks = [
        b for p in files for b in rule_breaks(package, p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8"))
    ]
    assert not breaks, f"{package} may import only {sorted(ALLOWED[package]) or 'nothing of ours'}: " + "; ".join(
        breaks
    )


def module_edges(package: str) -> dict[str, set[str]]:
    """`module -> modules of the same package it imports` (lazy and `TYPE_CHECKING` imports too); `from a import b`
    counts as importing `a.b` when that is a module."""
    names = {}
    for p in sorted((ROOT / package).rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p

    def module_of(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in names}
    for m, p in names.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            edges[m] |= {t for t in map(module_of, targets) if t is not None and t != m}
    return edges


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a loop (strongly connected, size > 1)."""
    reach = {m: set() for m in edges}
    for m in edges:  # the packages are small: a search from every module is fast enough
        todo = list(edges[m])
        while todo:
            n = todo.pop()
            if n not in reach[m]:
                reach[m].add(n)
                todo += edges[n]
    groups = {frozenset({m} | {n for n in reach[m] if m in reach[n]}) for m in edges}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def test_import_cycles_are_found_through_lazy_imports():
    edges = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}, "p.e": set()}
    assert import_cycles(edges) == [["p.a", "p.b", "p.c"]]
    assert import_cycles({"p.a": {"p.b"}, "p.b": set()}) == []


@pytest.mark.parametrize("package", ["retrievers", "agent", "data_synthesis", "eval", "training", "ingest"])
def test_package_has_no_import_cycle(package: str):
    cycles = import_cycles(module_edges(package))
    assert not cycles, f"{package}: modules that import each other (lazy imports included): {cycles}"
