# microbench, after gelu_epilogue (mb-gelu-epilogue.py): what is left at row 111's shape. (1) Each algorithm
# cuBLASLt's heuristic offers for the two epilogues the lever uses (it takes the first). (2) fc1's bias gradient,
# summed apart today (torch, 79 us a layer), summed instead in fc1's weight-gradient GEMM: BGRADB on
# main_grad^T (H x 4h, column-major) += x^T (H x T) @ dpre (T x 4h), the bias gradient the sum of B over T.
# Output: epilogue-algorithms-microbench.txt.
import torch
from nvmath.linalg.advanced import Matmul, MatmulEpilog, MatmulPlanPreferences

T, H, F = 15 * 1024, 1600, 6400
torch.manual_seed(0)
dev = "cuda"
x = (torch.randn(T, H, device=dev) * 0.5).bfloat16()
w1 = (torch.randn(F, H, device=dev) * 0.02).bfloat16()
b1 = (torch.randn(F, device=dev) * 0.1).bfloat16()
w2 = (torch.randn(H, F, device=dev) * 0.02).bfloat16()
g = (torch.randn(T, H, device=dev) * 0.01).bfloat16()
dpre = (torch.randn(T, F, device=dev) * 0.01).bfloat16()
stream = torch.cuda.current_stream()
print(torch.cuda.get_device_name(), flush=True)


def sustained(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n


def algorithms(name, a, b, epilog, inputs, **kw):
    try:
        mm = Matmul(a, b, options={"blocking": "auto", **kw.pop("options", {})}, stream=stream, **kw)
        algos = mm.plan(epilog=epilog, epilog_inputs=inputs, preferences=MatmulPlanPreferences(limit=16), stream=stream)
        ts = [sustained(lambda: mm.execute(algorithm=al, stream=stream)) for al in algos]
        print(f"{name}: {len(algos)} algorithms, ms: " + " ".join(f"{t:.3f}" for t in ts)
              + f"  (first {ts[0]:.3f}, best {min(ts):.3f} at #{ts.index(min(ts))})", flush=True)
        return mm
    except Exception as exc:  # noqa: BLE001 - report and go on
        print(f"{name}: FAILED: {type(exc).__name__}: {exc}", flush=True)


fwd = algorithms("GELU_AUX_BIAS (fc1)", w1, x.t(), MatmulEpilog.GELU_AUX_BIAS, {"bias": b1})
pre = fwd.execute(stream=stream)[1]["gelu_aux"] if fwd else None
if pre is not None:
    algorithms("DGELU (fc2 dgrad)", w2.t(), g.t(), MatmulEpilog.DGELU, {"gelu_aux": pre})

main_grad = torch.zeros(F, H, device=dev, dtype=torch.float32)
print(f"fc1 wgrad today, addmm into fp32 main_grad: {sustained(lambda: torch.addmm(main_grad, dpre.t(), x, out_dtype=torch.float32, out=main_grad)):.3f} ms;"
      f" the bias's sum apart: {sustained(lambda: dpre.sum(0, dtype=torch.float32)):.3f} ms", flush=True)
mg_t = main_grad.t()  # (H, 4h), column-major
wg = algorithms("fc1 wgrad BGRADB into main_grad", x.t(), dpre, MatmulEpilog.BGRADB, None,
                c=mg_t, beta=1.0, options={"inplace": True})
if wg is not None:
    try:
        main_grad.zero_()
        out = wg.execute(stream=stream)
        bg = out[1]["bgradb"]
        ref_w = dpre.t().float() @ x.float()
        ref_b = dpre.float().sum(0)
        rel = lambda a, b: ((a.float() - b).abs().max() / b.abs().max()).item()  # noqa: E731
        print(f"   values: main_grad {rel(main_grad, ref_w):.1e}, bias grad {rel(bg, ref_b):.1e} ({bg.dtype}, {tuple(bg.shape)})")
    except Exception as exc:  # noqa: BLE001
        print(f"   values: FAILED: {type(exc).__name__}: {exc}")
