"""Prefill rows of the CPU weight-only 4-bit GEMM: one SmolLM2-135M layer's four GEMMs (q|k|v,
o, gate|up, down) at M rows, 16-row passes of the decode-row kernel (`cpu_stream.decode_rows`
per 16 rows) against `gemm.q4w_mm`'s cpu_stream entry as it stands, with int8 and with float
activations, 2 threads, median of 5 (benchmarks/RESULTS.md, issue 22, fourth session: the
figures were taken with the entry still dequantizing above 16 rows; since then it runs the
16-row passes itself, so both columns now time the same path).

    python benchmarks/cpu_prefill_probe.py
"""
import time, statistics, torch
torch.set_num_threads(2)
import tskernels
from tskernels.ops.gemm import cpu_stream
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # SmolLM2 layer: qkv, o, gate|up, down
ws = {s: [tskernels.gemm.quantize_q4_groups(torch.randn(*s)) for _ in range(4)] for s in shapes}
def layer_chunked(a_by_k, act):
    for s in shapes:
        for w in ws[s][:1]:
            a = a_by_k[s[1]]
            out = []
            for i in range(0, a.shape[0], 16):
                out.append(cpu_stream.decode_rows(a[i:i+16].contiguous(), *w, act))
def layer_current(a_by_k, act):
    for s in shapes:
        w = ws[s][0]
        cpu_stream.q4w_mm(a_by_k[s[1]], *w, act_int8=act)
for act in (True, False):
    for m in (17, 32, 48, 64, 96, 128, 256):
        a = {576: torch.randn(m, 576), 1536: torch.randn(m, 1536)}
        r = {}
        for name, fn in (("chunked", layer_chunked), ("current", layer_current)):
            fn(a, act)
            ts = []
            for _ in range(5):
                t = time.perf_counter(); fn(a, act); ts.append(time.perf_counter() - t)
            r[name] = statistics.median(ts) * 1e3
        print(f"act_int8={act} M={m}: chunked {r['chunked']:.2f} ms  current {r['current']:.2f} ms per layer", flush=True)
