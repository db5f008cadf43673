"""A lean re-implementation of Composer's trace merge: the benchmark's stricter Composer peer.

Composer's published ``composer.profiler.json_trace_merger`` (measured too when the ``mosaicml``
wheel is installed) parses every file whole four times and writes each event with ``json.dump``,
which encodes in pure Python. This keeps its algorithm with less of that cost:

1. for every file, load the whole JSON to find the ``global_rank`` metadata event;
2. for every file, load the whole JSON again to find its ``clock_sync_timestamp_us``;
3. for every file, load the whole JSON a third time and write each event, shifted by the
   difference between its rank's clock-sync timestamp and rank 0's (the error bound is not used),
   as one ``json.dumps`` line of a JSON array.

Usage: python bench/composer_merge.py -o OUTPUT FILE...  (the published merger's arguments)
"""

from __future__ import annotations

import json
import sys


def _events(path: str) -> list[dict]:
    with open(path) as handle:
        data = json.load(handle)
    return data if isinstance(data, list) else data["traceEvents"]


def _metadata_value(path: str, name: str):
    for event in _events(path):
        if event.get("ph") == "M" and event.get("name") == name:
            return event["args"]["value"]
    raise RuntimeError(f"{path}: no {name} metadata event")


def merge_traces(output: str, *files: str) -> None:
    ranks = {path: _metadata_value(path, "global_rank") for path in files}
    clock_sync = {ranks[path]: _metadata_value(path, "clock_sync_timestamp_us") for path in files}
    reference = clock_sync[min(clock_sync)]
    with open(output, "w") as out:
        out.write("[\n")
        first = True
        for path in files:
            shift = clock_sync[ranks[path]] - reference
            for event in _events(path):
                if "ts" in event:
                    event["ts"] = event["ts"] - shift
                out.write(("" if first else ",\n") + json.dumps(event))
                first = False
        out.write("\n]\n")


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "-o":
        raise SystemExit("usage: python bench/composer_merge.py -o OUTPUT FILE...")
    merge_traces(sys.argv[2], *sys.argv[3:])
