"""The self-test proves learning through the images: aligned images are learned, shuffled ones stay at chance."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from suzak.selftest import COLORS, color_dataset, first_token_reward, windows


def test_color_dataset_conditions():
    aligned = color_dataset(40, seed=1)
    assert set(aligned["solution"]) == set(COLORS)
    for row in aligned:  # the dominant channel is the label's
        r, _, b = row["image"].getpixel((0, 0))
        assert (r > b) == (row["solution"] == "red")
    pixels = [row["image"].getpixel((0, 0)) for row in aligned]
    assert len(set(pixels)) == len(pixels)  # jittered: no two images equal
    shuffled = color_dataset(40, seed=1, images="shuffled")
    assert shuffled["solution"] == aligned["solution"]  # labels kept, images moved
    assert sorted(r["image"].getpixel((0, 0)) for r in shuffled) == sorted(pixels)
    grey = color_dataset(10, seed=1, images="grey")
    assert all(abs(r["image"].getpixel((0, 0))[0] - r["image"].getpixel((0, 0))[2]) <= 50 for r in grey)
    with pytest.raises(ValueError, match="aligned, shuffled or grey"):
        color_dataset(2, seed=0, images="inverted")


def test_first_token_reward_is_zero_one():
    reward = first_token_reward({"red": 5, "blue": 7})
    assert reward(None, completion_ids=[[5, 1], [7], [1, 5], []], solution=["red", "red", "red", "blue"]) == [
        1.0,
        0.0,
        0.0,
        0.0,
    ]
    assert windows([1.0] * 10 + [0.0] * 5) == [1.0, 0.0]


@pytest.mark.slow
def test_selftest_passes_aligned_and_stays_at_chance_shuffled(tmp_path):
    """The whole command as a user runs it (seed 0): PASS, aligned >= 0.9, shuffled control in 0.3-0.7."""
    report_path = tmp_path / "selftest.json"
    result = subprocess.run([sys.executable, "-m", "suzak.selftest", "--seed", "0", "--json", str(report_path)],
                            capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "PASS" in result.stdout
    report = json.loads(report_path.read_text())
    assert report["passed"] and report["aligned_accuracy"] >= 0.9 and 0.3 <= report["control_accuracy"] <= 0.7
    assert report["heldout_accuracy"] >= 0.9  # greedy, through the evaluation engine with vision tokens suppressed
    assert set(report) >= {"aligned_accuracy", "control_accuracy", "heldout_accuracy", "steps", "seconds", "passed"}
