"""``python -m suzak.release --checkpoint DIR --repo_id ID [--dry_run]`` or ``--upload FOLDER``."""

from suzak.release.publish import main

main()
