"""fp4-trainkit's one-block ViT on MNIST (examples/fp4_train_ViTOneBlock_mnist.py of
vuiseng9/fp4-trainkit) with fp4lab.torch: the model of configs/vit_mnist.json and
train/vit.cpp (patch 7, width 64, 4 heads, MLP ratio 2, dropout 0.1, scores times
sqrt(head_dim) as fp4-trainkit's attention does, head on [CLS]), only the *_proj
layers quantized, Adam lr 1e-3, batch 64; one run per recipe, printing the time
per epoch and the test accuracy.
  PYTHONPATH=build/python python3 examples/vit_mnist.py --epochs 1 --train-limit 2000      # CPU, quick
  PYTHONPATH=build/python python3 examples/vit_mnist.py --device cuda                       # all recipes, 5 epochs
MNIST: scripts/get_mnist.sh puts the IDX files in data/mnist/ (--data DIR)."""
import argparse, pathlib, time
import numpy as np, torch, torch.nn.functional as F
from torch import nn
import fp4lab.torch as ft

RECIPES = ["fp32", "fp4tk_mx_baseline", "fp4tk_nvidia_round_to_infinity", "fp4tk_tetrajet", "fp4tk_fp4_all_the_way"]


def idx(path):  # IDX: big-endian magic (0, 0, dtype 0x08, ndim), ndim int32 sizes, uint8 data
    raw = pathlib.Path(path).read_bytes()
    nd = raw[3]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(np.frombuffer(raw, ">i4", nd, 4))


def mnist(d, split):
    x = idx(f"{d}/{split}-images-idx3-ubyte").astype(np.float32) / 255.0
    return torch.tensor((x - 0.1307) / 0.3081), torch.tensor(idx(f"{d}/{split}-labels-idx1-ubyte").astype(np.int64))


class ViT(nn.Module):  # names as train/vit.cpp: patch_embed, blocks.0.attn.{q,k,v,o}_proj, blocks.0.ffn.*, head
    def __init__(s, E=64, H=4, P=7, mlp=2.0, p=0.1):
        super().__init__()
        s.P, s.H, s.p = P, H, p
        s.patch_embed = nn.Linear(P * P, E)  # = fp4-trainkit's Conv2d(kernel = stride = 7) on flattened patches
        s.cls_token, s.pos_embed = nn.Parameter(torch.zeros(1, 1, E)), nn.Parameter(torch.zeros(1, 17, E))
        nn.init.trunc_normal_(s.cls_token, std=0.02), nn.init.trunc_normal_(s.pos_embed, std=0.02)
        attn = nn.ModuleDict({"preln": nn.LayerNorm(E), **{k: nn.Linear(E, E) for k in ("q_proj", "k_proj", "v_proj", "o_proj")}})
        ffn = nn.ModuleDict({"preln": nn.LayerNorm(E), "up_proj": nn.Linear(E, int(E * mlp)), "down_proj": nn.Linear(int(E * mlp), E)})
        s.blocks = nn.ModuleList([nn.ModuleDict({"attn": attn, "ffn": ffn})])
        s.head = nn.Linear(E, 10)

    def forward(s, img):  # img [B, 28, 28]
        B, P = img.shape[0], s.P
        x = s.patch_embed(img.reshape(B, 4, P, 4, P).permute(0, 1, 3, 2, 4).reshape(B, 16, P * P))
        x = torch.cat([s.cls_token.expand(B, -1, -1), x], 1) + s.pos_embed
        for blk in s.blocks:
            a, f = blk["attn"], blk["ffn"]
            h = a["preln"](x)
            q, k, v = (a[n](h).reshape(B, 17, s.H, -1).transpose(1, 2) for n in ("q_proj", "k_proj", "v_proj"))
            att = F.dropout(torch.softmax((q @ k.transpose(-2, -1)) * q.shape[-1] ** 0.5, -1), s.p, s.training)
            x = x + a["o_proj"]((att @ v).transpose(1, 2).reshape(B, 17, -1))
            h = F.dropout(F.gelu(f["up_proj"](f["preln"](x))), s.p, s.training)
            x = x + F.dropout(f["down_proj"](h), s.p, s.training)
        return s.head(x[:, 0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", default=",".join(RECIPES)), ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=5), ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3), ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default="data/mnist"), ap.add_argument("--train-limit", type=int, default=0)
    a = ap.parse_args()
    (xtr, ytr), (xte, yte) = mnist(a.data, "train"), mnist(a.data, "t10k")
    if a.train_limit:
        xtr, ytr, xte, yte = xtr[:a.train_limit], ytr[:a.train_limit], xte[:a.train_limit], yte[:a.train_limit]
    xtr, ytr, xte, yte = (t.to(a.device) for t in (xtr, ytr, xte, yte))
    for recipe in a.recipes.split(","):
        torch.manual_seed(a.seed)
        model = ft.convert(ViT(), recipe, keep_high_precision=["patch_embed", "head"], seed=a.seed).to(a.device)
        opt, g = torch.optim.Adam(model.parameters(), lr=a.lr), torch.Generator().manual_seed(a.seed)
        for epoch in range(1, a.epochs + 1):
            model.train()
            t0 = time.perf_counter()
            for i in torch.randperm(len(xtr), generator=g).split(a.batch_size):
                i = i.to(a.device)
                loss = F.cross_entropy(model(xtr[i]), ytr[i])
                opt.zero_grad(set_to_none=True), loss.backward(), opt.step()
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            model.eval()
            with torch.no_grad():
                hits = sum((model(xte[j:j + 1000]).argmax(1) == yte[j:j + 1000]).sum().item() for j in range(0, len(xte), 1000))
            print(f"{recipe:32s} epoch {epoch}  {dt:7.2f} s/epoch  loss {loss.item():.4f}  test acc {100 * hits / len(xte):.2f}%", flush=True)


if __name__ == "__main__":
    main()
