"""fp4lab.torch: the trainer's quantized linear layer for PyTorch models.

Every GEMM of a converted layer runs through fp4lab's own trainer layer
(train/linear_function.hpp -> Backend::linear_forward / linear_backward: the
CPU reference train/cpu/linear.*, or CudaLinear on the GPU), so a layer given
the trainer's recipe, seed, layer id and step produces the trainer's operands
bit for bit. Nothing here quantizes anything itself.

    import fp4lab.torch as ft
    model = MyModel()
    ft.convert(model, "nvfp4", keep_high_precision=["head"], seed=1)
    # or one layer: ft.Linear(64, 128, recipe="mx_baseline", name="fc1", layer_id=0)

Recipes: a canned name (`fp4lab recipes list`), a recipe JSON file, JSON text,
or a dict (the same JSON object). A recipe with `switch_to` is refused (a layer
knows no run length): pass the recipe in force.

Shapes: x [..., in] (leading dims are flattened to [tokens, in]; the output is
[..., out]), weight [out, in], bias [out].

Dtypes: float32, bfloat16 and float16 tensors are accepted. Inputs are cast to
float32 (exact for bf16/fp16), the layer computes in float32 as the trainer
does, and each result is cast back to its source's dtype: y and dx to x's,
dW to weight's, db to bias's (one round-to-nearest from float32). Autocast is
not applied inside the layer.

Devices: CPU tensors run the CPU backend (OpenMP threads; bits independent of
the thread count); CUDA tensors run the CUDA backend on the device current
when the first CUDA layer ran (one GPU per process). x, weight and bias must be
on one device.

Streams (CUDA): the layer's work is queued on the legacy default stream,
PyTorch's default stream, so plain PyTorch code needs nothing. Under a side
stream (torch.cuda.stream(s)) each call makes the default stream wait for an
event recorded on s before the layer, and s wait for one recorded on the
default stream after it: ordered, without a host synchronisation.

Steps (stochastic rounding): operand op of a layer draws its SR bits from
Philox (seed, 0xA<<60 | layer_id<<44 | step<<3 | op), the trainer's stream.
A Linear's `step` starts at 0 and advances by one after every TRAINING forward
(module.training and grad enabled), like the trainer's step (the update
index), provided the model runs one forward per optimizer step; evaluation
forwards (module.eval() or torch.no_grad()) use the current step and do not
advance it. With gradient accumulation or activation checkpointing (a forward
recomputed), set the step explicitly: set_step(model, n) before each update,
or Linear.step. Two runs with the same seed, recipe, data and steps give the
same bits; another seed gives other SR bits.

Layer ids: convert() numbers every nn.Linear of the model, kept ones included,
0, 1, 2... in named_modules() order (declaration order), as the trainer numbers
its layers; the layer name is the module path ("blocks.0.attn.q_proj"), which
the recipe's own keep_high_precision patterns match ('*' wildcard, whole name).
"""
from __future__ import annotations

import contextlib
import json
import re
from typing import Iterable, Optional, Union

import torch
from torch import nn

from . import _C

__all__ = ["Linear", "convert", "linear", "set_step", "quantized_layers", "name_matches"]

RecipeLike = Union[str, dict]
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_cuda_device: Optional[int] = None  # the device the CUDA backend runs on (set by the first CUDA call)


def _recipe_text(recipe: RecipeLike) -> str:
    if isinstance(recipe, dict):
        return json.dumps(recipe)
    if isinstance(recipe, str):
        return recipe
    raise ValueError(f"fp4lab.torch: recipe must be a name, a JSON file, JSON text or a dict, not {type(recipe).__name__}")


def name_matches(pattern: str, name: str) -> bool:
    """The trainer's layer-name match (recipes/recipe.hpp): '*' matches any run of
    characters, everything else literally, over the whole name."""
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), name) is not None


def _backend_of(device: torch.device) -> str:
    global _cuda_device
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if _cuda_device is None:
            if index != torch.cuda.current_device():
                raise ValueError(f"fp4lab.torch: tensors on cuda:{index} but the current device is "
                                 f"cuda:{torch.cuda.current_device()}; call torch.cuda.set_device({index}) first")
            _cuda_device = index
        elif index != _cuda_device:
            raise ValueError(f"fp4lab.torch: the CUDA backend runs on cuda:{_cuda_device}; got a tensor on "
                             f"cuda:{index} (one GPU per process)")
        return "cuda"
    raise ValueError(f"fp4lab.torch: tensors on {device} are not supported (cpu or cuda)")


