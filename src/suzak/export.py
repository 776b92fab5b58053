"""``python -m suzak.export``: the command; the code is :mod:`suzak.release.export`."""

from suzak.release.export import main

if __name__ == "__main__":
    main()
