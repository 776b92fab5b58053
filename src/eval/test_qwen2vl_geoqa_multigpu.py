"""R1-V's multi-GPU GeoQA evaluation (754 questions), data parallel over the listed GPUs. Run from src/eval/:

    python test_qwen2vl_geoqa_multigpu.py --model_path M --batch_size 4 --output_path O --prompt_path P --gpu_ids 0,1

One process per GPU in ``--gpu_ids`` (default: every visible GPU; without a CUDA GPU, one CPU process), each
generating its share of the questions; the first gathers them, prints ``Accuracy: XX.XX%`` (R1-V's rule by default)
and writes R1-V's results JSON plus a markdown summary. ``--batch_size`` is per GPU (default 4, as R1-V's script).
``--help`` lists the options; the logic is in ``suzak.eval.multigpu``.
"""

from suzak.eval.multigpu import main

if __name__ == "__main__":
    main()