def _raw(t: Optional[torch.Tensor], what: str, shape, device: torch.device) -> int:
    """The address of a float32 contiguous tensor of `shape` on `device` (0 for None)."""
    if t is None:
        return 0
    if t.dtype != torch.float32:
        raise ValueError(f"fp4lab.torch: {what} must be float32 here, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"fp4lab.torch: {what} must be contiguous (row-major)")
    if t.device != device:
        raise ValueError(f"fp4lab.torch: {what} is on {t.device}, the layer's input on {device}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"fp4lab.torch: {what} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    return t.data_ptr() if t.numel() > 0 else 0


def _f32(t: Optional[torch.Tensor], what: str) -> Optional[torch.Tensor]:
    if t is None:
        return None
    if t.dtype not in _DTYPES:
        raise ValueError(f"fp4lab.torch: {what} has dtype {t.dtype}; float32, bfloat16 or float16 expected")
    return t.to(torch.float32).contiguous()


@contextlib.contextmanager
def _ordered_with_default_stream(device: torch.device):
    """Orders the layer's legacy-default-stream work with the current stream."""
    if device.type != "cuda":
        yield
        return
    cur = torch.cuda.current_stream(device)
    default = torch.cuda.default_stream(device)
    if cur == default:
        yield
        return
    before = torch.cuda.Event()
    before.record(cur)
    default.wait_event(before)
    yield
    after = torch.cuda.Event()
    after.record(default)
    cur.wait_event(after)


class _LinearFunction(torch.autograd.Function):
    """y = x W^T + b through a fp4lab._C.LinearFunction at `step`."""

    @staticmethod
    def forward(ctx, x, weight, bias, fn, step, need_backward):
        if weight.dim() != 2:
            raise ValueError(f"fp4lab.torch: weight must be [out, in], got shape {tuple(weight.shape)}")
        out_f, in_f = weight.shape
        if x.dim() < 1 or x.shape[-1] != in_f:
            raise ValueError(f"fp4lab.torch: x has shape {tuple(x.shape)}; its last dim must be in_features {in_f}")
        if bias is not None and tuple(bias.shape) != (out_f,):
            raise ValueError(f"fp4lab.torch: bias has shape {tuple(bias.shape)}, expected ({out_f},)")
        device = x.device
        for t, what in ((weight, "weight"), (bias, "bias")):
            if t is not None and t.device != device:
                raise ValueError(f"fp4lab.torch: {what} is on {t.device} but x on {device}")
        lead = x.shape[:-1]
        xf = _f32(x.reshape(-1, in_f), "x")
        wf, bf = _f32(weight, "weight"), _f32(bias, "bias")
        rows = xf.shape[0]
        y = torch.empty(rows, out_f, dtype=torch.float32, device=device)
        args = (_raw(xf, "x", (rows, in_f), device), rows, in_f, _raw(wf, "weight", (out_f, in_f), device), out_f,
                _raw(bf, "bias", (out_f,), device), _raw(y, "y", (rows, out_f), device))
        with _ordered_with_default_stream(device):
            saved = fn.forward(int(step), args[0], args[1], args[2], args[3], args[4], args[5], args[6],
                               bool(need_backward))
        ctx.fn, ctx.state = fn, saved
        ctx.meta = (tuple(x.shape), x.dtype, weight.dtype, None if bias is None else bias.dtype, rows, in_f, out_f)
        ctx.save_for_backward(wf)  # W as the forward used it (weight itself when float32 contiguous)
        return y.reshape(*lead, out_f).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        if ctx.state is None:
            raise RuntimeError("fp4lab.torch: this forward ran without a backward state (need_backward=False)")
        (wf,) = ctx.saved_tensors
        x_shape, x_dtype, w_dtype, b_dtype, rows, in_f, out_f = ctx.meta
        device = wf.device
        dyf = _f32(dy.reshape(rows, out_f), "dy")
        dx = torch.empty(rows, in_f, dtype=torch.float32, device=device) if ctx.needs_input_grad[0] else None
        dw = torch.empty(out_f, in_f, dtype=torch.float32, device=device)
        db = torch.empty(out_f, dtype=torch.float32, device=device) if b_dtype is not None else None
        with _ordered_with_default_stream(device):
            ctx.fn.backward(ctx.state, _raw(wf, "weight", (out_f, in_f), device),
                            _raw(dyf, "dy", (rows, out_f), device), _raw(dx, "dx", (rows, in_f), device),
                            _raw(dw, "dW", (out_f, in_f), device), _raw(db, "db", (out_f,), device))
        gx = dx.reshape(x_shape).to(x_dtype) if dx is not None else None
        gw = dw.to(w_dtype) if ctx.needs_input_grad[1] else None
        gb = db.to(b_dtype) if db is not None and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None


class _Functions:
    """One fp4lab._C.LinearFunction per backend for a layer's (recipe, name, id, seed)."""

    def __init__(self, recipe: str, name: str, layer_id: int, seed: int):
        self.key = (recipe, name, int(layer_id), int(seed))
        self.fns = {}

    def get(self, device: torch.device):
        be = _backend_of(device)
        if be not in self.fns:
            recipe, name, layer_id, seed = self.key
            self.fns[be] = _C.LinearFunction(be, recipe, name, layer_id, seed)
        return self.fns[be]

    # copy.deepcopy and pickling (torch.save of a model) keep the key only: the
    # _C objects are re-made on first use (they hold no state between calls).
    def __getstate__(self):
        return {"key": self.key}

    def __setstate__(self, state):
        self.key, self.fns = state["key"], {}

    def __deepcopy__(self, memo):
        return _Functions(*self.key)


_functional_cache = {}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *, recipe: RecipeLike = "fp32",
           name: str = "", layer_id: int = 0, seed: int = 0, step: int = 0) -> torch.Tensor:
    """Functional form: y = x W^T + b through the trainer's layer at `step` (differentiable)."""
    key = (_recipe_text(recipe), name, int(layer_id), int(seed))
    fns = _functional_cache.get(key)
    if fns is None:
        fns = _functional_cache[key] = _Functions(*key)
    need = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    return _LinearFunction.apply(x, weight, bias, fns.get(x.device), int(step), need)


class Linear(nn.Linear):
    """nn.Linear whose GEMMs run through fp4lab's trainer layer under `recipe`.

    name: the layer name (matched by the recipe's keep_high_precision); layer_id:
    its id in the SR streams (< 2^16); seed: the SR seed; step: see the module
    docstring (advances once per training forward)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: RecipeLike = "fp32",
                 name: str = "", layer_id: int = 0, seed: int = 0, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._setup(recipe, name, layer_id, seed)

    def _setup(self, recipe: RecipeLike, name: str, layer_id: int, seed: int) -> None:
        self.recipe = _recipe_text(recipe)
        self.name, self.layer_id, self.seed = name, int(layer_id), int(seed)
        self.step = 0
        self._fns = _Functions(self.recipe, self.name, self.layer_id, self.seed)
        self._fns.get(torch.device("cpu"))  # parses the recipe now: a bad one raises ValueError here

    @classmethod
    def from_linear(cls, lin: nn.Linear, *, recipe: RecipeLike, name: str, layer_id: int, seed: int = 0) -> "Linear":
        """A Linear sharing lin's parameters (no copy, no re-initialisation)."""
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m.in_features, m.out_features = lin.in_features, lin.out_features
        m.weight = lin.weight
        m.bias = lin.bias
        m.train(lin.training)
        m._setup(recipe, name, layer_id, seed)
        return m

    @property
    def quantized(self) -> bool:
        """False when the recipe keeps this layer in high precision (or is fp32)."""
        return self._fns.get(torch.device("cpu")).quantized

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        training = self.training and torch.is_grad_enabled()
        need = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, self.weight, self.bias))
        y = _LinearFunction.apply(x, self.weight, self.bias, self._fns.get(x.device), self.step, need)
        if training:
            self.step += 1
        return y

    def extra_repr(self) -> str:
        recipe = self.recipe if len(self.recipe) < 40 else self.recipe[:37] + "..."
        return (f"{super().extra_repr()}, recipe={recipe}, name={self.name!r}, layer_id={self.layer_id}, "
                f"seed={self.seed}, step={self.step}")


