"""`kbrouter ingest`: files and folders (PDF, HTML, Markdown, DOCX, XLSX, CSV/TSV, images, videos) -> KB corpora + a KB YAML.

Imports only `retrievers` (the one-way rule: nothing below `agent` knows about it, and it knows nothing of `agent`).
"""
