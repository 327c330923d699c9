"""Summarize the tile tuner's debug log (`logging` at DEBUG for "rtdnn.tiles", as
gpu_direct.sh writes it to $OUT/tiles.log): per tuned problem, every candidate's time and the
one chosen, so that a run shows which tile families win where; and at the end, over the
problems printed, the sum of their first candidates' times (what runs untuned where the
shipped table lacks a problem) against the sum of the chosen ones.

    python benchmarks/probes/tiles_log.py TILES_LOG [SUBSTRING ...]
    (only problems whose key holds every SUBSTRING, e.g. backward_filter 'g768')
"""

import re
import sys

TIMED = re.compile(r"\('(\w+)', '(.*)'\): (\w+)\((.*)\) ([0-9.]+) ms$")
CHOSEN = re.compile(r"\('(\w+)', '(.*)'\): chose (\w+)\((.*)\) \(([0-9.]+) ms\)$")
#: Fields left out of the printed tiles: the same for every candidate of a family.
QUIET = ("group_m=1, ", "num_stages=1, ")


def short(fields: str) -> str:
    for quiet in QUIET:
        fields = fields.replace(quiet, "")
    return fields


def main() -> None:
    path, *wanted = sys.argv[1:]
    current = None
    first: dict[str, float] = {}  # problem -> its first candidate's time
    best: dict[str, float] = {}  # problem -> the chosen candidate's time
    for line in open(path):
        line = line.strip()
        chosen = CHOSEN.search(line)
        timed = None if chosen else TIMED.search(line)
        match = chosen or timed
        if not match or not all(w in match[2] for w in wanted):
            continue
        algo, key, kind, fields, ms = match.groups()
        if key != current:
            print(f"{algo} {key}")
            current = key
        mark = "chose" if chosen else "     "
        print(f"  {mark} {float(ms):8.4f} ms  {kind}({short(fields)})")
        (best if chosen else first).setdefault(key, float(ms))
    tuned = [key for key in best if key in first]
    untuned_ms, tuned_ms = sum(first[k] for k in tuned), sum(best[k] for k in tuned)
    changed = sum(best[k] < first[k] for k in tuned)
    print(
        f"{len(tuned)} problems ({changed} not on their first candidate): first candidates "
        f"{untuned_ms:.3f} ms, chosen {tuned_ms:.3f} ms in all"
    )


if __name__ == "__main__":
    main()