def convert(model: nn.Module, recipe: RecipeLike, keep_high_precision: Iterable[str] = (), seed: int = 0,
            verbose: bool = False) -> nn.Module:
    """Swaps model's nn.Linear modules for fp4lab.torch.Linear in place; returns model.

    Every nn.Linear (named_modules() order, kept ones included) gets the id
    0, 1, 2...; those whose module path matches a keep_high_precision pattern
    ('*' wildcard, whole name; name_matches) stay torch nn.Linear, the others
    become Linear(name=path, layer_id=id, seed=seed) sharing their parameters.
    In the spirit of torchao's convert_to_float8_training (pytorch/ao,
    torchao/float8/float8_linear_utils.py: swap_linear_layers with a filter on
    the module's path) and fp4-trainkit's FP4LinearConverter
    (vuiseng9/fp4-trainkit, src/fp4tk/utils.py: setattr on the parent by a
    keyword test on the child's name); here the filter is the trainer's
    keep_high_precision match on the full path. A model that already holds an
    fp4lab.torch.Linear is refused (ids would be ambiguous)."""
    text = _recipe_text(recipe)
    keep = list(keep_high_precision)
    _C.LinearFunction("cpu", text)  # a bad recipe raises before anything is swapped
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for n, m in linears:
        if isinstance(m, Linear):
            raise ValueError(f"fp4lab.torch.convert: {n or 'the model'} is already an fp4lab.torch.Linear")
    if isinstance(model, nn.Linear):
        raise ValueError("fp4lab.torch.convert: the model itself is an nn.Linear; use Linear.from_linear")
    for layer_id, (n, m) in enumerate(linears):
        if any(name_matches(p, n) for p in keep):
            if verbose:
                print(f"[fp4lab] {n}: kept (torch nn.Linear), id {layer_id}")
            continue
        parent_name, _, attr = n.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, Linear.from_linear(m, recipe=text, name=n, layer_id=layer_id, seed=seed))
        if verbose:
            print(f"[fp4lab] {n}: fp4lab.torch.Linear, id {layer_id}")
    return model


def quantized_layers(model: nn.Module):
    """(path, Linear) for every fp4lab.torch.Linear in model."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]


def set_step(model: nn.Module, step: int) -> None:
    """Sets the step of every fp4lab.torch.Linear in model (e.g. the update index
    before each update when the forward count per update is not one)."""
    for _, m in quantized_layers(model):
        m.step = int(step)
