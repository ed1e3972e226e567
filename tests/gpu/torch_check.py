"""mkernel.torch on a GPU: the "mkernel" process-group backend and the
torch.ops.mkernel ops against a float64 CPU reference, on data that differs
per rank and element; torch.compile and CUDA-graph capture of the ops; what
fell back to NCCL/gloo. Every rank prints its failures; rank 0 prints
"TORCH CHECK: N failures".

    torchrun --nproc-per-node 2 tests/gpu/torch_check.py [--share-gpu]
    torchrun --nproc-per-node 2 tests/gpu/torch_check.py --share-gpu --latency   # first-call times only

--share-gpu puts every rank on GPU 0 (mKernel supports it; NCCL does not, so
nothing may fall back to NCCL there).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import mkernel
import mkernel.torch as mt

share = "--share-gpu" in sys.argv
local = int(os.environ.get("LOCAL_RANK", "0"))
dev = torch.device("cuda", 0 if share else local)
torch.cuda.set_device(dev)
mt.register()
dist.init_process_group("cuda:mkernel,cpu:gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pg = dist.distributed_c10d._get_default_group()
failures = []


def say(*a):
    print("[rank %d]" % rank, *a, flush=True)


def data(seed, r, n, dtype):
    """Rank r's input: differs per rank and element, exactly representable in dtype."""
    g = torch.Generator().manual_seed(seed * 1009 + r)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    return x.to(dtype)


def tol(dtype, terms):
    eps = {torch.float32: 1.2e-7, torch.bfloat16: 7.9e-3, torch.float16: 9.8e-4, torch.float64: 2.3e-16}[dtype]
    return 4 * eps * max(terms, 1)


def check(name, got, ref, dtype, terms=1):
    got = got.detach().to("cpu", torch.float64).reshape(-1)
    ref = ref.to(torch.float64).reshape(-1)
    if got.shape != ref.shape:
        failures.append("%s: shape %s, expected %s" % (name, tuple(got.shape), tuple(ref.shape)))
        return
    scale = ref.abs().max().item() + 1e-30
    err = (got - ref).abs().max().item() / scale
    if not err <= tol(dtype, terms):
        failures.append("%s: max error %.3g (relative to max |ref|), tolerance %.3g" % (name, err, tol(dtype, terms)))


def inputs(seed, n, dtype):
    allx = [data(seed, r, n, dtype) for r in range(world)]
    return allx, allx[rank].to(dev)


def reduce_ref(allx, op):
    xs = torch.stack([x.to(torch.float64) for x in allx])
    return {"sum": xs.sum(0), "max": xs.max(0).values, "min": xs.min(0).values, "avg": xs.mean(0),
            "prod": xs.prod(0)}[op]


OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}


def latency():
    # First-call cost: init is lazy (first CUDA collective), then plans load
    # (shipped / cached) or compile (NVRTC).
    for dtype, n in ((torch.bfloat16, 1 << 20), (torch.float32, 1 << 20), (torch.float16, 4096)):
        x = torch.ones(n, dtype=dtype, device=dev)
        torch.cuda.synchronize()
        t = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        first = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        second = (time.perf_counter() - t) * 1e3
        say("first all_reduce %s n=%d: %.1f ms, second %.2f ms" % (dtype, n, first, second))
    x = torch.ones(4096, device=dev)
    out = torch.empty(4096 * world, device=dev)
    t = time.perf_counter()
    dist.all_gather_into_tensor(out, x)
    torch.cuda.synchronize()
    say("first all_gather fp32: %.1f ms" % ((time.perf_counter() - t) * 1e3))


