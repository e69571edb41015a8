#!/usr/bin/env python3
"""Data-parallel faults end with a clear error, never a hang (issue 42). CPU backend, 2 MPI ranks.

  - ranks launched with different configs (mpirun's MPMD form: rank 0 with --set training.steps=8,
    rank 1 with 12) all exit non-zero within seconds, each with one line naming rank 1's config
    hash against rank 0's, and no run directory is made;
  - a rank stopped mid-run (SIGSTOP) makes the other exit with "no answer from rank 1 within 5 s"
    (distributed.timeout_s 5) and mpirun end, within the timeout plus a margin; so does one of an
    expert-parallel MoE run (distributed.expert_parallel 2), whose rank 0 waits in the token exchange;
  - a rank killed mid-run (SIGKILL) ends the job within seconds with a line naming it and the signal, leaves
    no partial file, and the job resumes from its last checkpoint (written every step).
Every launch has a subprocess timeout, so a hang fails the test instead of blocking CI.
Usage: test_dp_faults.py FP4LAB MPIEXEC   (Python stdlib only; Linux: reads /proc to find rank 1)
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

MPI_FLAGS = ["--oversubscribe", "--allow-run-as-root"]


def rank_pids(mpirun_pid):
    """{rank: pid} of the fp4lab processes mpirun started (its children, rank from their environment)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except (OSError, ValueError, IndexError):
            continue
        if b"OMPI_COMM_WORLD_RANK" in env:
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(name)
    return out


def end_group(pgid, grace=20.0):
    """Waits (at most grace s) until no process of the process group or session pgid is left, then kills what
    remains.

    A launch's session may outlive its mpirun: a rank that was sent SIGTERM writes its checkpoint after
    mpirun has gone. The temporary directory is removed only once every such writer has ended."""
    def members():
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                # Process group or session: mpirun's launcher may move the ranks into groups of their own,
                # but they stay in the session start_new_session made (seen: a resumed rank still writing
                # its checkpoint while the temporary directory was removed, on a loaded 2-core machine).
                if pgid in (int(fields[2]), int(fields[3])) and fields[0] != "Z":
                    out.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
        return out
    deadline = time.monotonic() + grace
    while members() and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in members():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while members() and time.monotonic() < deadline:
        time.sleep(0.1)


