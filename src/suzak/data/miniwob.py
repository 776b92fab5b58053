"""MiniWoB++ in a real Chromium: the ``miniwob`` dataset (rows of (task, seed) with their first screen) and the
``miniwob`` environment (:class:`MiniWoBEnvironment`, an episode of :mod:`suzak.models.episodes`).

MiniWoB++ (the ``miniwob`` package, Farama Foundation) ships its 130 web tasks inside the wheel and runs them in
Chrome through Selenium; suzak points it at Debian's ``chromium`` and ``chromium-driver`` (``setup.sh`` installs
them; elsewhere set ``MINIWOB_CHROME_BINARY`` and ``MINIWOB_CHROMEDRIVER`` in ``.env``). Each environment (TRL makes
one per concurrent rollout and reuses it across batches) starts its own headless browser on its first episode, keeps
it across episodes of the same task, and closes it with the run. A browser that crashes or hangs (no answer within
``timeout_s``) is killed and restarted: that episode ends with its reward so far, counted as ``crashed``, and the run
goes on.

The task's reward is MiniWoB's raw reward (1 success, -1 failure, partial progress between for the tasks that give
it), here clipped to 0-1 and without MiniWoB's time discount: the policy's thinking time is not the task's, so each
task's own timer is set to ``time_limit_s`` (default 600 s) instead of its 10-30 s.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import threading
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from PIL import Image

from suzak import SuzakError
from suzak.media.vision import PixelBudget
from suzak.models.episodes import (
    Action,
    Clicks,
    EpisodeCrashed,
    Keys,
    Outcome,
    ScreenEnvironment,
    Scrolls,
    Types,
)
from suzak.models.tools import ToolError
from suzak.scoring.prompts import episode_prompt

__all__ = [
    "CHROME_ENV",
    "MINIWOB",
    "MiniWoBEnvironment",
    "browser_paths",
    "miniwob_rows",
    "miniwob_tasks",
    "open_task",
]

logger = logging.getLogger(__name__)

MINIWOB = "miniwob"
CHROME_ENV = ("MINIWOB_CHROME_BINARY", "MINIWOB_CHROMEDRIVER")
_DEBIAN = ("/usr/bin/chromium", "/usr/bin/chromedriver")
_SETUP_HINT = "bash setup.sh installs Debian's chromium and chromium-driver (apt), or set MINIWOB_CHROME_BINARY and "


def browser_paths() -> tuple[str, str]:
    """The Chrome binary and its driver MiniWoB++ runs: ``MINIWOB_CHROME_BINARY`` / ``MINIWOB_CHROMEDRIVER`` where set,
    else Debian's ``chromium`` and ``chromedriver`` on the PATH; one line naming what is missing otherwise."""
    binary, driver = (os.environ.get(name) for name in CHROME_ENV)
    if bool(binary) != bool(driver):
        raise SuzakError(f"miniwob: set both {CHROME_ENV[0]} and {CHROME_ENV[1]} (one is set)")
    if not binary:
        binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
        driver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", binary), ("chromedriver", driver)) if not path or
               not Path(path).exists()]  # fmt: skip
    if missing:
        raise SuzakError(f"miniwob needs a browser and its driver; missing: {', '.join(missing)} ({_SETUP_HINT}"
                         f"{CHROME_ENV[1]} in .env)")  # fmt: skip
    return str(binary), str(driver)


def _gym():
    try:
        import gymnasium
        import miniwob
    except ImportError as error:
        raise SuzakError(f"miniwob: the miniwob package is not installed ({error}); bash setup.sh installs it") from None
    gymnasium.register_envs(miniwob)
    return gymnasium


def miniwob_tasks() -> list[str]:
    """The names of the tasks MiniWoB++ ships (its ``miniwob/<name>-v1`` environments).

    >>> tasks = miniwob_tasks()
    >>> len(tasks) > 100, "click-button" in tasks, "enter-text" in tasks
    (True, True, True)
    """
    gymnasium = _gym()
    names = [name.split("/", 1)[1].removesuffix("-v1") for name in gymnasium.registry
             if name.startswith(f"{MINIWOB}/") and name.endswith("-v1")]  # fmt: skip
    return sorted(names)


