#!/usr/bin/env python3
"""Hostile run archives and names against `fp4lab compare` (and the other
commands that start a child program): nothing a user opens can execute code
(issue 42; docs/DESIGN.md sections 5 and 7).
- gnuplot gets data, never script text from a run: newlines, quotes,
  backslashes, backticks, '@' and '$' in a recipe, metric or run directory name
  create no file (only with --plot; skipped with 77 without gnuplot);
- no shell: a $TMPDIR or --pytorch-dir holding shell syntax runs nothing
  (sr-bias --plot, bench train with a stand-in python3);
- wrong types, deep nesting, huge numbers, missing files, a directory that is no
  run, a FIFO, non-UTF-8 bytes and a 2 GB line each give exit 2 and one stderr
  line naming the file (and key), never a crash, hang or raw library text;
- control characters in names are printed escaped, never raw; without gnuplot, compare notes it
  and sr-bias --plot fails with one line;
- one run given twice (another path to it, a symbolic link) counts once, with a
  note; two directories holding the same run (config_hash and seed) are an error.
Usage: test_hostile_compare.py PATH/TO/fp4lab [--plot]. Python standard
library only. Prints one FAIL line per failed check; exits 1 if any, 77 when
--plot is asked for and gnuplot is missing."""
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

FP4LAB = os.path.abspath(sys.argv[1])
PLOT = len(sys.argv) > 2 and sys.argv[2] == "--plot"
fails = 0

METRICS = '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.0}\n{"step": 2, "eval": true, "val_loss": 1.9}\n'


def fail(msg):
    global fails
    fails += 1
    print("FAIL: " + msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def summary(**over):
    s = {"name": "t", "recipe": "fp32", "model": "gpt", "seed": 1, "status": "completed", "steps": 2,
         "total_steps": 2, "metric": "val_loss", "higher_is_better": False, "final": 1.9, "best": 1.9,
         "final_train_loss": 2.0, "ms_per_step": 1.0, "items_per_s": 100.0, "item": "tokens", "params": 10,
         "backend": "cpu", "config_hash": "00000000000000aa", "wall_s": 1.0}
    s.update(over)
    return s


NONE = object()  # make_run: leave that file out


def make_run(d, summ=None, metrics=METRICS):
    """A run directory d: summary.json (a dict, or str/bytes as written; None: summary(); NONE: no file) and
    metrics.jsonl (str/bytes; NONE: no file)."""
    os.makedirs(d, exist_ok=True)
    if summ is None:
        summ = summary()
    for name, body in (("summary.json", summ), ("metrics.jsonl", metrics)):
        if body is NONE:
            continue
        if isinstance(body, dict):
            body = json.dumps(body)
        with open(os.path.join(d, name), "wb") as f:
            f.write(body.encode() if isinstance(body, str) else body)
    return d


def limit_memory():
    # 1 GiB of data (RLIMIT_DATA: the heap and private writable mappings, not the shared libraries' code, so
    # a CUDA build's cuBLAS still loads): reading a 2 GB line into memory fails instead of swapping the
    # machine. Not under AddressSanitizer (ASAN_OPTIONS set: scripts/sanitize_robustness.sh), whose shadow
    # memory is terabytes of mappings; there the bounded reader is exercised without the cap.
    if "ASAN_OPTIONS" not in os.environ:
        resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))


def run(*args, cwd=None, env=None, timeout=120, preexec=None):
    try:
        p = subprocess.run([FP4LAB, *args], cwd=cwd, env=env, capture_output=True, timeout=timeout,
                           preexec_fn=preexec)
    except subprocess.TimeoutExpired:
        return None, b"", b"(timed out)"
    return p.returncode, p.stdout, p.stderr


