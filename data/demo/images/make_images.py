"""Copy the demo images (CC BY / CC BY-SA COCO photos only) from ../shared/data and write their captions corpus.

Run from the repository root: `python data/demo/images/make_images.py [SHARED_DATA_DIR]`. Files are copied
byte for byte (several COCO licences forbid derivatives; we keep all of them unmodified). Licences are checked
against ../shared/data/MANIFEST.tsv per file; anything not CC BY or CC BY-SA is refused.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

IDS = [
    "coco-78499",
    "coco-252639",
    "coco-408805",
    "coco-107438",
    "coco-358083",
    "coco-525891",
    "coco-174375",
    "coco-229997",
]
ALLOWED = ("Attribution License", "Attribution-ShareAlike License")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    here = Path(__file__).resolve().parent
    shared = Path(argv[0]) if argv else here.parents[3] / "shared" / "data"
    with (shared / "MANIFEST.tsv").open() as f:
        licences = {r["path"]: r["license"] for r in csv.DictReader(f, delimiter="\t")}
    rows = {r["image_id"]: r for r in map(json.loads, (shared / "image/coco/images.jsonl").open())}
    out, attribution = [], []
    for image_id in IDS:
        r = rows[image_id]
        rel = f"image/coco/{r['file']}"
        licence = licences[rel]
        if not licence.startswith(ALLOWED):
            raise SystemExit(f"{rel}: licence {licence!r} is not CC BY / CC BY-SA; pick another image")
        name = Path(r["file"]).name
        shutil.copyfile(shared / rel, here / name)
        out.append(
            {
                "id": image_id,
                "image": name,
                "captions": r["captions"],
                "objects": sorted({o["category"] for o in r["objects"]}),
                "license": r["license_name"],
                "license_url": r["license_url"],
                "flickr_url": r["flickr_url"],
            }
        )
        attribution.append(
            f"- `data/demo/images/{name}`: MS-COCO {r['coco_split']} image {r['coco_id']}, Flickr photo "
            f"{r['flickr_url']}, {r['license_name']} ({r['license_url']}); captions: COCO annotations, "
            "CC BY 4.0."
        )
    with (here / "images.jsonl").open("w") as f:
        for row in out:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print("\n".join(attribution))  # noqa: T201 (script output: paste into ATTRIBUTION-media.md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
