"""The self-test's report: reward windows, what PASS needs, the printed table and verdict, and the quiet progress of
its trainers."""

from __future__ import annotations

import statistics

from suzak.selftest.spec import TaskSpec

__all__ = [
    "JSON_KEYS",
    "condition_of",
    "floor_margin",
    "format_report",
    "margins",
    "needs",
    "quiet_progress",
    "verdicts",
    "windows",
]

# The top-level keys of ``--json`` (the whole report follows under "detail").
JSON_KEYS = ("task", "family", "aligned_accuracy", "control_accuracy", "heldout_accuracy", "unsuppressed_in_eval", "steps",
             "seconds", "passed")  # fmt: skip


def windows(rewards: list[float], size: int = 10) -> list[float]:
    """Mean reward over consecutive windows of ``size`` steps."""
    return [statistics.fmean(rewards[i : i + size]) for i in range(0, len(rewards), size)]


def condition_of(name: str) -> str:
    """The condition of a run's name: a mixture's runs are named ``<condition>/<source>``, each bar applying to each
    source's rows.

    >>> condition_of("aligned"), condition_of("shuffled/colour")
    ('aligned', 'shuffled')
    """
    return name.split("/", 1)[0]


def needs(spec: TaskSpec, condition: str) -> str:
    """What the ``condition``'s reward over its last 10 steps must be, as the report prints it.

    >>> from suzak.selftest import TASKS
    >>> needs(TASKS["color"], "aligned"), needs(TASKS["color"], "shuffled")
    ('>= 0.9', '0.3-0.7')
    """
    low, high = spec.control_band
    return f">= {spec.pass_at:g}" if condition_of(condition) == "aligned" else f"{low:g}-{high:g}"


def verdicts(spec: TaskSpec, last: dict[str, float], heldout: dict[str, float]) -> dict[str, bool]:
    """Each bar of PASS and whether the runs met it: the aligned run's reward over its last 10 steps reaches
    ``pass_at``, a control's stays inside ``control_band``; where the task sets them, the aligned run's held-out
    greedy accuracy reaches ``heldout_pass_at`` and a control's stays below ``heldout_control_below``.

    >>> from suzak.selftest import TASKS
    >>> verdicts(TASKS["color"], {"aligned": 0.95, "shuffled": 0.5}, {"aligned": 1.0, "shuffled": 0.5})
    {'aligned': True, 'shuffled': True, 'heldout_aligned': True, 'heldout_shuffled': True}
    """
    # a bar is met where its margin is >= 0; a control's held-out ceiling is strict (below it, not at it)
    return {bar: got > 0 if bar.startswith("heldout_") and condition_of(bar.removeprefix("heldout_")) != "aligned"
            else got >= 0 for bar, (got, _) in margins(spec, last, heldout).items()}  # fmt: skip


def margins(spec: TaskSpec, last: dict[str, float], heldout: dict[str, float]) -> dict[str, tuple[float, float]]:
    """How far inside each bar of :func:`verdicts` the runs are, and how far they must be to call the bar safe from a
    host's or a library's drift: ``{bar: (margin, required)}``, a negative margin a failed bar (docs/selftest.md).

    A control's margin is its distance to the nearer edge of its band (or under its held-out ceiling), required 0.1.
    An aligned run's is its distance above the bar, required 0.1, or half the room between the bar and a perfect 1.0
    where that is less (a bar of 0.9 can be passed by 0.1 only by a perfect run: 0.05 there).

    >>> from suzak.selftest import TASKS
    >>> m = margins(TASKS["color"], {"aligned": 0.97, "shuffled": 0.52}, {"aligned": 1.0, "shuffled": 0.49})
    >>> {name: (round(got, 3), need) for name, (got, need) in m.items()}  # doctest: +NORMALIZE_WHITESPACE
    {'aligned': (0.07, 0.05), 'shuffled': (0.18, 0.1), 'heldout_aligned': (0.1, 0.05),
     'heldout_shuffled': (0.21, 0.1)}
    """
    low, high = spec.control_band
    out = {}
    for name, value in last.items():
        out[name] = (value - spec.pass_at, _required(spec.pass_at)) if condition_of(name) == "aligned" else (
            min(value - low, high - value), 0.1)  # fmt: skip
    for name, value in heldout.items():
        aligned = condition_of(name) == "aligned"
        bar = spec.heldout_pass_at if aligned else spec.heldout_control_below
        if bar is not None:
            out[f"heldout_{name}"] = (value - bar, _required(bar)) if aligned else (bar - value, 0.1)
    return out


