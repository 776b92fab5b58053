"""How far inside its bars each self-test passes, over seeds: the validation behind docs/selftest.md's margins table.

    python bench/bench_selftest_margins.py --runs color:qwen2_5_vl:0 color:qwen2_5_vl:1 grounding:qwen3_vl:0
    python bench/bench_selftest_margins.py --runs video:qwen2_5_vl:1:120      # TASK:FAMILY:SEED[:STEPS]
    .venv-vllm/bin/python bench/bench_selftest_margins.py --vllm --runs color:qwen2_5_vl:0   # generating with vLLM
    python bench/bench_selftest_margins.py --table bench/results_selftest_margins.jsonl

Each run is the command a user runs (``python -m suzak.selftest --task T --family F --seed S --json ...``: aligned
and its control, each in its own process); its report's ``margins`` (:func:`suzak.selftest.report.margins`) say how
far inside each bar it passed and how far it must be. One JSON line per run goes to --results (with the CPU's vector
extensions: torch's CPU kernels, and so the runs, differ between AVX2 and AVX-512 hosts); the table has one line per
run, with its tightest bar.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stamp import ROOT, commit


def cpu() -> str:
    """The CPU's model name and its widest vector extension (avx512f or avx2)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return f"{model} ({'avx512f' if 'avx512f' in flags else 'avx2' if 'avx2' in flags else 'no avx2'})"


def run(spec: str, results: Path, vllm: bool = False) -> dict:
    task, family, seed, *steps = spec.split(":")
    with tempfile.TemporaryDirectory(prefix="suzak-bench-margins-") as tmp:
        report_path = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "suzak.selftest", "--task", task, "--family", family, "--seed", seed,
                   "--json", str(report_path), *(["--steps", steps[0]] if steps else []), *(["--vllm"] if vllm else [])]  # fmt: skip
        start = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        if not report_path.exists():
            raise SystemExit(f"{spec}: the self-test wrote no report (exit {done.returncode}):\n{done.stderr[-2000:]}")
        report = json.loads(report_path.read_text())["detail"]  # the whole report (the top level: its summary)
    row = {"task": task, "family": family, "seed": int(seed), "steps": report["steps"],
           "generation": report["generation"], "passed": report["passed"],
           "last10": report["last10"], "heldout": report["heldout"], "margins": report["margins"],
           "windows": report["windows"], "seconds": round(time.monotonic() - start, 1), "cpu": cpu(),
           "commit": commit(), "date": datetime.date.today().isoformat(),
           **({"judge": report["judge"]} if "judge" in report else {})}  # fmt: skip
    with open(results, "a") as handle:
        handle.write(json.dumps(row) + "\n")
    return row


def table(rows: list[dict]) -> str:
    """One line per run: each condition's reward over its last 10 steps and held-out accuracy, and the bar with the
    least room over its required margin (``safe``: every bar passed by its required margin)."""
    lines = ["| task | family | generation | seed | steps | aligned (last 10) | control (last 10) | held-out aligned / "
             "control | tightest bar: margin (needs) | safe | seconds |", "|---|---|---|---:|---:|---:|---:|---|---|---|---:|"]  # fmt: skip
    for row in rows:
        # a mixture's runs are named <condition>/<source>: each source's figure, in the same order
        aligned = [name for name in row["last10"] if name.split("/")[0] == "aligned"]
        controls = [name for name in row["last10"] if name.split("/")[0] != "aligned"]
        spare, bar = min((got - need, bar) for bar, (got, need) in row["margins"].items())
        got, need = row["margins"][bar]

        def figures(values: dict, names: list[str]) -> str:
            return ", ".join(f"{values[name]:.3f}" for name in names)

        label = controls[0].split("/")[0] + (" per source" if "/" in controls[0] else "")
        lines.append(f"| {row['task']} | {row['family']} | {row['generation']} | {row['seed']} | {row['steps']} | "
                     f"{figures(row['last10'], aligned)} | {figures(row['last10'], controls)} ({label}) | "
                     f"{figures(row['heldout'], aligned)} / {figures(row['heldout'], controls)} | "
                     f"{bar}: {got:+.3f} ({need:g}) | {'yes' if spare >= 0 and row['passed'] else 'NO'} | "
                     f"{row['seconds']:.0f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="*", default=[], metavar="TASK:FAMILY:SEED[:STEPS]")
    parser.add_argument("--vllm", action="store_true", help="generate with vLLM (run with .venv-vllm's python)")
    parser.add_argument("--results", default=str(ROOT / "bench" / "results_selftest_margins.jsonl"))
    parser.add_argument("--table", default=None, metavar="JSONL", help="print the table of these rows and stop")
    args = parser.parse_args()
    if args.table:
        print(table([json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]))
        return
    os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
    rows = [run(spec, Path(args.results), args.vllm) for spec in args.runs]
    print(table(rows))


if __name__ == "__main__":
    main()
