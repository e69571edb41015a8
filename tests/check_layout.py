#!/usr/bin/env python3
"""The house rules of the source tree (docs/DESIGN.md section 1), checked:
- dependencies point one way, core -> sim -> recipes -> cuda -> train -> apps -> python:
  no #include "M/..." from a module ranked below M;
- schemes/<name>/ (one folder per scaling scheme: its rule, kernels and tests side by side) is a second home
  of sim-level and cuda-level files, ranked per file: .cu/.cuh as cuda, the others as sim (its test_*.cpp
  as tests); an include of schemes/... is ranked by the included file's suffix;
- train/cpu and train/cuda are twins: neither includes the other;
- recipes/ is backend-neutral: it names no backend memory (the words "packed" and "device" do not occur
  in it; a backend's form of a stored weight is train/'s StoredWeight, issue 46);
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
BACKEND_WORDS = re.compile(r"\b(packed|device)\b", re.IGNORECASE)


def schemes_rank(path: str) -> int:
    """The rank of a file under schemes/: its kernels are cuda-level, the rest sim-level."""
    return RANK["cuda"] if pathlib.PurePosixPath(path).suffix in {".cu", ".cuh"} else RANK["sim"]


def include_rank(target: str):
    first = target.split("/")[0]
    if first == "schemes":
        return schemes_rank(target)
    return RANK.get(first)


def sources(root: pathlib.Path):
    """(file, its rank name, its rank) for every source file the rules cover."""
    for module in ORDER:
        for f in sorted((root / module).rglob("*")):
            if f.suffix in SOURCES and f.is_file():
                yield f, module, RANK[module]
    for f in sorted((root / "schemes").rglob("*")):
        if f.suffix in SOURCES and f.is_file() and not f.name.startswith("test_"):
            r = schemes_rank(f.name)
            yield f, ORDER[r], r


def main(root: pathlib.Path) -> int:
    problems = []
    for f, module, rank in sources(root):
        rel = f.relative_to(root).as_posix()
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
        if len(lines) > MAX_LINES:
            problems.append(f"{rel}: {len(lines)} lines (at most {MAX_LINES} outside tests/)")
        for n, line in enumerate(lines, 1):
            if module == "recipes" and BACKEND_WORDS.search(line):
                problems.append(f"{rel}:{n}: says \"{BACKEND_WORDS.search(line).group(1)}\": recipes/ is "
                                "backend-neutral (a backend's memory is train/'s, e.g. LayerPlan::w_stored)")
            m = INCLUDE.match(line)
            if not m:
                continue
            r = include_rank(m.group(1))
            if r is not None and r > rank:
                problems.append(f"{rel}:{n}: includes {m.group(1)}, which is above {module}/ "
                                f"(order: {' -> '.join(ORDER)}; schemes/ files rank by suffix)")
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
