"""One way to read a config file, used by `kbrouter synth`, `kbrouter eval`, `run`/`ask`/`demo` and the KB files.

- One YAML dialect (`yaml_loads`): `yaml.safe_load`, except that only `true`/`false` are booleans (`save_strategy:
  no` is the string "no") and `1e-4` is a float (PyYAML reads it as a string). Override values use it too.
- Overrides are `--a.b value` or `--a.b=value` (`parse_overrides`); dots reach nested mappings. The old eval form
  `a.b=value` is an error that gives the new form.
- Unknown top-level keys are an error naming the key, the file and the closest valid keys (`check_keys`).
- A file may start from another with `base: <file>` (`read_layered`; training recipes too): a variant names only
  what it changes.
- Paths written in the YAML resolve against the YAML file's folder (`resolve_path`); paths given as overrides are left
  as written, so they resolve against the working directory.
- A key added to a config after results were hashed leaves the old hash as it was while it has its old behaviour
  (`drop_new_at_default`, given one table of such keys per hash: `SynthConfig.result_hash`, `EvalConfig.fingerprint`).

Example::

    cfg = load_config_file(SynthConfig, "configs/synth/smollm2_cpu.yaml", ["--teacher.model", "/models/qwen"],
                           path_keys=("kb_config", "inputs.*.path"))
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

NEW_FORM = "`--key value`, dots for nested keys: e.g. `--agent.max_steps 2`"


class _Loader(yaml.SafeLoader):
    """`yaml.SafeLoader` with YAML 1.2 booleans (`true`/`false` only) and exponent floats without a dot (`1e-4`)."""


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def yaml_loads(text: str) -> Any:
    """Parse YAML text in the project's one dialect: `no`/`yes`/`on`/`off` stay strings, `1e-4` is a float."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def read_text(path: str | os.PathLike) -> str:
    """A text file's contents as UTF-8.

    Raises:
        ValueError: the file is not UTF-8; the message names `path:line` and the fix.
    """
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); save the file as UTF-8"
        ) from None


def load_yaml(path: str | os.PathLike, loader=yaml_loads):  # noqa: ANN001, ANN201 - any YAML value
    """Parse a YAML file (UTF-8) with `loader` (default: the project's dialect, `yaml_loads`).

    Raises:
        ValueError: not UTF-8, or a YAML syntax error; the message names `path:line:column` and the problem.
    """
    text = read_text(path)
    try:
        return loader(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = " ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
        raise ValueError(f"{where}: YAML syntax error: {problem}; fix the YAML there") from None


BASE_KEY = "base"


def read_layered(
    path: str | os.PathLike,
    what: str = "config",
    resolve: Callable[[dict, Path], dict] | None = None,
    _chain: tuple[Path, ...] = (),
) -> dict:
    """A config file's values with its `base:` chain applied: the values of the file it names, then its own on top.

    `base:` names another file of the same kind, relative to this file's folder (e.g. `base: annotation_cpu.yaml`) or
    absolute. A key of the file replaces the base's value whole (a mapping too); a key set to `null` drops the base's
    value, so the field's default applies. A base may have a base of its own. `resolve(values, folder)`, when given,
    turns each file's own values into what they mean from its own folder (relative paths) before they are merged.
    `what` names the kind of file in the messages (`recipe`, `config`).

    Raises:
        FileNotFoundError: the file, or a base it names, does not exist (the message names both files).
        ValueError: not a mapping, `base:` not a file name, or a chain of bases that returns to a file in it.
    """
    path = Path(path)
    if not path.is_file():
        if _chain:
            raise FileNotFoundError(f"{_chain[-1]}: base {what} not found: {path} (`{BASE_KEY}:` is relative to the "
                                    f"{what}'s folder)")  # fmt: skip
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist")
    values = load_yaml(path) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: this {what} must be a mapping of keys to values, got {type(values).__name__}")
    base = values.pop(BASE_KEY, None)
    here = path.resolve()
    if resolve is not None:
        values = resolve(values, here.parent)
    if base is None:
        return values
    if not isinstance(base, str) or not base.strip():
        raise ValueError(f"{path}: `{BASE_KEY}:` names another {what} file (e.g. `{BASE_KEY}: other.yaml`, relative "
                         f"to this {what}'s folder), got {base!r}")  # fmt: skip
    base_path = resolve_path(base, here.parent)
    if base_path.resolve() in (*_chain, here):
        cycle = " -> ".join(str(p) for p in (*_chain, here, base_path.resolve()))
        raise ValueError(f"{path}: `{BASE_KEY}: {base}` makes a cycle of {what}s ({cycle}); remove one `{BASE_KEY}:`")
    merged = read_layered(base_path, what, resolve, (*_chain, here))
    for key, value in values.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def resolve_path(value: str | os.PathLike, base: Path | None) -> Path:
    """`value` with `$VARS` and `~` expanded, joined to `base` when relative (and `base` is given)."""
    p = Path(os.path.expandvars(str(value))).expanduser()
    return base / p if base is not None and not p.is_absolute() else p


def parse_overrides(tokens: Sequence[str]) -> list[tuple[str, Any]]:
    """`--a.b value` / `--a.b=value` tokens as `(key, value)` pairs; values are parsed by `yaml_loads`.

    Raises:
        ValueError: an old-style `a.b=value` override (the message gives the new form), a stray word, or a key
            without a value.
    """
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            key, eq, raw = tok.partition("=")
            if eq and re.fullmatch(r"[A-Za-z_][\w.-]*", key):
                raise ValueError(f"override {tok!r} is the old `key=value` form; write `--{key} {raw}` ({NEW_FORM})")
            raise ValueError(f"unexpected argument {tok!r}; overrides look like {NEW_FORM}")
        key, eq, raw = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(tokens):
                raise ValueError(f"override --{key} has no value; overrides look like {NEW_FORM}")
            raw, i = tokens[i + 1], i + 1
        if not key or key.startswith(".") or key.endswith(".") or ".." in key:
            raise ValueError(f"override {tok!r} has no valid key; overrides look like {NEW_FORM}")
        out.append((key, yaml_loads(raw)))
        i += 1
    return out


def set_dotted(data: dict, key: str, value: Any) -> None:
    """Set `data[a][b] = value` for `key` "a.b", creating mappings on the way. A `-` in a part means `_` unless the
    mapping already has the part as written (`--num-shards 4` sets `num_shards`).

    Raises:
        ValueError: a part of the key holds something other than a mapping.
    """
    node = data
    parts = key.split(".")
    for depth, part in enumerate(parts):
        name = part if part in node else part.replace("-", "_")
        if depth == len(parts) - 1:
            node[name] = value
            return
        child = node.setdefault(name, {})
        if child is None:
            child = node[name] = {}
        if not isinstance(child, dict):
            raise ValueError(f"override --{key}: `{'.'.join(parts[: depth + 1])}` is {child!r}, not a mapping")
        node = child


def field_names(cls: type) -> list[str]:
    """The keys a config of dataclass `cls` may give (its `init` fields)."""
    return sorted(f.name for f in dataclasses.fields(cls) if f.init)


def check_keys(cls: type, values: dict, where: str, skip: Sequence[str] = ()) -> None:
    """Every key of `values` must be an `init` field of dataclass `cls` (leaving out `skip`).

    Raises:
        ValueError: an unknown key; the message names it, `where` (the file, or the section) and the closest keys.
    """
    valid = [k for k in field_names(cls) if k not in skip]
    for key in values:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=3)
            hint = f"; did you mean {close}?" if close else f"; valid keys: {valid}"
            raise ValueError(f"unknown key {key!r} in {where}{hint}")


