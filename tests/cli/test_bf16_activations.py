#!/usr/bin/env python3
"""`fp4lab train configs/gpt_baby.json` under precision.activations "bf16" (docs/DESIGN.md, "BF16
activations") against the same run under "fp32" (python3 stdlib only): both train (the loss falls), their
step losses differ (the mode is in effect) but stay close (within 3% at every logged step and at the
evaluation: BF16 activations round each stored tensor by at most 2^-9 relative, which a 60-step run does not
amplify past that); the bf16 run's config.json and run directory name the mode; a bad value is refused with
exit 2 and one line naming the key, the value and the valid ones.
Usage: test_bf16_activations.py FP4LAB_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile

FP4LAB = os.path.abspath(sys.argv[1])
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "gpt_baby.json")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def train(cwd, *sets):
    args = [FP4LAB, "train", CONFIG]
    for s in ("training.steps=60", "training.warmup_steps=10", "training.decay_steps=60",
              "training.eval_interval=60", "training.eval_iters=2", "training.log_interval=5", "threads=2",
              "output.dir=runs") + sets:
        args += ["--set", s]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True)


def losses(run_dir):
    steps, evals = {}, {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("eval"):
                evals[r["step"]] = r["val_loss"]
            elif "loss" in r:
                steps[r["step"]] = r["loss"]
    return steps, evals


with tempfile.TemporaryDirectory() as t:
    os.makedirs(os.path.join(t, "data"))  # gpt_baby's character data, relative to the working directory
    with open(os.path.join(t, "data", "tinyshakespeare.txt"), "w") as f:
        for i in range(600):
            f.write(f"line {i}: the quick brown fox jumps over the lazy dog, again and again.\n")
    runs, seen = {}, set()
    for mode in ("fp32", "bf16"):
        p = train(t, f"precision.activations={mode}")
        check(p.returncode == 0, f"{mode}: exit {p.returncode}: {p.stderr[-2000:]}")
        dirs = {d for d in os.listdir(os.path.join(t, "runs")) if os.path.isdir(os.path.join(t, "runs", d))}
        runs[mode] = [os.path.join(t, "runs", d) for d in sorted(dirs - seen)]  # the run this mode made
        seen |= dirs
    if not failures:
        check(len(runs["fp32"]) == 1 and len(runs["bf16"]) == 1, f"run directories: {runs}")
    if not failures:
        d32, d16 = runs["fp32"][0], runs["bf16"][0]
        check(os.path.basename(d16) == "gpt_baby-fp32-bf16act-s1", f"bf16 run directory {d16}")
        check(os.path.basename(d32) == "gpt_baby-fp32-s1", f"fp32 run directory {d32}")
        with open(os.path.join(d16, "config.json")) as f:
            check(json.load(f).get("precision") == {"activations": "bf16"}, "bf16 config.json lacks precision")
        with open(os.path.join(d32, "config.json")) as f:
            check("precision" not in json.load(f), "fp32 config.json names precision (the default stays out)")
        s32, e32 = losses(d32)
        s16, e16 = losses(d16)
        check(sorted(s32) == sorted(s16) and len(s32) == 12, f"logged steps {sorted(s32)} vs {sorted(s16)}")
        check(s16[60] < 0.8 * s16[5], f"bf16 does not train: step 5 {s16[5]}, step 60 {s16[60]}")
        check(any(s16[k] != s32[k] for k in s32), "bf16 step losses equal fp32's: the mode had no effect")
        for k in s32:
            check(abs(s16[k] - s32[k]) <= 0.03 * s32[k], f"step {k}: bf16 loss {s16[k]} vs fp32 {s32[k]}")
        check(abs(e16[60] - e32[60]) <= 0.03 * e32[60], f"val_loss at 60: bf16 {e16[60]} vs fp32 {e32[60]}")
        print(f"gpt_baby 60 steps: final loss fp32 {s32[60]:.5f} bf16 {s16[60]:.5f}; "
              f"val_loss fp32 {e32[60]:.5f} bf16 {e16[60]:.5f}")
    p = train(t, "precision.activations=fp16")
    want = 'config.precision.activations: "fp16" is not valid; valid: fp32, bf16'
    check(p.returncode == 2 and want in p.stderr, f"bad value: exit {p.returncode}, stderr {p.stderr!r}")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
