"""``python -m suzak.selftest``: the self-test command (:func:`suzak.selftest.cli.main`)."""

from suzak.selftest.cli import main

if __name__ == "__main__":
    main()
