"""Mixtures (issue 52): a recipe's ``datasets:`` list, the weighted passes over its sources, and each source's rewards
scoring only its own rows (work in progress: the trainer is not wired to it yet)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from suzak import SuzakError
from suzak.data.mixture import combine, mixture_order, parse_sources

TWO = [{"name": "colour", "dataset": "color_squares", "options": {"num_rows": 40}, "weight": 3,
        "rewards": ["word_match"]},
       {"name": "boxes", "dataset": "grounding_shapes", "options": {"num_rows": 20}, "rewards": ["iou", "box_format"],
        "reward_weights": [1.0, 0.5]}]  # fmt: skip


def test_a_pass_follows_the_weights_in_every_stretch_and_depends_on_the_seed_alone():
    picks, rows = mixture_order([150, 50, 5], [3, 1, 1], seed=0, total=500)  # passes of 205 rows: 123, 41, 41
    assert Counter(picks.tolist()) == {0: 300, 1: 100, 2: 100}
    for start in range(0, 500, 50):  # every stretch of 50 rows keeps the shares within a row
        window = Counter(picks[start : start + 50].tolist())
        assert abs(window[0] - 30) <= 1 and abs(window[1] - 10) <= 1 and abs(window[2] - 10) <= 1
    small = rows[picks == 2].tolist()  # 100 draws from 5 rows: 20 permutations, across the passes
    assert all(sorted(small[i : i + 5]) == list(range(5)) for i in range(0, 100, 5))
    again, other = mixture_order([150, 50, 5], [3, 1, 1], seed=0, total=500), mixture_order([150, 50, 5], [3, 1, 1],
                                                                                             seed=1, total=500)  # fmt: skip
    assert (again[1] == rows).all() and not (other[1] == rows).all()


def test_each_source_walks_its_own_permutations_pass_after_pass_so_an_epoch_draws_every_row():
    """Issue 67: 10,000 rows beside 100 at equal weights give a pass 5,050 rows of each; the large source's other
    4,950 rows were never drawn. Its draws now go on through its permutation from one pass to the next, and an epoch
    is the fewest passes in which every row of every source is drawn (here 2)."""
    from suzak.data.mixture import Epoch

    picks, rows = mixture_order([10000, 100], [1, 1], seed=0)
    assert len(picks) == 20200 and Counter(picks.tolist()) == {0: 10100, 1: 10100}
    large = rows[picks == 0]
    assert sorted(large[:10000].tolist()) == list(range(10000))  # every row once before any twice, across passes
    assert (large[:5050] == mixture_order([10000, 100], [1, 1], seed=0, total=10100)[1][::2]).all()  # one stream
    assert Epoch.of([10000, 100], [1, 1], batch=16).rows == 20208  # whole generation batches: TRL drops a last part
    capped = Epoch.of([2_000_000, 10], [1, 100])  # 19,802 draws of the large source a pass, ~101 passes to draw all
    assert not capped.whole and capped.passes == 2 and capped.rows <= 1 << 22


def test_combine_names_each_rows_source_and_fills_the_columns_another_source_has():
    from suzak.data import build_dataset

    sources = parse_sources(TWO)
    parts = [build_dataset(s.dataset, **s.options) for s in sources]
    mixed = combine(parts, sources, seed=0)  # passes of 60 rows, 45 and 15: the colour source's 40 rows take 2
    assert len(mixed) == 120 and Counter(mixed["source"]) == {"colour": 90, "boxes": 30}
    assert {(row["source"], row["source_row"]) for row in mixed} == {
        *(("colour", i) for i in range(40)), *(("boxes", i) for i in range(20))}  # fmt: skip
    assert set(parts[1].column_names) - set(parts[0].column_names) <= set(mixed.column_names)
    colour = next(row for row in mixed if row["source"] == "colour")
    assert colour["image"] is not None and colour["solution"] in ("red", "blue")


def test_each_sources_rewards_score_only_its_rows():
    from suzak.scoring.rewards import resolve_reward, routed

    calls = []

    def spy(name):
        def reward(completions, solution, **kwargs):
            calls.append((name, list(solution)))
            return [1.0] * len(completions)

        reward.__name__ = name
        return reward

    colour, boxes = routed(spy("word"), "colour"), routed(spy("box"), "boxes")
    kwargs = {"completions": ["red", "[0, 0, 1, 1]", "blue"], "solution": ["red", "[0, 0, 1, 1]", "blue"],
              "source": ["colour", "boxes", "colour"], "trainer_state": None}  # fmt: skip
    assert colour(**kwargs) == [1.0, None, 1.0] and boxes(**kwargs) == [None, 1.0, None]
    assert calls == [("word", ["red", "blue"]), ("box", ["[0, 0, 1, 1]"])]
    assert routed(resolve_reward("word_match"), "colour").__name__ == "colour/word_match"
    extra = []
    logged = routed(lambda completions, log_extra, **kw: log_extra("x", ["a"] * len(completions)) or [0.0], "boxes")
    logged(completions=["c", "b"], source=["colour", "boxes"], log_extra=lambda column, values: extra.append(values))
    assert extra == [[None, "a"]]  # a column a source's reward logs is None on the other sources' rows
    with pytest.raises(SuzakError, match="no 'source' column"):
        colour(completions=["red"], solution=["red"])


@pytest.mark.parametrize(("change", "message"), [
    ({"weight": -1}, r"datasets\[0\] \('colour'\): weight -1 must be a number above 0"),
    ({"rewards": []}, r"datasets\[0\] \('colour'\): no rewards"),
    ({"name": "boxes"}, r"datasets\[1\] \('boxes'\): a second source named 'boxes' \(datasets\[0\]\)"),
    ({"reward_kwargs": {"iou": {}}}, r"reward_kwargs for iou, which is not among its rewards \(word_match\)"),
    ({"reward_weights": [1, 2]}, r"2 reward_weights for 1 rewards \(word_match\)"),
    ({"dataset": ""}, r"'dataset' is required"),
    ({"reward_weights": 0.5}, r"datasets\[0\] \('colour'\): reward_weights 0.5 must be a list of numbers, one per "
                              r"reward \(word_match\)"),
    ({"reward_weights": ["high"]}, r"datasets\[0\] \('colour'\): reward_weights \['high'\] must be a list of numbers"),
    ({"reward_kwargs": ["word_match"]}, r"datasets\[0\] \('colour'\): reward_kwargs \['word_match'\] must be a mapping "
                                        "of reward name to its keyword arguments"),
    ({"reward_kwargs": {"word_match": 0.5}}, r"datasets\[0\] \('colour'\): reward_kwargs of word_match 0.5 must be a "
                                             "mapping of its keyword arguments"),
    ({"rewards": ["word_match", 3]}, r"datasets\[0\] \('colour'\): rewards \['word_match', 3\] must be a list of "
                                     "reward names"),
    ({"name": "my source"}, r"datasets\[0\] \('my source'\): name 'my source' names metric columns "
                            r"\(sources/<name>/...\): letters, digits, '_' and '-' only"),
    ({"tools": [3]}, r"datasets\[0\] \('colour'\): tools \[3\] must be a list of tool names"),
])  # fmt: skip
def test_a_bad_source_is_one_line_naming_it(change, message):
    with pytest.raises(SuzakError, match=message):
        parse_sources([{**TWO[0], **change}, TWO[1]])


def test_the_recipe_field_takes_a_yaml_list_or_json_and_checks_it_before_anything_loads():
    from suzak.training.configs import SuzakArguments

    assert [s.name for s in SuzakArguments(datasets=TWO).mixture()] == ["colour", "boxes"]
    assert [s.share for s in SuzakArguments(datasets=json.dumps(TWO)).mixture()] == [0.75, 0.25]
    assert SuzakArguments().mixture() is None
    with pytest.raises(SuzakError, match="--datasets must be a JSON list of objects"):
        SuzakArguments(datasets="[{name: a}]")
    with pytest.raises(SuzakError, match=r"datasets\[0\] \('colour'\): unknown key 'wieght' \(did you mean 'weight'"):
        SuzakArguments(datasets=[{**TWO[0], "wieght": 2}])


def test_the_mixture_recipe_trains_each_source_scored_by_its_own_rewards_alone(tmp_path, run_env):
    """`suzak train --config recipes/mixture_smoke.yaml`: colour squares and grounding shapes in one run; TRL logs
    each source's rewards apart (rewards/<source>/<reward>), and in completions.csv a source's rewards are empty on
    the other source's rows and filled on its own."""
    import csv
    import sys

    from conftest import run_ok

    out = tmp_path / "run"
    # unshuffled, every batch holds the epoch's interleaving (3 colour rows, 1 box row); TRL's shuffle of the epoch
    # gives a step of 4 prompts no box row with probability 0.3, and 4 steps none with seed 0
    result = run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/mixture_smoke.yaml", "--max_steps", "4",
                     "--shuffle_dataset", "false", "--output_dir", str(out)], run_env)  # fmt: skip
    assert "mixture of 112 rows: colour 75% (88 rows of color_squares), boxes 25% (24 rows" in result.stderr
    with open(out / "metrics.csv", newline="") as file:
        logs = [row for row in csv.DictReader(file) if row.get("reward")]
    assert len(logs) == 4 and all(
        name in logs[0] for name in ("rewards/colour/word_match/mean", "rewards/boxes/iou/mean",
                                     "rewards/boxes/box_format/mean"))  # fmt: skip
    with open(out / "completions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    colour = [row for row in rows if "What color" in row["prompt"]]
    boxes = [row for row in rows if "Locate" in row["prompt"]]
    assert colour and boxes and len(colour) + len(boxes) == len(rows) == 64
    assert {row["source"] for row in colour} == {"colour"} and {row["source"] for row in boxes} == {"boxes"}
    # a source's reward leaves the other source's rows unscored by design: not counted as None/NaN (a step without
    # a source's rows logs nothing for its rewards)
    fractions = [log[f"rewards/{name}/nonfinite_frac"] for log in logs
                 for name in ("colour/word_match", "boxes/iou", "boxes/box_format")]  # fmt: skip
    assert set(fractions) <= {"", "0.0"} and "0.0" in fractions, fractions
    # each source's own figures, on the steps its rows were in
    shown = [log for log in logs if log.get("sources/colour/rows")]
    assert shown and all(float(log["sources/colour/rows"]) > 0 for log in shown)
    for log in logs:
        for source in ("colour", "boxes"):
            if log.get(f"sources/{source}/rows"):
                assert 0 <= float(log[f"sources/{source}/reward"]) <= 1.5
                assert 0 <= float(log[f"sources/{source}/zero_std_groups"]) <= 1
                assert 0 < float(log[f"sources/{source}/completion_length"]) <= 32
                assert 0 <= float(log[f"sources/{source}/clipped_ratio"]) <= 1
    with open(out / "metrics.csv", newline="") as file:
        evals = [row for row in csv.DictReader(file) if row.get("eval/accuracy")]
    assert [int(row["step"]) for row in evals] == [0, 2, 4]  # the baseline, then every eval_steps 2
    for row in evals:  # 8 held-out rows of each source, each scored by its own source's first reward
        own = float(row["eval/colour/accuracy"]), float(row["eval/boxes/accuracy"])
        assert float(row["eval/accuracy"]) == pytest.approx(sum(own) / 2)
    assert sum(float(log.get("sources/colour/rows") or 0) + float(log.get("sources/boxes/rows") or 0)
               for log in logs) == 16  # 4 prompts a step, 4 steps  # fmt: skip
    assert all(row["reward/colour/word_match"] != "" and row["reward/boxes/iou"] == "" for row in colour)
    assert all(row["reward/colour/word_match"] == "" and row["reward/boxes/iou"] != "" for row in boxes)
    # the step line, suzak plot and suzak watch show each source
    lines = [line for line in (out / "train.log").read_text().splitlines() if "step 4/4 | reward" in line]
    assert lines and "(colour " in lines[0] and "boxes " in lines[0] and "eval " in lines[0], lines
    assert (out / "plots" / "sources.png").is_file()
    from suzak.watch import read_progress, render

    frame = render(read_progress(out), width=120)
    assert "colour reward" in frame and "boxes reward" in frame and "boxes/iou" in frame, frame


def test_one_dataset_fields_beside_a_mixture_are_one_line(tmp_path):
    """dataset_name, rewards, reward_weights ... beside ``datasets:`` would be ignored: refused by the parser."""
    import yaml

    from suzak.training.configs import parse_args

    recipe = tmp_path / "mix.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": "tiny", "datasets": TWO, "rewards": ["iou"],
                                      "output_dir": str(tmp_path / "out")}))  # fmt: skip
    with pytest.raises(SuzakError, match=r"datasets: each source sets its own dataset and rewards, and rewards is set"):
        parse_args(["--config", str(recipe)])
    recipe.write_text(yaml.safe_dump({"model_name_or_path": "tiny", "datasets": TWO, "output_dir": str(tmp_path)}))
    with pytest.raises(SuzakError, match=r"and dataset_name, reward_weights are set beside them"):
        parse_args(["--config", str(recipe), "--dataset_name", "color_squares", "--reward_weights", "1"])
    suzak_args, _, _ = parse_args(["--config", str(recipe)])
    assert [s.name for s in suzak_args.mixture()] == ["colour", "boxes"]