def floor_margin(value: float, bar: float) -> tuple[float, float]:
    """(how far ``value`` is above the floor ``bar``, how far it must be): a prepared bar's margin (the judge task's
    judge accuracy), as :func:`margins` gives an aligned run's.

    >>> floor_margin(1.0, 0.95)
    (0.05, 0.025)
    """
    return round(value - bar, 6), _required(bar)


def _required(bar: float) -> float:
    return round(min(0.1, (1.0 - bar) / 2), 6)


def format_report(report: dict) -> str:
    names = list(report["windows"])
    lines = ["| steps | " + " | ".join(f"{n} reward" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for i in range(max(len(w) for w in report["windows"].values())):
        cells = [f"{report['windows'][n][i]:.3f}" if i < len(report["windows"][n]) else "" for n in names]
        lines.append(f"| {10 * i + 1}-{10 * i + 10} | " + " | ".join(cells) + " |")
    verdict = "PASS" if report["passed"] else "FAIL"
    bars = report["needs"]
    runs = ", ".join(f"{name} {value:.3f} (needs {bars[name]})" for name, value in report["last10"].items())
    heldout_needs = report.get("heldout_needs", {})
    heldout = ", ".join(
        f"{name} {value:.3f}" + (f" (needs {heldout_needs[name]})" if name in heldout_needs else "")
        for name, value in report["heldout"].items()
    )
    family = f" ({report['family']})" if report.get("family") else ""
    lines.append(f"{verdict}{family}: reward over the last 10 steps: {runs}; held-out greedy accuracy: {heldout}; "
                 f"{report['seconds']:.0f} s")  # fmt: skip
    checks = [gap for run in report.get("sampler_checks", {}).values() for gap in run]
    if checks:
        lines.append(f"vLLM against the policy: largest mean |log p(vLLM) - log p(policy)| {max(c[1] for c in checks):.2g} "
                     f"per token over {len(checks)} checks of the stale-sampler guard")  # fmt: skip
    judge = report.get("judge")
    if judge and judge.get("accuracy") is not None:
        lines.append(f"the judge: {judge['sft_steps']} SFT steps, accuracy {judge['accuracy']:.3f} on unseen squares "
                     f"(needs {judge['needs']})")  # fmt: skip
    elif judge:
        lines.append(f"the judge: {judge['folder']} (--judge)")
    kept = [name for name, folder in report.get("kept_priors", {}).items() if folder]
    if kept:
        lines.append(f"priors loaded from --prior_cache (not trained in this run): {', '.join(kept)}")
    if report["unsuppressed_in_eval"]:
        lines.append(f"FAIL: the evaluation engine does not suppress {', '.join(report['unsuppressed_in_eval'])}, "
                     "which training suppressed: evaluation would score a different policy")  # fmt: skip
    return "\n".join(lines)


def heldout_needs(spec: TaskSpec, conditions) -> dict[str, str]:
    """What each condition's held-out accuracy must be, where the task sets a bar (for the printed verdict).

    >>> from suzak.selftest import TASKS
    >>> heldout_needs(TASKS["counting"], ["aligned", "shuffled"])
    {'aligned': '>= 0.8', 'shuffled': '< 0.5'}
    """
    out = {}
    for name in conditions:
        aligned = condition_of(name) == "aligned"
        bar = spec.heldout_pass_at if aligned else spec.heldout_control_below
        if bar is not None:
            out[name] = f">= {bar:g}" if aligned else f"< {bar:g}"
    return out


def quiet_progress(trainer) -> None:
    """A progress bar for the steps instead of a printed dict per logged step."""
    from transformers import PrinterCallback, ProgressCallback

    class StepBar(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            """Print nothing: the reward table at the end sums the logs up."""

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(StepBar())
