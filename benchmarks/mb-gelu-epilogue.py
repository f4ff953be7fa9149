# microbench: the MLP's GeLU in cuBLASLt's GEMM epilogues (nvmath-python) vs today's kernels, at row 111's shape.
# Today: fc1's GEMM writes the pre-activation, Megatron's compiled bias-GeLU reads it and writes the activation;
# backward, fc2's dgrad GEMM writes the activation's gradient and megalab's Triton bias_gelu backward reads it with
# the pre-activation to write the pre-activation's gradient and the bias's. With the epilogues: fc1's GEMM adds the
# bias and applies GeLU (tanh) itself, writing the activation and the pre-activation (GELU_AUX_BIAS); fc2's dgrad
# GEMM applies GeLU's derivative from that pre-activation and sums the bias gradient (DGELU_BGRAD).
import statistics
import torch
import nvmath
from nvmath.linalg.advanced import Matmul, MatmulEpilog
from megalab.runtime import bias_gelu as BG

T, H, F = 15 * 1024, 1600, 6400
torch.manual_seed(0)
dev = "cuda"
x = (torch.randn(T, H, device=dev) * 0.5).bfloat16()
w1 = (torch.randn(F, H, device=dev) * 0.02).bfloat16()
b1 = (torch.randn(F, device=dev) * 0.1).bfloat16()
w2 = (torch.randn(H, F, device=dev) * 0.02).bfloat16()
g = (torch.randn(T, H, device=dev) * 0.01).bfloat16()
stream = torch.cuda.current_stream()


def timed(fn, n=20, sustained=False):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if sustained:  # n calls back to back, one pair of events: the card's clock under load
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record(); torch.cuda.synchronize()
        return s.elapsed_time(e) / n
    ts = []
    for _ in range(n):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)


# cuBLASLt is column-major: compute the transposes. pre^T (F x T) = W1 (F x H) @ x^T (H x T), bias along F.
fwd = Matmul(w1, x.t(), options={"blocking": "auto"}, stream=stream)
fwd.plan(epilog=MatmulEpilog.GELU_AUX_BIAS, epilog_inputs={"bias": b1}, stream=stream)
yT, aux = fwd.execute(stream=stream)
preT = aux["gelu_aux"]
# dpre^T (F x T) = W2^T (F x H) @ g^T (H x T), GeLU's derivative from pre^T, the bias gradient summed along T.
bwd = Matmul(w2.t(), g.t(), options={"blocking": "auto"}, stream=stream)
bwd.plan(epilog=MatmulEpilog.DGELU_BGRAD, epilog_inputs={"gelu_aux": preT}, stream=stream)
dpreT, baux = bwd.execute(stream=stream)
dbias = baux["dgelu_bgrad"]
print("layouts: y^T", tuple(yT.shape), yT.stride(), " pre^T", tuple(preT.shape), preT.stride(),
      " dpre^T", tuple(dpreT.shape), dpreT.stride(), " dbias", tuple(dbias.shape), flush=True)

# today's path, for the values and the times
pre_ref = x @ w1.t()
y_ref = BG.megatron_bias_gelu().bias_gelu(b1, pre_ref)
pre_leaf = pre_ref.detach().requires_grad_()
b_leaf = b1.detach().requires_grad_()
y2 = BG.BiasGeLU.apply(pre_leaf, b_leaf)
dy = g @ w2
y2.backward(dy)


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


print(f"values: y {rel(yT.t(), y_ref):.2e}  pre {rel(preT.t(), pre_ref + b1):.2e}  dpre {rel(dpreT.t(), pre_leaf.grad):.2e}"
      f"  dbias {rel(dbias, b_leaf.grad):.2e}  (max |diff| / max |ref|)", flush=True)


def base_fwd():
    p = x @ w1.t()
    return BG.megatron_bias_gelu().bias_gelu(b1, p)


def base_bwd():
    d = g @ w2
    return BG.BiasGeLU.backward(_Ctx(), d)


class _Ctx:  # what BiasGeLU.backward reads off its ctx
    saved_tensors = (pre_ref, b1)
    bias = b_leaf
    needs_input_grad = (True, True)


def epi_fwd():
    return fwd.execute(stream=stream)


def epi_bwd():
    return bwd.execute(stream=stream)


def gemm_fwd():
    return x @ w1.t()


def gemm_bwd():
    return g @ w2


