#!/usr/bin/env python3
"""Fuzzing of golden-suite manifests: `fp4lab verify SUITE SUITE` on a few
hundred deterministic mutations of the suite's manifest.json (byte-level and
JSON-level) must end with exit 0 or 1 (a verdict) or 2 with one error line
(`fp4lab: error: ...`), never 3 (internal error), a signal or a multi-line
error. Prints the counts (valid / clean error / unclean); exits 1 on any
unclean outcome. Usage: fuzz_manifest.py PATH/TO/fp4lab [N]"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

REPLACEMENTS = [None, "text", -1, 0, 1e308, 2**63, 2**64, 0.5, True, [], {}, [1, 2, 3], "../../escape", ""]


def mutate_bytes(text, rng):
    b = bytearray(text.encode())
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(6)
        if not b:
            break
        i = rng.randrange(len(b))
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.choice(b'\x00\xff{}[]",:0')
        elif op == 2:
            del b[i:i + rng.randint(1, 40)]
        elif op == 3:
            b[i:i] = b[i:i + rng.randint(1, 40)]
        elif op == 4:
            del b[i:]
        else:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(b)


def mutate_json(doc, rng):
    paths = []

    def walk(v, p):
        if p:
            paths.append(p)
        if isinstance(v, dict):
            for k in v:
                walk(v[k], p + [k])
        elif isinstance(v, list):
            for i in range(min(len(v), 3)):  # the first cases are enough
                walk(v[i], p + [i])

    walk(doc, [])
    p = rng.choice(paths)
    parent = doc
    for k in p[:-1]:
        parent = parent[k]
    op = rng.randrange(3)
    if op == 0:
        parent[p[-1]] = rng.choice(REPLACEMENTS)
    elif op == 1:
        del parent[p[-1]]
    elif isinstance(parent, dict):
        parent[str(p[-1]) + "x"] = parent.pop(p[-1])
    return json.dumps(doc).encode()


def main():
    fp4lab = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    tmp = tempfile.mkdtemp(prefix="fp4lab_fuzz_manifest_")
    try:
        suite = os.path.join(tmp, "suite")
        subprocess.run([fp4lab, "golden", "--out", suite], check=True, stdout=subprocess.DEVNULL)
        manifest = os.path.join(suite, "manifest.json")
        base = open(manifest).read()
        counts = {"valid": 0, "clean error": 0, "unclean": 0}
        first = None
        for k in range(n):
            rng = random.Random(k)
            data = mutate_bytes(base, rng) if k % 2 == 0 else mutate_json(json.loads(base), rng)
            with open(manifest, "wb") as f:
                f.write(data)
            r = subprocess.run([fp4lab, "verify", suite, suite], capture_output=True, text=True, errors="replace")
            errors = [l for l in r.stderr.splitlines() if l.startswith("fp4lab: error:")]
            if r.returncode in (0, 1) and not errors:
                counts["valid"] += 1
            elif r.returncode == 2 and len(errors) == 1:
                counts["clean error"] += 1
            else:
                counts["unclean"] += 1
                if first is None:
                    first = "mutation %d: exit %d: %s" % (k, r.returncode, r.stderr.strip()[:300])
        print("manifest fuzz: %d valid, %d clean errors, %d unclean" % (counts["valid"], counts["clean error"],
                                                                          counts["unclean"]))
        if first:
            print("FAIL: first unclean outcome: " + first)
            return 1
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
