"""``python -m suzak.eval {superclevr,geoqa,gsm8k,clevr_synthetic} --model_path M …`` and
``python -m suzak.eval rescore RESULTS.json --task {superclevr,geoqa,clevr_synthetic} …``"""

from suzak.eval.cli import main

if __name__ == "__main__":
    main()