def check_tasks(tasks: Sequence[str]) -> list[str]:
    """``tasks`` as MiniWoB++ names them; one line naming an unknown one."""
    known = set(miniwob_tasks())
    unknown = [task for task in tasks if task not in known]
    if unknown or not tasks:
        raise SuzakError(f"miniwob: unknown task(s) {', '.join(unknown) or '(none given)'}; MiniWoB++ ships "
                         f"{len(known)}, e.g. click-button, enter-text, click-checkboxes (suzak eval --task miniwob "
                         "--tasks list names them all)")  # fmt: skip
    return list(tasks)


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every open browser, closed when the run ends


@atexit.register
def _close_all() -> None:
    for task in list(_LIVE):
        task.close()


class _Task:
    """One headless browser running one MiniWoB++ task (its gymnasium environment), each call bounded by
    ``timeout_s``; a call that fails or hangs kills the browser and raises :class:`EpisodeCrashed`."""

    def __init__(self, task: str, time_limit_s: float, timeout_s: float):
        self.task, self.time_limit_s, self.timeout_s = task, time_limit_s, timeout_s
        self._env = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"miniwob-{task}")
        self.observation: dict | None = None
        self.info: dict = {}
        self.done = False
        self.raw_reward = 0.0
        self._tree: list[int] = []  # the browser's processes (the driver first), read when it opened
        _LIVE.add(self)

    def _call(self, what: str, function, *args, **kwargs):
        future = self._pool.submit(function, *args, **kwargs)
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            self.kill()
            raise EpisodeCrashed(f"MiniWoB++ {self.task}: the browser did not answer {what} within "
                                 f"{self.timeout_s:g} s; killed, a new one starts with the next episode") from None  # fmt: skip
        except Exception as error:  # a dead driver, a page that did not load: the browser is not to be trusted
            self.kill()
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise EpisodeCrashed(f"MiniWoB++ {self.task}: {what} failed ({first})") from None

    def _open(self):
        from miniwob.reward import get_raw_reward

        os.environ[CHROME_ENV[0]], os.environ[CHROME_ENV[1]] = browser_paths()
        env = _gym().make(f"{MINIWOB}/{self.task}-v1", reward_processor=get_raw_reward)
        pid = env.unwrapped.instance.driver.service.process.pid
        self._tree = [pid, *_descendants(pid)]
        return env

    def reset(self, seed: int) -> Image.Image:
        def run():
            if self._env is None or self._env.unwrapped.instance.died:
                self._env = self._open()
            driver = self._env.unwrapped.instance.driver  # the task's own timer, read as each episode starts
            driver.execute_script(f"core.EPISODE_MAX_TIME = {int(self.time_limit_s * 1000)};")
            return self._env.reset(seed=int(seed))

        self.observation, self.info = self._call("reset", run)
        self.done, self.raw_reward = False, 0.0
        return Image.fromarray(self.observation["screenshot"])

    def step(self, action: Action) -> None:
        if self._env is None:
            raise EpisodeCrashed(f"MiniWoB++ {self.task}: no browser is running")
        observation, reward, terminated, _truncated, info = self._call(action.kind, self._env.step,
                                                                       self._action(action))  # fmt: skip
        self.info = info
        self.done = bool(terminated)
        self.raw_reward = float(reward)
        if not self.done:
            self.observation = observation

    def _action(self, action: Action):
        import numpy as np
        from miniwob.action import ActionTypes

        env = self._env.unwrapped
        if action.kind == "click":
            return env.create_action(ActionTypes.CLICK_COORDS, coords=np.array([action.x, action.y]))
        if action.kind == "scroll":
            kind = ActionTypes.SCROLL_UP_COORDS if action.direction == "up" else ActionTypes.SCROLL_DOWN_COORDS
            return env.create_action(kind, coords=np.array([action.x, action.y]))
        if action.kind == "type_text":
            limit = env.action_space_config.text_max_len
            if len(action.text or "") > limit:
                raise ToolError(f"MiniWoB++ types at most {limit} characters at once, got {len(action.text)}")
            return env.create_action(ActionTypes.TYPE_TEXT, text=action.text or "")
        if action.kind == "press_key":
            keys = list(env.action_space_config.allowed_keys)
            key = _key_name(action.text or "", keys)
            if key is None:
                raise ToolError(f"unknown key {action.text!r}; MiniWoB++ takes {', '.join(keys[:12])}, ...")
            return env.create_action(ActionTypes.PRESS_KEY, key=keys.index(key))
        raise ToolError(f"MiniWoB++ has no action {action.kind!r}")

    def screen(self) -> Image.Image | None:
        """The screen now; None once the episode is over (MiniWoB++ shows its cover, not the task's last state)."""
        if self.done or self.observation is None:
            return None
        return Image.fromarray(self.observation["screenshot"])

    def kill(self) -> None:
        """Close the browser whatever its state: a quit (bounded), then every process of its tree (the driver, the
        Chromium it started and Chromium's own children, recorded when it opened: a driver that died leaves them
        orphaned)."""
        env, self._env = self._env, None
        # a call still hung in the worker thread must not hold up the next browser's calls: a new worker for them
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"miniwob-{self.task}")
        if env is None:
            return
        driver = getattr(getattr(getattr(env.unwrapped.instance, "driver", None), "service", None), "process", None)
        tree = set(self._tree) | ({driver.pid} if driver is not None else set())
        for pid in list(tree):  # before the quit, which orphans Chromium's children as it ends
            tree |= set(_descendants(pid))
        closer = threading.Thread(target=env.close, daemon=True)
        closer.start()
        closer.join(timeout=10)
        for pid in tree:
            _kill_browser_process(pid)
        if driver is not None:  # this process's child: reaped, not left a zombie
            with contextlib.suppress(subprocess.TimeoutExpired):  # (one that outlives SIGKILL is the kernel's to end)
                driver.wait(timeout=5)
        self._tree = []
    def close(self) -> None:
        self.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)  # (kill's fresh worker, never used)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux's /proc), deepest last; [] where it is gone."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            found += [kid, *_descendants(kid)]
    return found


