"""One ingest run: walk the inputs, parse what changed, keep what did not, drop what was deleted.

State lives in the corpus folder: `ingest.json` (settings, and per file its sha256, outcome and parse file) and
`parsed/<key>.json` (the `Parsed` of each file). A file is re-parsed only when its content hash changed (or with
`force`); the records of a file that is gone are removed. A parse is written under a temporary name and renamed, and
a file's figures go to a private folder that is swapped in only when its parse succeeded, so a crash or a skip never
leaves partial records.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ingest.docling_parser import DOCLING_SUFFIXES, docling_python, parse_docling
from ingest.media import IMAGE_SUFFIXES, VIDEO_SUFFIXES, parse_image, parse_video
from ingest.office import parse_delimited, parse_docx, parse_xlsx
from ingest.pdf import parse_pdf
from ingest.units import Limits, Parsed, Skip
from ingest.web import parse_html, parse_markdown
from retrievers.integrity import sha256_file

logger = logging.getLogger(__name__)

STATE_FILE = "ingest.json"
PARSED_DIR = "parsed"
FIGURES_DIR = "figures"
STATE_VERSION = 1
PARSER_VERSION = 2  # raise when a parser's output changes: every file is then re-parsed once


@dataclass(frozen=True)
class Settings:
    """What the records depend on besides the files' bytes; another value needs `--force` (a full re-parse)."""

    limits: Limits = field(default_factory=Limits)
    password: bool = False  # whether one was given (the password itself is never stored)
    exclude: tuple[str, ...] = ()
    parser: str = "builtin"  # builtin | docling (DOCX, HTML, PDF through docling's own env; the rest builtin)

    def __post_init__(self) -> None:
        if self.parser not in PARSER_CHOICES:
            raise ValueError(f"--parser must be one of {', '.join(PARSER_CHOICES)}, got {self.parser!r}")

    def to_dict(self) -> dict:
        return {
            "limits": asdict(self.limits), "password": self.password, "exclude": list(self.exclude),
            "parser": self.parser,
        }  # fmt: skip


PARSER_CHOICES = ("builtin", "docling")


@dataclass
class FileOutcome:
    """What happened to one file in this run."""

    file: str
    status: str  # parsed | reused | skipped
    reason: str = ""
    message: str = ""
    seconds: float = 0.0
    parsed: Parsed | None = None


# suffix -> parser(path, file, figure_dir, figure_prefix, corpus_dir, limits, password)
ParseFn = Callable[[Path, str, Path, str, Path, Limits, str], Parsed]
PARSERS: dict[str, ParseFn] = {
    ".pdf": lambda p, f, fd, fp, cd, lim, pw: parse_pdf(p, f, fd, fp, lim, pw),
    ".html": lambda p, f, fd, fp, cd, lim, pw: parse_html(p, f, fd, fp),
    ".htm": lambda p, f, fd, fp, cd, lim, pw: parse_html(p, f, fd, fp),
    ".md": lambda p, f, fd, fp, cd, lim, pw: parse_markdown(p, f, fd, fp),
    ".markdown": lambda p, f, fd, fp, cd, lim, pw: parse_markdown(p, f, fd, fp),
    ".docx": lambda p, f, fd, fp, cd, lim, pw: parse_docx(p, f, fd, fp),
    ".xlsx": lambda p, f, fd, fp, cd, lim, pw: parse_xlsx(p, f, lim),
    ".xlsm": lambda p, f, fd, fp, cd, lim, pw: parse_xlsx(p, f, lim),
    ".csv": lambda p, f, fd, fp, cd, lim, pw: parse_delimited(p, f, lim),
    ".tsv": lambda p, f, fd, fp, cd, lim, pw: parse_delimited(p, f, lim),
    **{s: (lambda p, f, fd, fp, cd, lim, pw: parse_image(p, f, cd)) for s in IMAGE_SUFFIXES},
    **{s: (lambda p, f, fd, fp, cd, lim, pw: parse_video(p, f)) for s in VIDEO_SUFFIXES},
}
SIDECAR_SUFFIXES = (".txt", ".srt", ".vtt")  # read with the image or video they describe, not on their own


