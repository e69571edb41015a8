"""What scripts/bench_pytorch_gpt.py and scripts/bench_pytorch_vit.py share: the options and checks of
the device and the timing (--device; --threads, --steps, --repeats), torch's set-up (threads, TF32, seed)
and the timing loop, which prints one line per round and the last line

    RESULT <variant> <median ms/iter> <min> <max> <items/s at the median>

that `fp4lab bench train` parses (apps/cmd_train.cpp, bench_pytorch: the last line's first five
whitespace-separated fields, tag RESULT; keep this format as it is). Imported by those two scripts,
found beside them (Python puts a script's directory first on sys.path).
"""
import time

import torch


def add_device_arg(ap):
    """--device cpu|cuda (each script's first option)."""
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")


def add_timing_args(ap):
    """--threads (torch's CPU threads), --steps (timed steps a round), --repeats (rounds)."""
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)


def check_timing_args(ap, a):
    """Exits through ap.error (status 2, usage on stderr) unless --steps and --repeats are positive."""
    if a.steps <= 0 or a.repeats <= 0:
        ap.error("--steps and --repeats must be positive")


def setup_torch(a, tf32=False):
    """a.threads CPU threads, TF32 matmuls and convolutions on or off, seed 1337 (before the model is built)."""
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1337)


def median(rounds):
    """The median of a sorted list (the mean of the two middle values for an even count)."""
    n = len(rounds)
    return rounds[n // 2] if n % 2 else 0.5 * (rounds[n // 2 - 1] + rounds[n // 2])


def result_line(name, rounds, items):
    """The RESULT line of `rounds` (ms/iter, sorted), `items` (tokens or images) a step."""
    med = median(rounds)
    return f"RESULT {name} {med:.4f} {rounds[0]:.4f} {rounds[-1]:.4f} {items * 1000 / med:.0f}"


def run_rounds(a, step, warmup, name, shape, items, unit):
    """`warmup` untimed calls of step(), then a.repeats rounds of a.steps timed ones (synchronised
    before and after each step on CUDA, as fp4lab's bench train); prints a line per round
    (`shape` describes the model, `items` a step counted in `unit`) and, last, the RESULT line."""
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    where = torch.cuda.get_device_name() if a.device == "cuda" else f"{a.threads} threads"
    rounds = []
    for r in range(a.repeats):
        total = 0.0
        for _ in range(a.steps):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            total += time.perf_counter() - t0
        ms = 1000 * total / a.steps
        rounds.append(ms)
        print(f"pytorch {torch.__version__} {name} {shape}, {where}, round {r + 1}: {ms:.2f} ms/iter, "
              f"{items * 1000 / ms:.0f} {unit}/s", flush=True)
    rounds.sort()
    print(result_line(name, rounds, items))