def _kill_browser_process(pid: int) -> None:
    """SIGKILL ``pid`` when it is still a browser's process (chromedriver, chromium, its crash handler): a pid the
    kernel gave to another program since is left alone."""
    import signal

    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return
    if name.startswith(("chromedriver", "chromium", "chrome")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _key_name(name: str, keys: Sequence[str]) -> str | None:
    """MiniWoB++'s name of a key as a model writes it ("Enter", "enter", "ctrl+a", "Control+A")."""
    aliases = {"enter": "<Enter>", "return": "<Enter>", "tab": "<Tab>", "backspace": "<Backspace>",
               "delete": "<Delete>", "escape": "<Escape>", "esc": "<Escape>", "space": " ", "up": "<Up>",
               "arrowup": "<Up>", "down": "<Down>", "arrowdown": "<Down>", "left": "<Left>", "arrowleft": "<Left>",
               "right": "<Right>", "arrowright": "<Right>", "pageup": "<PageUp>", "pagedown": "<PageDown>",
               "home": "<Home>", "end": "<End>"}  # fmt: skip
    if name in keys:
        return name
    text = name.strip()
    parts = [part.strip().lower() for part in text.replace("-", "+").split("+")]
    if len(parts) > 1 and parts[0] in ("ctrl", "control", "cmd", "command", "meta"):
        candidate = f"C-{parts[1]}"
        return candidate if candidate in keys else None
    candidate = aliases.get(text.lower(), text)
    return candidate if candidate in keys else None


class MiniWoBEnvironment(ScreenEnvironment, Clicks, Types, Keys, Scrolls):
    """A MiniWoB++ episode in a real Chromium (the ``miniwob`` environment of a recipe's ``tools``). The row gives
    ``task`` and ``seed`` (:func:`miniwob_rows`); ``time_limit_s`` is each task's timer, ``timeout_s`` the most one
    browser call may take before the browser counts as hung."""

    def __init__(self, budget: PixelBudget, max_steps: int = 8, max_visual_tokens: int | None = None, *,
                 time_limit_s: float = 600.0, timeout_s: float = 30.0):  # fmt: skip
        super().__init__(budget, max_steps, max_visual_tokens)
        self.time_limit_s, self.timeout_s = time_limit_s, timeout_s
        self._task: _Task | None = None
        self.restarts = 0

    def _start(self, row: dict[str, Any]) -> Image.Image:
        task, seed = row.get("task"), row.get("seed")
        if not isinstance(task, str) or seed is None:
            raise SuzakError("a miniwob row needs 'task' and 'seed' (suzak.data.miniwob.miniwob_rows builds them)")
        if self._task is None or self._task.task != task:
            if self._task is not None:
                _release(self._task)
            self._task = _acquire(task, self.time_limit_s, self.timeout_s)
        try:
            return self._task.reset(int(seed))
        except EpisodeCrashed:
            self.restarts += 1
            raise

    def _perform(self, action: Action) -> None:
        assert self._task is not None
        try:
            self._task.step(action)
        except EpisodeCrashed:
            self.restarts += 1
            raise

    def _outcome(self) -> Outcome:
        assert self._task is not None
        raw = self._task.raw_reward
        reward = min(max(raw, 0.0), 1.0)
        return Outcome(done=self._task.done, reward=reward, success=self._task.done and raw >= 1.0)

    def _screen(self) -> Image.Image | None:
        assert self._task is not None
        return self._task.screen()

    def _close(self) -> None:
        """Close this environment's browser (the run's end does it for every one; private: TRL would offer a public
        method to the model as a tool)."""
        if self._task is not None:
            self._task.close()
            self._task = None


# Browsers of this process that no environment holds, by task: an environment whose next row is another task hands
# its browser back here and takes one of the new task's (TRL reuses its environments across batches, whose rows mix
# tasks), so a process keeps about as many browsers per task as it runs that task's episodes at once.
_IDLE: dict[str, list[_Task]] = {}
_IDLE_LOCK = threading.Lock()
MAX_IDLE = 32  # idle browsers a process keeps, all tasks together; the oldest is closed past it


def _acquire(task: str, time_limit_s: float, timeout_s: float) -> _Task:
    with _IDLE_LOCK:
        idle = _IDLE.get(task, [])
        browser = idle.pop() if idle else None
    if browser is not None:
        browser.time_limit_s, browser.timeout_s = time_limit_s, timeout_s
        return browser
    return _Task(task, time_limit_s, timeout_s)


def _release(browser: _Task) -> None:
    with _IDLE_LOCK:
        _IDLE.setdefault(browser.task, []).append(browser)
        idle = [b for browsers in _IDLE.values() for b in browsers]
        oldest = idle[0] if len(idle) > MAX_IDLE else None
        if oldest is not None:
            _IDLE[oldest.task].remove(oldest)
    if oldest is not None:
        oldest.close()


def open_task(task: str, time_limit_s: float = 600.0, timeout_s: float = 30.0) -> _Task:
    """One browser on one task (the dataset's first screens, tests)."""
    check_tasks([task])
    return _Task(task, time_limit_s, timeout_s)


def miniwob_rows(tasks: Sequence[str] | str = ("click-button",), seeds: Iterable[int] | int = 16, *, start: int = 0,
                 template: str = "episode"):  # fmt: skip
    """The ``miniwob`` dataset: one row per (task, seed), seeds ``start``.. (``seeds`` a count) or the given ones, the
    tasks interleaved. Each row holds its first screen (``image``, the screenshot the episode starts on: one browser
    per task takes them here), the task's instruction (``utterance``) and the prompt (:func:`suzak.scoring.prompts.
    episode_prompt`); ``solution`` is empty: the environment scores the episode.

    >>> rows = miniwob_rows(["click-button"], [3])
    >>> row = rows[0]
    >>> row["task"], row["seed"], row["image"].size, row["utterance"]
    ('click-button', 3, (160, 210), 'Click on the "no" button.')
    """
    from datasets import Dataset
    from tqdm.auto import tqdm

    task_names = check_tasks([tasks] if isinstance(tasks, str) else list(tasks))
    seed_list = list(range(start, start + seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list:
        raise SuzakError("miniwob: no seeds")
    rows: list[dict[str, Any]] = []
    browsers = {task: open_task(task) for task in task_names}
    try:
        with tqdm(total=len(seed_list) * len(task_names), desc="miniwob first screens", disable=None) as bar:
            for seed in seed_list:
                for task in task_names:
                    browser = browsers[task]
                    image = browser.reset(seed)
                    utterance = str(browser.observation["utterance"])
                    rows.append({"prompt": episode_prompt(utterance, template), "image": image, "task": task,
                                 "seed": seed, "utterance": utterance, "solution": ""})  # fmt: skip
                    bar.update(1)
    finally:
        for browser in browsers.values():
            browser.close()
    return Dataset.from_list(rows)
