#!/usr/bin/env python3
"""Expert load over training from MoE runs' metrics.jsonl (train/moe.hpp's figures).

  scripts/moe_load.py OUT_PREFIX RUN_DIR...

Groups the runs by recipe (config.json's recipe name) and writes
  OUT_PREFIX.tsv   step, then per recipe the mean over its seeds of max_load (max over layers and
                   experts of E * f_e; 1 = balanced) and of the auxiliary loss
  OUT_PREFIX.png   max_load against step per recipe (gnuplot, when it is installed)
and prints per recipe: seeds, final max_load mean [min, max], the largest max_load seen, final aux loss.
"""
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict


def recipe_of(run_dir):
    with open(os.path.join(run_dir, "config.json")) as f:
        r = json.load(f).get("recipe")
    return r if isinstance(r, str) else (r or {}).get("name", "custom")


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    prefix, runs = argv[1], argv[2:]
    series = defaultdict(list)  # recipe -> [ {step: (max_load, aux)} per seed ]
    for d in runs:
        pts = {}
        with open(os.path.join(d, "metrics.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                if "max_load" in rec:
                    pts[rec["step"]] = (rec["max_load"], rec["moe_aux_loss"])
        if not pts:
            print(f"moe_load.py: {d}/metrics.jsonl has no max_load (not an MoE run?)", file=sys.stderr)
            return 2
        series[recipe_of(d)].append(pts)
    recipes = sorted(series)
    steps = sorted(set.intersection(*[set(p) for r in recipes for p in series[r]]))
    with open(prefix + ".tsv", "w") as f:
        f.write("step\t" + "\t".join(f"{r}_max_load\t{r}_aux" for r in recipes) + "\n")
        for s in steps:
            cols = []
            for r in recipes:
                ps = series[r]
                cols.append(sum(p[s][0] for p in ps) / len(ps))
                cols.append(sum(p[s][1] for p in ps) / len(ps))
            f.write(f"{s}\t" + "\t".join(f"{v:.6g}" for v in cols) + "\n")
    print("recipe                 seeds  final max_load mean [min, max]   peak max_load   final aux")
    for r in recipes:
        ps = series[r]
        last = [p[steps[-1]][0] for p in ps]
        peak = max(v[0] for p in ps for v in p.values())
        aux = sum(p[steps[-1]][1] for p in ps) / len(ps)
        print(f"{r:22s} {len(ps):5d}  {sum(last)/len(last):8.3f} [{min(last):.3f}, {max(last):.3f}]"
              f"   {peak:13.3f}   {aux:.5f}")
    if shutil.which("gnuplot"):
        plots = ", ".join(f"'{prefix}.tsv' using 1:{2 + 2 * i} with lines lw 2 title '{r}'"
                          for i, r in enumerate(recipes))
        script = (f"set terminal pngcairo noenhanced size 900,500\nset output '{prefix}.png'\nset grid\n"
                  "set xlabel 'step'\nset ylabel 'max over layers, experts of E f_e (1 = balanced)'\n"
                  f"set key top right\nplot {plots}\n")
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
