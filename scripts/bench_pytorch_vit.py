#!/usr/bin/env python3
"""PyTorch reference of fp4lab's ViT (train/model.hpp: fp4-trainkit's one-block ViT on MNIST) for
`fp4lab bench train` on a ViT config: the same shapes, written from train/model.hpp's description,
not copied from fp4-trainkit.
  patches p x p -> width E (a linear layer on flattened patches), [CLS] token + learned position
  embedding, `layers` pre-LN blocks: attention with separate q/k/v/o projections (dropout on the
  probabilities, scores scaled by 1/sqrt(head_dim) or sqrt(head_dim) as model.attn_scale), MLP
  E -> ratio*E -> E with GELU and dropout after each, no final LayerNorm, a head on [CLS].
Optimizer Adam (or AdamW with --weight-decay), synthetic images and labels, FP32.

    python3 scripts/bench_pytorch_vit.py [--device cpu|cuda] [--image 28 --patch 7 --channels 1
        --classes 10 --width 64 --heads 4 --layers 1 --mlp-ratio 2 --dropout 0.1 --batch 64
        --attn-scale inv_sqrt_head_dim|sqrt_head_dim --weight-decay 0 --grad-clip 0]
        [--threads 2] [--steps 20] [--repeats 1] [--compile]
Each of `repeats` rounds times `steps` steps, synchronised per step. Prints one line per round and
a last line
    RESULT <variant> <median ms/iter> <min> <max> <images/s at the median>
(options, timing loop and RESULT line shared with bench_pytorch_gpt.py: bench_pytorch_common.py).
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import bench_pytorch_common as common


class Block(nn.Module):
    def __init__(self, E, H, F_, p, scale):
        super().__init__()
        self.H, self.scale = H, scale
        self.ln1, self.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
        self.q, self.k, self.v, self.o = (nn.Linear(E, E) for _ in range(4))
        self.up, self.down = nn.Linear(E, F_), nn.Linear(F_, E)
        self.drop_p, self.drop_m1, self.drop_m2 = nn.Dropout(p), nn.Dropout(p), nn.Dropout(p)

    def forward(self, x):
        B, N, E = x.shape
        h = self.ln1(x)
        q, k, v = (t(h).view(B, N, self.H, E // self.H).transpose(1, 2) for t in (self.q, self.k, self.v))
        a = self.drop_p(torch.softmax((q @ k.transpose(-1, -2)) * self.scale, dim=-1))
        x = x + self.o((a @ v).transpose(1, 2).reshape(B, N, E))
        return x + self.drop_m2(self.down(self.drop_m1(F.gelu(self.up(self.ln2(x))))))


class ViT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.p = a.patch
        n = (a.image // a.patch) ** 2
        self.patch_embed = nn.Linear(a.channels * a.patch * a.patch, a.width)
        self.cls = nn.Parameter(torch.empty(1, 1, a.width))
        self.pos = nn.Parameter(torch.empty(1, n + 1, a.width))
        nn.init.trunc_normal_(self.cls, std=0.02)
        nn.init.trunc_normal_(self.pos, std=0.02)
        hd = a.width // a.heads
        scale = math.sqrt(hd) if a.attn_scale == "sqrt_head_dim" else 1.0 / math.sqrt(hd)
        self.blocks = nn.ModuleList(
            Block(a.width, a.heads, int(a.width * a.mlp_ratio), a.dropout, scale) for _ in range(a.layers))
        self.head = nn.Linear(a.width, a.classes)

    def forward(self, img, y):
        B, C, S, _ = img.shape
        p = self.p
        x = img.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(B, -1, C * p * p)
        x = torch.cat([self.cls.expand(B, -1, -1), self.patch_embed(x)], dim=1) + self.pos
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(x[:, 0]), y)


def main():
    ap = argparse.ArgumentParser()
    common.add_device_arg(ap)
    for name, kind, default in (("image", int, 28), ("patch", int, 7), ("channels", int, 1), ("classes", int, 10),
                                ("width", int, 64), ("heads", int, 4), ("layers", int, 1),
                                ("mlp-ratio", float, 2.0), ("dropout", float, 0.1), ("batch", int, 64),
                                ("weight-decay", float, 0.0), ("grad-clip", float, 0.0)):
        ap.add_argument("--" + name, type=kind, default=default)
    ap.add_argument("--attn-scale", choices=["inv_sqrt_head_dim", "sqrt_head_dim"], default="sqrt_head_dim")
    common.add_timing_args(ap)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    common.check_timing_args(ap, a)
    if a.image % a.patch or a.width % a.heads:
        ap.error("--patch must divide --image and --heads must divide --width")
    common.setup_torch(a, tf32=False)
    dev = torch.device(a.device)
    m = ViT(a).to(dev)
    opt = (torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=a.weight_decay) if a.weight_decay > 0
           else torch.optim.Adam(m.parameters(), lr=1e-3))
    fwd = torch.compile(m) if a.compile else m
    x = torch.randn(a.batch, a.channels, a.image, a.image, device=dev)
    y = torch.randint(a.classes, (a.batch,), device=dev)

    def step():
        loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(m.parameters(), a.grad_clip)
        opt.step()

    name = ("compile" if a.compile else "eager") + ",fp32,vit"
    common.run_rounds(a, step, 10 if a.compile else 3, name, f"batch {a.batch}", a.batch, "images")


if __name__ == "__main__":
    main()
