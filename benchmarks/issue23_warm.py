"""Compile (fill the Triton cache with) the sampler configurations the GPU tier's sampling
tests launch, one process per configuration, so the tests run warm. python ... [N]"""
import itertools
import subprocess
import sys

if len(sys.argv) > 1:
    import torch
    from tskernels.ops.sampling import triton_sample as ts
    from tests.kernels.test_sampling import params
    v, dt, cfg = sys.argv[1], sys.argv[2], sys.argv[3]
    x = torch.randn(2, int(v), device="cuda").to(getattr(torch, dt))
    kw = {"a": dict(cmax=256), "b": dict(cmax=1), "c": dict(cmax=256, pipeline="groupmax", gmax=1),
          "d": {}}[cfg]
    ts.run(x, **params(2, "cuda", 0.8, 3, 0.9, 0.05), **kw)
    torch.cuda.synchronize()
else:
    # V shapes the launch through the chunk (128 / 256) and Triton's specialisation of V and
    # the row stride (== 1, divisible by 16, other)
    jobs = [[v, d, c] for v, d, c in itertools.product(["1", "96", "100", "150", "160"],
                                                        ["float32", "float16"], "abc")]
    jobs += [["151936", "float32", "d"]]
    procs = [subprocess.Popen([sys.executable, __file__, *j]) for j in jobs]
    print("warm-up exit codes", [p.wait() for p in procs], flush=True)