def backend():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for n in (1000, (1 << 20) + 3):
            tag = "%s n=%d" % (str(dtype).replace("torch.", ""), n)
            for op in ("sum", "max", "avg"):
                allx, x = inputs(1, n, dtype)
                dist.all_reduce(x, op=OPS[op])
                check("all_reduce %s %s" % (op, tag), x, reduce_ref(allx, op).to(dtype), dtype, world)
            allx, x = inputs(2, n, dtype)
            out = torch.empty(n * world, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, x)
            check("all_gather_into_tensor " + tag, out, torch.cat(allx), dtype)
            outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(world)]
            dist.all_gather(outs, x)
            check("all_gather (list) " + tag, torch.cat(outs), torch.cat(allx), dtype)
            allx, x = inputs(3, n * world, dtype)
            out = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(out, x)
            ref = reduce_ref(allx, "sum").to(dtype)
            check("reduce_scatter_tensor " + tag, out, ref[rank * n:(rank + 1) * n], dtype, world)
            out2 = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter(out2, list(x.chunk(world)))
            check("reduce_scatter (list) " + tag, out2, ref[rank * n:(rank + 1) * n], dtype, world)
            allx, x = inputs(4, n, dtype)
            root = world - 1
            dist.broadcast(x, src=root)
            check("broadcast " + tag, x, allx[root], dtype)
            allx, x = inputs(5, n, dtype)
            dist.reduce(x, dst=0)
            if rank == 0:
                check("reduce " + tag, x, reduce_ref(allx, "sum").to(dtype), dtype, world)
            allx, x = inputs(6, n * world, dtype)
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x)
            ref = torch.cat([a[rank * n:(rank + 1) * n] for a in allx])
            check("all_to_all_single " + tag, out, ref, dtype)
    # PREMUL_SUM (what FSDP scales gradients with): each rank's own factor,
    # as a number and as a one-element tensor on the GPU; on mKernel, not NCCL
    if hasattr(dist, "_make_nccl_premul_sum"):
        nccl_before = pg.stats["nccl"]
        for dtype in (torch.float32, torch.bfloat16):
            n = 4099
            w = [0.5 + 0.25 * q for q in range(world)]
            for kind in ("number", "tensor"):
                f = w[rank] if kind == "number" else torch.tensor([w[rank]], dtype=dtype, device=dev)
                allx, x = inputs(7, n, dtype)
                dist.all_reduce(x, op=dist._make_nccl_premul_sum(f))
                ref = sum(a.to(torch.float64) * w[q] for q, a in enumerate(allx))
                check("all_reduce premul_sum (%s) %s" % (kind, dtype), x, ref.to(dtype), dtype, world)
                allx, x = inputs(8, n * world, dtype)
                out = torch.empty(n, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(out, x, op=dist._make_nccl_premul_sum(f))
                ref = sum(a.to(torch.float64) * w[q] for q, a in enumerate(allx))[rank * n:(rank + 1) * n]
                check("reduce_scatter_tensor premul_sum (%s) %s" % (kind, dtype), out, ref.to(dtype), dtype, world)
        if pg.stats["nccl"] != nccl_before:
            failures.append("PREMUL_SUM went to NCCL (%d calls)" % (pg.stats["nccl"] - nccl_before))
    else:
        say("SKIP premul_sum: this torch has no dist._make_nccl_premul_sum")
    # async: wait() orders the caller's stream after the collective
    allx, x = inputs(7, 1 << 16, torch.float32)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        w = dist.all_reduce(x, async_op=True)
    w.wait()
    check("all_reduce async_op", x, reduce_ref(allx, "sum"), torch.float32, world)
    # CPU tensors: gloo
    allx, x = inputs(8, 100, torch.float32)
    xc = x.cpu()
    dist.all_reduce(xc)
    check("all_reduce CPU (gloo)", xc, reduce_ref(allx, "sum"), torch.float32, world)
    # a new group over every rank: its own mKernel communicator
    g = dist.new_group(list(range(world)))
    allx, x = inputs(9, 5000, torch.float32)
    dist.all_reduce(x, group=g)
    check("all_reduce new_group", x, reduce_ref(allx, "sum"), torch.float32, world)
    dist.barrier()


def ops():
    comm = mt.Communicator()
    cid = comm.id
    n = 3000
    allx, x = inputs(11, n, torch.float32)
    check("op all_reduce", torch.ops.mkernel.all_reduce(x, "sum", cid), reduce_ref(allx, "sum"), torch.float32, world)
    check("op all_gather", torch.ops.mkernel.all_gather(x, cid), torch.cat(allx), torch.float32)
    allx, x = inputs(12, n * world, torch.bfloat16)
    ref = reduce_ref(allx, "sum").to(torch.bfloat16)
    check("op reduce_scatter", torch.ops.mkernel.reduce_scatter(x.view(world * 30, -1), "sum", cid).reshape(-1),
          ref[rank * n:(rank + 1) * n], torch.bfloat16, world)
    check("op broadcast", torch.ops.mkernel.broadcast(x, 0, cid), allx[0], torch.bfloat16)
    y = torch.ops.mkernel.reduce(x, "max", 0, cid)
    check("op reduce", y, reduce_ref(allx, "max").to(torch.bfloat16) if rank == 0 else allx[rank], torch.bfloat16)
    out = torch.ops.mkernel.all_to_all(x, cid)
    check("op all_to_all", out, torch.cat([a[rank * n:(rank + 1) * n] for a in allx]), torch.bfloat16)

    # torch.compile: the op inside a compiled function (fake impl traced)
    def f(t):
        return torch.ops.mkernel.all_reduce(t * 2, "sum", cid) + 1

    try:
        cf = torch.compile(f, fullgraph=True)
        allx, x = inputs(13, 4096, torch.float32)
        check("torch.compile all_reduce", cf(x), reduce_ref(allx, "sum") * 2 + 1, torch.float32, world)
    except Exception as e:  # noqa: BLE001  (reported, not hidden)
        failures.append("torch.compile: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:300]))

    # CUDA graphs: capture once, replay on new data
    static = torch.zeros(1 << 16, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.mkernel.all_reduce(static, "sum", cid)  # warm-up: plans and instance outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = torch.ops.mkernel.all_reduce(static, "sum", cid)
    for seed in (14, 15):
        allx, x = inputs(seed, 1 << 16, torch.float32)
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        check("CUDA graph replay seed %d" % seed, y, reduce_ref(allx, "sum"), torch.float32, world)
    # bad input: a clear error, nothing launched
    try:
        torch.ops.mkernel.all_reduce(torch.zeros(4, dtype=torch.bool, device=dev), "sum", cid)
        failures.append("bool all_reduce: no error")
    except TypeError as e:
        if "not supported" not in str(e):
            failures.append("bool all_reduce: unclear error %s" % e)
    try:
        torch.ops.mkernel.all_reduce(torch.zeros(4, device=dev), "xor", cid)
        failures.append("op xor: no error")
    except mkernel.MkError as e:
        if "unknown reduction op" not in str(e):
            failures.append("op xor: unclear error %s" % e)
    # Communicator.all_reduce(out=...) is checked like the input
    try:
        comm.all_reduce(torch.zeros(8, dtype=torch.bfloat16, device=dev), out=torch.zeros(8, device=dev))
        failures.append("all_reduce out of another dtype: no error")
    except ValueError:
        pass
    comm.destroy()
    # the backend: a non-contiguous tensor is an error on every rank (as with NCCL), not a fallback
    try:
        dist.all_reduce(torch.zeros(8, 8, device=dev).t())
        failures.append("non-contiguous all_reduce: no error")
    except (ValueError, RuntimeError) as e:
        if "contiguous" not in str(e):
            failures.append("non-contiguous all_reduce: unclear error %s" % e)


def fused():
    """torch.ops.mkernel.all_reduce_rmsnorm / all_reduce_fp8 / all_reduce_premulsum against a float64
    reference of all_reduce + residual add + rms_norm (and of e4m3 rows),
    eagerly, under torch.compile and replayed from a CUDA graph."""
    comm = mt.Communicator()
    cid = comm.id
    for dtype, tokens, hidden in ((torch.bfloat16, 5, 4096), (torch.float16, 1, 1024), (torch.float32, 3, 8192)):
        allx = [data(40 + tokens, r, tokens * hidden, dtype).view(tokens, hidden) for r in range(world)]
        residual = data(41, 100, tokens * hidden, dtype).view(tokens, hidden)
        weight = (1 + 0.1 * data(42, 101, hidden, torch.float64)).to(dtype)
        x = allx[rank].to(dev)
        out, ro = torch.ops.mkernel.all_reduce_rmsnorm(x, residual.to(dev), weight.to(dev), 1e-5, cid)
        ar = reduce_ref(allx, "sum")
        h = ar + residual.to(torch.float64)
        ref = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.to(torch.float64)
        check("all_reduce_rmsnorm residual_out %s" % dtype, ro, h, dtype, world + 1)
        check("all_reduce_rmsnorm out %s" % dtype, out, ref, dtype, 4 * (world + 1))
        o8, q, scales = torch.ops.mkernel.all_reduce_fp8(x, cid)
        amax = ar.abs().amax(-1)
        check("all_reduce_fp8 scales %s" % dtype, scales, amax / 448, dtype, world)
        check("all_reduce_fp8 q %s" % dtype, q.to(torch.float64) * scales.to(torch.float64).unsqueeze(-1), ar,
              torch.bfloat16, 3)  # e4m3 keeps 3 mantissa bits: within 2^-4 relative of the row's amax
        check("all_reduce_fp8 out %s" % dtype, o8, ar, dtype, world)
        # a prologue fusion: each rank's input times its own scale, then the sum
        scales_r = [0.5 + 0.25 * r for r in range(world)]
        ps = torch.ops.mkernel.all_reduce_premulsum(x, scales_r[rank], cid)
        pref = sum(a.to(torch.float64) * s for a, s in zip(allx, scales_r))
        check("all_reduce_premulsum %s" % dtype, ps, pref, dtype, world + 1)

    def f(t, r, w):
        o, ro = torch.ops.mkernel.all_reduce_rmsnorm(t * 2, r, w, 1e-6, cid)
        return o + 1, ro

    tokens, hidden = 8, 2048
    allx = [data(50, r, tokens * hidden, torch.float32).view(tokens, hidden) for r in range(world)]
    residual = data(51, 100, tokens * hidden, torch.float32).view(tokens, hidden).to(dev)
    weight = torch.ones(hidden, device=dev)
    h = reduce_ref(allx, "sum") * 2 + residual.cpu().to(torch.float64)
    ref = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    try:
        o, ro = torch.compile(f, fullgraph=True)(allx[rank].to(dev), residual, weight)
        check("torch.compile all_reduce_rmsnorm", o, ref + 1, torch.float32, 8)
    except Exception as e:  # noqa: BLE001  (reported, not hidden)
        failures.append("torch.compile all_reduce_rmsnorm: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:300]))
    # a CUDA graph: capture once, replay on new data
    static = torch.zeros(tokens, hidden, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.mkernel.all_reduce_rmsnorm(static, residual, weight, 1e-6, cid)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        go, gro = torch.ops.mkernel.all_reduce_rmsnorm(static, residual, weight, 1e-6, cid)
    for seed in (52, 53):
        allx = [data(seed, r, tokens * hidden, torch.float32).view(tokens, hidden) for r in range(world)]
        static.copy_(allx[rank].to(dev))
        graph.replay()
        torch.cuda.synchronize()
        h = reduce_ref(allx, "sum") + residual.cpu().to(torch.float64)
        check("CUDA graph all_reduce_rmsnorm seed %d" % seed, go, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6),
              torch.float32, 8)
    # bad input: a clear error
    try:
        torch.ops.mkernel.all_reduce_rmsnorm(static, residual, torch.ones(7, device=dev), 1e-6, cid)
        failures.append("all_reduce_rmsnorm with a weight of the wrong length: no error")
    except ValueError as e:
        if "weight" not in str(e):
            failures.append("all_reduce_rmsnorm bad weight: unclear error %s" % e)
    comm.destroy()


if "--latency" in sys.argv:
    latency()
else:
    backend()
    ops()
    fused()
    stats = dict(pg.stats)
    say("calls by library:", stats)
    if share and stats["nccl"]:
        failures.append("ranks share a GPU but %d calls went to NCCL" % stats["nccl"])
    if stats["mkernel"] < 60:
        failures.append("only %d calls ran on mKernel" % stats["mkernel"])
    for f in failures:
        say("FAIL", f)
    counts = torch.tensor([len(failures)], dtype=torch.int64)
    dist.all_reduce(counts)  # CPU tensor: gloo
    if rank == 0:
        print("TORCH CHECK: %d failures (world %d%s)" % (counts.item(), world, ", sharing GPU 0" if share else ""),
              flush=True)
dist.destroy_process_group()