def one_error_line(name, rc, err, want_rc, *patterns):
    """A failure: exit want_rc, exactly one printable stderr line 'fp4lab: error: ...' holding every pattern."""
    text = err.decode("utf-8", "replace")
    lines = text.strip("\n").split("\n")
    check(rc == want_rc, f"{name}: exit {rc}, expected {want_rc} (stderr: {text.strip()!r})")
    check(len(lines) == 1 and lines[0].startswith("fp4lab: error: "), f"{name}: not one error line: {text!r}")
    check(all(32 <= b < 127 or b >= 128 for b in err.rstrip(b"\n")) and b"\r" not in err,
          f"{name}: control bytes in stderr: {err!r}")
    try:
        err.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"{name}: stderr is not UTF-8: {err!r}")
    for p in patterns:
        check(p in text, f"{name}: stderr lacks {p!r}: {text.strip()!r}")
    for raw in ("std::", "[json.exception", "type must be", "cannot use value()", "internal error",
                "while running `fp4lab compare`"):
        check(raw not in text, f"{name}: stderr shows raw text {raw!r}: {text.strip()!r}")


def no_new_files(name, t, before):
    after = set(os.listdir(t))
    check(after == before, f"{name}: injected command created {sorted(after - before)}")


def hostile_types(t):
    """Wrong types and values in summary.json: exit 2, one line naming summary.json and the key."""
    cases = [
        ("recipe number", summary(recipe=5), '"recipe"'),
        ("recipe object", summary(recipe={"a": 1}), '"recipe"'),
        ("recipe array", summary(recipe=[1, 2]), '"recipe"'),
        ("steps string", summary(steps="10"), '"steps"'),
        ("steps negative", summary(steps=-1), '"steps"'),
        ("best NaN string", summary(best="NaN"), '"best"'),
        ("final bool", summary(final=True), '"final"'),
        ("seed float", summary(seed=1.5), '"seed"'),
        ("status number", summary(status=0), '"status"'),
        ("higher_is_better string", summary(higher_is_better="yes"), '"higher_is_better"'),
        ("metric missing", {k: v for k, v in summary().items() if k != "metric"}, '"metric"'),
        ("metric object", summary(metric={"x": 1}), '"metric"'),
        ("metric with script text", summary(metric='val_loss\nsystem("touch PWNED_metric")'), '"metric"'),
        ("recipe 1 MB", summary(recipe="r" * 300000), '"recipe"'),
    ]
    for name, s, key in cases:
        d = make_run(os.path.join(t, "types_" + name.replace(" ", "_")), s)
        rc, out, err = run("compare", d, "--plot", "-")
        one_error_line(name, rc, err, 2, "summary.json", key)
    # Numbers past a double, or an integer past 64 bits where an integer belongs.
    raw = json.dumps(summary())
    for name, body, pats in [
        ("final 1e999", raw.replace('"final": 1.9', '"final": 1e999'), ("summary.json", "1e999")),
        ("best -1e400", raw.replace('"best": 1.9', '"best": -1e400'), ("summary.json",)),
        ("seed 10^30", raw.replace('"seed": 1', '"seed": 1000000000000000000000000000000'), ("summary.json", '"seed"')),
        ("steps 2^64", raw.replace('"steps": 2', '"steps": 18446744073709551616'), ("summary.json", '"steps"')),
        ("seed 2^63", raw.replace('"seed": 1', '"seed": 9223372036854775808'), ("summary.json", '"seed"')),
    ]:
        d = make_run(os.path.join(t, "num_" + name.replace(" ", "_").replace("^", "")), body)
        rc, out, err = run("compare", d, "--plot", "-")
        one_error_line(name, rc, err, 2, *pats)


