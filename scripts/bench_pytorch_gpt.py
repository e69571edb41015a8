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
                                         [--dtype fp32|bf16] [--threads 2] [--steps 20]
--dtype bf16 runs the forward under torch.autocast(bfloat16) as nanoGPT does on GPUs;
fp32 is plain FP32 (TF32 off). Prints ms/iteration and tokens/s.
"""
import argparse, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--size", choices=sorted(SIZES), default="baby")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1337)
    L, H, C, T, B, p = SIZES[a.size]
    dev = torch.device(a.device)
    m = GPT(T=T, C=C, L=L, H=H, p=p).to(dev)
    decay = [q for q in m.parameters() if q.dim() >= 2]
    nodecay = [q for q in m.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    x = torch.randint(65, (B, T), device=dev)
    y = torch.randint(65, (B, T), device=dev)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    ctx = (torch.autocast(device_type=a.device, dtype=torch.bfloat16) if a.dtype == "bf16"
           else torch.autocast(device_type=a.device, enabled=False))
    total = 0.0
    for s in range(a.steps + 3):
        sync()
        t0 = time.perf_counter()
        with ctx:
            loss = m(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        sync()
        if s >= 3:
            total += time.perf_counter() - t0
    ms = 1000 * total / a.steps
    where = torch.cuda.get_device_name() if a.device == "cuda" else f"{a.threads} threads"
    print(f"pytorch {torch.__version__} eager {a.dtype} {a.size}, {where}: {ms:.2f} ms/iter, "
          f"{B * T * 1000 / ms:.0f} tokens/s")


if __name__ == "__main__":
    main()
