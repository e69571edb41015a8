#!/usr/bin/env python3
"""fp4-trainkit's fp4_all_the_way collapse settled in its own code (issue 49, item 4): the statistics and the
plot of scripts/fp4tk_vit_run.py's runs beside fp4lab's emulation of the same three arms.

  python3 scripts/fp4tk_settle_analysis.py DATA_DIR [--epoch 3] [--margin 2.0]

DATA_DIR holds fp4tk/{base,sr,ls}_SEED.json (scripts/fp4tk_vit_run.py --out) and fp4lab/RUN/metrics.jsonl
(fp4lab train runs; the arm from the run name: "ls4096" -> ls, "atw-fp4tk_sr" -> sr, else base). Writes
DATA_DIR/summary.json, DATA_DIR/summary.md and DATA_DIR/curves.svg, and prints summary.md.
Statistics (numpy only; Student t from the regularized incomplete beta, below):
  - per source and arm: n, mean, sample std, 95% t interval of the test accuracy at --epoch;
  - the rescues in fp4-trainkit's own code (sr - base, ls - base): Welch difference, 95% interval,
    two-sided p, Holm-adjusted over the two comparisons;
  - emulation against own code per arm: Welch difference with its 90% interval; "equivalent within
    +-margin" when that interval lies inside (-margin, +margin) (two one-sided tests at 5%).
"""
import argparse
import json
import math
import pathlib

import numpy as np

ARMS = {"base": "unmodified", "sr": "unbiased SR", "ls": "loss scale 4096"}
SOURCES = {"fp4tk": "fp4-trainkit's code (its CUDA path)", "fp4lab": "fp4lab's emulation (its CPU path's arithmetic)"}


def betainc(a, b, x):
    """Regularized incomplete beta I_x(a, b): Lentz's continued fraction on the side where it converges."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d, f = 1.0, 1.0 - (a + b) * x / (a + 1.0), 0.0
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def t_sf2(t, df):
    """Two-sided p of Student's t with df degrees of freedom."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p, df):
    """The t with P(T <= t) = p (p > 0.5), by bisection on t_sf2."""
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_sf2(mid, df) / 2 > 1 - p else (lo, mid)
    return (lo + hi) / 2


def describe(v):
    v = np.asarray(v, float)
    n, m = len(v), float(np.mean(v))
    s = float(np.std(v, ddof=1)) if n > 1 else float("nan")
    h = t_quantile(0.975, n - 1) * s / math.sqrt(n) if n > 1 else float("nan")
    return {"n": n, "mean": m, "std": s, "ci95": [m - h, m + h], "values": [float(x) for x in v]}


