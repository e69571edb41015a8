#!/usr/bin/env python3
"""fp4-trainkit's own ViT/MNIST training, timed per epoch, for the table beside
examples/vit_mnist.py (fp4lab.torch) and `fp4lab train configs/vit_mnist.json`.

Runs fp4-trainkit's ViTOneBlock (examples/models/vit.py), its FP4LinearConverter
on the `_proj` layers with FP4_RECIPES[recipe], Adam and cross-entropy, batch 64,
exactly the loop of its examples/fp4_train_ViTOneBlock_mnist.py. The one change:
the images come from the IDX files of scripts/get_mnist.sh as tensors (the same
normalisation, (x/255 - 0.1307)/0.3081), because torchvision's MNIST downloader
needs a network the GPU machine does not have.

  python3 scripts/fp4tk_vit_timing.py --fp4tk shared/fp4-trainkit --recipe nvidia_round_to_infinity \
      --device cuda --epochs 1 [--data data/mnist]
"""
import argparse
import pathlib
import sys
import time

import numpy as np
import torch
from torch import nn


def idx(path):  # IDX: big-endian magic (0, 0, 0x08, ndim), ndim int32 sizes, uint8 data
    raw = pathlib.Path(path).read_bytes()
    nd = raw[3]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(np.frombuffer(raw, ">i4", nd, 4))


def mnist(d, split):
    x = idx(f"{d}/{split}-images-idx3-ubyte").astype(np.float32) / 255.0
    x = torch.tensor((x - 0.1307) / 0.3081).unsqueeze(1)  # [N, 1, 28, 28] as ToTensor + Normalize
    return x, torch.tensor(idx(f"{d}/{split}-labels-idx1-ubyte").astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fp4tk", required=True, help="a checkout of github.com/vuiseng9/fp4-trainkit")
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--data", default="data/mnist")
    ap.add_argument("--lr", type=float, default=1e-3)
    a = ap.parse_args()
    root = pathlib.Path(a.fp4tk)
    sys.path[:0] = [str(root / "src"), str(root / "examples")]
    from models.vit import ViTOneBlock
    from fp4tk import FP4LinearConverter, FP4_RECIPES

    torch.manual_seed(1)
    xtr, ytr = mnist(a.data, "train")
    xte, yte = mnist(a.data, "t10k")
    model = ViTOneBlock().to(a.device)
    FP4LinearConverter().apply(model, recipe=FP4_RECIPES[a.recipe], keywords=["_proj"], verbose=False)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    crit = nn.CrossEntropyLoss()
    for epoch in range(1, a.epochs + 1):
        model.train()
        perm = torch.randperm(len(ytr))
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(0, len(ytr), 64):
            j = perm[i:i + 64]
            x, y = xtr[j].to(a.device), ytr[j].to(a.device)
            loss = crit(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()  # fp4-trainkit's loop reads the loss every step
        if a.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(yte), 64):
                correct += (model(xte[i:i + 64].to(a.device)).argmax(1).cpu() == yte[i:i + 64]).sum().item()
        print(f"fp4-trainkit {a.recipe} epoch {epoch}: {dt:.2f} s, test_acc {100.0 * correct / len(yte):.2f}%")


if __name__ == "__main__":
    main()
