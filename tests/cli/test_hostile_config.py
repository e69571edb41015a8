#!/usr/bin/env python3
"""`fp4lab train` on hostile config values (issue 42): each must end with exit
code 2 and one stderr line, "fp4lab: error: ...", naming the key (or file) at
fault; never a crash (signal), a hang, an unnamed "out of memory" or a
completed run of garbage. Runs in a temporary directory on a tiny generated
text, so nothing heavy runs even where a check fails.
Usage: test_hostile_config.py PATH/TO/fp4lab. Python standard library only.
Prints one FAIL line per failed check; exits 1 if any."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

FP4LAB = os.path.abspath(sys.argv[1])
fails = 0


def fail(msg):
    global fails
    fails += 1
    print("FAIL: " + msg)


def train(cwd, config, *sets):
    args = [FP4LAB, "train", config, "--quiet"]
    for s in sets:
        args += ["--set", s]
    try:
        p = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "", "(timed out after 60 s)"
    return p.returncode, p.stdout, p.stderr


def expect_input_error(cwd, what, config, sets, needles, header=False):
    """Exit 2, exactly one stderr line "fp4lab: error: ..." holding every needle, no completed run.
    header: the run's "fp4lab train: NAME ... -> DIR" line may come first (errors found while
    loading the data, after the config checks)."""
    shutil.rmtree(os.path.join(cwd, "runs"), ignore_errors=True)  # no case sees another's run
    rc, _, err = train(cwd, config, *sets)
    lines = err.strip().splitlines()
    if header and len(lines) == 2 and lines[0].startswith("fp4lab train: "):
        lines = lines[1:]
    if rc != 2:
        fail("%s: exit %s (want 2); stderr: %s" % (what, rc, err.strip()[:300]))
        return
    if len(lines) != 1 or not lines[0].startswith("fp4lab: error: "):
        fail("%s: want one 'fp4lab: error:' line, got: %r" % (what, err[:300]))
        return
    for n in needles:
        if n not in lines[0]:
            fail("%s: %r not in %r" % (what, n, lines[0][:300]))
    for d, _, files in os.walk(os.path.join(cwd, "runs")):
        if "summary.json" in files:
            fail("%s: a run completed in %s" % (what, d))


def main():
    with tempfile.TemporaryDirectory(prefix="fp4lab_hostile_") as tmp:
        words = ["the cat sat. ", "a dog ran! ", "we sing low; ", "to be or not. "]
        with open(os.path.join(tmp, "t.txt"), "w") as f:
            f.write("".join(words[(i * 7 + i // 3) % 4] for i in range(600)))
        cfg = {"name": "h", "model": {"type": "gpt", "layers": 1, "heads": 2, "width": 16, "context": 16},
               "data": {"type": "char", "path": "t.txt"},
               "training": {"batch_size": 2, "steps": 2, "eval_iters": 1, "log_interval": 1},
               "output": {"dir": "runs"}}
        with open(os.path.join(tmp, "c.json"), "w") as f:
            json.dump(cfg, f)

        # (--set, substrings of the message): the key, and the range where there is one.
        cases = [
            ("model.context=0", ["config.model.context", "1..65536"]),
            ("model.layers=1000000000", ["config.model.layers", "1..1024"]),
            ("model.heads=0", ["config.model.heads"]),
            ("model.width=-1", ["config.model.width"]),
            ("model.dropout=1.5", ["config.model.dropout", "[0, 1)"]),
            ("model.layernorm_eps=0", ["config.model.layernorm_eps"]),
            ("training.lr=1e999", ["training.lr", "overflow"]),
            ("training.lr=0", ["config.training.lr", "> 0"]),
            ("training.min_lr=-1", ["config.training.min_lr", ">= 0"]),
            ("training.eval_iters=0", ["config.training.eval_iters"]),
            ("training.eps=-1", ["config.training.eps"]),
            ("training.weight_decay=-1", ["config.training.weight_decay"]),
            ("training.beta1=1", ["config.training.beta1"]),
            ("training.beta2=1.5", ["config.training.beta2"]),
            ("training.grad_clip=-1", ["config.training.grad_clip"]),
            ("training.warmup_steps=-5", ["config.training.warmup_steps"]),
            ("training.log_interval=0", ["config.training.log_interval"]),
            ("training.eval_interval=-1", ["config.training.eval_interval"]),
            ("training.loss_scale=0", ["config.training.loss_scale"]),
            ("training.batch_size=0", ["config.training.batch_size"]),
            ("data.train_limit=-1", ["config.data.train_limit"]),
            ("training.lr=\"abc\"", ["config.training.lr", "wrong type"]),
            ("training.lr=" + "[" * 100000, ["--set training.lr", "nested deeper"]),
            # (one argument holds at most 128 KiB on Linux)
            ("training.lr=" + "[" * 60000 + "]" * 60000, ["--set training.lr", "nested deeper"]),
            ("recipe=" + '{"a":' * 20000 + "1" + "}" * 20000, ["--set recipe", "nested deeper"]),
        ]
        for s, needles in cases:
            expect_input_error(tmp, "--set " + s[:60], "c.json", [s], needles)
        expect_input_error(tmp, "output.dir a file", "c.json", ['output.dir="t.txt"'],
                           ["config.output.dir", "t.txt", "not a directory"])
        expect_input_error(tmp, "data.path a directory", "c.json", ["data.path=\"" + tmp + "\""],
                           ["data.path", tmp, "is a directory"], header=True)

        # Sizes beyond any machine's memory: the keys and the bytes, before any allocation.
        expect_input_error(tmp, "huge model", "c.json", ["model.layers=1024", "model.width=65536"],
                           ["model.layers x model.width^2", "bytes", "of memory"])
        expect_input_error(tmp, "huge batch", "c.json",
                           ["training.batch_size=16777216", "model.context=65536"],
                           ["training.batch_size x model.context", "of memory"])

        # Hostile config files: deep nesting, 1e999, a directory.
        with open(os.path.join(tmp, "deep.json"), "w") as f:
            f.write('{"name": ' + "[" * 100000)
        expect_input_error(tmp, "deep config file", "deep.json", [], ["deep.json", "nested deeper than 64"])
        # Closed: valid JSON, whose recursive copy or dump (a wrong-type message) overflowed the stack.
        with open(os.path.join(tmp, "deep_closed.json"), "w") as f:
            f.write('{"name": ' + "[" * 100000 + "]" * 100000 + "}")
        expect_input_error(tmp, "deep closed config file", "deep_closed.json", [],
                           ["deep_closed.json", "nested deeper than 64"])
        with open(os.path.join(tmp, "inf.json"), "w") as f:
            f.write(json.dumps(cfg).replace('"batch_size": 2', '"batch_size": 2, "lr": 1e999'))
        expect_input_error(tmp, "lr 1e999 in a file", "inf.json", [], ["inf.json", "training.lr", "overflow"])
        os.mkdir(os.path.join(tmp, "cfgdir"))
        expect_input_error(tmp, "config is a directory", "cfgdir", [], ["cfgdir", "directory"])
        with open(os.path.join(tmp, "deeprecipe.json"), "w") as f:
            f.write('{"extends": ' + "[" * 100000 + "]" * 100000 + "}")
        expect_input_error(tmp, "deep recipe file", "c.json", ["recipe=\"deeprecipe.json\""],
                           ["deeprecipe.json", "nested deeper than 64"])
        # A config whose top level is not an object, with --recipe (which sets a key in it).
        with open(os.path.join(tmp, "list.json"), "w") as f:
            f.write("[1, 2]")
        p = subprocess.run([FP4LAB, "train", "list.json", "--recipe", "fp32", "--quiet"], cwd=tmp,
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 2 or "list.json" not in p.stderr or "expected a JSON object" not in p.stderr:
            fail("config [1, 2] with --recipe: exit %s, %r" % (p.returncode, p.stderr.strip()[:300]))

    print("test_hostile_config: %d failure(s)" % fails)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
