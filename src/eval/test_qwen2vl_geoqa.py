"""R1-V's GeoQA evaluation (754 questions), on suzak's engine. Run from src/eval/:

    python test_qwen2vl_geoqa.py --model_path Qwen/Qwen2.5-VL-3B-Instruct --batch_size 50

Reads prompts/geoqa_test_prompts.jsonl with images under ./Geo170K/images/test/ (see prompts/README.md), prints
``Accuracy: XX.XX%`` and writes R1-V's results JSON plus a markdown summary. ``--help`` lists the options; the logic
is in ``suzak.eval`` (``python -m suzak.eval geoqa`` is the same command).
"""

from suzak.eval.cli import main

if __name__ == "__main__":
    main(task="geoqa")