def hostile_structure(t):
    """Not JSON objects, deep nesting, non-UTF-8, missing or odd files, no run at all."""
    deep = '{"recipe": "fp32", "metric": "val_loss", "x": ' + "[" * 200000 + "]" * 200000 + "}"
    cases = [
        ("summary array", "[1, 2]", METRICS, ("summary.json", "object")),
        ("summary number", "5", METRICS, ("summary.json", "object")),
        ("summary empty", "", METRICS, ("summary.json", "invalid JSON")),
        ("summary deep", deep, METRICS, ("summary.json", "nested")),
        ("summary non-UTF-8", b'{"recipe": "\xff\xfe\x1b[31m", "metric": "val_loss"}', METRICS,
         ("summary.json", "invalid JSON")),
        ("summary 2 MB", '{"metric": "val_loss", "pad": "' + "x" * (2 << 20) + '"}', METRICS, ("summary.json", "MiB")),
        ("metrics not an object", summary(), "[1, 2]\n", ("metrics.jsonl:1", "object")),
        ("metrics step string", summary(), '{"step": 1, "loss": 2.0}\n{"step": "x", "loss": 1.0}\n',
         ("metrics.jsonl:2", '"step"')),
        ("metrics loss NaN string", summary(), '{"step": 1, "loss": "NaN"}\n', ("metrics.jsonl:1", '"loss"')),
        ("metrics eval string", summary(), '{"step": 1, "eval": true, "val_loss": "1.0"}\n',
         ("metrics.jsonl:1", '"val_loss"')),
        ("metrics step missing", summary(), '{"loss": 2.0}\n', ("metrics.jsonl:1", '"step"')),
        ("metrics deep", summary(), '{"step": 1, "x": ' + "[" * 100000 + "]" * 100000 + "}\n",
         ("metrics.jsonl:1", "nested")),
        ("metrics bad line", summary(), '{"step": 1, "loss": 2.0}\n{"step": \n{"step": 3, "loss": 1.0}\n',
         ("metrics.jsonl:2", "invalid JSON")),
        ("metrics non-UTF-8", summary(), b'{"step": 1, "note": "\xc3\x28\x07"}\n', ("metrics.jsonl:1",)),
        ("summary missing", NONE, METRICS, ("summary.json", "not found")),
        ("metrics missing", summary(), NONE, ("metrics.jsonl", "not found")),
    ]
    for name, s, m, pats in cases:
        d = make_run(os.path.join(t, "struct_" + name.replace(" ", "_")), s, m)
        rc, out, err = run("compare", d, "--plot", "-", timeout=60)
        one_error_line(name, rc, err, 2, *pats)

    # A directory that is not a run at all (empty; a file named like a run).
    empty = os.path.join(t, "not_a_run")
    os.makedirs(empty)
    rc, out, err = run("compare", empty, "--plot", "-")
    one_error_line("empty directory", rc, err, 2, "summary.json")
    # summary.json a directory; a FIFO (opening it would block forever): errors, no hang.
    d = make_run(os.path.join(t, "summary_dir"), NONE)
    os.makedirs(os.path.join(d, "summary.json"))
    rc, out, err = run("compare", d, "--plot", "-")
    one_error_line("summary.json a directory", rc, err, 2, "summary.json")
    d = make_run(os.path.join(t, "metrics_fifo"), None, NONE)
    os.mkfifo(os.path.join(d, "metrics.jsonl"))
    rc, out, err = run("compare", d, "--plot", "-", timeout=30)
    one_error_line("metrics.jsonl a FIFO", rc, err, 2, "metrics.jsonl")

    # A 2 GB line (a sparse file: no disk used): refused at its first MiB, under a 1 GiB memory limit.
    d = make_run(os.path.join(t, "big_line"), None, NONE)
    with open(os.path.join(d, "metrics.jsonl"), "wb") as f:
        f.write(b'{"step": 1, "loss": "')
        f.truncate((2 << 30) + 16)
    rc, out, err = run("compare", d, "--plot", "-", timeout=60, preexec=limit_memory)
    one_error_line("2 GB line", rc, err, 2, "metrics.jsonl:1", "longer than")

    # A run directory whose name holds a newline and an escape: its error is still one line.
    d = make_run(os.path.join(t, "bad\nname\x1b[2J"), summary(recipe=7))
    rc, out, err = run("compare", d, "--plot", "-")
    one_error_line("newline in a directory name", rc, err, 2, "summary.json", '"recipe"', "\\x0a", "\\x1b")


