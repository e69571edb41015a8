#!/usr/bin/env python3
"""The run lifecycle under faults (issue 42): `fp4lab train` killed or failing at every write and rename
of a run (the fault points of train/run_files.hpp, FP4LAB_FAULT), interrupted by SIGINT/SIGTERM, raced by
a second process, handed damaged or foreign files. After each fault, what a user does next (run again,
--resume) must give the run an uninterrupted process gives: the same checkpoint.bin bytes and the same
metrics and summary (timing fields aside), with nothing left behind. Checksums are checked against
Python's zlib (an independent CRC-32). Usage: test_run_faults.py FP4LAB_BINARY
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

FP4LAB = os.path.abspath(sys.argv[1])
TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "DESIGN.md")

CONFIG = {
    "name": "tiny",
    "model": {"type": "gpt", "layers": 1, "heads": 2, "width": 16, "context": 8, "dropout": 0.0, "bias": False},
    "data": {"type": "char", "path": "tiny.txt"},
    "training": {"batch_size": 4, "steps": 6, "optimizer": "adamw", "lr": 1e-3, "min_lr": 1e-4,
                 "schedule": "cosine", "warmup_steps": 1, "decay_steps": 6, "eval_interval": 2, "eval_iters": 2,
                 "log_interval": 1},
    "recipe": "fp32", "seed": 1, "backend": "cpu", "threads": 1,
    "output": {"dir": "runs"},
}
RUN = os.path.join("runs", "tiny-fp32-s1")
# Measurements of the process that wrote the run, not results: timing, checksums, and the backend's memory
# (device_memory: a resumed run's allocations differ from an uninterrupted one's).
TIMING = {"ms_per_step", "items_per_s", "wall_s", "checksums", "device_memory"}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return cond


def workdir(steps=6, extra=None):
    d = tempfile.mkdtemp(prefix="fp4lab_faults_")
    with open(TEXT, "rb") as src, open(os.path.join(d, "tiny.txt"), "wb") as dst:
        dst.write(src.read()[:20000])
    cfg = json.loads(json.dumps(CONFIG))
    cfg["training"]["steps"] = steps
    cfg["training"]["decay_steps"] = steps
    for k, v in (extra or {}).items():
        cfg["training"][k] = v
    with open(os.path.join(d, "tiny.json"), "w") as f:
        json.dump(cfg, f)
    return d


def train(d, *args, env=None, wait=True):
    e = dict(os.environ)
    e.pop("FP4LAB_FAULT", None)
    e.update(env or {})
    cmd = [FP4LAB, "train", "tiny.json", "--quiet", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=d, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=d, env=e, capture_output=True, text=True, timeout=120)


def error_lines(p):
    return [l for l in p.stderr.splitlines() if l.startswith("fp4lab: error:")]


def results(d, run=RUN):
    """checkpoint.bin's bytes, metrics.jsonl and summary.json without timing fields."""
    r = os.path.join(d, run)
    with open(os.path.join(r, "checkpoint.bin"), "rb") as f:
        ckpt = f.read()
    with open(os.path.join(r, "metrics.jsonl")) as f:
        metrics = [{k: v for k, v in json.loads(l).items() if k not in TIMING} for l in f if l.strip()]
    with open(os.path.join(r, "summary.json")) as f:
        summary = {k: v for k, v in json.load(f).items() if k not in TIMING}
    return ckpt, metrics, summary


def leftovers(d):
    out = []
    for root, dirs, files in os.walk(os.path.join(d, "runs")):
        for n in dirs + files:
            if ".tmp." in n or ".old." in n:
                out.append(os.path.join(root, n))
    return out