def walk(
    paths: list[str | Path], exclude: tuple[str, ...] = (), skip_dir: Path | None = None
) -> list[tuple[Path, str]]:
    """`(path, name)` of every file under `paths`, in a stable order; `name` is relative to the folder given.

    Hidden files and folders, files matching an `exclude` glob (on the name or the relative path) and anything under
    `skip_dir` (the corpus folder itself) are left out.

    Raises:
        FileNotFoundError: a path does not exist (checked for all before any work).
        ValueError: two inputs give the same relative name.
    """
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(
            f"kbrouter ingest: no such file or folder: {', '.join(repr(m) for m in missing)}; check the path"
        )
    out: dict[str, Path] = {}
    skip = skip_dir.resolve() if skip_dir is not None else None
    for given in map(Path, paths):
        if given.is_file():
            found = [(given, given.name)]
        else:
            found = []
            for p in sorted(given.rglob("*")):
                rel = p.relative_to(given)
                if any(part.startswith(".") for part in rel.parts) or not p.is_file():
                    continue
                if skip is not None and p.resolve().is_relative_to(skip):
                    continue
                found.append((p, rel.as_posix()))
        for p, name in found:
            if any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(p.name, g) for g in exclude):
                continue
            if name in out and out[name].resolve() != p.resolve():
                raise ValueError(f"two inputs are both named {name!r} ({out[name]} and {p}); ingest them separately")
            out[name] = p
    return [(p, name) for name, p in sorted(out.items())]


def file_key(name: str) -> str:
    """A file-system-safe, collision-free key for a file name."""
    return re.sub(r"[^\w.-]", "_", name)[:80] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]


def read_state(corpus_dir: Path) -> dict | None:
    """The state of an earlier run, or None. Raises ValueError when the file is not ingest state."""
    path = corpus_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e}); delete the folder {str(corpus_dir)!r} to start over") from e
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"{path}: not kbrouter ingest state; delete the folder {str(corpus_dir)!r} to start over")
    return state


def check_settings(state: dict | None, settings: Settings, force: bool, corpus_dir: Path) -> None:
    """Refuse to mix records made with other settings into one KB set, unless `force`."""
    if state is None or force:
        return
    old, new = {"parser": "builtin", **state.get("settings", {})}, settings.to_dict()  # no key: made before --parser
    diffs = [f"{k}: was {old.get(k)!r}, now {new[k]!r}" for k in new if old.get(k) != new[k]]
    if diffs:
        raise ValueError(
            f"{corpus_dir} was ingested with other settings ({'; '.join(diffs)}); rerun with the same flags, "
            "or add --force to re-parse every file with the new ones"
        )


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(path)


def parse_one(path: Path, name: str, corpus_dir: Path, settings: Settings, password: str) -> FileOutcome:
    """Parse one file into `parsed/<key>.json` (and its figures), or skip it with a named reason."""
    start = time.monotonic()
    size = path.stat().st_size
    suffix = path.suffix.lower()
    if suffix not in PARSERS:
        return FileOutcome(name, "skipped", "unsupported type", f"no reader for {suffix or 'files without a suffix'}")
    if size == 0:
        return FileOutcome(name, "skipped", "empty", "zero-byte file")
    limit = settings.limits.max_bytes
    if size > limit:
        return FileOutcome(
            name, "skipped", "over size limit", f"{size / 2**20:,.0f} MiB > --max-mb {limit / 2**20:,.0f}"
        )
    key = file_key(name)
    final_figures = corpus_dir / FIGURES_DIR / key
    tmp_figures = corpus_dir / FIGURES_DIR / f"{key}.tmp-{os.getpid()}"
    shutil.rmtree(tmp_figures, ignore_errors=True)
    prefix = f"{FIGURES_DIR}/{key}"
    try:
        if settings.parser == "docling" and suffix in DOCLING_SUFFIXES:
            parsed = parse_docling(path, name, tmp_figures, prefix, settings.limits)
        else:
            parsed = PARSERS[suffix](path, name, tmp_figures, prefix, corpus_dir, settings.limits, password)
    except Skip as e:
        shutil.rmtree(tmp_figures, ignore_errors=True)
        return FileOutcome(name, "skipped", e.reason, str(e), time.monotonic() - start)
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, RuntimeError) as e:
        # a reader library failing on an odd file must not end the run; the summary names the file and the error
        shutil.rmtree(tmp_figures, ignore_errors=True)
        logger.warning("%s: parser error", name, exc_info=logger.isEnabledFor(logging.DEBUG))
        return FileOutcome(name, "skipped", "parser error", f"{type(e).__name__}: {str(e)[:160]}")
    elapsed = time.monotonic() - start
    if elapsed > settings.limits.max_seconds:
        shutil.rmtree(tmp_figures, ignore_errors=True)
        return FileOutcome(
            name, "skipped", "over time limit", f"took {elapsed:.0f} s > --max-seconds {settings.limits.max_seconds:g}"
        )
    shutil.rmtree(final_figures, ignore_errors=True)
    if tmp_figures.exists():
        tmp_figures.rename(final_figures)
    (corpus_dir / PARSED_DIR).mkdir(parents=True, exist_ok=True)
    _write_json(corpus_dir / PARSED_DIR / f"{key}.json", parsed.to_dict())
    return FileOutcome(name, "parsed", seconds=elapsed, parsed=parsed)