def escaped_table(t):
    """Control characters in names reach the table escaped; the table keeps one line per run."""
    a = make_run(os.path.join(t, "esc", "run\x1b]0;title\x07"), summary(recipe="\x1b[31mred\x1b[0m\r\nrow2"))
    b = make_run(os.path.join(t, "esc", "plain"), summary(recipe="nvfp4\u202e", config_hash="00000000000000bb"))
    rc, out, err = run("compare", a, b, "--plot", "-")
    text = out.decode("utf-8", "replace")
    check(rc == 0, f"escaped table: exit {rc}: {err!r}")
    check(b"\x1b" not in out and b"\r" not in out and b"\x07" not in out, f"escaped table: raw control bytes: {out!r}")
    check("\u202e" not in text, "escaped table: raw right-to-left override")
    check("\\x1b[31mred\\x1b[0m\\x0d\\x0arow2" in text, f"escaped table: recipe not shown escaped: {text!r}")
    check("run\\x1b]0;title\\x07" in text, f"escaped table: run name not shown escaped: {text!r}")
    check("nvfp4\\u{202e}" in text, f"escaped table: U+202E not shown escaped: {text!r}")
    rows = [l for l in text.splitlines() if l.startswith("run\\x1b") or l.startswith("plain")]
    check(len(rows) == 2, f"escaped table: expected 2 run rows, got {rows!r}")


def duplicates(t):
    """One run given twice counts once (note); the same run in two directories is an error."""
    base = os.path.join(t, "dup")
    a = make_run(os.path.join(base, "a"), summary(seed=1, final=1.0, config_hash="00000000000000a1"))
    make_run(os.path.join(base, "b"), summary(seed=2, final=2.0, config_hash="00000000000000a2"))
    os.symlink("a", os.path.join(base, "link_a"))
    for name, args in [("same path twice", ["a", "a"]), ("./a and a", ["./a", "a", "b"]),
                       ("a/ and a", ["a/", "b", "a"]), ("symlink", ["a", "link_a", "b"]),
                       ("absolute and relative", [a, "a", "b"])]:
        rc, out, err = run("compare", *args, "--plot", "-", cwd=base)
        text = out.decode()
        check(rc == 0, f"{name}: exit {rc}: {err!r}")
        check("counted once" in text, f"{name}: no note that the run counts once: {text!r}")
        with open(os.path.join(base, "compare.json")) as f:
            stats = json.load(f)
        n_runs = 2 if "b" in args else 1
        check(len(stats["runs"]) == n_runs, f"{name}: {len(stats['runs'])} runs in compare.json, expected {n_runs}")
        fp32 = [r for r in stats["recipes"] if r["recipe"] == "fp32"]
        check(fp32 and fp32[0]["final"]["n"] == n_runs, f"{name}: fp32 counted {fp32 and fp32[0]['final']['n']} "
                                                        f"times, expected {n_runs}")
    # A copy of run a under another name: the same config_hash and seed.
    shutil.copytree(os.path.join(base, "a"), os.path.join(base, "a_copy"))
    rc, out, err = run("compare", "a", "b", "a_copy", "--plot", "-", cwd=base)
    one_error_line("a copied", rc, err, 2, "a_copy", "same run", "00000000000000a1")
    check("fp4lab: error: compare: a and a_copy" in err.decode(), f"a copied: both directories not named: {err!r}")
    # Same config_hash, other seed (other samples) and same seed, other config: fine.
    make_run(os.path.join(base, "c"), summary(seed=3, final=1.1, config_hash="00000000000000a1"))
    rc, out, err = run("compare", "a", "c", "--plot", "-", cwd=base)
    check(rc == 0, f"same config, other seed: exit {rc}: {err!r}")


def no_gnuplot(t):
    """Without gnuplot on PATH: compare notes it and succeeds; sr-bias --plot fails with one line (exit 1)."""
    d = make_run(os.path.join(t, "nognuplot", "a"))
    empty = os.path.join(t, "nognuplot", "bin")
    os.makedirs(empty)
    env = dict(os.environ, PATH=empty)
    rc, out, err = run("compare", d, "--plot", os.path.join(t, "nognuplot", "c.png"), env=env)
    check(rc == 0 and b"gnuplot not found (apt-get install gnuplot-nox); no plot drawn" in out,
          f"compare without gnuplot: exit {rc}, stdout {out!r}, stderr {err!r}")
    rc, out, err = run("sr-bias", "--points", "3", "--plot", os.path.join(t, "nognuplot", "sr.png"), env=env)
    one_error_line("sr-bias without gnuplot", rc, err, 1, "gnuplot not found")


