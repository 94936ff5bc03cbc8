"""Rows of a command's result as a program reads them: `--format csv|json`.

    FORMATS                      the choices a command offers (table: the console's rich table)
    rows_text(rows, fmt) -> str  the rows (dicts with the same keys) as CSV with a header, or a
                                 JSON array of objects
"""

from __future__ import annotations

import csv
import io
import json

FORMATS = ("table", "csv", "json")


def rows_text(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt != "csv":
        raise ValueError(f"format: expected csv or json, got {fmt!r}")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else [], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().rstrip("\n")
