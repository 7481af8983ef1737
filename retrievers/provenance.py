"""Where a record came from in its source document: file, page, bbox or time span, table or figure number.

`kbrouter ingest` stores `metadata["provenance"]` on every record it writes; evidence lines, the step display, hit
cards and trajectories show `provenance_label` of it ("report.pdf p. 4, table 2"). A record without provenance (every
hand-written corpus) gets an empty label, so it renders exactly as before.
"""

from __future__ import annotations

SECTION_CHARS = 60


def provenance_label(metadata: dict) -> str:
    """A short human-readable source of a record ("report.pdf p. 4, table 2"), or "" when it has no provenance.

    Example:
        >>> provenance_label({"provenance": {"file": "report.pdf", "page": 4, "table": 2}})
        'report.pdf p. 4, table 2'
    """
    prov = metadata.get("provenance") if isinstance(metadata, dict) else None
    if not isinstance(prov, dict) or not prov.get("file"):
        return ""
    head = str(prov["file"])
    if prov.get("page") is not None:
        head += f" p. {prov['page']}"
    parts = [head]
    if prov.get("sheet"):
        parts.append(f"sheet {prov['sheet']}")
    section = str(prov.get("section") or "")
    if section:
        cut = section if len(section) <= SECTION_CHARS else section[: SECTION_CHARS - 1] + "…"
        parts.append(f'section "{cut}"')
    for key in ("table", "figure"):
        if prov.get(key) is not None:
            parts.append(f"{key} {prov[key]}")
    if prov.get("rows"):  # a long table is cut into parts of a few rows each
        first, last = prov["rows"]
        parts.append(f"rows {first}–{last}")
    if prov.get("start") is not None and prov.get("end") is not None:
        parts.append(f"{float(prov['start']):.1f}s–{float(prov['end']):.1f}s")
    return ", ".join(parts)
