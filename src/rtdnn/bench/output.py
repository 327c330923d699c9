"""Where a benchmark's results go: one JSON file and one markdown table per run."""

from __future__ import annotations

import json
import os
from dataclasses import asdict


def write_results(out_dir: str, stem: str, title: str, rows: list, md: str, **extra) -> None:
    """<out_dir>/<stem>.json ({"title", the `extra` fields, "rows": the rows as dicts}) and
    <out_dir>/<stem>.md (the table `md`), the folder made if missing."""
    os.makedirs(out_dir, exist_ok=True)
    record = {"title": title, **extra, "rows": [asdict(r) for r in rows]}
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(record, f, indent=1)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(md)
