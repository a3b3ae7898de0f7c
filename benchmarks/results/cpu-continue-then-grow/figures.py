"""Per run of ab.sh: counts from the manifest, and the tokens the engine generated on the first pass and on retries
(`new_output_tokens`: a continuation's own tokens, not the cut-off text it keeps), retry attempts by strategy, and
outputs left cut off. Usage: python figures.py /tmp/ctg/out-*"""

import json
import sys
from pathlib import Path

import pandas as pd

for folder in map(Path, sys.argv[1:]):
    counts = json.loads((folder / "current" / "manifest.json").read_text())["counts"]
    attempts = pd.read_parquet(folder / "current" / "attempts")
    retries = attempts[attempts.attempt > 1]
    latest = attempts.sort_values("attempt").groupby(["item_id", "candidate"]).tail(1)
    print(f"{folder.name}: accepted {counts['accepted']}, rejected {counts['rejected']}, "
          f"cut off on the first pass {counts['truncated_first_pass']}, "
          f"first-pass tokens {int(attempts[attempts.attempt == 1].new_output_tokens.sum())}, "
          f"retry tokens {int(retries.new_output_tokens.sum())}, "
          f"retry attempts {retries.strategy.value_counts().to_dict()}, "
          f"left cut off {int((latest.finish_reason == 'length').sum())}")
