"""``python -m suzak.data BUILDER --output DIR [--format disk|parquet|jsonl] …``"""

from suzak.data.builders import main

main()