def run_ingest(
    paths: list[str | Path],
    corpus_dir: Path,
    settings: Settings,
    password: str = "",
    force: bool = False,
    on_file: Callable[[FileOutcome], None] | None = None,
) -> tuple[list[FileOutcome], list[str]]:
    """Bring the corpus folder's parses up to date with `paths`.

    Returns:
        The outcome of every file (in name order) and the names of files removed since the last run.

    Raises:
        FileNotFoundError: an input path does not exist, or `--parser docling` without its env (`make docling`).
        ValueError: the folder was ingested with other settings (and not `force`), or its state is unreadable.
    """
    corpus_dir = Path(corpus_dir)
    if settings.parser == "docling":
        docling_python()  # fail before any work, naming the path and `make docling`
    state = read_state(corpus_dir)
    check_settings(state, settings, force, corpus_dir)
    files = walk(paths, settings.exclude, skip_dir=corpus_dir)
    corpus_dir.mkdir(parents=True, exist_ok=True)
    fresh = state is None or force or state.get("parser_version") != PARSER_VERSION
    known = {} if fresh else state.get("files", {})
    outcomes: list[FileOutcome] = []
    entries: dict[str, dict] = {}
    names = {name for _, name in files}
    by_name = {name: path for path, name in files}
    for name in sorted(names):
        path = by_name[name]
        sha = sha256_file(path) if path.stat().st_size <= settings.limits.max_bytes else f"size:{path.stat().st_size}"
        old = known.get(name)
        parse_file = corpus_dir / PARSED_DIR / f"{file_key(name)}.json"
        if old and old.get("sha256") == sha and (old["status"] == "skipped" or parse_file.is_file()):
            if old["status"] == "skipped":
                outcome = FileOutcome(name, "skipped", old.get("reason", ""), old.get("message", ""))
            else:
                outcome = FileOutcome(name, "reused", parsed=Parsed.from_dict(json.loads(parse_file.read_text())))
            entries[name] = old
        else:
            outcome = parse_one(path, name, corpus_dir, settings, password)
            if outcome.status == "skipped":
                parse_file.unlink(missing_ok=True)  # an old parse of a file that now fails is no longer true
                shutil.rmtree(corpus_dir / FIGURES_DIR / file_key(name), ignore_errors=True)
            entries[name] = {
                "sha256": sha,
                "status": "skipped" if outcome.status == "skipped" else "ok",
                "reason": outcome.reason,
                "message": outcome.message,
            }
        outcomes.append(outcome)
        if on_file is not None:
            on_file(outcome)
    removed = sorted(set((state or {}).get("files", {})) - names) if state is not None and not force else []
    stale = set((state or {}).get("files", {})) - names
    for name in stale:
        (corpus_dir / PARSED_DIR / f"{file_key(name)}.json").unlink(missing_ok=True)
        shutil.rmtree(corpus_dir / FIGURES_DIR / file_key(name), ignore_errors=True)
    _write_json(
        corpus_dir / STATE_FILE,
        {"version": STATE_VERSION, "parser_version": PARSER_VERSION, "settings": settings.to_dict(), "files": entries},
    )
    return outcomes, removed