def wait_for_losses(p, metrics, n):
    """Waits (at most 120 s) until the job p has logged n losses in metrics, or ended."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if os.path.exists(metrics):
            with open(metrics) as f:
                if sum(1 for l in f if '"loss"' in l) >= n:
                    return
        time.sleep(0.1)


def stopped_rank(name, train_cmd, mpiexec, runs, d, failures):
    """Rank 1 of a 2-rank `train_cmd` stopped mid-run: rank 0 gives up after distributed.timeout_s (5 s) with one
    line naming rank 1, and the job ends."""
    cmd = [mpiexec] + MPI_FLAGS + ["-np", "2"] + train_cmd + ["--set", "output.name=" + name]
    metrics = os.path.join(runs, name, "metrics.jsonl")
    err_path = os.path.join(d, name + ".err")
    with open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    stopped = None
    try:
        wait_for_losses(p, metrics, 3)  # until a few steps have run
        pids = rank_pids(p.pid)
        if p.poll() is not None or 1 not in pids:
            failures.append(f"{name}: the run did not get going (exit {p.poll()}, ranks {pids})")
        else:
            stopped = pids[1]
            os.kill(stopped, signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                rc = p.wait(timeout=5 + 40)
                took = time.monotonic() - t0
                with open(err_path) as f:
                    err = f.read()
                lines = [l for l in err.splitlines() if "no answer from rank 1 within 5 s during " in l]
                print(f"test_dp_faults: {name}: rank 1 stopped: exit {rc} after {took:.1f} s; {lines[:1]}")
                if rc == 0:
                    failures.append(f"{name}: mpirun exited 0")
                if len(lines) != 1 or not lines[0].startswith("fp4lab: error: rank 0: no answer from rank 1") or \
                        " at step " not in lines[0] or "a rank stopped or died" not in lines[0]:
                    failures.append(f"{name}: want rank 0's one timeout line, got {lines}; "
                                    f"stderr: {err.strip()[-800:]}")
                if took < 4:
                    failures.append(f"{name}: gave up after {took:.1f} s, before the 5 s timeout")
            except subprocess.TimeoutExpired:
                failures.append(f"{name}: mpirun still running 45 s after rank 1 stopped (a hang)")
    finally:
        if stopped:  # wake the stopped rank, whether or not mpirun has ended
            try:
                os.kill(stopped, signal.SIGCONT)
            except OSError:
                pass
        if p.poll() is None:  # the test's own processes: end the job
            for pid in rank_pids(p.pid).values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            p.kill()
            p.wait()
        end_group(p.pid)



def main():
    fp4lab, mpiexec = sys.argv[1], sys.argv[2]
    if not os.path.isdir("/proc/self"):
        print("test_dp_faults: no /proc; skipped")
        return 77
    failures = []
    with tempfile.TemporaryDirectory() as d:
        words = ["the cat sat. ", "a dog ran! ", "we sing low; ", "to be or not. "]
        text = os.path.join(d, "text.txt")
        with open(text, "w") as f:
            f.write("".join(words[(i * 7 + i // 3) % 4] for i in range(600)))
        runs = os.path.join(d, "runs")
        cfg = {"name": "faults", "model": {"type": "gpt", "layers": 1, "heads": 2, "width": 32, "context": 16,
                                           "dropout": 0.0},
               "data": {"type": "char", "path": text},
               "training": {"batch_size": 6, "steps": 100000, "lr": 1e-2, "eval_interval": 100000,
                            "eval_iters": 1, "log_interval": 1, "checkpoint_interval": 100000},
               "distributed": {"timeout_s": 5},
               "seed": 5, "threads": 1, "output": {"dir": runs}}
        path = os.path.join(d, "faults.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        train = [fp4lab, "train", path, "--quiet"]

        # (i) different --set on the two ranks: refused on both before anything runs.
        cmd = [mpiexec] + MPI_FLAGS + ["-np", "1"] + train + ["--set", "training.steps=8", ":", "-np", "1"] + \
            train + ["--set", "training.steps=12"]
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            took = time.monotonic() - t0
            lines = [l for l in p.stderr.splitlines() if "rank 1's config differs from rank 0's (config_hash " in l]
            print(f"test_dp_faults: different configs: exit {p.returncode} after {took:.1f} s; {lines[:1]}")
            if p.returncode == 0:
                failures.append("different configs: mpirun exited 0")
            if len(lines) != 2 or not all(l.startswith("fp4lab: error: ") and
                                          l.endswith("launch every rank with the same config and --set options")
                                          for l in lines):
                failures.append(f"different configs: want one error line from each rank naming rank 1's config, got "
                                f"{lines}; stderr: {p.stderr.strip()[-600:]}")
            if took > 60:
                failures.append(f"different configs: took {took:.0f} s (want seconds)")
            if os.path.exists(runs) and os.listdir(runs):
                failures.append(f"different configs: a run directory was made: {os.listdir(runs)}")
        except subprocess.TimeoutExpired as e:
            failures.append(f"different configs: mpirun still running after 120 s (a hang); stderr: "
                            f"{(e.stderr or b'')[-600:]!r}")

        # (ii) rank 1 stopped mid-run: rank 0 gives up after distributed.timeout_s (5 s) and the job ends; under
        # data parallelism (rank 0 waits in the step's reduction) and under expert parallelism (a MoE GPT whose
        # experts are split over the 2 ranks: rank 0 waits in the forward's token exchange).
        stopped_rank("stopped", train, mpiexec, runs, d, failures)
        ep_cfg = dict(cfg, model=dict(cfg["model"], layers=2, moe={"experts": 8, "top_k": 2}),
                      training=dict(cfg["training"], batch_size=8),
                      distributed={"timeout_s": 5, "expert_parallel": 2})
        ep_path = os.path.join(d, "faults_ep.json")
        with open(ep_path, "w") as f:
            json.dump(ep_cfg, f)
        stopped_rank("stopped_ep", [fp4lab, "train", ep_path, "--quiet"], mpiexec, runs, d, failures)

        # (iii) rank 1 killed mid-run (SIGKILL, as the OOM killer does): the job ends within seconds, not
        # exit 0, with a line naming rank 1 and the signal (mpirun's); rank 0's run directory holds no partial
        # file and its last checkpoint (written every step here) is whole: the job resumes from it.
        killed_cfg = dict(cfg, training=dict(cfg["training"], checkpoint_interval=1))
        kpath = os.path.join(d, "killed.json")
        with open(kpath, "w") as f:
            json.dump(killed_cfg, f)
        cmd = [mpiexec] + MPI_FLAGS + ["-np", "2", fp4lab, "train", kpath, "--quiet", "--set", "output.name=killed"]
        metrics = os.path.join(runs, "killed", "metrics.jsonl")
        err_path = os.path.join(d, "killed.err")
        with open(err_path, "w") as err:
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            wait_for_losses(p, metrics, 5)
            pids = rank_pids(p.pid)
            if p.poll() is not None or 1 not in pids:
                failures.append(f"killed rank: the run did not get going (exit {p.poll()}, ranks {pids})")
            else:
                os.kill(pids[1], signal.SIGKILL)
                t0 = time.monotonic()
                try:
                    rc = p.wait(timeout=5 + 40)
                    took = time.monotonic() - t0
                    with open(err_path) as f:
                        err = f.read()
                    named = [l for l in err.splitlines() if "rank 1" in l and ("signal 9" in l or "Killed" in l
                                                                                 or "killed" in l)]
                    print(f"test_dp_faults: rank 1 killed: exit {rc} after {took:.1f} s; {named[:1]}")
                    if rc == 0:
                        failures.append("killed rank: mpirun exited 0")
                    if not named:
                        failures.append(f"killed rank: no line names rank 1 and its signal; stderr: {err.strip()[-800:]}")
                    rd = os.path.join(runs, "killed")
                    partial = [n for n in os.listdir(rd) if ".tmp" in n or n.endswith(".part")] if os.path.isdir(rd) else []
                    if partial:
                        failures.append(f"killed rank: partial files left in the run directory: {partial}")
                    # The last checkpoint is whole: the 2-rank job resumes from it (stopped by SIGTERM after 6 s).
                    rp = subprocess.Popen(["timeout", "-s", "TERM", "6", mpiexec] + MPI_FLAGS +
                                          ["-np", "2", fp4lab, "train", kpath, "--resume", "--set",
                                           "output.name=killed"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True)
                    try:
                        r = subprocess.CompletedProcess(rp.args, None, *rp.communicate(timeout=60))
                    finally:
                        end_group(rp.pid)
                        rp.wait()
                    resumed = [l for l in r.stderr.splitlines() if l.startswith("resuming ") and " at step " in l]
                    print(f"test_dp_faults: resumed after the kill: {resumed[:1]}")
                    damaged = [l for l in r.stderr.splitlines() if l.startswith("fp4lab: error:") and "SIGTERM" not in l]
                    if not resumed or damaged:
                        failures.append(f"killed rank: the run did not resume from its checkpoint: "
                                        f"{r.stderr.strip()[-800:]}")
                except subprocess.TimeoutExpired:
                    failures.append("killed rank: mpirun still running 45 s after rank 1 was killed (a hang)")
        finally:
            if p.poll() is None:
                for pid in rank_pids(p.pid).values():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                p.kill()
                p.wait()
            end_group(p.pid)

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