@pytest.mark.parametrize("boxes_max", [12544, 100352])
def test_each_sources_rows_are_fitted_to_its_own_pixel_budget(boxes_max, tiny_model_dir, tmp_path):
    """A source's own max_pixels (the boxes: 12544 pixels, 16 visual tokens, or 100352, 128; colour on the recipe's
    50176): its rows are fitted to it in training's batches, their box frames are in that frame, the pre-check counts
    its tokens, its held-out rows reach the eval engine at it; the processor (and so vLLM, whose bounds are checked
    against the same budget) resizes into the budget enclosing both, which leaves every fitted image as it is: one
    prompt size per row everywhere."""
    import yaml

    from suzak.eval.engine import HFEngine
    from suzak.media.boxes import BoxFrame
    from suzak.media.vision import PixelBudget, images_of, processor_bounds
    from suzak.runs.generation_eval import GenerationEvalCallback
    from suzak.training.build import grpo_trainer
    from suzak.training.checks import precheck
    from suzak.training.configs import parse_args

    with open("recipes/mixture_smoke.yaml") as file:
        sources = yaml.safe_load(file)["datasets"]
    sources[1] = {**sources[1], "max_pixels": boxes_max}
    trainer = grpo_trainer(*parse_args([
        "--config", "recipes/mixture_smoke.yaml", "--model_name_or_path", str(tiny_model_dir), "--datasets",
        json.dumps(sources), "--eval_rows", "4", "--max_steps", "1", "--output_dir", str(tmp_path / "out")]))  # fmt: skip
    budget = trainer.pixel_budget
    enclosing = max(boxes_max, 50176)
    assert (budget.min_pixels, budget.max_pixels, budget.factor) == (3136, enclosing, 28)
    assert processor_bounds(trainer.processing_class) == (3136, enclosing)
    rows = list(trainer.train_dataset)
    own = {"colour": PixelBudget(3136, 50176, 28), "boxes": PixelBudget(3136, boxes_max, 28)}
    assert {row["source"]: tuple(row["pixel_budget"]) for row in rows} == {"colour": (3136, 50176),
                                                                          "boxes": (3136, boxes_max)}  # fmt: skip
    picked = [next(r for r in rows if r["source"] == "colour"), *[r for r in rows if r["source"] == "boxes"][:3]]
    batch = trainer.prepare_batch(picked)
    for original, fitted in zip(picked, batch, strict=True):
        (image,), (fit,) = images_of(original), images_of(fitted)
        assert (fit.height, fit.width) == own[original["source"]].size(image.height, image.width)
        if original["source"] == "boxes":
            assert fitted["box_frame"] == BoxFrame.of("qwen2_5_vl", image.width, image.height,
                                                      own["boxes"]).as_dict()  # fmt: skip
            # scenes of up to 900 pixels a side, each past both budgets: fitted to the source's
            assert fit.width * fit.height > 50176 if boxes_max > 50176 else fit.width * fit.height <= boxes_max
        # the processor leaves a fitted image as it is: its visual tokens are the row's own budget's
        grid = trainer.processing_class.image_processor(images=[fit], return_tensors="pt")["image_grid_thw"]
        assert int(grid.prod()) // 4 == own[original["source"]].tokens(image.height, image.width)
    report = precheck(trainer.train_dataset, trainer.processing_class, budget, max_completion_length=32,
                      context_length=None)  # fmt: skip
    assert report["visual_tokens"]["max"] == max(own[r["source"]].tokens(*images_of(r)[0].size[::-1]) for r in rows)
    held = next(c for c in trainer.callback_handler.callbacks if isinstance(c, GenerationEvalCallback))
    boxes = [row for row in held.rows if row["source"] == "boxes"]
    assert len(boxes) == 4 and all(tuple(row["pixel_budget"]) == (3136, boxes_max) for row in boxes)
    engine = HFEngine(trainer.model, trainer.processing_class, held.budget, 4, 8, progress=False)
    (image,), (fit,) = images_of(boxes[0]), engine.fitted_images(boxes[0])
    assert (fit.height, fit.width) == own["boxes"].size(image.height, image.width)


