"""The README's commands work as printed on a fresh `make setup`: bare `kbrouter` is explained (it lives in
.venv/bin), every command it shows is a real subcommand whose shipped files exist, and the 16 GB multimodal example
sits next to the offline alias that works without the hub."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from kbrouter.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def code_lines(text: str) -> list[tuple[int, str]]:
    """(offset, line) of every line inside a fenced code block."""
    out, inside, offset = [], False, 0
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            inside = not inside
        elif inside:
            out.append((offset, line.rstrip("\n")))
        offset += len(line)
    return out


COMMAND_LINES = [(at, line) for at, line in code_lines(README) if line.startswith("kbrouter ")]


def test_bare_kbrouter_comes_after_the_line_that_puts_it_on_path():
    assert COMMAND_LINES, "the README shows no kbrouter command"
    first = COMMAND_LINES[0][0]
    activate = README.find("source .venv/bin/activate")
    assert 0 <= activate < first, "the first `kbrouter ...` command comes before `source .venv/bin/activate`"


def test_the_makefile_calls_kbrouter_by_its_venv_path():
    recipes = [line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("\t")]
    bare = [line for line in recipes if re.search(r"(^|[\s;&|])kbrouter\b", line.replace("$(BIN)/kbrouter", ""))]
    assert bare == []


def test_every_readme_command_is_a_subcommand_and_its_shipped_files_exist():
    for _, line in COMMAND_LINES:
        words = shlex.split(line.split("  #")[0].rstrip(" \\"))
        assert words[1] in COMMANDS, line
        for flag, value in zip(words, words[1:], strict=False):
            if flag in ("--kb", "--config", "--questions") and value.startswith(("configs/", "data/")):
                assert (ROOT / value).is_file(), f"{line}: {value} does not exist"


def test_the_hub_vl_example_has_the_offline_alias_beside_it():
    vl = [line for _, line in COMMAND_LINES if "--backend vl" in line and line.split()[1] == "ask"]
    models = {shlex.split(line)[shlex.split(line).index("--model") + 1] for line in vl}
    assert "tiny-qwen2.5-vl" in models and "Qwen/Qwen2.5-VL-7B-Instruct" in models
