#!/usr/bin/env python3
"""Lists the doctest TEST_CASEs and SUBCASEs that ran without reaching a single
assertion (CHECK/REQUIRE/...): tests that pass whatever the code does.

Usage: tests/zero_assertion_cases.py [--unreached DIR] EXE... [-- doctest options]
  e.g. tests/zero_assertion_cases.py --unreached tests build/tests/test_core build/tests/test_train
Runs each executable once with the XML reporter and every successful assertion
logged (-s), counts the <Expression> elements under each <TestCase> and
<SubCase>, and prints those with none. Exit status 1 if any is found. A case
skipped through doctest (doctest::skip(), or a filter) is not run and not listed.
--unreached DIR also lists the assertion macros (CHECK*, REQUIRE*, FAIL*) in
DIR's .cpp/.hpp files whose line no executable's run reached: checks behind an
`if` that never holds, loops over empty ranges, files of executables not given
(informational; FAIL lines on failure paths belong there).
"""
import glob
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

REACHED = set()  # (real path, line) of every assertion that ran


def scan(exe, extra):
    cmd = [exe, "--reporters=xml", "-s", "--no-version"] + extra
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    xml = run.stdout.decode("utf-8", "replace")
    start = xml.find("<doctest")
    if start < 0:
        print(f"{exe}: no XML report (exit status {run.returncode})")
        return [], 0
    root = ET.fromstring(xml[start:xml.rfind("</doctest>") + len("</doctest>")])
    found, cases = [], 0
    for e in root.iter("Expression"):
        REACHED.add((os.path.realpath(e.get("filename", "")), int(e.get("line", "0"))))

    def walk(node, path):
        for child in node:
            if child.tag == "SubCase":
                sub = path + [child.get("name", "")]
                if not any(True for _ in child.iter("Expression")):
                    found.append(" / ".join(sub) + f"  ({child.get('filename')}:{child.get('line')})")
                walk(child, sub)

    for tc in root.iter("TestCase"):
        cases += 1
        name = tc.get("name", "")
        res = tc.find("OverallResultsAsserts")
        asserts = sum(1 for _ in tc.iter("Expression"))
        if res is not None:
            asserts = max(asserts, int(res.get("successes", "0")) + int(res.get("failures", "0")))
        if asserts == 0:
            found.append(f"{name}  ({tc.get('filename')}:{tc.get('line')})")
        walk(tc, [name])
    return found, cases


def unreached(src_dir):
    macro = re.compile(r"\b(CHECK|REQUIRE|FAIL_CHECK|FAIL)(_[A-Z_]+)?\s*\(")
    files = glob.glob(os.path.join(src_dir, "**", "*.cpp"), recursive=True)
    files += glob.glob(os.path.join(src_dir, "**", "*.hpp"), recursive=True)
    out = []
    for f in sorted(files):
        with open(f, encoding="utf-8", errors="replace") as fh:
            for i, line in enumerate(fh, 1):
                code = line.split("//")[0]
                if macro.search(code) and (os.path.realpath(f), i) not in REACHED:
                    out.append(f"{f}:{i}: {line.strip()[:100]}")
    return out


def main(argv):
    src_dir = None
    if argv[:1] == ["--unreached"]:
        src_dir, argv = argv[1], argv[2:]
    exes, extra = argv, []
    if "--" in argv:
        i = argv.index("--")
        exes, extra = argv[:i], argv[i + 1:]
    total = 0
    for exe in exes:
        found, cases = scan(exe, extra)
        print(f"{exe}: {cases} test cases run, {len(found)} without an assertion")
        for f in found:
            print("  " + f)
        total += len(found)
    if src_dir:
        lines = unreached(src_dir)
        print(f"assertion lines under {src_dir} that no run reached: {len(lines)}")
        for l in lines:
            print("  " + l)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