def hostile_bench(t):
    """bench train's PyTorch rows: a --pytorch-dir holding shell syntax is a path, nothing runs."""
    fake = os.path.join(t, "fakebin")
    os.makedirs(fake)
    log = os.path.join(t, "python_args.txt")
    # A stand-in python3: logs its arguments (NUL-separated), says torch imports, prints a RESULT line.
    with open(os.path.join(fake, "python3"), "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\n"
                f"open({log!r}, 'a').write('\\0'.join(sys.argv[1:]) + '\\n---\\n')\n"
                "if sys.argv[1] != '-c': print('RESULT fake 1.0 1.0 1.0')\n")
    os.chmod(os.path.join(fake, "python3"), 0o755)
    evil = "d'; touch PWNED_bench; echo '$(touch PWNED_bench2)\n`touch PWNED_bench3`"
    os.makedirs(os.path.join(t, evil))
    open(os.path.join(t, evil, "bench_pytorch_gpt.py"), "w").close()
    before = set(os.listdir(t))
    env = dict(os.environ, PATH=fake + os.pathsep + os.environ.get("PATH", ""))
    rc, out, err = run("bench", "train", "--steps", "1", "--repeats", "1", "--recipes", "fp32", "--set",
                       "model.layers=1", "--set", "model.width=32", "--pytorch", "on", "--pytorch-dir", evil,
                       cwd=t, env=env, timeout=300)
    check(rc == 0, f"bench --pytorch-dir: exit {rc}: {err!r}")
    no_new_files("bench --pytorch-dir", t, before | {"python_args.txt"})
    calls = open(log).read().split("\n---\n") if os.path.exists(log) else []
    script_call = [c for c in calls if c and not c.startswith("-c\0")]
    check(len(script_call) == 1 and script_call[0].split("\0")[0] == evil + "/bench_pytorch_gpt.py",
          f"bench --pytorch-dir: the script path did not arrive as one argument: {script_call!r}")
    check(b"pytorch fake" in out, f"bench --pytorch-dir: no PyTorch row: {out!r}")
    # A relative directory starting with '-' (python3 would read "-c..." as code to run): passed as ./-c...
    opt = "-cimport os; os.system('touch PWNED_opt')"
    os.makedirs(os.path.join(t, opt))
    open(os.path.join(t, opt, "bench_pytorch_gpt.py"), "w").close()
    os.remove(log)
    rc, out, err = run("bench", "train", "--steps", "1", "--repeats", "1", "--recipes", "fp32", "--set",
                       "model.layers=1", "--set", "model.width=32", "--pytorch", "on", "--pytorch-dir=" + opt,
                       cwd=t, env=env, timeout=300)
    calls = open(log).read().split("\n---\n") if os.path.exists(log) else []
    script_call = [c for c in calls if c and not c.startswith("-c\0")]
    check(rc == 0 and len(script_call) == 1 and script_call[0].split("\0")[0] == "./" + opt + "/bench_pytorch_gpt.py",
          f"bench --pytorch-dir -c...: the script path was not made ./-c...: exit {rc}, {script_call!r}, {err!r}")


# Text that would run a command were it gnuplot or shell script text: each command goes to $HOME
# ("cd;" first: gnuplot's system() runs sh), which the test points at its directory, and touches a
# PWNED_* file there. (Directory names cannot hold '/', so no absolute path.)
INJECT = ['x\nsystem("cd;touch PWNED_nl")\n#', "x'\nsystem(\"cd;touch PWNED_q\")\n'",
          'x\\\nsystem("cd;touch PWNED_bs")', "x`cd;touch PWNED_bt`", "x@m", "x$(cd;touch PWNED_dollar)",
          "x\"; system(\"cd;touch PWNED_dq\"); \"", "x'.system('cd;touch PWNED_sq').'",
          "x';system('cd;touch PWNED_sq2');'"]


