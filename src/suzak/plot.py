"""``python -m suzak.plot``: the command; the code is :mod:`suzak.runs.plots`."""

from suzak.runs.plots import main

if __name__ == "__main__":
    main()