@pytest.mark.parametrize(("change", "said"), [
    ({"min_pixels": 100, "max_pixels": 200}, "datasets[1] ('boxes'): max_pixels 200 is below one visual token of "
                                             "this model (28x28"),
    ({"max_pixels": 1000}, "datasets[1] ('boxes'): max_pixels 1000 is below min_pixels 3136 (the recipe's: set the "
                           "source's min_pixels too)"),
    ({"min_pixels": 60000, "max_pixels": 50000}, "datasets[1] ('boxes'): min_pixels 60000 must be at least 1 and at "
                                                 "most max_pixels (50000)"),
])  # fmt: skip
def test_a_sources_pixel_budget_that_cannot_be_is_one_line_before_the_weights_load(change, said, tmp_path):
    from suzak.train import main

    with pytest.raises(SystemExit) as stop:
        main(["--config", "recipes/mixture_smoke.yaml", "--datasets", json.dumps([TWO[0], {**TWO[1], **change}]),
              "--output_dir", str(tmp_path / "run")])  # fmt: skip
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message and said in message, message


def test_a_think_answer_source_under_qwen3_5s_thinking_prompt_stops_before_the_weights_load(family_model_dir,
                                                                                             tmp_path):  # fmt: skip
    """Qwen3.5's template opens <think> in every generation prompt: a source whose template answers in
    ``<think>…</think><answer>…</answer>`` would score a format reward of 0 on every row beside sources that learn.
    The mixture stops in one line naming the source, as a single dataset does; ``opening_in_completion`` or the
    template's own switch lets it run."""
    from suzak.train import main

    counting = {"name": "counting", "dataset": "clevr_synthetic", "options": {"num_rows": 16}, "prompt_template": "r1v",
                "rewards": ["clevr_count", "think_format"]}  # fmt: skip
    flags = ["--config", "recipes/mixture_smoke.yaml", "--model_name_or_path", str(family_model_dir("qwen3_5")),
             "--datasets", json.dumps([{**TWO[0], "prompt_template": "plain"}, counting]), "--max_steps", "1",
             "--output_dir", str(tmp_path / "run")]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main(flags)
    message = str(stop.value.code)
    assert message.startswith("error: source 'counting': the model's chat template ends every generation prompt "
                              "with <think> (Qwen3.5's thinking mode)") and "\n" not in message, message  # fmt: skip
    main([*flags, "--chat_template_kwargs", '{"enable_thinking": false}', "--eval_rows", "0"])
    assert (tmp_path / "run" / "metrics.csv").is_file()


