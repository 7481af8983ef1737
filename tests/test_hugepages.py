"""Huge pages for malloc: the console script re-executes itself once with `glibc.malloc.hugetlb=1`, never twice,
and leaves the user's own `GLIBC_TUNABLES` choice and `KBROUTER_HUGEPAGES=0` alone."""

import os
import platform
import subprocess
import sys

import pytest

from kbrouter.hugepages import hugepage_env, thp_mode, tunables_with_hugepages

LINUX = {"system": "Linux", "libc": "glibc", "thp": "madvise"}


@pytest.mark.parametrize(
    "current,expected",
    [
        ("", "glibc.malloc.hugetlb=1"),
        ("glibc.malloc.arena_max=2", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
        ("glibc.malloc.hugetlb=0", None),  # the user's value wins
        ("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", None),  # already on: no second re-exec
    ],
)
def test_tunables_with_hugepages(current, expected):
    assert tunables_with_hugepages(current) == expected


def test_hugepage_env_adds_the_tunable_and_keeps_the_rest():
    env = hugepage_env({"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, **LINUX)
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}


@pytest.mark.parametrize(
    "env,where",
    [
        ({"KBROUTER_HUGEPAGES": "0"}, LINUX),
        ({"KBROUTER_HUGEPAGES": "off"}, LINUX),
        ({}, {**LINUX, "thp": "never"}),
        ({}, {**LINUX, "thp": ""}),  # no THP file (a container without /sys, another kernel)
        ({}, {**LINUX, "libc": ""}),  # musl: no glibc tunables
        ({}, {**LINUX, "system": "Darwin"}),
    ],
)
def test_hugepage_env_runs_as_is(env, where):
    assert hugepage_env(env, **where) is None


def test_thp_mode_reads_the_bracketed_mode(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert thp_mode(f) == "madvise"
    assert thp_mode(tmp_path / "missing") == ""


APPLIES = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" and thp_mode() in {"always", "madvise"}
SCRIPT = (
    "import os, sys\n"
    "print('TUNABLES=' + os.environ.get('GLIBC_TUNABLES', ''), flush=True)\n"
    "sys.argv = ['kbrouter', 'synth-merge', '--help']\n"
    "from kbrouter.cli import main\n"
    "main()\n"
)


@pytest.mark.skipif(not APPLIES, reason="huge pages for malloc need Linux, glibc and transparent huge pages on")
@pytest.mark.parametrize("off", [False, True])
def test_console_run_reexecutes_once_with_huge_pages(off):
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["KBROUTER_HUGEPAGES"] = "0" if off else "1"
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = [line for line in out.stdout.splitlines() if line.startswith("TUNABLES=")]
    assert seen == (["TUNABLES="] if off else ["TUNABLES=", "TUNABLES=glibc.malloc.hugetlb=1"])
    assert "usage" in out.stdout.lower()
