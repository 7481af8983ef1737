"""Transparent huge pages for glibc's malloc: the `kbrouter` console script re-executes itself once with them on.

A CPU training step allocates and frees the same large activation tensors every step. glibc serves each from a fresh
`mmap` and returns it on free, so the kernel faults in and zeroes every 4 KiB page again: the bf16 SFT of stop 28
spent 1,380 of its 5,555 CPU seconds in the kernel (370 M minor page faults in 53 min). `glibc.malloc.hugetlb=1`
(glibc >= 2.35) makes malloc ask for transparent huge pages on those chunks (`madvise`), one fault per 2 MiB.
`python benchmarks/cpu_train_speed.py --sft_steps 8 --grpo_steps 3` (the budget recipes, 2 cores): SFT page faults
31.4 M -> 0.31 M, kernel time 136 -> 91 s, 27.3 -> 23.3 s a step (1.17x); Step-GRPO 98.8 -> 84.3 s a step (1.17x).
Generation hardly pays the cost: `kbrouter eval` of the shipped agent on the 15 video questions took 53.7 / 48.5 s
without and 52.4 / 46.8 s with it (two runs each), with the same predictions.

The tunable is read when the process starts, so it cannot be set from Python: the console script re-executes itself
(same PID, same argv) with it added to `GLIBC_TUNABLES`. Off with `KBROUTER_HUGEPAGES=0`; a `GLIBC_TUNABLES` that
already names `glibc.malloc.hugetlb` is left as it is (the user's value wins).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
OFF_ENV = "KBROUTER_HUGEPAGES"
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def tunables_with_hugepages(current: str) -> str | None:
    """`GLIBC_TUNABLES` with `glibc.malloc.hugetlb=1` appended; None when it already sets that tunable."""
    names = {item.split("=", 1)[0].strip() for item in current.split(":") if item.strip()}
    if TUNABLE in names:
        return None
    return f"{current}:{TUNABLE}=1" if current.strip() else f"{TUNABLE}=1"


def thp_mode(path: Path = THP_MODE_FILE) -> str:
    """The kernel's transparent-huge-page mode (`always`, `madvise` or `never`); '' where it cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else ""


def hugepage_env(env: Mapping[str, str], *, system: str, libc: str, thp: str) -> dict[str, str] | None:
    """The environment to re-execute with, or None to run as is (not Linux glibc, THP off, opted out, already set)."""
    if system != "Linux" or libc != "glibc" or thp not in {"always", "madvise"}:
        return None
    if env.get(OFF_ENV, "1").strip().lower() in {"0", "false", "no", "off"}:
        return None
    tunables = tunables_with_hugepages(env.get("GLIBC_TUNABLES", ""))
    if tunables is None:
        return None
    return {**env, "GLIBC_TUNABLES": tunables}


def reexec_with_hugepages() -> None:
    """Replace this process by the same command with huge pages on, where `hugepage_env` says so; else return."""
    new_env = hugepage_env(os.environ, system=platform.system(), libc=platform.libc_ver()[0], thp=thp_mode())
    argv = getattr(sys, "orig_argv", None)
    if new_env is None or not argv or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], new_env)
