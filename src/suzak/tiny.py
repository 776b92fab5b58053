"""``python -m suzak.tiny``: the command; the code is :mod:`suzak.models.tiny`."""

from suzak.models.tiny import main

if __name__ == "__main__":
    main()