def welch(a, b, level):
    """mean(a) - mean(b), its `level` interval and two-sided p (Welch-Satterthwaite df)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    d = float(np.mean(a) - np.mean(b))
    h = t_quantile(0.5 + level / 2, df) * se
    return {"diff": d, "ci": [d - h, d + h], "level": level, "df": df, "p": t_sf2(abs(d) / se, df)}


def arm_of(name):
    return "ls" if "ls4096" in name else "sr" if "atw-fp4tk_sr" in name else "base"


def load(d):
    """{source: {arm: {seed: [test_acc per epoch]}}}."""
    runs = {s: {a: {} for a in ARMS} for s in SOURCES}
    for f in sorted((d / "fp4tk").glob("*.json")):
        arm, seed = f.stem.rsplit("_", 1)
        runs["fp4tk"][arm][int(seed)] = [e["test_acc"] for e in json.loads(f.read_text())["epochs"]]
    for m in sorted((d / "fp4lab").glob("*/metrics.jsonl")):
        recs = [json.loads(line) for line in m.read_text().splitlines() if line.strip()]
        evals = [r["test_acc"] for r in recs if r.get("eval")]
        seed = json.loads((m.parent / "config.json").read_text())["seed"]
        runs["fp4lab"][arm_of(m.parent.name)][int(seed)] = evals
    return runs


def at_epoch(runs, epoch):
    return {s: {a: [acc[epoch - 1] for acc in runs[s][a].values() if len(acc) >= epoch] for a in ARMS} for s in SOURCES}


def svg(runs, path, epochs):
    """Test accuracy per epoch: each run thin, each arm's mean thick; solid fp4-trainkit, dashed fp4lab."""
    W, H, L, R, T, B = 720, 420, 60, 200, 30, 50
    colors = {"base": "#d62728", "sr": "#1f77b4", "ls": "#2ca02c"}
    ymin, ymax = 60.0, 100.0
    x = lambda e: L + (e - 1) / max(1, epochs - 1) * (W - L - R)
    y = lambda v: T + (ymax - min(max(v, ymin), ymax)) / (ymax - ymin) * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<text x="{L}" y="18">fp4-trainkit fp4_all_the_way, ViT/MNIST, lr 5e-4: test accuracy (%) per epoch</text>']
    for v in range(int(ymin), int(ymax) + 1, 10):
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                   f'<text x="{L - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
    for e in range(1, epochs + 1):
        out.append(f'<text x="{x(e):.1f}" y="{H - B + 18}" text-anchor="middle">{e}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">epoch</text>')
    legend = 0
    for s, dash in (("fp4tk", ""), ("fp4lab", ' stroke-dasharray="6,4"')):
        for a, c in colors.items():
            curves = [acc[:epochs] for acc in runs[s][a].values()]
            if not curves:
                continue
            for acc in curves:
                pts = " ".join(f"{x(i + 1):.1f},{y(v):.1f}" for i, v in enumerate(acc))
                out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-opacity="0.25"{dash}/>')
            k = min(len(acc) for acc in curves)
            mean = np.mean([acc[:k] for acc in curves], axis=0)
            pts = " ".join(f"{x(i + 1):.1f},{y(v):.1f}" for i, v in enumerate(mean))
            out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2.5"{dash}/>')
            ly = T + 20 + 18 * legend
            out.append(f'<line x1="{W - R + 10}" x2="{W - R + 40}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="2.5"{dash}/>'
                       f'<text x="{W - R + 46}" y="{ly + 4}">{s}: {ARMS[a]} (n={len(curves)})</text>')
            legend += 1
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--epoch", type=int, default=3)
    ap.add_argument("--margin", type=float, default=2.0)
    a = ap.parse_args()
    d = pathlib.Path(a.data)
    runs = load(d)
    acc = at_epoch(runs, a.epoch)
    res = {"epoch": a.epoch, "margin": a.margin, "arms": ARMS, "sources": SOURCES,
           "describe": {s: {k: describe(v) for k, v in acc[s].items() if v} for s in SOURCES}}
    rescues = {k: welch(acc["fp4tk"][k], acc["fp4tk"]["base"], 0.95) for k in ("sr", "ls")}
    order = sorted(rescues, key=lambda k: rescues[k]["p"])  # Holm: p sorted, multiplied by (m - rank)
    running = 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, rescues[k]["p"] * (len(order) - i)))
        rescues[k]["p_holm"] = running
    res["rescues_in_fp4tk"] = rescues
    res["emulation_minus_fp4tk"] = {}
    for k in ARMS:
        if len(acc["fp4lab"][k]) > 1 and len(acc["fp4tk"][k]) > 1:
            w = welch(acc["fp4lab"][k], acc["fp4tk"][k], 0.90)
            w["equivalent"] = -a.margin < w["ci"][0] and w["ci"][1] < a.margin
            res["emulation_minus_fp4tk"][k] = w
    (d / "summary.json").write_text(json.dumps(res, indent=1) + "\n")
    md = [f"Test accuracy (%) after epoch {a.epoch}; 95% t intervals.", "",
          "| arm | source | n | mean | std | 95% CI |", "|---|---|---|---|---|---|"]
    for k in ARMS:
        for s in SOURCES:
            r = res["describe"][s].get(k)
            if r:
                md.append(f"| {ARMS[k]} | {SOURCES[s]} | {r['n']} | {r['mean']:.2f} | {r['std']:.2f} | "
                          f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] |")
    md += ["", "Rescues in fp4-trainkit's own code (Welch, Holm over 2):", "",
           "| comparison | difference | 95% CI | p | p (Holm) |", "|---|---|---|---|---|"]
    for k, w in rescues.items():
        md.append(f"| {ARMS[k]} - unmodified | {w['diff']:+.2f} | [{w['ci'][0]:+.2f}, {w['ci'][1]:+.2f}] | "
                  f"{w['p']:.2g} | {w['p_holm']:.2g} |")
    md += ["", f"fp4lab's emulation minus fp4-trainkit's code (Welch 90% CI; equivalent within +-{a.margin:g}):", "",
           "| arm | difference | 90% CI | equivalent |", "|---|---|---|---|"]
    for k, w in res["emulation_minus_fp4tk"].items():
        md.append(f"| {ARMS[k]} | {w['diff']:+.2f} | [{w['ci'][0]:+.2f}, {w['ci'][1]:+.2f}] | "
                  f"{'yes' if w['equivalent'] else 'no'} |")
    (d / "summary.md").write_text("\n".join(md) + "\n")
    svg(runs, d / "curves.svg", max(len(v) for s in SOURCES for arm in runs[s].values() for v in arm.values()))
    print("\n".join(md))


if __name__ == "__main__":
    main()
