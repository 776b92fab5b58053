"""Shared fixtures: the tiny offline Qwen2.5-VL (and each family's tiny model) is built once per test session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[1]


def _vllm_on_cpu() -> None:
    """With vLLM installed and no GPU (a scratch venv for tests/test_vllm_boundary.py), select vLLM's CPU platform.

    vLLM finds no platform on a GPU-less machine with its CUDA build, and its config checks then fail. This must run
    before anything imports vLLM's config modules (TRL's GRPOTrainer does), which bind the platform they find.
    """
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return
    import torch

    if torch.cuda.is_available():
        return
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()  # input processing only: no vLLM kernel runs in these tests


_vllm_on_cpu()


def _cores() -> int:
    """The cores this process may run on (as suzak.selftest counts them for its conditions)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_xdist_auto_num_workers(config) -> int:
    """``pytest -n auto`` (the README's test command): one worker per core, at most one per 6 GiB of memory.

    Most of the suite's time is end-to-end runs in subprocesses whose tiny matrices keep a second torch thread far
    from twice as fast, so two workers on CI's 2 cores finish the main suite in ~70% of one worker's time
    (docs/benchmarks.md#ci). The memory cap keeps a machine of many cores and little memory from starting more
    end-to-end runs at once than fit (each is a process with its own torch; a self-test trains two at once).
    """
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return max(1, min(_cores(), memory // (6 << 30) if memory else _cores()))


def pytest_configure(config) -> None:
    """Under pytest-xdist each worker (and what it starts) gets its share of the cores and a rendezvous port.

    Threads: torch's OpenMP threads spin while they wait, so two workers' runs of two threads each on 2 cores
    slowed the demo run 4x (94 s alone, 357 s beside a self-test); one thread each costs a run little (its tiny
    matrices gain little from a second thread). Port: torchrun, DeepSpeed and TRL's colocated vLLM group all default
    to 29500, and two workers launching at once would collide (EADDRINUSE).
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if not worker:
        _deal_tests_one_by_one(config)
        return
    os.environ["MASTER_PORT"] = str(29600 + 100 * int(worker.removeprefix("gw")))
    threads = max(1, _cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # subprocesses' torch; this process's is set below
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _deal_tests_one_by_one(config) -> None:
    """In the controller of ``-n N``: tests go to whichever worker is free, one at a time (``--maxschedchunk=1``),
    not in xdist's default first chunks of a quarter of each worker's share in collection order, which gave the
    first worker every slow test (they are sorted first, below): in the CI of 83ec219 one worker ran the self-tests
    back to back while the other sat idle for the last minutes of the main suite, and the vLLM tier's four
    self-tests all went to one worker."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config, items) -> None:
    """With several workers, the slow tests go first, the self-tests (the longest) before the other slow ones
    (stable order otherwise), so the workers finish together instead of one running a self-test alone at the end."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:  # set in each worker, where collection runs
        items.sort(key=lambda item: (item.get_closest_marker("slow") is None, "selftest" not in item.name))


def run_ok(cmd: list[str], env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a command from the repo root as a user would; fail the test with its output tail if it fails."""
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def last_trainer_state(output_dir: Path) -> dict:
    """``trainer_state.json`` of the newest ``checkpoint-N`` in ``output_dir``."""
    states = sorted(output_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    return json.loads(states[-1].read_text())


@pytest.fixture(scope="session")
def run_env(tmp_path_factory) -> dict:
    """Environment for end-to-end runs: the tiny model cached once per test session, no .env from the repo."""
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "DATASET", "OUTPUT_DIR")}
    env["SUZAK_CACHE"] = str(tmp_path_factory.mktemp("suzak-cache"))
    env["SUZAK_ENV_FILE"] = str(tmp_path_factory.mktemp("env") / "absent.env")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from suzak.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen2.5-vl")


def zoom_prior_model(folder: Path, for_vllm: bool = False) -> Path:
    """:func:`suzak.selftest.small_zoom_prior` on the tiny Qwen2.5-VL whose vocabulary knows the tool format
    (:func:`suzak.selftest.zoom_corpus`), saved with its processor under ``folder``; ``for_vllm``: the shape vLLM's
    CPU build runs."""
    from suzak.models.tiny import TinyConfig
    from suzak.selftest import small_zoom_prior, zoom_corpus

    tiny = TinyConfig.shaped("qwen2_5_vl", for_vllm=for_vllm, extra_corpus=zoom_corpus("qwen2_5_vl"))
    model, processor, _ = small_zoom_prior(folder, tiny)
    saved = folder / "prior_model"
    model.save_pretrained(saved)
    processor.save_pretrained(saved)
    return saved


@pytest.fixture(scope="session")
def zoom_prior_dir(tmp_path_factory) -> Path:
    """:func:`zoom_prior_model`, built once per test session (the HF zoom rollouts and the eval's tool loop)."""
    return zoom_prior_model(tmp_path_factory.mktemp("zoom-prior"))


@pytest.fixture(scope="session")
def family_model_dir(tmp_path_factory):
    """``family_model_dir(family)``: the tiny model of a family (suzak.models.tiny.FAMILIES: the Qwen VL ones and two
    text-only ones), built once per test session."""
    from suzak.models.tiny import TinyConfig, build_tiny_model

    built: dict[str, Path] = {}

    def build(family: str) -> Path:
        if family not in built:
            folder = tmp_path_factory.mktemp("tiny") / f"tiny-{family}"
            built[family] = build_tiny_model(folder, TinyConfig(family=family))
        return built[family]

    return build


@pytest.fixture(scope="session")
def tiny_processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def gsm8k_jsonl() -> Path:
    return FIXTURES / "gsm8k_tiny.jsonl"


@pytest.fixture(scope="session")
def eval_fixture_dir(tmp_path_factory) -> Path:
    """R1-V-format SuperCLEVR-like (8 items, mixed image sizes) and GeoQA-like (6 items) files with their images."""
    from suzak.eval.fixtures import write_fixtures

    root = tmp_path_factory.mktemp("r1v-eval")
    write_fixtures(root, superclevr=8, geoqa=6)
    return root
