#!/usr/bin/env python3
"""fp4-trainkit's own ViT/MNIST training (its model, converter, recipes and loop), with the two
interventions of fp4lab's diagnosis of its fp4_all_the_way collapse as options, timed and logged per epoch.

Runs fp4-trainkit's ViTOneBlock (examples/models/vit.py), its FP4LinearConverter on the `_proj` layers
with FP4_RECIPES[recipe], Adam and cross-entropy, batch 64: the loop of its
examples/fp4_train_ViTOneBlock_mnist.py (train loss and accuracy summed over the epoch, then test
accuracy). Changes to that script, all stated:
  - the images come from the IDX files of scripts/get_mnist.sh as tensors (the same normalisation,
    (x/255 - 0.1307)/0.3081), because torchvision's downloader needs a network; the shuffle is
    torch.randperm from torch.manual_seed(--seed) (its DataLoader(shuffle=True) draws from the same
    global generator, unseeded there);
  - --sr unbiased: fp4-trainkit's stochastic rounding (m += U[-0.5, 0.5) on the 1-bit mantissa, then
    round and clamp: two grid steps of noise, biased at its clamps; docs/log/research_fp4trainkit.md
    section 5) is replaced by unbiased SR onto the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} of the same
    block scale (round up with probability (a - lo) / (hi - lo), magnitudes above 6 saturate as its RN
    does); its scales, block layout and round-to-nearest are untouched;
  - --loss-scale S: backward of S * loss, the gradients divided by S (exact for a power of two) before
    Adam's step, so the quantized gradients of the backward are S times larger (above NVFP4's 2^-9 scale
    floor) while the update is that of the unscaled loss.

  python3 scripts/fp4tk_vit_run.py --fp4tk shared/fp4-trainkit --recipe fp4_all_the_way --lr 5e-4 \
      --epochs 5 --seed 1 [--sr unbiased] [--loss-scale 4096] [--device cuda] [--out run.json]

Prints a line per epoch; --out writes {"args": ..., "epochs": [{epoch, seconds, train_loss, train_acc,
test_acc}, ...]} after every epoch (a run cut short keeps its finished epochs).
"""
import argparse
import json
import pathlib
import sys
import time

import numpy as np
import torch
from torch import nn

E2M1_MAX = 6.0


def idx(path):  # IDX: big-endian magic (0, 0, 0x08, ndim), ndim int32 sizes, uint8 data
    raw = pathlib.Path(path).read_bytes()
    nd = raw[3]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(np.frombuffer(raw, ">i4", nd, 4))


def mnist(d, split):
    x = idx(f"{d}/{split}-images-idx3-ubyte").astype(np.float32) / 255.0
    x = torch.tensor((x - 0.1307) / 0.3081).unsqueeze(1)  # [N, 1, 28, 28] as ToTensor + Normalize
    return x, torch.tensor(idx(f"{d}/{split}-labels-idx1-ubyte").astype(np.int64))


def sr_e2m1(a):
    """Unbiased stochastic rounding of magnitudes a >= 0 (block-scaled) onto the E2M1 grid; E[q] = a on
    [0, 6], a > 6 saturates to 6. The grid step is 0.5 below 2, 1 below 4, 2 below 6 (powers of two,
    so a / step, floor and the products are exact)."""
    a = a.clamp(max=E2M1_MAX)
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(a.dtype)
    lo = torch.floor(a / step) * step
    up = torch.rand_like(a) * step < (a - lo)  # P(up) = (a - lo) / step
    return torch.where(up, lo + step, lo)