@dataclasses.dataclass(frozen=True)
class Gate:
    """A new key's old-behaviour value that also turns off the keys `gated` (settings of what it switches off)."""

    value: object
    gated: tuple[str, ...]


def drop_new_at_default(data: dict, new_keys: Mapping[str, object]) -> dict:
    """`data` less each key of `new_keys` whose value equals its table value (the one that behaves as before the key
    existed), so a config hashed before the key was added hashes as it did. A `Gate` value drops its `gated` keys too
    (whatever their values); a key a gate has dropped is not checked again.

    Example:
        >>> table = {"prior": Gate(0, ("prior_size",)), "prior_size": 0, "focus": "head"}
        >>> drop_new_at_default({"prior": 0, "prior_size": 0.5, "focus": "all", "lr": 1}, table)
        {'focus': 'all', 'lr': 1}
        >>> drop_new_at_default({"prior": 10, "prior_size": 0, "focus": "head", "lr": 1}, table)
        {'prior': 10, 'lr': 1}

    Raises:
        KeyError: a key of `new_keys` is not in `data` (a renamed field the table still names).
    """
    out = dict(data)
    dropped: set[str] = set()
    for key, spec in new_keys.items():
        if key in dropped:
            continue
        value, gated = (spec.value, spec.gated) if isinstance(spec, Gate) else (spec, ())
        if out[key] == value:
            for k in (key, *gated):
                out.pop(k, None)
                dropped.add(k)
    return out


def _absolute(value: str, base: Path) -> str:
    p = resolve_path(value, None)
    return str(p if p.is_absolute() else (base / p).resolve())  # an absolute path is kept as written


def _resolve_keys(node: Any, parts: list[str], base: Path) -> Any:
    if not parts:
        if isinstance(node, str) and node:
            return _absolute(node, base)
        if isinstance(node, list):
            return [_absolute(v, base) if isinstance(v, str) and v else v for v in node]
        return node
    head, rest = parts[0], parts[1:]
    if head == "*" and isinstance(node, list):
        return [_resolve_keys(v, rest, base) for v in node]
    if isinstance(node, dict) and head in node:
        return {**node, head: _resolve_keys(node[head], rest, base)}
    return node


def read_config(
    cls: type,
    path: str | os.PathLike | None,
    overrides: Sequence[str] = (),
    *,
    values: Sequence[tuple[str, Any]] = (),
    path_keys: Sequence[str] = (),
    skip: Sequence[str] = (),
    what: str = "config",
) -> dict:
    """The checked keyword arguments of `cls` from a YAML file, `--a.b value` overrides and typed `(key, value)`
    pairs (applied last, e.g. from argparse flags).

    `path_keys` are dotted keys (`*` for every item of a list, e.g. `inputs.*.path`) whose YAML values are paths:
    they resolve against the YAML file's folder, before the overrides are applied.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: malformed YAML, not a mapping, a bad override or an unknown key (named, with the file).
    """
    data: dict = {}
    if path is not None:
        path = Path(path)

        def resolve(values: dict, folder: Path) -> dict:
            for key in path_keys:
                values = _resolve_keys(values, key.split("."), folder)
            return values

        data = read_layered(path, what, resolve)
    for key, value in [*parse_overrides(overrides), *values]:
        set_dotted(data, key, value)
    check_keys(cls, data, str(path) if path is not None else "the overrides", skip)
    return data


def load_config_file(cls: type, path: str | os.PathLike | None, overrides: Sequence[str] = (), **kwargs: Any) -> Any:
    """`cls(**read_config(cls, path, overrides, **kwargs))`; an invalid value's message is prefixed with the file.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: see `read_config`, or `cls` rejects a value.
    """
    data = read_config(cls, path, overrides, **kwargs)
    try:
        return cls(**data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path or 'overrides'}: {e}") from e