def checksums_hold(d, run=RUN):
    """summary.json's CRCs and checkpoint.bin's, recomputed with zlib."""
    r = os.path.join(d, run)
    with open(os.path.join(r, "summary.json")) as f:
        s = json.load(f)
    ok = True
    for name, rec in s["checksums"].items():
        with open(os.path.join(r, name), "rb") as f:
            b = f.read()
        ok &= rec["bytes"] == len(b) and rec["crc32"] == "%08x" % zlib.crc32(b)
    with open(os.path.join(r, "checkpoint.bin"), "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[8:16])[0]
    head = b[16:16 + n]
    ok &= b[:8] == b"FP4LCK02" and struct.unpack("<I", b[16 + n:20 + n])[0] == zlib.crc32(head)
    ok &= json.loads(head)["payload_crc32"] == "%08x" % zlib.crc32(b[20 + n:])
    return ok


def fault_points(d, *args):
    p = train(d, *args, env={"FP4LAB_FAULT": "list"})
    assert p.returncode == 0, p.stderr
    pts = [l.split(": ", 1)[1] for l in p.stderr.splitlines() if l.startswith("fp4lab fault point")]
    shutil.rmtree(os.path.join(d, "runs"))
    return pts


def recover(d, env=None):
    """What a user does after a failure: --resume, or a plain start where there is nothing to resume."""
    p = train(d, "--resume", env=env)
    if p.returncode == 2 and "cannot resume" in p.stderr and "does not exist" in p.stderr:
        p = train(d, env=env)
    return p


def reference(steps=6, extra=None):
    d = workdir(steps, extra)
    p = train(d)
    assert p.returncode == 0, p.stderr
    r = results(d)
    shutil.rmtree(d)
    return r


def test_kill_at_every_point(ref):
    d0 = workdir()
    pts = fault_points(d0)
    shutil.rmtree(d0)
    check(len(pts) >= 20, f"only {len(pts)} fault points listed")
    for k in range(1, len(pts) + 1):
        d = workdir()
        p = train(d, env={"FP4LAB_FAULT": f"kill:{k}"})
        check(p.returncode == -signal.SIGKILL, f"kill:{k} ({pts[k - 1]}): exit {p.returncode}, expected SIGKILL")
        # The recovery itself killed at the same point, then recovered again.
        recover(d, env={"FP4LAB_FAULT": f"kill:{k}"})
        p3 = recover(d)
        if check(p3.returncode == 0, f"kill:{k} ({pts[k - 1]}): recovery failed: {p3.stderr.strip()}"):
            check(results(d) == ref, f"kill:{k} ({pts[k - 1]}): the recovered run differs from the uninterrupted one")
            check(checksums_hold(d), f"kill:{k}: checksums do not match zlib's")
            check(not leftovers(d), f"kill:{k}: left {leftovers(d)}")
            c = subprocess.run([FP4LAB, "compare", RUN, "--plot", "-"], cwd=d, capture_output=True, text=True)
            check(c.returncode == 0, f"kill:{k}: compare refuses the recovered run: {c.stderr.strip()}")
        shutil.rmtree(d)


def test_fail_at_every_point(ref):
    d0 = workdir()
    pts = fault_points(d0)
    shutil.rmtree(d0)
    for k in range(1, len(pts) + 1):
        d = workdir()
        p = train(d, env={"FP4LAB_FAULT": f"fail:{k}"})
        errs = error_lines(p)
        check(p.returncode == 1, f"fail:{k} ({pts[k - 1]}): exit {p.returncode}, expected 1 (environment)")
        check(len(errs) == 1 and "No space left on device" in errs[0] and "/" in errs[0],
              f"fail:{k}: expected one error line naming the file and the reason, got {p.stderr.strip()!r}")
        p3 = recover(d)
        if check(p3.returncode == 0, f"fail:{k}: recovery failed: {p3.stderr.strip()}"):
            check(results(d) == ref, f"fail:{k} ({pts[k - 1]}): the recovered run differs")
            check(not leftovers(d), f"fail:{k}: left {leftovers(d)}")
        shutil.rmtree(d)


def snapshot(path):
    out = {}
    for root, _, files in os.walk(path):
        for n in files:
            with open(os.path.join(root, n), "rb") as f:
                out[os.path.relpath(os.path.join(root, n), path)] = f.read()
    return out


def test_force_kill_at_every_point(ref):
    """An old run (4 steps) replaced by --force with 6 steps, killed at every point: afterwards the old run
    is back byte for byte, or the new run completes; never neither."""
    d0 = workdir(steps=4)
    assert train(d0).returncode == 0
    old = snapshot(os.path.join(d0, RUN))
    cfg = json.load(open(os.path.join(d0, "tiny.json")))
    cfg["training"]["steps"] = cfg["training"]["decay_steps"] = 6
    json.dump(cfg, open(os.path.join(d0, "tiny.json"), "w"))
    p = train(d0, "--force", env={"FP4LAB_FAULT": "list"})
    pts = [l for l in p.stderr.splitlines() if l.startswith("fp4lab fault point")]
    check(p.returncode == 0 and results(d0) == ref, "--force: the replacing run differs from a fresh one")
    for k in range(1, len(pts) + 1):
        d = tempfile.mkdtemp(prefix="fp4lab_force_")
        for n in ("tiny.txt", "tiny.json"):
            shutil.copy(os.path.join(d0, n), d)
        _restore(d, old)
        p = train(d, "--force", env={"FP4LAB_FAULT": f"kill:{k}"})
        check(p.returncode == -signal.SIGKILL, f"force kill:{k}: exit {p.returncode}")
        r = train(d, "--resume")
        if r.returncode == 0:
            check(results(d) == ref, f"force kill:{k}: the new run resumed differs from a fresh one")
        else:
            check("differs from this config" in r.stderr,
                  f"force kill:{k}: neither the old run back nor the new one resumable: {r.stderr.strip()}")
            check(snapshot(os.path.join(d, RUN)) == old, f"force kill:{k}: the old run came back changed")
        check(not leftovers(d), f"force kill:{k}: left {leftovers(d)}")
        shutil.rmtree(d)
    shutil.rmtree(d0)


def _restore(d, files):
    for rel, b in files.items():
        p = os.path.join(d, RUN, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(b)


def wait_for(pred, timeout=60):
    t = time.time()
    while time.time() - t < timeout:
        if pred():
            return True
        time.sleep(0.01)
    return False


LONG = {"eval_interval": 1000}  # 3000 steps: long enough to be caught running


def test_two_processes(ref_long):
    """A second train, sweep or --resume on a run directory in use is refused, naming the holder."""
    for second in (["train"], ["train", "--resume"], ["train", "--force"], ["sweep", "--recipes", "fp32"]):
        d = workdir(steps=3000, extra=LONG)
        p1 = train(d, wait=False)
        lock = os.path.join(d, RUN + ".lock")
        held = wait_for(lambda: os.path.exists(lock) and os.path.getsize(lock) > 0)
        os.kill(p1.pid, signal.SIGSTOP)
        try:
            cmd = [FP4LAB, second[0], "tiny.json", "--quiet", *second[1:]]
            p2 = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=120)
        finally:
            os.kill(p1.pid, signal.SIGCONT)
        out, err = p1.communicate(timeout=300)
        errs = error_lines(p2)
        check(held, f"{second}: the first process never held the lock")
        check(p2.returncode == 1 and len(errs) == 1 and "in use by another fp4lab process" in errs[0]
              and f"pid {p1.pid}" in errs[0], f"{second}: the second process was not refused: {p2.stderr.strip()}")
        check(p1.returncode == 0 and results(d) == ref_long, f"{second}: the first run was disturbed: {err.strip()}")
        shutil.rmtree(d)


def test_signals(ref_long):
    """SIGINT/SIGTERM stop the run at a step with a checkpoint; --resume finishes it bit-exactly."""
    ref = ref_long
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        d = workdir(steps=3000, extra=LONG)
        p = train(d, wait=False)
        metrics = os.path.join(d, RUN, "metrics.jsonl")
        wait_for(lambda: os.path.exists(metrics) and os.path.getsize(metrics) > 2000)
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
        errs = [l for l in err.splitlines() if l.startswith("fp4lab: error:")]
        check(p.returncode == code, f"{sig.name}: exit {p.returncode}, expected {code}")
        check(len(errs) == 1 and f"interrupted by {sig.name}" in errs[0] and "--resume" in errs[0],
              f"{sig.name}: expected one line saying the state and how to continue, got {err.strip()!r}")
        r = train(d, "--resume")
        check(r.returncode == 0 and results(d) == ref, f"{sig.name}: the resumed run differs: {r.stderr.strip()}")
        check(not leftovers(d), f"{sig.name}: left {leftovers(d)}")
        shutil.rmtree(d)


def test_force_refuses_what_is_not_a_run():
    d = workdir()
    os.makedirs(os.path.join(d, RUN))
    with open(os.path.join(d, RUN, "notes.txt"), "w") as f:
        f.write("precious")
    for args in (["--force"], [], ["--resume"]):
        p = train(d, *args)
        errs = error_lines(p)
        check(p.returncode == 2 and len(errs) == 1 and "notes.txt" in errs[0] and "not an fp4lab run" in errs[0],
              f"{args}: a directory that is not a run: {p.stderr.strip()!r}")
    check(open(os.path.join(d, RUN, "notes.txt")).read() == "precious", "--force touched a directory not a run")
    shutil.rmtree(d)
    # A run whose checkpoint.bin is a FIFO (opening it would block forever): refused, not hung.
    d = workdir()
    assert train(d).returncode == 0
    os.remove(os.path.join(d, RUN, "checkpoint.bin"))
    os.mkfifo(os.path.join(d, RUN, "checkpoint.bin"))
    try:
        p = train(d, "--resume")
        check(p.returncode == 2 and "checkpoint.bin" in p.stderr and "not a regular file" in p.stderr,
              f"a FIFO for checkpoint.bin: {p.returncode} {p.stderr.strip()!r}")
    except subprocess.TimeoutExpired:
        check(False, "a FIFO for checkpoint.bin: fp4lab hung")
    shutil.rmtree(d)


def first_checkpoint_then_killed(d):
    """A run killed right after its first checkpoint (step 2 of 6)."""
    pts = fault_points(d)
    k = next(i for i, p in enumerate(pts, 1) if p.startswith("rename") and p.endswith("checkpoint.bin"))
    p = train(d, env={"FP4LAB_FAULT": f"kill:{k + 1}"})
    assert p.returncode == -signal.SIGKILL, p.stderr


def rewrite_header(path, edit):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[8:16])[0]
    h = json.loads(b[16:16 + n])
    edit(h)
    t = json.dumps(h).encode()
    open(path, "wb").write(b[:8] + struct.pack("<Q", len(t)) + t + struct.pack("<I", zlib.crc32(t)) + b[20 + n:])


