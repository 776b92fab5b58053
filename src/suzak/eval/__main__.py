"""``python -m suzak.eval {superclevr,geoqa,gsm8k,clevr_synthetic} --model_path M …``"""

from suzak.eval.cli import main

if __name__ == "__main__":
    main()
