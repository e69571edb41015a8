#!/usr/bin/env python3
"""Are two sets of runs the same computation? Compares every run directory under BASE with the one of the
same name under NEW: each metrics.jsonl record (losses, learning rate, gradient norm, evaluations) must be
equal, key for key and value for value (JSON numbers as written: the doubles' round-trip text), except the
timing keys (ms_per_step, items_per_s). Prints one line per run and a total; exit 0 only if every run matches.

  scripts/metrics_same.py BASE_DIR NEW_DIR
"""
import json
import os
import sys

TIMING = {"ms_per_step", "items_per_s"}


def records(path):
    with open(path) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f if line.strip()]


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    base, new = sys.argv[1], sys.argv[2]
    names = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)) and not d.endswith(".old"))
    bad = 0
    for n in names:
        a, b = os.path.join(base, n, "metrics.jsonl"), os.path.join(new, n, "metrics.jsonl")
        if not (os.path.exists(a) and os.path.exists(b)):
            print(f"MISSING {n}: {a if not os.path.exists(a) else b}")
            bad += 1
            continue
        ra, rb = records(a), records(b)
        diff = [i for i in range(max(len(ra), len(rb))) if i >= len(ra) or i >= len(rb) or ra[i] != rb[i]]
        if diff:
            i = diff[0]
            print(f"DIFFER  {n}: {len(diff)} of {max(len(ra), len(rb))} records; first at record {i}: "
                  f"{ra[i] if i < len(ra) else None} vs {rb[i] if i < len(rb) else None}")
            bad += 1
        else:
            losses = [r["loss"] for r in ra if "loss" in r]
            print(f"same    {n}: {len(ra)} records, last loss {losses[-1] if losses else '-'}")
    print(f"metrics_same: {len(names) - bad} of {len(names)} runs identical")
    return 0 if names and bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