def test_damaged_files(ref):
    base = workdir()
    first_checkpoint_then_killed(base)
    other = workdir()
    cfg = json.load(open(os.path.join(other, "tiny.json")))
    cfg["seed"] = 2
    cfg["output"]["name"] = "tiny-fp32-s1"
    json.dump(cfg, open(os.path.join(other, "tiny.json"), "w"))
    first_checkpoint_then_killed(other)
    ck = os.path.join(RUN, "checkpoint.bin")

    def flip(d):
        p = os.path.join(d, ck)
        b = bytearray(open(p, "rb").read())
        b[-7] ^= 0x10
        open(p, "wb").write(bytes(b))

    cases = [
        ("a flipped bit in the weights", flip, ["checkpoint.bin", "CRC-32"]),
        ("trailing garbage", lambda d: open(os.path.join(d, ck), "ab").write(b"junk"),
         ["checkpoint.bin", "trailing bytes"]),
        ("a truncated file", lambda d: os.truncate(os.path.join(d, ck), os.path.getsize(os.path.join(d, ck)) - 9),
         ["checkpoint.bin", "truncated"]),
        ("an impossible step", lambda d: rewrite_header(os.path.join(d, ck), lambda h: h.update(step=999)),
         ["checkpoint.bin", "step"]),
        ("a step of the wrong type", lambda d: rewrite_header(os.path.join(d, ck), lambda h: h.update(step="2")),
         ["checkpoint.bin", "'step'", "string"]),
        ("a header bit flipped", lambda d: _flip_header(os.path.join(d, ck)), ["checkpoint.bin", "CRC-32"]),
        ("another run's checkpoint", lambda d: shutil.copy(os.path.join(other, ck), os.path.join(d, ck)),
         ["checkpoint.bin", "config_hash"]),
        ("the corpus edited in place", lambda d: open(os.path.join(d, "tiny.txt"), "a").write("x"),
         ["data.path", "tiny.txt", "changed"]),
    ]
    for what, damage, words in cases:
        d = tempfile.mkdtemp(prefix="fp4lab_damage_")
        shutil.rmtree(d)
        shutil.copytree(base, d)
        damage(d)
        p = train(d, "--resume")
        errs = error_lines(p)
        check(p.returncode == 2 and len(errs) == 1 and all(w in errs[0] for w in words),
              f"{what}: expected exit 2 and one line with {words}, got {p.returncode} {p.stderr.strip()!r}")
        shutil.rmtree(d)
    # The untouched copy resumes to the uninterrupted result.
    p = train(base, "--resume")
    check(p.returncode == 0 and results(base) == ref, f"the undamaged run does not resume: {p.stderr.strip()}")
    # A finished run whose summary.json came from another run: mixed files are an error, not reused.
    p = train(other, "--resume")
    shutil.copy(os.path.join(other, RUN, "summary.json"), os.path.join(base, RUN, "summary.json"))
    p = train(base, "--resume")
    check(p.returncode == 2 and "mixed" in p.stderr, f"a summary.json of another run accepted: {p.stderr.strip()!r}")
    # compare checks the files summary.json was computed from: an edited metrics.jsonl, another run's config.json.
    for name, damage in (("metrics.jsonl", lambda r: open(os.path.join(r, "metrics.jsonl"), "a").write(
                             '{"step": 6, "eval": true, "val_loss": 0.001, "train_loss": 0.001}\n')),
                         ("config.json", lambda r: shutil.copy(os.path.join(other, RUN, "config.json"), r))):
        d = workdir()
        assert train(d).returncode == 0
        damage(os.path.join(d, RUN))
        c = subprocess.run([FP4LAB, "compare", RUN, "--plot", "-"], cwd=d, capture_output=True, text=True)
        errs = error_lines(c)
        check(c.returncode == 2 and len(errs) == 1 and name in errs[0] and "changed since the run finished" in errs[0],
              f"compare accepts a run whose {name} changed after it finished: {c.returncode} {c.stderr.strip()!r}")
        shutil.rmtree(d)
    shutil.rmtree(base)
    shutil.rmtree(other)


