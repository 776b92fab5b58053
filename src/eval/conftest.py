"""The R1-V eval scripts here are named test_*.py (R1-V's names) but are not tests: pytest must not collect them."""

collect_ignore_glob = ["test_*.py"]
