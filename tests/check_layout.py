#!/usr/bin/env python3
"""The house rules of the source tree (docs/DESIGN.md section 1), checked:
- dependencies point one way, core -> sim -> recipes -> cuda -> train -> apps -> python:
  no #include "M/..." from a module ranked below M;
- train/cpu and train/cuda are twins: neither includes the other;
- no source file outside tests/ over 800 lines.
Usage: check_layout.py REPO_ROOT. Prints one line per violation; exit 1 if any."""
import pathlib
import re
import sys

ORDER = ["core", "sim", "recipes", "cuda", "train", "apps", "python"]
RANK = {m: i for i, m in enumerate(ORDER)}
SOURCES = {".cpp", ".hpp", ".cu", ".cuh", ".h"}
MAX_LINES = 800
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def main(root: pathlib.Path) -> int:
    problems = []
    for module in ORDER:
        for f in sorted((root / module).rglob("*")):
            if f.suffix not in SOURCES or not f.is_file():
                continue
            rel = f.relative_to(root).as_posix()
            lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
            if len(lines) > MAX_LINES:
                problems.append(f"{rel}: {len(lines)} lines (at most {MAX_LINES} outside tests/)")
            for n, line in enumerate(lines, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1).split("/")
                if target[0] in RANK and RANK[target[0]] > RANK[module]:
                    problems.append(f"{rel}:{n}: includes {m.group(1)}, which is above {module}/ "
                                    f"(order: {' -> '.join(ORDER)})")
                if rel.startswith("train/cpu/") and m.group(1).startswith("train/cuda/") or \
                        rel.startswith("train/cuda/") and m.group(1).startswith("train/cpu/"):
                    problems.append(f"{rel}:{n}: includes {m.group(1)}: train/cpu and train/cuda are twins")
    for p in problems:
        print(p)
    print(f"check_layout: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(pathlib.Path(sys.argv[1])))