def _flip_header(path):
    b = bytearray(open(path, "rb").read())
    b[20] ^= 0x01
    open(path, "wb").write(bytes(b))


def test_stale_temporaries():
    d = workdir()
    assert train(d).returncode == 0
    junk = [RUN + ".tmp.99999999", os.path.join(RUN, "checkpoint.bin.tmp.424242")]
    os.makedirs(os.path.join(d, junk[0]))
    open(os.path.join(d, junk[1]), "wb").write(b"\0" * 1000)
    p = train(d, "--resume")
    check(p.returncode == 0 and not any(os.path.exists(os.path.join(d, j)) for j in junk),
          f"stale temporaries were not removed: {p.stderr.strip()}")
    shutil.rmtree(d)


def test_dead_output_temporaries():
    """cast/quantize outputs: a killed writer's <out>.tmp.<pid> goes once its process is gone; a live one's stays."""
    d = tempfile.mkdtemp(prefix="fp4lab_outtmp_")
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }"
    hdr += " " * (64 - 10 - len(hdr) - 1) + "\n"
    with open(os.path.join(d, "x.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + struct.pack("<4f", 1, 2, 3, 4))
    dead = subprocess.Popen(["true"])
    dead.wait()
    junk = {os.path.join(d, f"y.npy.tmp.{dead.pid}"): False, os.path.join(d, f"y.npy.tmp.{os.getpid()}"): True}
    for j in junk:
        open(j, "wb").write(b"partial")
    p = subprocess.run([FP4LAB, "cast", "--to", "e2m1", os.path.join(d, "x.npy"), os.path.join(d, "y.npy")],
                       capture_output=True, text=True)
    check(p.returncode == 0 and all(os.path.exists(j) == keep for j, keep in junk.items()),
          f"output temporaries: {p.stderr.strip()} {[(j, os.path.exists(j)) for j in junk]}")
    shutil.rmtree(d)


def main():
    ref = reference()
    ref_long = reference(steps=3000, extra=LONG)
    for t in (test_force_refuses_what_is_not_a_run, test_stale_temporaries, test_dead_output_temporaries, test_damaged_files, test_two_processes,
              test_signals, test_kill_at_every_point, test_fail_at_every_point, test_force_kill_at_every_point):
        before, t0 = len(failures), time.time()
        args = {"ref": ref, "ref_long": ref_long}
        t(*[args[a] for a in t.__code__.co_varnames[:t.__code__.co_argcount]])
        print(f"{t.__name__}: {'ok' if len(failures) == before else 'FAILED'} ({time.time() - t0:.1f} s)", flush=True)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("test_run_faults: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
