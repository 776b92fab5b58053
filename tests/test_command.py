"""The ``suzak`` command: its subcommands, each one's own help, an unknown one in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from suzak.__main__ import COMMANDS, main, usage


def test_suzak_help_lists_every_command_in_one_line_each():
    result = subprocess.run([sys.executable, "-m", "suzak", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == usage()
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS) and {"train", "sft", "eval", "selftest", "watch", "tiny"} <= set(listed)
    console = ROOT / ".venv" / "bin" / "suzak"  # the console script setup.sh installs
    if console.exists():
        assert subprocess.run([str(console), "--help"], capture_output=True, text=True).stdout == result.stdout


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_is_its_modules_own_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: ")


def test_an_unknown_command_is_one_line_with_the_closest_name(capsys):
    with pytest.raises(SystemExit) as done:
        main(["tarin", "--config", "x.yaml"])
    assert done.value.code == 2
    assert capsys.readouterr().err == "error: unknown command 'tarin' (did you mean train?)\n"


def test_watch_and_a_tool_less_eval_start_without_the_trainer_stack():
    """``suzak watch`` reads files and ``suzak eval`` without ``--tools`` generates with a model: neither imports TRL
    (whose trainer stack, with peft and bitsandbytes, is ~4 s of imports a process): ``suzak watch --help`` went
    from 6.4 s to 0.07 s, ``suzak eval --help`` from 7.4 s to 4.3 s (2026-11-30), and every test's eval process the
    same."""
    code = "import sys, suzak.watch, suzak.eval; print(sorted(m for m in ('trl', 'peft') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "[]", result.stdout + result.stderr[-2000:]
