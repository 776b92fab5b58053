"""Which commit a benchmark row measured: `SUZAK_COMMIT` where the tree has no .git (the GPU machine), else git's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    if os.environ.get("SUZAK_COMMIT"):  # a copy of the tree without .git (the benchmark GPU machine)
        return os.environ["SUZAK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "?"


def append_rows(path, rows: list[dict]) -> None:
    """Append ``rows`` to the JSONL results file ``path``, one JSON line each."""
    with open(path, "a") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)


def markdown_table(rows: list[dict], fields: tuple[str, ...], digits: int = 3) -> str:
    """``rows`` as a Markdown table of ``fields``, floats to ``digits`` significant digits."""
    lines = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    for row in rows:
        cells = [f"{row[k]:.{digits}g}" if isinstance(row[k], float) else str(row[k]) for k in fields]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
