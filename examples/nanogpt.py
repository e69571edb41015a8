"""nanoGPT (karpathy/nanoGPT model.py / train.py) on tiny Shakespeare characters, its linear
layers converted by fp4lab.torch.convert: the model of configs/gpt_shakespeare_char.json and
train/gpt.cpp (bias False, tied lm_head, AdamW (0.9, 0.99) with weight decay 0.1 on 2-D
tensors, warmup then cosine, clip 1.0; layer names h.<i>.attn.c_attn ... lm_head as the
trainer's). Prints ms/step and the loss; evaluates on the 10% validation split at the end.
  PYTHONPATH=build/python python3 examples/nanogpt.py --steps 20 --layers 2 --width 64 --context 64 --batch 8
  PYTHONPATH=build/python python3 examples/nanogpt.py --device cuda --recipe nvfp4 --steps 500"""
import argparse, math, pathlib, time
import torch, torch.nn.functional as F
from torch import nn
import fp4lab.torch as ft


def layernorm(C):  # LayerNorm without bias (nanoGPT bias=False); torch < 2.1: a bias frozen at 0
    try:
        return nn.LayerNorm(C, bias=False)
    except TypeError:
        m = nn.LayerNorm(C)
        m.bias.requires_grad_(False)
        return m


class Block(nn.Module):
    def __init__(s, C, H, p):
        super().__init__()
        s.H, s.p = H, p
        s.ln_1 = layernorm(C)
        s.attn = nn.ModuleDict({"c_attn": nn.Linear(C, 3 * C, bias=False), "c_proj": nn.Linear(C, C, bias=False)})
        s.ln_2 = layernorm(C)
        s.mlp = nn.ModuleDict({"c_fc": nn.Linear(C, 4 * C, bias=False), "c_proj": nn.Linear(4 * C, C, bias=False)})

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = (t.reshape(B, T, s.H, -1).transpose(1, 2) for t in s.attn["c_attn"](s.ln_1(x)).split(C, 2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        y = F.dropout(torch.softmax(att, -1), s.p, s.training) @ v
        x = x + F.dropout(s.attn["c_proj"](y.transpose(1, 2).reshape(B, T, C)), s.p, s.training)
        return x + F.dropout(s.mlp["c_proj"](F.gelu(s.mlp["c_fc"](s.ln_2(x)))), s.p, s.training)


class GPT(nn.Module):
    def __init__(s, V, T, L, H, C, p):
        super().__init__()
        s.wte, s.wpe, s.drop = nn.Embedding(V, C), nn.Embedding(T, C), p
        s.h = nn.ModuleList([Block(C, H, p) for _ in range(L)])
        s.ln_f = layernorm(C)
        s.lm_head = nn.Linear(C, V, bias=False)
        s.lm_head.weight = s.wte.weight  # tied, as nanoGPT
        for n, w in s.named_parameters():
            if w.dim() == 2:
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") else 0.02)

    def forward(s, idx, targets):
        x = F.dropout(s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device)), s.drop, s.training)
        for b in s.h:
            x = b(x)
        logits = s.lm_head(s.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in dict(recipe="nvfp4", device="cpu", data="", keep="").items():
        ap.add_argument(f"--{k}", default=v)
    for k, v in dict(steps=200, layers=6, heads=6, width=384, context=256, batch=64, warmup=100, seed=1,
                     log=10, eval_iters=20).items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    for k, v in dict(lr=1e-3, min_lr=1e-4, dropout=0.2).items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=float, default=v)
    a = ap.parse_args()
    root = pathlib.Path(__file__).resolve().parents[1]
    path = a.data or next(p for p in (root / "data/tinyshakespeare.txt", pathlib.Path("/work/shared/data/tinyshakespeare.txt")) if p.exists())
    text = pathlib.Path(path).read_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text])
    n = int(0.9 * len(data))
    split = {"train": data[:n], "val": data[n:]}
    g = torch.Generator().manual_seed(a.seed)

    def batch(which):
        d = split[which]
        i = torch.randint(len(d) - a.context - 1, (a.batch,), generator=g)
        x = torch.stack([d[j:j + a.context] for j in i.tolist()])
        y = torch.stack([d[j + 1:j + 1 + a.context] for j in i.tolist()])
        return x.to(a.device), y.to(a.device)

    torch.manual_seed(a.seed)
    model = GPT(len(chars), a.context, a.layers, a.heads, a.width, a.dropout)
    ft.convert(model, a.recipe, keep_high_precision=[k for k in a.keep.split(",") if k], seed=a.seed)
    model.to(a.device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.99))
    print(f"recipe {a.recipe}: {len(ft.quantized_layers(model))} fp4lab layers, "
          f"{sum(p.numel() for p in params) / 1e6:.2f}M parameters, device {a.device}", flush=True)
    t0 = time.perf_counter()
    for step in range(a.steps):
        lr = a.lr * (step + 1) / (a.warmup + 1) if step < a.warmup else a.min_lr + 0.5 * (a.lr - a.min_lr) * (
            1 + math.cos(math.pi * min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))))
        for grp in opt.param_groups:
            grp["lr"] = lr
        ft.set_step(model, step)  # the trainer's step: the SR streams of update `step`
        x, y = batch("train")
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if (step + 1) % a.log == 0 or step + 1 == a.steps:
            lv = loss.item()  # synchronises
            dt = (time.perf_counter() - t0) * 1000 / a.log if (step + 1) % a.log == 0 else float("nan")
            print(f"step {step + 1:5d}  loss {lv:.4f}  {dt:8.1f} ms/step  lr {lr:.2e}", flush=True)
            t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        val = sum(model(*batch("val")).item() for _ in range(a.eval_iters)) / a.eval_iters
    print(f"val loss {val:.4f}")


if __name__ == "__main__":
    main()
