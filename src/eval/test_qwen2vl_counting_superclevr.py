"""R1-V's SuperCLEVR counting evaluation (200 questions), on suzak's engine. Run from src/eval/:

    python test_qwen2vl_counting_superclevr.py --model_path Qwen/Qwen2-VL-2B-Instruct --batch_size 64

Reads prompts/superclevr_test200_counting_problems.jsonl with images under ./images/ (see prompts/README.md),
prints ``Accuracy: XX.XX%`` and writes R1-V's results JSON plus a markdown summary. ``--help`` lists the options;
the logic is in ``suzak.eval`` (``python -m suzak.eval superclevr`` is the same command).
"""

from suzak.eval.cli import main

if __name__ == "__main__":
    main(task="superclevr")