for sustained in (False, True):
    how = "sustained (20 back to back)" if sustained else "one call at a time (median of 20)"
    r = {k: timed(f, sustained=sustained) for k, f in
         (("fc1 GEMM alone", gemm_fwd), ("fc1 GEMM + bias-GeLU (today)", base_fwd), ("fc1 GELU_AUX_BIAS", epi_fwd),
          ("fc2 dgrad GEMM alone", gemm_bwd), ("fc2 dgrad + bias-GeLU backward (today)", base_bwd),
          ("fc2 dgrad DGELU_BGRAD", epi_bwd))}
    print(f"-- {how}, ms per call")
    for k, v in r.items():
        print(f"   {k:42s} {v:7.3f}")
    print(f"   saved per layer: forward {r['fc1 GEMM + bias-GeLU (today)'] - r['fc1 GELU_AUX_BIAS']:.3f} ms, "
          f"backward {r['fc2 dgrad + bias-GeLU backward (today)'] - r['fc2 dgrad DGELU_BGRAD']:.3f} ms", flush=True)

# The backward's epilogue, every algorithm cuBLASLt's heuristic offers; GeLU's derivative alone (DGELU) with the
# bias gradient summed apart; and the bias gradient in fc1's weight-gradient GEMM instead (BGRADA: it sums A, the
# pre-activation's gradient, over the tokens while the GEMM accumulates the fp32 main_grad, as TE does).
from nvmath.linalg.advanced import MatmulPlanPreferences
for epi, inputs in ((MatmulEpilog.DGELU_BGRAD, {"gelu_aux": preT}), (MatmulEpilog.DGELU, {"gelu_aux": preT})):
    mm = Matmul(w2.t(), g.t(), options={"blocking": "auto"}, stream=stream)
    algos = mm.plan(epilog=epi, epilog_inputs=inputs, preferences=MatmulPlanPreferences(limit=16), stream=stream)
    ts = []
    for a in algos:
        try:
            ts.append(timed(lambda: mm.execute(algorithm=a, stream=stream), sustained=True))
        except Exception as exc:  # noqa: BLE001
            ts.append(float("nan"))
    print(f"{epi.name}: {len(algos)} algorithms, sustained ms: " + " ".join(f"{t:.3f}" for t in ts), flush=True)
dpre = dpreT.t()
print(f"bias gradient apart, torch sum over tokens: {timed(lambda: dpre.sum(0), sustained=True):.3f} ms", flush=True)
main_grad = torch.zeros(F, H, device=dev, dtype=torch.float32)
wg_today = lambda: torch.addmm(main_grad, dpre.t(), x, out_dtype=torch.float32, out=main_grad)
print(f"fc1 wgrad today (addmm into fp32 main_grad): {timed(wg_today, sustained=True):.3f} ms", flush=True)
try:
    wg = Matmul(dpreT, x, c=main_grad, beta=1.0, options={"blocking": "auto", "inplace": True}, stream=stream)
    algos = wg.plan(epilog=MatmulEpilog.BGRADA, preferences=MatmulPlanPreferences(limit=16), stream=stream)
    ts = [timed(lambda: wg.execute(algorithm=a, stream=stream), sustained=True) for a in algos]
    print(f"fc1 wgrad BGRADA into main_grad: {len(algos)} algorithms, sustained ms: " + " ".join(f"{t:.3f}" for t in ts))
    main_grad.zero_(); out = wg.execute(stream=stream)
    bg = out[1]["bgrada"] if isinstance(out, tuple) else None
    print(f"   values: dW {rel(main_grad, (dpre.t().float() @ x.float())):.2e}  dbias {rel(bg, dpre.float().sum(0)):.2e}"
          f"  bgrad dtype {bg.dtype}", flush=True)
except Exception as exc:  # noqa: BLE001
    print(f"fc1 wgrad BGRADA: FAILED: {type(exc).__name__}: {exc}", flush=True)

# does it capture in a CUDA graph (Megatron's full-iteration graph replays every kernel of the step)?
try:
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        for _ in range(2):
            fwd.execute(stream=side); bwd.execute(stream=side)
    stream.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cs = torch.cuda.current_stream()
        gy, gaux = fwd.execute(stream=cs)
        gd, gb = bwd.execute(stream=cs)
    graph.replay(); torch.cuda.synchronize()
    print(f"CUDA graph capture: ok; replay matches eager: y {rel(gy, yT):.1e}, dpre {rel(gd, dpreT):.1e}")
except Exception as exc:  # noqa: BLE001 - report what failed
    print(f"CUDA graph capture: FAILED: {type(exc).__name__}: {exc}")
print("nvmath", nvmath.__version__, "cuBLASLt", nvmath.bindings.cublasLt.get_version(), "torch", torch.__version__,
      torch.cuda.get_device_name())
