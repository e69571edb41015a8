#!/usr/bin/env python3
"""compare --by / --metric on real run archives (session 38's, docs/results/data/bf16_activations_2026-12-03),
Python stdlib only: the three commands its README gives reproduce the Welch differences, intervals, df and p
that best_val_welch.py printed there (the script, now in git history, computed them from the summaries' best
with its own t distribution; mpmath at 40 digits agrees to 10 digits). Also: the arms (model.attention absent
from runs_fp32attn's configs stands for "fp32"), the CLI's refusals (one line naming the key or value, exit 2),
and sweep --metric best (two tiny runs: the table and statistics of compare --metric best).
Usage: test_compare_data.py FP4LAB SOURCE_DIR"""
import json
import os
import subprocess
import sys
import tempfile

FP4LAB = os.path.abspath(sys.argv[1])
DATA = os.path.join(os.path.abspath(sys.argv[2]), "docs", "results", "data", "bf16_activations_2026-12-03")
fails = 0


def check(cond, msg):
    global fails
    if not cond:
        fails += 1
        print("FAIL: " + msg)
    return cond


def runs(*dirs):
    return [os.path.join(DATA, d, r) for d in dirs for r in sorted(os.listdir(os.path.join(DATA, d)))]


def compare(t, *args):
    p = subprocess.run([FP4LAB, "compare", *args, "--plot", os.path.join(t, "c.png")], capture_output=True,
                       text=True, env={**os.environ, "PATH": t})  # no gnuplot on this PATH: the JSON only
    return p.returncode, p.stdout, p.stderr


# best_val_welch.py's lines: "A -> B: diff D  95% CI [LO, HI]  Welch df DF  p P" (D = mean B - mean A).
WANT = [
    (["--by", "model.attention"], ("runs_fp32attn", "runs_fp32"), "fp32", "bf16_flash",
     ("+0.00049", "-0.01166", "+0.01264", "2.4", "0.89")),
    (["--by", "precision.activations"], ("runs_fp32", "runs_bf16"), "fp32", "bf16",
     ("-0.00243", "-0.02082", "+0.01595", "3.3", "0.71")),
    (["--by", "precision.activations"], ("runs_gpt2_fp32", "runs_gpt2_bf16"), "fp32", "bf16",
     ("+0.00184", "-0.05025", "+0.05394", "3.7", "0.92")),
]