def patch_unbiased_sr(simulator, scale_of, rounding, block_axis):
    """Replaces simulator.emulate for its Stochastic quantizers: the same block layout (ColWise blocks run
    down columns) and scale (scale_of, fp4-trainkit's own method), then sr_e2m1; the Nearest ones run
    fp4-trainkit's code. rounding, block_axis: fp4tk.recipe's Rounding and BlockAxis."""
    original = simulator.emulate

    def emulate(self, tensor):
        if self.rounding != rounding.Stochastic:
            return original(self, tensor)
        col = self.block_axis == block_axis.ColWise
        t = tensor.T if col else tensor
        r = t.shape[0]
        blocks = t.reshape(r, -1, self.K)
        scale = getattr(self, scale_of)(blocks)
        scaled = blocks / scale
        out = (scale * (scaled.sign() * sr_e2m1(scaled.abs()))).reshape(r, -1)
        return out.T if col else out

    simulator.emulate = emulate


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fp4tk", required=True, help="a checkout of github.com/vuiseng9/fp4-trainkit")
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--data", default="data/mnist")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sr", choices=["fp4tk", "unbiased"], default="fp4tk")
    ap.add_argument("--loss-scale", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--out", help="JSON file of the per-epoch records")
    ap.add_argument("--batches", type=int, default=0, help="train on the first N batches of each epoch (0: all; timing)")
    a = ap.parse_args()
    if a.loss_scale <= 0 or np.frexp(a.loss_scale)[0] != 0.5:
        sys.exit(f"fp4tk_vit_run.py: --loss-scale {a.loss_scale}: a power of two > 0 (the unscaling is exact)")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    root = pathlib.Path(a.fp4tk)
    sys.path[:0] = [str(root / "src"), str(root / "examples")]
    from models.vit import ViTOneBlock
    from fp4tk import FP4LinearConverter, FP4_RECIPES
    from fp4tk.recipe import BlockAxis, Rounding
    from fp4tk.quantizer.mxfp4 import MXFP4Simulator
    from fp4tk.quantizer.nvfp4 import NVFP4Simulator

    if a.sr == "unbiased":
        patch_unbiased_sr(MXFP4Simulator, "get_e8m0_scale", Rounding, BlockAxis)
        patch_unbiased_sr(NVFP4Simulator, "get_e4m3_scale", Rounding, BlockAxis)
    torch.manual_seed(a.seed)
    xtr, ytr = mnist(a.data, "train")
    xte, yte = mnist(a.data, "t10k")
    model = ViTOneBlock().to(a.device)
    FP4LinearConverter().apply(model, recipe=FP4_RECIPES[a.recipe], keywords=["_proj"], verbose=False)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    crit = nn.CrossEntropyLoss()
    record = {"args": vars(a), "torch": torch.__version__, "epochs": []}
    for epoch in range(1, a.epochs + 1):
        model.train()
        perm = torch.randperm(len(ytr))
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = correct = 0
        loss_sum = 0.0
        for i in range(0, len(ytr) if a.batches <= 0 else min(len(ytr), 64 * a.batches), 64):
            j = perm[i:i + 64]
            x, y = xtr[j].to(a.device), ytr[j].to(a.device)
            logits = model(x)
            loss = crit(logits, y)
            opt.zero_grad()
            (loss * a.loss_scale if a.loss_scale != 1.0 else loss).backward()
            if a.loss_scale != 1.0:
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.div_(a.loss_scale)
            opt.step()
            loss_sum += loss.item() * y.size(0)  # fp4-trainkit's loop reads the loss every step
            correct += (logits.argmax(1) == y).sum().item()
            total += y.size(0)
        if a.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        model.eval()
        test_correct = 0
        with torch.no_grad():
            for i in range(0, len(yte), 64):
                test_correct += (model(xte[i:i + 64].to(a.device)).argmax(1).cpu() == yte[i:i + 64]).sum().item()
        rec = {"epoch": epoch, "seconds": dt, "train_loss": loss_sum / total, "train_acc": 100.0 * correct / total,
               "test_acc": 100.0 * test_correct / len(yte)}
        record["epochs"].append(rec)
        print(f"fp4-trainkit {a.recipe} sr {a.sr} loss_scale {a.loss_scale:g} seed {a.seed} epoch {epoch}: "
              f"{dt:.2f} s, train_loss {rec['train_loss']:.4f}, test_acc {rec['test_acc']:.2f}%", flush=True)
        if a.out:
            pathlib.Path(a.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