@pytest.mark.slow
def test_two_ranks_build_one_mixture_and_train_disjoint_rows_of_it(tmp_path, run_env):
    """torchrun, 2 CPU ranks (gloo), recipes/mixture_smoke.yaml: both ranks build the same mixture (the same rows in
    the same order), each generation batch's rows are split between them with no row on both, a row's group stays on
    one rank, over the run each source's share of either rank's prompts follows the 3:1 weights, and
    ``sources/<name>/rows_seen`` counts the rows of both ranks."""
    import csv
    import json
    import sys
    from collections import Counter

    from conftest import run_ok

    out, record = tmp_path / "ddp", tmp_path / "record"
    record.mkdir()
    env = {**run_env, "SUZAK_CACHE": str(tmp_path / "cache")}
    run_ok([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "tests/rank_probe.py", "--record",
            str(record), "--", "--config", "recipes/mixture_smoke.yaml", "--max_steps", "6",
            "--per_device_train_batch_size", "16", "--eval_rows", "0", "--output_dir", str(out)], env,
           timeout=900)  # fmt: skip
    ranks = [json.loads((record / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["dataset"] == ranks[1]["dataset"] and len(ranks[0]["dataset"]) == 32
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == 6
    shares = []
    for rank in ranks:
        prompts = [rows[i] for rows in rank["batches"] for i in range(0, len(rows), 4)]  # one row a group of 4
        assert all(len(set(map(tuple, rows[i : i + 4]))) == 1 for rows in rank["batches"] for i in range(0, 16, 4))
        shares.append(Counter(row[0] for row in prompts))
    for mine, theirs in zip(ranks[0]["batches"], ranks[1]["batches"], strict=True):
        assert not {row[3] for row in mine} & {row[3] for row in theirs}  # no row on both ranks in one batch
    for counts in shares:  # 24 prompts a rank; 3:1 gives 18 colour in expectation (binomial sd ~2.1)
        assert sum(counts.values()) == 24 and 12 <= counts["colour"] <= 23 and counts["boxes"] >= 1, shares
    with open(out / "metrics.csv", newline="") as file:  # rows_seen counts both ranks' rows (96 colour, 32 boxes)
        last = [row for row in csv.DictReader(file) if row.get("loss")][-1]
    for source, size in (("colour", 96), ("boxes", 32)):
        drawn = {row[3] for rank in ranks for rows in rank["batches"] for row in rows if row[0] == source}
        assert float(last[f"sources/{source}/rows_seen"]) == pytest.approx(len(drawn) / size), (source, len(drawn))


@pytest.mark.parametrize(("change", "said"), [
    ({"dataset": "grounding_shape"}, "source 'boxes'"),
    ({"rewards": ["clevr_count"], "reward_weights": [1.0]}, "source 'boxes'"),
])  # fmt: skip
def test_a_source_its_builder_or_rewards_cannot_serve_stops_before_the_weights_load(change, said, tmp_path, capsys):
    """An unknown builder, or a reward whose parser cannot read a source's gold answers (the pre-flight per source):
    one line naming the source from `suzak train`, before any model loads."""
    import yaml

    from suzak.train import main

    with open("recipes/mixture_smoke.yaml") as file:
        sources = yaml.safe_load(file)["datasets"]
    sources[1] = {**sources[1], **change}
    with pytest.raises(SystemExit) as stop:
        main(["--config", "recipes/mixture_smoke.yaml", "--datasets", json.dumps(sources),
              "--output_dir", str(tmp_path / "run")])  # fmt: skip
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message and said in message, message
    assert "loaded " not in capsys.readouterr().err


def test_text_rows_share_a_mixture_and_its_batches_with_image_rows(tiny_model_dir, tmp_path):
    """GSM8K-style text rows beside colour squares on a VL model: the text source's messages become one text part
    each (rendered as before by Qwen's template), every step's batch holds rows of both, each scored by its own
    rewards."""
    import csv

    import datasets as hf

    from suzak.data import build_dataset
    from suzak.train import main

    colour = build_dataset("color_squares", num_rows=4, seed=0, template="plain")
    math = build_dataset("gsm8k_synthetic", num_rows=4, seed=0, template="gsm8k")
    assert math.features["prompt"].feature["content"] == hf.Value("string")
    sources = parse_sources([{"name": "colour", "dataset": "c", "rewards": ["word_match"]},
                             {"name": "math", "dataset": "m", "rewards": ["gsm8k_accuracy"]}])  # fmt: skip
    mixed = combine([colour, math], sources, seed=0)
    texts = sorted(row["prompt"][-1]["content"][0]["text"] for row in mixed if row["source"] == "math")
    assert all(len(row["prompt"][-1]["content"]) == 1 for row in mixed if row["source"] == "math")
    assert texts == sorted(row["prompt"][-1]["content"] for row in math)
    entries = [{"name": "colour", "dataset": "color_squares", "options": {"num_rows": 48, "seed": 0},
                "prompt_template": "plain", "rewards": ["word_match"]},
               {"name": "math", "dataset": "gsm8k_synthetic", "options": {"num_rows": 48, "seed": 0},
                "prompt_template": "gsm8k", "rewards": ["gsm8k_accuracy", "gsm8k_format"]}]  # fmt: skip
    out = tmp_path / "run"
    # unshuffled, every batch holds the epoch's interleaving (2 rows of each); shuffled, each step of 4 prompts holds
    # one source alone with probability 1/8
    main(["--config", "recipes/mixture_smoke.yaml", "--model_name_or_path", str(tiny_model_dir), "--datasets",
          json.dumps(entries), "--max_steps", "3", "--eval_rows", "4", "--eval_steps", "3", "--shuffle_dataset",
          "false", "--output_dir", str(out)])  # fmt: skip
    with open(out / "completions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    by_step = Counter((row["step"], row["source"]) for row in rows)
    assert all(by_step[(step, source)] > 0 for step in ("1", "2", "3") for source in ("colour", "math")), by_step
    assert all(row["reward/math/gsm8k_accuracy"] == "" for row in rows if row["source"] == "colour")
    assert all(row["reward/colour/word_match"] == "" for row in rows if row["source"] == "math")


def test_sft_on_a_mixture_targets_each_row_in_its_sources_format_and_evaluates_each_source(tmp_path, run_env):
    """``suzak sft`` of recipes/sft_mixture_smoke.yaml (a warm start before a mixture's GRPO): every row's target is
    its gold answer in its own source's answer format, in the model's box frame at its source's budget, so each of
    its source's rewards gives it full marks; each source's held-out rows are scored by its own first reward."""
    import asyncio
    import csv
    import inspect
    import sys

    from conftest import run_ok
    from suzak.data.targets import to_sft_dataset
    from suzak.media.boxes import with_box_frame
    from suzak.training.build import RunInputs, build_datasets, sft_trainer
    from suzak.training.configs import parse_sft_args
    from suzak.trl_internals.rewards import reward_call_kwargs

    suzak_args, sft_args, model_args = parse_sft_args(["--config", "recipes/sft_mixture_smoke.yaml", "--output_dir",
                                                       str(tmp_path / "unused"), "--max_steps", "1"])  # fmt: skip
    inputs = RunInputs.read(suzak_args, model_args)
    dataset, _ = build_datasets(suzak_args, sft_args, inputs)  # the rows before sft_trainer fits their images
    formats = {source.name: template.answer_format for source, _, template in inputs.sources}
    rows = list(to_sft_dataset(dataset, formats, inputs.family, inputs.budget))
    trained = sft_trainer(suzak_args, sft_args, model_args).train_dataset
    assert [row["completion"] for row in trained] == [row["completion"] for row in rows]
    assert {row["source"] for row in rows} == {"colour", "boxes"}
    for source, funcs, _ in inputs.sources:
        mine = [with_box_frame(row, inputs.family, inputs.budget) for row in rows if row["source"] == source.name]
        for func in funcs:
            scores = func(**reward_call_kwargs(mine, [row["completion"] for row in mine]))
            scores = asyncio.run(scores) if inspect.isawaitable(scores) else scores
            assert scores == [1.0] * len(mine), (source.name, func.__name__)
    out = tmp_path / "sft"
    run_ok([sys.executable, "-m", "suzak.sft", "--config", "recipes/sft_mixture_smoke.yaml", "--max_steps", "20",
            "--output_dir", str(out)], run_env)  # fmt: skip
    with open(out / "metrics.csv", newline="") as file:
        evals = [row for row in csv.DictReader(file) if row.get("eval/accuracy")]
    assert [row["step"] for row in evals] == ["0", "20"]
    for row in evals:
        own = float(row["eval/colour/accuracy"]), float(row["eval/boxes/accuracy"])
        assert float(row["eval/accuracy"]) == pytest.approx(sum(own) / 2)


def test_sft_on_a_mixture_of_text_and_image_sources_is_one_line_before_the_weights_load(tmp_path):
    """TRL's SFT collator cannot batch a text row beside image rows; the run stops in one line naming the source."""
    from suzak import SuzakError
    from suzak.training.build import sft_trainer
    from suzak.training.configs import parse_sft_args

    maths = {"name": "maths", "dataset": "gsm8k_synthetic", "options": {"num_rows": 16}, "prompt_template": "gsm8k",
             "rewards": ["gsm8k_accuracy"]}  # fmt: skip
    sources = [{**TWO[0], "prompt_template": "plain"}, maths]
    parsed = parse_sft_args(["--config", "recipes/sft_mixture_smoke.yaml", "--datasets", json.dumps(sources),
                             "--output_dir", str(tmp_path)])  # fmt: skip
    with pytest.raises(SuzakError, match=r"^suzak.sft on a mixture: source\(s\) 'maths' have rows without an image"):
        sft_trainer(*parsed)


# --- issue 67: mixtures as a long real run uses them ------------------------------------------------------------------

LARGE_AND_SMALL = [{"name": "large", "dataset": "color_squares", "options": {"num_rows": 40, "seed": 0},
                    "prompt_template": "plain", "rewards": ["word_match"]},
                   {"name": "small", "dataset": "color_squares", "options": {"num_rows": 4, "seed": 1},
                    "prompt_template": "plain", "rewards": ["word_match"]}]  # fmt: skip


@pytest.mark.slow
def test_a_run_draws_every_row_of_a_large_source_within_an_epoch_and_counts_them_across_a_resume(tmp_path, run_env):
    """A 40-row source beside a 4-row one at equal weights: a pass holds 22 rows of each, so one pass drew 22 of the
    40 rows, and every epoch drew the same 22. An epoch is now 2 passes (88 rows: 4 steps of 22 prompts), in which
    every row of the large source is drawn; ``sources/<name>/rows_seen`` counts the distinct rows drawn so far, and a
    run resumed from its step-2 checkpoint counts on from there."""
    import csv
    import sys

    from conftest import run_ok

    out = tmp_path / "run"
    flags = [sys.executable, "-m", "suzak.train", "--config", "recipes/mixture_smoke.yaml", "--datasets",
             json.dumps(LARGE_AND_SMALL), "--eval_rows", "0", "--per_device_train_batch_size", "44",
             "--num_generations", "2", "--max_completion_length", "4", "--lr_scheduler_type", "constant",
             "--save_strategy", "steps", "--save_steps", "2", "--output_dir", str(out)]  # fmt: skip
    first = run_ok([*flags, "--max_steps", "2"], run_env)
    assert ("mixture: one epoch = 2 passes of 44 rows (large 22 a pass, small 22); every row of every source drawn at "
            "least once per epoch") in first.stderr  # fmt: skip
    run_ok([*flags, "--max_steps", "4", "--resume_from_checkpoint", "latest"], run_env)
    with open(out / "completions.csv", newline="") as file:
        drawn = [(int(row["step"]), row["source"], int(row["source_row"])) for row in csv.DictReader(file)]
    assert {row for step, source, row in drawn if source == "large"} == set(range(40))
    with open(out / "metrics.csv", newline="") as file:
        logs = [row for row in csv.DictReader(file) if row.get("loss")]
    assert [int(log["step"]) for log in logs] == [1, 2, 3, 4]
    for log in logs:  # the fraction of each source's rows drawn up to this step, the resumed steps included
        for source, size in (("large", 40), ("small", 4)):
            seen = {row for step, name, row in drawn if name == source and step <= int(log["step"])}
            assert float(log[f"sources/{source}/rows_seen"]) == pytest.approx(len(seen) / size), (log["step"], source)
    assert float(logs[-1]["sources/large/rows_seen"]) == float(logs[-1]["sources/small/rows_seen"]) == 1.0


def test_max_train_rows_holds_for_a_mixture_split_by_weight(tmp_path, caplog):
    """``max_train_rows 8`` on the 3:1 smoke mixture trained 24 distinct rows in 6 steps: now 8 in all, 6 and 2, each
    source's first rows after its shuffle by the seed, as one dataset keeps its own; fewer than one a source is one
    line from the parser."""
    import logging

    from suzak.data import build_dataset
    from suzak.training.build import RunInputs, build_datasets
    from suzak.training.configs import parse_args

    suzak_args, args, model_args = parse_args(["--config", "recipes/mixture_smoke.yaml", "--max_train_rows", "8",
                                               "--output_dir", str(tmp_path)])  # fmt: skip
    with caplog.at_level(logging.INFO, logger="suzak.training.build"):
        dataset, _ = build_datasets(suzak_args, args, RunInputs.read(suzak_args, model_args))
    kept = {source: {row["index"] for row in dataset if row["source"] == source} for source in ("colour", "boxes")}
    assert {source: len(rows) for source, rows in kept.items()} == {"colour": 6, "boxes": 2}
    colour = build_dataset("color_squares", num_rows=96, seed=0, template="plain").select(range(88))  # 8 held out
    assert kept["colour"] == set(colour.shuffle(seed=0).select(range(6))["index"])
    assert "max_train_rows 8: colour keeps 6 of its 88 rows, boxes keeps 2 of its 24 rows" in caplog.text
    with pytest.raises(SuzakError, match=r"^max_train_rows 1: a mixture keeps at least one row of each of its 2 "):
        parse_args(["--config", "recipes/mixture_smoke.yaml", "--max_train_rows", "1", "--output_dir", str(tmp_path)])


@pytest.mark.parametrize(("flags", "said"), [
    (["--datasets", json.dumps([{**TWO[0], "weight": 1}, TWO[1]])], "datasets[0].weight: 3.0 -> 1.0"),
    (["--datasets", json.dumps([{**TWO[0], "name": "colours"}, TWO[1]])], "datasets[0].name: 'colour' -> 'colours'"),
    (["--datasets", json.dumps([{**TWO[0], "options": {"num_rows": 48}}, TWO[1]])],
     "datasets[0].options: {'num_rows': 40} -> {'num_rows': 48}"),
    (["--datasets", json.dumps([TWO[0]])], "datasets: [{'name': 'colour', "),
    (["--max_train_rows", "8"], "max_train_rows: None -> 8"),
])  # fmt: skip
def test_a_resume_that_changes_the_mixtures_rows_is_refused_in_one_line(flags, said, tmp_path):
    """Resumed with an edited ``datasets:`` (weights 3:1 -> 1:1, a source renamed, its options, a source dropped) or
    ``max_train_rows``, a mixture run drew other rows than its checkpoint's as if nothing changed; now refused before
    the model loads, as a changed ``dataset_options`` is, naming what changed. A source's rewards change no row."""
    from suzak.runs.checkpoints import mark_complete
    from suzak.runs.faults import state_settings
    from suzak.training.configs import parse_args
    from suzak.training.session import check_resume_settings

    base = ["--config", "recipes/mixture_smoke.yaml", "--datasets", json.dumps(TWO), "--output_dir", str(tmp_path)]
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    mark_complete(folder, 2, settings=state_settings(parse_args(base)))
    with pytest.raises(SuzakError) as refused:
        check_resume_settings(str(folder), state_settings(parse_args([*base, *flags])), override=False)
    message = str(refused.value)
    assert message.startswith(f"resume_from_checkpoint {folder}: this run changes 1 setting(s) the checkpoint's state "
                              "depends on (") and said in message and "\n" not in message, message  # fmt: skip
    rewarded = [TWO[0], {**TWO[1], "reward_weights": [1.0, 1.0]}]
    check_resume_settings(str(folder), state_settings(parse_args([*base, "--datasets", json.dumps(rewarded)])), False)


def test_skip_bad_rows_lists_every_sources_bad_rows_once_per_run(tmp_path):
    """``skipped_rows.jsonl`` was written source by source, each over the last: only the last source's bad rows were
    listed. It now lists every source's, written once per run: a second run replaces the list instead of adding to
    it, and a run without bad rows removes it."""
    from suzak.training.build import RunInputs, build_datasets
    from suzak.training.configs import parse_args
    from test_validation import write_dataset

    folders = {name: tmp_path / name for name in ("a", "b", "good")}
    for folder in folders.values():
        folder.mkdir()
    write_dataset(folders["a"], [("good.png", "3")] * 9 + [("text.png", "3")])  # line 10: not an image
    write_dataset(folders["b"], [("good.png", "4")] * 8 + [("good.png", "many"), ("good.png", "4")])  # line 9
    write_dataset(folders["good"], [("good.png", "5")] * 10)
    out = tmp_path / "run"
    listing = out / "skipped_rows.jsonl"

    def build(first: str, second: str) -> None:
        sources = [{"name": name, "dataset": str(folders[folder] / "data.jsonl"), "prompt_template": "r1v",
                    "rewards": ["clevr_count"]} for name, folder in (("a", first), ("b", second))]  # fmt: skip
        suzak_args, args, model_args = parse_args([
            "--config", "recipes/mixture_smoke.yaml", "--datasets", json.dumps(sources), "--skip_bad_rows", "true",
            "--max_bad_fraction", "0.2", "--eval_rows", "0", "--output_dir", str(out)])  # fmt: skip
        build_datasets(suzak_args, args, RunInputs.read(suzak_args, model_args))

    for _ in range(2):
        build("a", "b")
        listed = [json.loads(line) for line in listing.read_text().splitlines()]
        assert [(row["source"], row["line"], row["column"]) for row in listed] == [("a", 10, "image"),
                                                                                   ("b", 9, "solution")]  # fmt: skip
    build("good", "good")
    assert not listing.exists()


def test_a_sources_own_eval_rows_without_eval_steps_stop_before_the_weights_load(tmp_path, monkeypatch):
    """A source's own ``eval_rows`` with no ``eval_steps`` (and the recipe's eval_rows 0) was refused once the
    weights had loaded; the parser refuses it now, in the same words."""
    import yaml

    import suzak.training.build as build
    from suzak.train import main

    def loaded(*args, **kwargs):
        raise AssertionError("the weights loaded")

    monkeypatch.setattr(build, "load_policy", loaded)
    with open("recipes/mixture_smoke.yaml") as file:
        recipe = yaml.safe_load(file)
    del recipe["eval_steps"]
    recipe.update(eval_rows=0, output_dir=str(tmp_path / "run"))
    recipe["datasets"][1]["eval_rows"] = 4
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit) as stop:
        main(["--config", str(path)])
    assert str(stop.value.code) == "error: eval_rows needs eval_steps: how often to generate the held-out answers"
