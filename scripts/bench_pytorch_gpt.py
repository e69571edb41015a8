#!/usr/bin/env python3
"""nanoGPT-style reference for `fp4lab bench train`, PyTorch eager:
  --size baby               4 layers, 4 heads, width 128, context 64, batch 12, dropout 0 (configs/gpt_baby.json)
  --size shakespeare_char   6 layers, 6 heads, width 384, context 256, batch 64, dropout 0.2
                            (configs/gpt_shakespeare_char.json)
vocab 65, bias=False, AdamW(betas 0.9/0.99, wd 0.1 on 2-D weights), grad clip 1.0.
The model follows karpathy/nanoGPT model.py (pre-LN blocks, GELU MLP 4x, tied lm_head,
causal attention through scaled_dot_product_attention, dropout on embeddings, attention
and residual branches) written from its description, not copied.

    python3 scripts/bench_pytorch_gpt.py [--device cpu|cuda] [--size baby|shakespeare_char]
        [--layers L --heads H --width C --context T --batch B --dropout P --vocab V]  (override the size)
        [--dtype fp32|bf16] [--threads 2] [--steps 20] [--repeats 1]
        [--fused-adamw] [--compile] [--cuda-graphs] [--tf32]
--dtype bf16 runs the forward under torch.autocast(bfloat16) as nanoGPT does on GPUs;
fp32 is plain FP32 (TF32 off unless --tf32). --fused-adamw: AdamW(fused=True) (CUDA); --compile:
torch.compile(model); --cuda-graphs: torch.compile(model, mode="reduce-overhead"), which replays the
compiled forward and backward as CUDA graphs (implies --compile). Compiled variants warm up for 10 steps
(compilation and graph recording), eager ones for 3. Each of `repeats` rounds times `steps` steps,
synchronised per step (as fp4lab's bench train). Prints one line per round and a last line
    RESULT <variant> <median ms/iter> <min> <max> <tokens/s at the median>
(options, timing loop and RESULT line shared with bench_pytorch_vit.py: bench_pytorch_common.py).
"""
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F

import bench_pytorch_common as common


class Block(nn.Module):
    def __init__(self, C, H, p):
        super().__init__()
        self.H, self.p = H, p
        self.drop = nn.Dropout(p)
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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        x = x + self.drop(self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    def __init__(self, V=65, T=64, C=128, L=4, H=4, p=0.0):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.drop = nn.Dropout(p)
        self.h = nn.ModuleList(Block(C, H, p) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, bias=False)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.wte.weight = self.lm_head.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


SIZES = {  # (layers, heads, width, context, batch, dropout)
    "baby": (4, 4, 128, 64, 12, 0.0),
    "shakespeare_char": (6, 6, 384, 256, 64, 0.2),
}


def variant_name(a):
    parts = ["compile+cuda-graphs" if a.cuda_graphs else "compile" if a.compile else "eager", a.dtype]
    if a.fused_adamw:
        parts.append("fused-adamw")
    if a.tf32:
        parts.append("tf32")
    return ",".join(parts)


def main():
    ap = argparse.ArgumentParser()
    common.add_device_arg(ap)
    ap.add_argument("--size", choices=sorted(SIZES), default="baby")
    for name, kind in (("layers", int), ("heads", int), ("width", int), ("context", int), ("batch", int),
                       ("dropout", float), ("vocab", int)):
        ap.add_argument("--" + name, type=kind, default=None)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    common.add_timing_args(ap)
    ap.add_argument("--fused-adamw", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--cuda-graphs", action="store_true")
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args()
    common.check_timing_args(ap, a)
    if a.device == "cpu" and (a.cuda_graphs or a.fused_adamw):
        ap.error("--cuda-graphs and --fused-adamw need --device cuda")
    common.setup_torch(a, tf32=a.tf32)
    L, H, C, T, B, p = SIZES[a.size]
    L = a.layers if a.layers is not None else L
    H = a.heads if a.heads is not None else H
    C = a.width if a.width is not None else C
    T = a.context if a.context is not None else T
    B = a.batch if a.batch is not None else B
    p = a.dropout if a.dropout is not None else p
    V = a.vocab if a.vocab is not None else 65
    dev = torch.device(a.device)
    m = GPT(V=V, T=T, C=C, L=L, H=H, p=p).to(dev)
    decay = [q for q in m.parameters() if q.dim() >= 2]
    nodecay = [q for q in m.parameters() if q.dim() < 2]
    extra = {"fused": True} if a.fused_adamw else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), **extra)
    fwd = m
    if a.compile or a.cuda_graphs:
        fwd = torch.compile(m, mode="reduce-overhead" if a.cuda_graphs else None)
    x = torch.randint(V, (B, T), device=dev)
    y = torch.randint(V, (B, T), device=dev)
    ctx = (torch.autocast(device_type=a.device, dtype=torch.bfloat16) if a.dtype == "bf16"
           else torch.autocast(device_type=a.device, enabled=False))

    def step():
        with ctx:
            loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()

    common.run_rounds(a, step, 10 if fwd is not m else 3, variant_name(a), f"L{L} H{H} C{C} T{T} B{B}", B * T,
                      "tokens")


if __name__ == "__main__":
    main()
