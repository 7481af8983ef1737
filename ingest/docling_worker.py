"""Runs inside the docling env (`.venv-docling`, `make docling`): one file -> a plain JSON dict on stdout.

    .venv-docling/bin/python -I ingest/docling_worker.py FILE --figure-dir DIR [--artifacts-path MODELS]

Only the standard library and docling are imported here, never kbrouter: docling's pins clash with the main env's,
so the two never share an interpreter (`ingest.docling_parser` runs this file as a subprocess and turns its output
into kbrouter's units). The dict holds the document's items in reading order:

    {"name", "pages": {page_no: [width, height]},
     "items": [{"type": "text", "label", "text", "level", "prov"},
               {"type": "table", "header", "rows", "caption", "prov"},
               {"type": "picture", "image" (a file in DIR, or null), "caption", "prov"}]}

`prov` is a list of `{"page", "bbox"}` with the bbox in PDF points, origin top-left (`[x0, top, x1, bottom]`, as
`ingest.pdf` writes it); DOCX and HTML have no pages, so their `prov` is empty. A PDF needs docling's layout models:
without them the worker exits with status 3 and says how to get them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

EXIT_NEEDS_WEIGHTS = 3
EXIT_FAILED = 4
FORMATS = {".docx": "DOCX", ".html": "HTML", ".htm": "HTML", ".pdf": "PDF"}
PDF_FIX = (
    "docling reads a PDF only with its layout model weights: on a machine with internet run "
    "`docling-tools models download` (after `.venv-docling/bin/pip install 'docling-slim[format-pdf,models-local]'`, "
    "which brings torch), copy the models folder here and give it as docling's `artifacts_path` "
    "(env KBROUTER_DOCLING_ARTIFACTS=/path/to/models); or ingest PDFs with the default weight-free parser "
    "(no --parser docling)"
)


def main(argv: list[str] | None = None) -> int:
    """Convert one file with docling and print the simplified document as JSON; returns the exit status."""
    parser = argparse.ArgumentParser(prog="docling_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--figure-dir", type=Path, required=True, help="where pictures are saved as PNG")
    parser.add_argument("--artifacts-path", default="", help="docling's models folder (needed for PDF only)")
    args = parser.parse_args(argv)
    suffix = args.file.suffix.lower()
    if suffix not in FORMATS:
        return _fail(EXIT_FAILED, f"no docling reader set up for {suffix!r} (have: {sorted(FORMATS)})")
    # docling and its plugins may print; stdout carries the JSON alone
    with contextlib.redirect_stdout(sys.stderr):
        try:
            doc = _convert_pdf(args.file, args.artifacts_path) if suffix == ".pdf" else _convert_declarative(args.file)
        except _NeedsWeights as e:
            return _fail(EXIT_NEEDS_WEIGHTS, str(e))
        except _Failed as e:
            return _fail(EXIT_FAILED, str(e))
        out = simplify(doc, args.figure_dir)
    sys.stdout.write(json.dumps(out, ensure_ascii=False))
    return 0


def _convert_declarative(path: Path):  # noqa: ANN202 - a DoclingDocument (docling's types exist only in its env)
    """DOCX and HTML through docling's declarative backend, as its SimplePipeline does.

    Not through `DocumentConverter`: in docling-slim 2.143 `docling.document_converter` imports the ASR pipeline,
    which imports torch, so it fails in an env without the `models-local` extra even for a DOCX.
    """
    from docling.backend.html_backend import HTMLDocumentBackend
    from docling.backend.msword_backend import MsWordDocumentBackend
    from docling.datamodel.base_models import InputFormat
    from docling.datamodel.document import InputDocument

    fmt, backend = {
        ".docx": (InputFormat.DOCX, MsWordDocumentBackend),
        ".html": (InputFormat.HTML, HTMLDocumentBackend),
        ".htm": (InputFormat.HTML, HTMLDocumentBackend),
    }[path.suffix.lower()]
    source = InputDocument(path_or_stream=path, format=fmt, backend=backend)
    if not source.valid:
        raise _Failed(f"docling cannot read {path.name} as {fmt.value}")
    return source._backend.convert()  # noqa: SLF001 - the backend docling built for this input


def _convert_pdf(path: Path, artifacts_path: str):  # noqa: ANN202
    if not artifacts_path or not Path(artifacts_path).is_dir():
        where = f"artifacts_path {artifacts_path!r} is not a folder" if artifacts_path else "no artifacts_path is set"
        raise _NeedsWeights(f"{where}. {PDF_FIX}")
    try:
        from docling.datamodel.base_models import ConversionStatus, InputFormat
        from docling.datamodel.pipeline_options import PdfPipelineOptions
        from docling.document_converter import DocumentConverter, PdfFormatOption
    except ImportError as e:
        raise _NeedsWeights(f"the PDF pipeline does not import in this env ({e}). {PDF_FIX}") from None
    options = PdfPipelineOptions(artifacts_path=artifacts_path, do_ocr=False)
    converter = DocumentConverter(
        allowed_formats=[InputFormat.PDF], format_options={InputFormat.PDF: PdfFormatOption(pipeline_options=options)}
    )
    result = converter.convert(path, raises_on_error=False)
    if result.status != ConversionStatus.SUCCESS:
        errors = "; ".join(e.error_message for e in result.errors)
        raise _Failed(f"conversion {result.status.value}: {errors or 'no details'}")
    return result.document


class _Failed(Exception):
    pass


class _NeedsWeights(Exception):
    pass


def _fail(status: int, message: str) -> int:
    sys.stderr.write(f"docling_worker: {message}\n")  # the parent reports the last such line
    return status


def simplify(doc, figure_dir: Path) -> dict:  # noqa: ANN001 - a docling DoclingDocument
    """The items of a DoclingDocument in reading order, as plain JSON types (see the module docstring)."""
    from docling_core.types.doc import PictureItem, SectionHeaderItem, TableItem, TextItem

    pages = {int(n): [p.size.width, p.size.height] for n, p in (doc.pages or {}).items()}
    items: list[dict] = []
    n_pictures = 0
    for item, _level in doc.iterate_items():
        prov = [_prov(p, pages) for p in item.prov]
        if isinstance(item, TableItem):
            header, rows = _table(item, doc)
            items.append(
                {"type": "table", "header": header, "rows": rows, "caption": item.caption_text(doc), "prov": prov}
            )
        elif isinstance(item, PictureItem):
            n_pictures += 1
            image = item.get_image(doc)
            name = None
            if image is not None:
                figure_dir.mkdir(parents=True, exist_ok=True)
                name = f"picture{n_pictures}.png"
                image.save(figure_dir / name)
            items.append({"type": "picture", "image": name, "caption": item.caption_text(doc), "prov": prov})
        elif isinstance(item, TextItem):
            level = item.level if isinstance(item, SectionHeaderItem) else 0
            items.append(
                {"type": "text", "label": str(item.label.value), "text": item.text, "level": level, "prov": prov}
            )
    return {"name": doc.name, "pages": pages, "items": items}


def _table(item, doc) -> tuple[list[str], list[list[str]]]:  # noqa: ANN001
    df = item.export_to_dataframe(doc=doc)
    header = [" ".join(str(x) for x in c) if isinstance(c, tuple) else str(c) for c in df.columns]
    rows = [["" if v is None else str(v) for v in row] for row in df.itertuples(index=False, name=None)]
    if all(h.isdigit() for h in header) and rows:  # no column-header cells: pandas numbered the columns
        header, rows = rows[0], rows[1:]
    return header, rows


def _prov(p, pages: dict) -> dict:  # noqa: ANN001 - a docling ProvenanceItem
    height = pages.get(p.page_no, [0, 0])[1]
    box = p.bbox.to_top_left_origin(page_height=height) if height else p.bbox
    return {"page": p.page_no, "bbox": [round(v, 1) for v in (box.l, box.t, box.r, box.b)]}


if __name__ == "__main__":
    raise SystemExit(main())