def hostile_plot(t):
    """compare --plot and sr-bias --plot with hostile names, recipes and $TMPDIR: nothing runs, the PNG comes."""
    base = os.path.join(t, "plot")
    os.makedirs(base)
    dirs = []
    for i, s in enumerate(INJECT):
        # The same hostile text as a recipe (two seeds: the band's title) and as a directory name.
        for seed in (1, 2):
            dirs.append(make_run(os.path.join(base, f"r{i}_{seed}"),
                                 summary(recipe=s, seed=seed, config_hash=f"{i:015x}{seed}")))
        name = s.replace("/", "_")
        dirs.append(make_run(os.path.join(base, name), summary(recipe=f"solo{i}", config_hash=f"{i:015x}f")))
    before = set(os.listdir(base))
    png = os.path.join(base, "out.png")
    for env_tmp in (None, "tmp'$(cd;touch PWNED_tmpdir)'\nsystem(\"cd;touch PWNED_tmpgp\")"):
        env = dict(os.environ, HOME=base)
        if env_tmp:
            os.makedirs(os.path.join(base, env_tmp))
            before.add(env_tmp)
            env["TMPDIR"] = os.path.join(base, env_tmp)
        rc, out, err = run("compare", *dirs, "--plot", png, cwd=base, env=env, timeout=300)
        check(rc == 0, f"compare --plot (TMPDIR {env_tmp!r}): exit {rc}: {err!r}")
        check(os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n",
              f"compare --plot (TMPDIR {env_tmp!r}): no PNG written")
        # The forest plot of the paired differences: the hostile recipe names are its y tics.
        forest = os.path.join(base, "out_forest.png")
        check(os.path.exists(forest) and open(forest, "rb").read(8) == b"\x89PNG\r\n\x1a\n",
              f"compare --plot (TMPDIR {env_tmp!r}): no forest PNG written")
        no_new_files(f"compare --plot (TMPDIR {env_tmp!r})", base, before | {"out.png", "out.json", "out_forest.png"})
        if env_tmp:
            check(os.listdir(env["TMPDIR"]) == [], f"compare --plot: left {os.listdir(env['TMPDIR'])} in TMPDIR")
        for f in (png, forest, os.path.join(base, "out.json")):
            if os.path.exists(f):
                os.remove(f)
    # sr-bias --plot under a $TMPDIR holding shell and gnuplot syntax.
    env = dict(os.environ, HOME=base,
               TMPDIR=os.path.join(base, "tmp'$(cd;touch PWNED_tmpdir)'\nsystem(\"cd;touch PWNED_tmpgp\")"))
    rc, out, err = run("sr-bias", "--format", "e2m1", "--points", "4", "--plot", "sr.png", cwd=base, env=env)
    check(rc == 0, f"sr-bias --plot (hostile TMPDIR): exit {rc}: {err!r}")
    check(os.path.exists(os.path.join(base, "sr.png")), "sr-bias --plot (hostile TMPDIR): no PNG")
    no_new_files("sr-bias --plot (hostile TMPDIR)", base, before | {"sr.png"})


def main():
    if PLOT and shutil.which("gnuplot") is None:
        print("SKIP: gnuplot not found (apt-get install gnuplot-nox)")
        return 77
    t = tempfile.mkdtemp()
    try:
        if PLOT:
            hostile_plot(t)
        else:
            hostile_types(t)
            hostile_structure(t)
            escaped_table(t)
            duplicates(t)
            no_gnuplot(t)
            hostile_bench(t)
    finally:
        shutil.rmtree(t, ignore_errors=True)
    name = "test_hostile_compare" + (" --plot" if PLOT else "")
    print(f"{name}: {fails} failed check(s)" if fails else f"{name}: all checks passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
