"""Reading local data files: one place for a JSONL file's lines, each bad line named by file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from suzak import SuzakError

__all__ = ["read_jsonl"]


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, row) for each non-empty line; a malformed line is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise SuzakError(f"JSONL file not found: {path}")
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise SuzakError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise SuzakError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            yield number, row
