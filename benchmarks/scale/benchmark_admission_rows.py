"""CPU per admitted episode's rows from data files of many row groups (LeRobot v3.0 writes a row group
per episode), for one or two checkouts side by side:

    python benchmarks/scale/benchmark_admission_rows.py --checkouts /path/old /path/new

Each checkout runs in its own process (``PYTHONPATH=<checkout>``) on the same tabular dataset (2,000
episodes of 2 rows in two data files of 1,000 row groups), reads 400 episodes round the files through
``RowReader`` (footers kept open) and prints the process CPU time per admission, twice.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

_ONE = r'''
import sys, time
from episodestream._format.metadata import load_metadata
from episodestream._format.rows import RowReader
from episodestream._runtime.sources import open_source
root = sys.argv[1]
files = open_source(root, revision=None)
meta = load_metadata(files)
for _ in range(2):
    reader = RowReader(files, meta, max_open_files=2, max_open_row_groups=4096)
    reader.read(meta.episodes[0]); reader.read(meta.episodes[1000])  # footers open, imports warm
    start = time.process_time()
    for k in range(400):
        reader.read(meta.episodes[(k * 7) % 2000])
    print(f"{(time.process_time() - start) / 400 * 1e3:.2f}", flush=True)
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkouts", nargs="+", required=True)
    args = parser.parse_args()
    from episodestream.tools.synthetic import write_tabular_dataset

    root = write_tabular_dataset(os.path.join(tempfile.mkdtemp(), "ds"), num_episodes=2000, episode_length=2,
                                 episodes_per_data_file=1000)
    for checkout in args.checkouts:
        checkout = os.path.abspath(checkout)
        env = {**os.environ, "PYTHONPATH": checkout}
        out = subprocess.run([sys.executable, "-c", _ONE, str(root)], env=env, capture_output=True, text=True,
                             check=True, cwd=checkout).stdout.split()
        print(f"{checkout}: {', '.join(out)} ms of CPU per admission (1,000 row groups per file)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