with tempfile.TemporaryDirectory(prefix="fp4lab_compare_data_") as t:
    for by, dirs, base, other, want in WANT:
        rc, out, err = compare(t, *by, "--metric", "best", *runs(*dirs))
        if not check(rc == 0, f"compare {by} {dirs}: exit {rc}: {err}"):
            continue
        j = json.load(open(os.path.join(t, "c.json")))
        check(j["baseline"] == base and j["compared"] == "best" and j["by"] == by[1:], f"{dirs}: {j['baseline']}")
        arms = [r["recipe"] for r in j["recipes"]]
        check(sorted(arms) == sorted([base, other]), f"{dirs}: arms {arms}")
        tv = [r for r in j["recipes"] if r["recipe"] == other][0]["tests_vs_baseline"]
        got = ("%+.5f" % tv["welch_diff"], "%+.5f" % tv["welch_ci95"][0], "%+.5f" % tv["welch_ci95"][1],
               "%.1f" % tv["welch_df"], "%.2f" % tv["welch_p"])
        check(got == want, f"{dirs}: compare gives {got}, best_val_welch.py gave {want}")
        check(all(r[("best")]["n"] == 3 for r in j["recipes"]), f"{dirs}: not 3 runs an arm")
        check("statistics: " in out and "loss curves" not in out, f"{dirs}: {out[-300:]}")

    # The final metric differs (the best is the third seed's ~1.457, the final ~1.70).
    rc, out, err = compare(t, "--by", "precision.activations", *runs("runs_fp32", "runs_bf16"))
    j = json.load(open(os.path.join(t, "c.json"))) if rc == 0 else {}
    check(rc == 0 and j.get("compared") == "final" and j["recipes"][0]["final"]["mean"] > 1.6,
          f"--metric final: {rc} {err}")
    # Without --by: one arm (all are recipe bf16).
    rc, out, err = compare(t, *runs("runs_fp32", "runs_bf16"))
    j = json.load(open(os.path.join(t, "c.json"))) if rc == 0 else {}
    check(rc == 0 and [r["recipe"] for r in j["recipes"]] == ["bf16"], f"no --by: {rc} {err}")

    # Refusals: exit 2, one line naming what is wrong.
    r = runs("runs_fp32")
    for args, want in [
        (["--by", "precison.activations"], "compare: --by \"precison.activations\": no run's config.json has this key"),
        (["--by", "model"], "config.json: key \"model\": an object; --by takes keys whose values are strings"),
        (["--by", "model.attention,", "--metric", "best"], "compare: --by \"\": not a config key"),
        (["--by", "model.attention", "--baseline", "flash"], "valid --baseline: \"bf16_flash\""),
    ]:
        rc, out, err = compare(t, *args, *r)
        lines = err.strip().splitlines()
        check(rc == 2 and len(lines) == 1 and want in lines[0], f"{args}: exit {rc}, {err!r}")
    rc, out, err = compare(t, "--metric", "last", *r)
    check(rc != 0 and "--metric" in err and "final" in err, f"--metric last: exit {rc}, {err!r}")
    p = subprocess.run([FP4LAB, "compare", "--help"], capture_output=True, text=True)
    check("--by" in p.stdout and "--metric" in p.stdout, "compare --help names --by and --metric")
    check(not os.path.exists(os.path.join(DATA, "runs_fp32", "compare.json")), "wrote into the data directory")

    # sweep --metric best: two 6-step runs of a tiny GPT; its table and statistics are compare --metric best's of
    # the same run directories (the runs are not trained again by the second command).
    text = os.path.join(t, "words.txt")
    with open(text, "w") as f:
        f.write(" ".join("alpha beta gamma delta epsilon zeta eta theta".split()[i % 8] for i in range(4000)))
    cfg = {"name": "sweep_metric", "recipe": "fp32", "seed": 1, "backend": "cpu", "threads": 1,
           "model": {"type": "gpt", "layers": 1, "heads": 2, "width": 16, "context": 8, "dropout": 0.0},
           "data": {"type": "char", "path": text},
           "training": {"batch_size": 4, "steps": 6, "lr": 3e-2, "warmup_steps": 0, "eval_interval": 2,
                        "eval_iters": 1, "log_interval": 1},
           "output": {"dir": os.path.join(t, "runs")}}
    with open(os.path.join(t, "sweep.json"), "w") as f:
        json.dump(cfg, f)
    p = subprocess.run([FP4LAB, "sweep", os.path.join(t, "sweep.json"), "--seeds", "1,2", "--quiet", "--metric",
                        "best", "--plot", os.path.join(t, "s.png")], capture_output=True, text=True,
                       env={**os.environ, "PATH": t})
    sj = json.load(open(os.path.join(t, "s.json"))) if p.returncode == 0 else {}
    dirs = [os.path.join(t, "runs", f"sweep_metric-fp32-s{s}") for s in (1, 2)]
    rc, out, err = compare(t, "--metric", "best", *dirs)
    cj = json.load(open(os.path.join(t, "c.json"))) if rc == 0 else {}
    check(p.returncode == 0 and sj.get("compared") == "best" and sj["recipes"] == cj["recipes"]
          and p.stdout.replace("s.png", "c.png").replace("s.json", "c.json") == out,
          f"sweep --metric best vs compare --metric best: {p.returncode} {p.stderr[-400:]}\n{p.stdout!r}\n{out!r}\n"
          f"{sj.get('recipes')}\n{cj.get('recipes')}\ncompare: {rc} {err}")

print(f"test_compare_data: {fails} failure(s)")
sys.exit(1 if fails else 0)
