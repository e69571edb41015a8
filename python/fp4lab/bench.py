"""Timings of the Python entry points on CUDA tensors, as figures (not tests).

    python3 -m fp4lab.bench [--rows 8192 --cols 8192] [--quantizers nvfp4,mxfp4] [--repeats 20]

For each quantizer: the median time of fp4lab.quantize on a CUDA float32 and
bfloat16 tensor of rows x cols (CUDA events around the call, the launch
included), and its bandwidth against torch's device-to-device copy of the
same input measured in the same run (the roofline of a pass over the data).
Compare with `fp4lab bench quantize --backend cuda` on the same machine: the
same kernels, called from C++.

Then the cost of a call above its kernel on a small tensor (128 x 128): the
host wall time of one fp4lab.quantize call (output allocation, argument
checks, launch) minus the kernel's own time, median of many calls, with the
GPU kept busy so that launches are not waited for.
"""
import argparse
import statistics
import time


def main():
    import torch
    import fp4lab
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=8192)
    p.add_argument("--quantizers", default="nvfp4,mxfp4,mxfp8_e4m3,nvfp4_2d")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    if not fp4lab.cuda_available() or not torch.cuda.is_available():
        raise SystemExit("fp4lab.bench: needs fp4lab's CUDA backend and a GPU")
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}; torch {torch.__version__}; fp4lab {fp4lab.__version__}")
    x32 = torch.randn(a.rows, a.cols, device=dev)
    inputs = {"float32": x32, "bfloat16": x32.to(torch.bfloat16)}

    def median_ms(fn, inner=10):
        """Median over `repeats` of the time of `inner` back-to-back calls, per call: calls
        queued as a training step queues them, the host's cost hidden behind the GPU's
        wherever it is shorter (as for `fp4lab bench quantize`'s C++ calls)."""
        for _ in range(3):
            fn()
        times = []
        for _ in range(a.repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(inner):
                fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / inner)
        return statistics.median(times)

    print(f"\nfp4lab.quantize on a CUDA tensor [{a.rows}, {a.cols}] (median of {a.repeats}); 'packed': "
          "packed=True, dequant=False (4-bit codes two a byte + scales: the outputs of `fp4lab bench quantize`'s "
          "rows); 'all': codes one a byte, scales, FP32 dequant")
    print(f"{'quantizer':<14}{'input':<10}{'outputs':<9}{'ms':>9}{'copy ms':>9}{'of copy':>9}")
    for name, x in inputs.items():
        dst = torch.empty_like(x)
        copy = median_ms(lambda: dst.copy_(x))
        for q in a.quantizers.split(","):
            four_bit = q.startswith(("nvfp4", "mxfp4"))
            for outs in (("packed", "all") if four_bit else ("all",)):
                kw = dict(packed=True, dequant=False) if outs == "packed" else {}
                ms = median_ms(lambda: fp4lab.quantize(x, q, **kw))
                print(f"{q:<14}{name:<10}{outs:<9}{ms:9.3f}{copy:9.3f}{copy / ms:9.2f}")

    small = torch.randn(128, 128, device=dev)
    q = "nvfp4"
    kernel = median_ms(lambda: fp4lab.quantize(small, q), inner=1)
    # Where the host time goes: each step of the call alone (median of 200, microseconds).
    import fp4lab as f
    parts = {
        "torch.empty x3": lambda: [torch.empty((128, 128), dtype=torch.uint8, device=dev) for _ in range(3)],
        "current stream (raw)": lambda: f._current_stream(torch, 0),
        "_C.quantize_device": None,
        "whole call": lambda: fp4lab.quantize(small, q),
    }
    bufs = [torch.empty((128, 128), dtype=torch.uint8, device=dev), torch.empty((128, 8), dtype=torch.uint8, device=dev),
            torch.empty((128, 8), dtype=torch.float32, device=dev), torch.empty((128, 128), dtype=torch.float32, device=dev),
            torch.empty((1,), dtype=torch.float32, device=dev)]
    s = torch.cuda.current_stream().cuda_stream
    parts["_C.quantize_device"] = lambda: f._C.quantize_device(q, small.data_ptr(), "f32", 128, 128, 0, 0,
                                                               *(b.data_ptr() for b in bufs), False, s)
    for label, fn in parts.items():
        ts = []
        for _ in range(200):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        print(f"  host time of {label:<20} {statistics.median(ts):8.1f} us")
    big = torch.randn(4096, 4096, device=dev)
    walls = []
    for _ in range(200):
        torch.mm(big, big)  # keeps the GPU busy: the call below never waits for its launch
        t0 = time.perf_counter()
        fp4lab.quantize(small, q)
        walls.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    wall = statistics.median(walls)
    print(f"\ncost of a call on [128, 128] {q}: host wall {wall * 1e3:.1f} us per call (median of 200, "
          f"GPU busy), {kernel * 1e3:.1f} us from call to kernel end on an idle GPU (CUDA events)")


if __name__ == "__main__":
    main()
