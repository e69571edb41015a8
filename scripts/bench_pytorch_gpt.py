#!/usr/bin/env python3
"""nanoGPT-style reference for `fp4lab bench train`: the baby GPT (4 layers, 4 heads,
width 128, context 64, batch 12, vocab 65, bias=False, dropout 0) trained with
PyTorch eager on the CPU, AdamW(betas 0.9/0.99, wd 0.1 on 2-D weights), grad clip 1.0.
The model follows karpathy/nanoGPT model.py (pre-LN blocks, GELU MLP 4x, tied lm_head,
causal attention) written from its description, not copied.

    python3 scripts/bench_pytorch_gpt.py [--threads 2] [--steps 20]
Prints ms/iteration and tokens/s in the same format as `fp4lab bench train`.
"""
import argparse, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C, bias=False)
        self.c_attn = nn.Linear(C, 3 * C, bias=False)
        self.attn_proj = nn.Linear(C, C, bias=False)
        self.ln_2 = nn.LayerNorm(C, bias=False)
        self.c_fc = nn.Linear(C, 4 * C, bias=False)
        self.mlp_proj = nn.Linear(4 * C, C, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, V=65, T=64, C=128, L=4, H=4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, bias=False)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.wte.weight = self.lm_head.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    m = GPT()
    decay = [p for p in m.parameters() if p.dim() >= 2]
    nodecay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    x = torch.randint(65, (12, 64))
    y = torch.randint(65, (12, 64))
    total = 0.0
    for s in range(a.steps + 2):
        t0 = time.perf_counter()
        loss = m(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if s >= 2:
            total += time.perf_counter() - t0
    ms = 1000 * total / a.steps
    print(f"pytorch {torch.__version__} eager, {a.threads} threads: {ms:.2f} ms/iter, {12 * 64 * 1000 / ms:.0f} tokens/s")


if __name__ == "__main__":
    main()
