#!/usr/bin/env python3
"""CLI checks that runs and outputs are never lost, stale or silently wrong:
outputs written all or none (quantize, golden), failures as one line with exit
1 (environment) or 2 (usage/input), NaN/Inf warnings and honest --stats, and
verify's robustness (unreadable candidate files, bad candidate directories,
--failures-only, suite files checked against manifest.json).
Usage: test_robust.py PATH/TO/fp4lab. Python standard library only.
Prints one FAIL line per failed check; exits 1 if any."""
import json
import math
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

from npyio import write_npy

FP4LAB = os.path.abspath(sys.argv[1])
fails = 0


def fail(msg):
    global fails
    fails += 1
    print("FAIL: " + msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def run(*args, cwd=None, preexec=None):
    p = subprocess.run([FP4LAB, *args], cwd=cwd, capture_output=True, text=True, preexec_fn=preexec)
    return p.returncode, p.stdout, p.stderr


def read_bytes(path):
    with open(path, 'rb') as f:
        return f.read()


def tree(root):
    """{relative path: bytes} of every file under root."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = read_bytes(p)
    return out


def leftovers(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if '.tmp.' in f or '.old.' in f]


def one_error_line(name, rc, err, want_rc, *patterns):
    """A failure: exit want_rc, exactly one stderr line 'fp4lab: error: ...' holding every pattern, no C++ text."""
    lines = err.strip().splitlines()
    check(rc == want_rc, f"{name}: exit {rc}, expected {want_rc} (stderr: {err.strip()})")
    check(len(lines) == 1 and lines[0].startswith("fp4lab: error: "), f"{name}: not one error line: {err!r}")
    for p in patterns:
        check(p in err, f"{name}: stderr lacks {p!r}: {err.strip()}")
    for raw in ("std::", "max_size()", "filesystem error", "[json.exception", "internal error", "Run with --help"):
        check(raw not in err, f"{name}: stderr shows raw text {raw!r}: {err.strip()}")


def main():
    t = tempfile.mkdtemp()
    try:
        tests(t)
    finally:
        shutil.rmtree(t, ignore_errors=True)
    print(f"test_robust: {fails} failed check(s)" if fails else "test_robust: all checks passed")
    return 1 if fails else 0


def tests(t):
    random.seed(1)
    x = [random.gauss(0, 1) for _ in range(128)]
    write_npy(f"{t}/x.npy", '<f4', (4, 32), x)
    xn = list(x)
    xn[5] = math.nan
    write_npy(f"{t}/xn.npy", '<f4', (4, 32), xn)

    # ---- 5. several outputs: all or none -------------------------------------------
    rc, out, err = run("quantize", "--quantizer", "mxfp4", "x.npy", "--dequant", "d.npy", cwd=t)
    check(rc == 0, f"quantize mxfp4: exit {rc}: {err}")
    before = read_bytes(f"{t}/d.npy")
    rc, out, err = run("quantize", "--quantizer", "nvfp4", "x.npy", "--dequant", "d.npy", "--codes", "nodir/c.npy",
                       cwd=t)
    one_error_line("quantize bad --codes", rc, err, 2, "nodir/c.npy", "does not exist")
    check(read_bytes(f"{t}/d.npy") == before, "quantize bad --codes: --dequant's old file was replaced")
    check(not leftovers(t), f"quantize bad --codes: left {leftovers(t)}")
    rc, out, err = run("quantize", "--quantizer", "nvfp4", "x.npy", "--dequant", "d.npy", "--scales", "d.npy", cwd=t)
    one_error_line("quantize same output twice", rc, err, 2, "given as two outputs")
    rc, out, err = run("quantize", "--quantizer", "nvfp4", "x.npy", "--dequant", "d.npy", "--codes", "c.npy",
                       "--scales", "s.npy", "--global-scale", "g.npy", cwd=t)
    check(rc == 0 and all(os.path.exists(f"{t}/{f}") for f in ("d.npy", "c.npy", "s.npy", "g.npy")),
          f"quantize with every output: exit {rc}: {err}")

    # golden over an existing suite: a bad path late in the suite changes nothing.
    suite = f"{t}/suite"
    rc, out, err = run("golden", "--out", suite)
    check(rc == 0 and os.path.exists(f"{suite}/manifest.json"), f"golden: exit {rc}: {err}")
    blocked = f"{suite}/nvfp4_noglobal__specials/dequant.npy"
    os.remove(blocked)
    os.mkdir(blocked)
    old = tree(suite)
    rc, out, err = run("golden", "--out", suite, "--seed", "99")
    one_error_line("golden, a late path blocked", rc, err, 2, "nvfp4_noglobal__specials/dequant.npy")
    check(tree(suite) == old, "golden, a late path blocked: the old suite was modified (not all-or-none)")
    check(not leftovers(suite), f"golden, a late path blocked: left {leftovers(suite)[:3]}")
    os.rmdir(blocked)
    shutil.rmtree(suite)
    rc, out, err = run("golden", "--out", suite)
    check(rc == 0, f"golden again: exit {rc}: {err}")

    # golden failing while writing (file size limit, as a full disk): nothing left behind, exit 1.
    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100 * 1024, 100 * 1024))
    rc, out, err = run("golden", "--out", f"{t}/new/suite", preexec=small_files)
    one_error_line("golden, write fails", rc, err, 1, "File too large")
    check(not os.path.exists(f"{t}/new"), "golden, write fails: left the directories it made")

    # ---- 7. one line, exit 1 (environment) or 2 (usage/input) -----------------------
    rc, out, err = run("bench", "cast", "--elements", str(2**62), "--repeats", "1")
    one_error_line("bench cast huge", rc, err, 1, "out of memory while", "--elements")
    rc, out, err = run("bench", "quantize", "--rows", "2000000000", "--cols", "2000000000")
    one_error_line("bench quantize huge", rc, err, 1, "out of memory while")
    with open(f"{t}/afile", "w") as f:
        f.write("x")
    rc, out, err = run("golden", "--out", f"{t}/afile/sub")
    one_error_line("golden under a file", rc, err, 2, f"{t}/afile", "not a directory")
    rc, out, err = run("cast", f"{t}/x.npy", f"{t}/c.npy")
    one_error_line("CLI11 missing option", rc, err, 2, "--to")
    rc, out, err = run("cast", "--to", "e2m1", f"{t}/x.npy", f"{t}/c.npy", "extra")
    one_error_line("CLI11 extra argument", rc, err, 2, "extra")
    rc, out, err = run("train", f"{t}/no_such_config.json")
    one_error_line("CLI11 missing file", rc, err, 2, "no_such_config.json")
    rc, out, err = run("--help")
    check(rc == 0 and "Exit codes" in out and "out of memory" in out, "--help: no exit-code footer")
    if os.geteuid() != 0:  # root writes anywhere
        os.mkdir(f"{t}/ro")
        os.chmod(f"{t}/ro", 0o555)
        rc, out, err = run("quantize", "--quantizer", "mxfp4", f"{t}/x.npy", "--dequant", f"{t}/ro/d.npy")
        one_error_line("output in a read-only directory", rc, err, 1, "ro/d.npy", "not writable")
        os.chmod(f"{t}/ro", 0o755)

    # ---- 9. NaN / Inf: warn, and --stats never claims an exact result ---------------
    write_npy(f"{t}/cn.npy", '<f4', (3,), [1.0, math.nan, math.inf])
    rc, out, err = run("cast", "--to", "e2m1", f"{t}/cn.npy", f"{t}/cc.npy")
    check(rc == 0, f"cast NaN: exit {rc}")
    check("warning: " in err and "1 NaN input(s)" in err and "1 Inf input(s)" in err and
          "e2m1 has no NaN: encoded as +6" in err and len(err.strip().splitlines()) == 1,
          f"cast NaN to e2m1: no one-line warning: {err!r}")
    rc, out, err = run("cast", "--to", "e4m3", f"{t}/x.npy", f"{t}/cc.npy")
    check(rc == 0 and err == "", f"cast of finite values warns: {err!r}")
    rc, out, err = run("quantize", "--quantizer", "nvfp4", f"{t}/xn.npy", "--dequant", f"{t}/dn.npy", "--stats")
    check(rc == 0, f"quantize nvfp4 NaN: exit {rc}: {err}")
    check("1 NaN input(s)" in err and "per-tensor scale NaN: every output is NaN" in err and
          "128 of 128 outputs are NaN" in err, f"quantize nvfp4 NaN: warning: {err!r}")
    stats = {l.split()[0]: l.split()[1] for l in out.splitlines() if l.strip()}
    check(stats.get("max_abs_error") == "nan", f"quantize nvfp4 NaN: max_abs_error {stats.get('max_abs_error')}")
    check(stats.get("sqnr_db") == "nan", f"quantize nvfp4 NaN: sqnr_db {stats.get('sqnr_db')}")
    check("nan_outputs        128 of 128" in out, f"quantize nvfp4 NaN: no NaN count: {out}")
    rc, out, err = run("quantize", "--quantizer", "mxfp4", f"{t}/xn.npy", "--dequant", f"{t}/dn.npy", "--stats")
    check("32 of 128 outputs are NaN" in err and "block's e8m0 scale NaN" in err, f"quantize mxfp4 NaN: {err!r}")
    check("over the 96 element(s) with finite input and output" in out, f"quantize mxfp4 NaN: stats: {out}")
    rc, out, err = run("quantize", "--quantizer", "nvfp4", f"{t}/x.npy", "--dequant", f"{t}/dn.npy", "--stats")
    stats = {l.split()[0]: l.split()[1] for l in out.splitlines() if l.strip()}
    check(err == "" and float(stats.get("max_abs_error", "nan")) > 0 and "nan_outputs        0 of 128" in out,
          f"quantize finite: stats changed: {out} {err}")

    # ---- 10. verify -------------------------------------------------------------------
    rc, out, err = run("verify", suite, suite)
    # The suite's size follows the canned quantizers (golden --help); the manifest is the count.
    n = len(json.load(open(f"{suite}/manifest.json"))["cases"])
    check(n >= 120, f"verify self: only {n} cases in the suite's manifest")
    check(rc == 0 and f"verify: {n} cases: {n} passed, 0 failed, 0 missing" in out, f"verify self: {rc} {out[-200:]}")
    cand = f"{t}/cand"
    shutil.copytree(suite, cand)
    with open(f"{cand}/mxfp4__odd/codes.npy", "wb") as f:
        f.write(read_bytes(f"{suite}/mxfp4__odd/codes.npy")[:100])
    rc, out, err = run("verify", suite, cand)
    check(rc == 1, f"verify unreadable candidate: exit {rc}, expected 1: {err}")
    check("FAIL mxfp4__odd: " in out and "codes.npy" in out, f"verify unreadable candidate: no FAIL line: {out[-300:]}")
    check(f"verify: {n} cases: {n - 1} passed, 1 failed, 0 missing" in out, f"verify unreadable: summary: {out[-200:]}")
    rc, out, err = run("verify", suite, cand, "--failures-only")
    check(rc == 1 and "ok " not in out and "FAIL mxfp4__odd" in out and "1 failed" in out,
          f"verify --failures-only: exit {rc}: {out[-300:]} {err}")
    rc, out, err = run("verify", suite, f"{t}/cnad")
    one_error_line("verify misspelled candidate dir", rc, err, 2, f"{t}/cnad", "does not exist")
    os.mkdir(f"{t}/empty")
    rc, out, err = run("verify", suite, f"{t}/empty")
    one_error_line("verify empty candidate dir", rc, err, 2, f"{t}/empty", "empty")
    # Suite files are checked against manifest.json: a wrong-shaped or truncated suite file is named.
    bad = f"{t}/badsuite"
    shutil.copytree(suite, bad)
    write_npy(f"{bad}/mxfp4__tiny/codes.npy", '|u1', (2, 2), [0, 1, 2, 3])
    write_npy(f"{bad}/nvfp4__odd/dequant.npy", '<f4', (1,), [0.0])
    rc, out, err = run("verify", bad, suite)
    check(rc == 2, f"verify bad suite: exit {rc}, expected 2")
    check("BAD-SUITE mxfp4__tiny" in out and "manifest.json says uint8 [64, 64]" in out and
          "BAD-SUITE nvfp4__odd" in out, f"verify bad suite: not reported: {out[-400:]}")
    check(f"verify: {n} cases: {n - 2} passed" in out, f"verify bad suite: summary: {out[-200:]}")
    check(len(err.strip().splitlines()) == 1 and "badsuite" in err, f"verify bad suite: error line: {err!r}")
    m = json.load(open(f"{suite}/manifest.json"))
    del m["cases"][3]["shape"]
    json.dump(m, open(f"{bad}/manifest.json", "w"))
    rc, out, err = run("verify", bad, suite)
    one_error_line("verify manifest without 'shape'", rc, err, 2, "manifest.json", "cases[3]", "'shape'")


if __name__ == "__main__":
    sys.exit(main())
