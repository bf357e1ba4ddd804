"""Lab script: do the fp8 reference pieces give the same answer on the GPU as on the host?
(benchmarks/diag_moe_fp8.py found the fused-experts reference 1.1-1.2 % rms apart.)"""
import torch

import tskernels_ref.gemm as gref

torch.manual_seed(0)
x = torch.randn(300, 1024).to(torch.bfloat16)
qc, sc = gref.quantize_fp8_per_token_group(x.float(), 128)
qg, sg = gref.quantize_fp8_per_token_group(x.float().cuda(), 128)
print("quant bytes differ", int((qc.view(torch.uint8) != qg.cpu().view(torch.uint8)).sum()),
      "of", qc.numel(), "scale max rel", float(((sc - sg.cpu()).abs() / sc.abs()).max()))
a, b = torch.randn(2400, 1024), torch.randn(1024, 1024)
want = a.double() @ b.double()
for name, got in (("cpu fp32", a @ b), ("cuda fp32", (a.cuda() @ b.cuda()).cpu())):
    print(name, "matmul rel rms", float((got.double() - want).norm() / want.norm()))
