"""Issue 12's before/after counts, from the source with `ast`: code outside the one owner that still does the owner's job.

- JSONL reads: `json.loads(...)` of a line (an argument whose source names a line) outside `retrievers/jsonl.py`.
- JSONL writes: `json.dumps(...) + "\\n"` outside `retrievers/jsonl.py`.
- YAML parses: `yaml.safe_load` / `yaml.load` / `yaml.full_load` calls outside `retrievers/config_file.py` (the one
  YAML dialect); and the config loaders: the functions that call its `load_config_file` / `read_config` / `load_yaml`.
- Import cycles: groups of modules of one package that import each other (lazy imports too), as
  `tests/test_imports.py` finds them.

    python scripts/one_way_counts.py          # prints every site, then the counts
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.test_imports import import_cycles, module_edges  # noqa: E402 - after the path insert

PACKAGES = ["retrievers", "agent", "ingest", "data_synthesis", "eval", "training", "kbrouter"]
YAML_CALLS = {"safe_load", "load", "full_load"}
LOADER_CALLS = {"load_config_file", "load_yaml", "read_config"}


def call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def sites(path: Path, source: str) -> dict[str, list[str]]:
    rel = path.relative_to(ROOT).as_posix()
    out: dict[str, list[str]] = {"jsonl_read": [], "jsonl_write": [], "yaml_parse": [], "config_loader": []}
    tree = ast.parse(source)
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and rel != "retrievers/config_file.py":
            if any(isinstance(n, ast.Call) and call_name(n) in LOADER_CALLS for n in ast.walk(fn)):
                out["config_loader"].append(f"{rel}:{fn.lineno} {fn.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and call_name(node) == "loads" and node.args:
            if "line" in ast.get_source_segment(source, node.args[0]).lower() and rel != "retrievers/jsonl.py":
                out["jsonl_read"].append(f"{rel}:{node.lineno}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Call):
            is_newline = isinstance(node.right, ast.Constant) and node.right.value == "\n"
            pretty = any(k.arg == "indent" for k in node.left.keywords)  # a JSON file, not JSON lines
            if call_name(node.left) == "dumps" and is_newline and not pretty and rel != "retrievers/jsonl.py":
                out["jsonl_write"].append(f"{rel}:{node.lineno}")
        if isinstance(node, ast.Call) and call_name(node) in YAML_CALLS and rel != "retrievers/config_file.py":
            if "yaml" in ast.get_source_segment(source, node.func):
                out["yaml_parse"].append(f"{rel}:{node.lineno}")
    return out


def main() -> int:
    found: dict[str, list[str]] = {"jsonl_read": [], "jsonl_write": [], "yaml_parse": [], "config_loader": []}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for kind, where in sites(path, path.read_text(encoding="utf-8")).items():
                found[kind] += where
    cycles = [c for p in PACKAGES for c in import_cycles(module_edges(p))]
    for kind, where in found.items():
        print(f"{kind}: {', '.join(where) or '-'}")  # noqa: T201 (CLI output)
    print(f"import cycles: {cycles or '-'}")  # noqa: T201
    print(  # noqa: T201
        f"\ncounts: JSONL reads outside the reader {len(found['jsonl_read'])}, JSONL writes outside the writer "
        f"{len(found['jsonl_write'])}, YAML parses outside the dialect {len(found['yaml_parse'])}, config loaders through it "
        f"{len(found['config_loader'])}, import cycles {len(cycles)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
