#!/usr/bin/env python3
"""Trains a small MLP with W worker processes on loopback, either on Tessera's Parameter
Service or with torch.distributed's gloo backend (allreduce of the gradients, then
torch.optim.SGD), and compares accuracy and iteration time. On the service, --mode optimizer
runs the optimizer there (tessera_paramsvc.torch.ServiceOptimizer); --mode hook keeps
torch.optim.SGD in the workers and averages DistributedDataParallel's gradient buckets on the
service (tessera_paramsvc.torch.comm_hook).

The dataset is generated deterministically (no downloads): 10 classes in 64 dimensions, each
class a Gaussian around a random centre (seeded), 8192 training and 2048 test samples. Every
worker starts from the same seeded model, trains on its 1/W shard with the same batch order
for both backends, so the two runs apply the same averaged-gradient SGD-with-momentum steps
(up to fp32 summation order).

    pip install ./python            # or a build tree's package: PYTHONPATH=build/python
    /usr/bin/python3 python/examples/paramsvc_train.py --backend both --workers 4 --mode hook

It starts `tessera paramsvc serve` (the tessera command on PATH, or --bin-dir DIR) unless
--port names a running service.

prints one JSON line per backend and, with --backend both, exits 1 when the accuracies differ
by more than --tolerance.
"""
import argparse
import json
import os
import secrets
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp



def make_data(seed=7, n_train=8192, n_test=2048, dim=64, classes=10, noise=2.2):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g)
    def draw(n):
        y = torch.randint(0, classes, (n,), generator=g)
        x = centres[y] + noise * torch.randn(n, dim, generator=g)
        return x, y
    return draw(n_train), draw(n_test)


def make_model(hidden, dim=64, classes=10):
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, classes))


def hidden_for(model_mb):
    # Parameters of the MLP: 64h + h + h*h + h + 10h + 10; solve for h.
    target = model_mb * (1 << 20) / 4
    h = int((-(76) + (76 * 76 + 4 * target) ** 0.5) / 2)
    return max(h, 16)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, a, conn, out):
    torch.set_num_threads(1)
    (xtr, ytr), (xte, yte) = make_data()
    model = make_model(a.hidden)
    loss_fn = torch.nn.CrossEntropyLoss()
    state = None
    if a.backend == "paramsvc" and a.mode == "hook":
        import tessera_paramsvc.torch as tps
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % conn["dist_port"],
                                rank=rank, world_size=a.workers)
        model = torch.nn.parallel.DistributedDataParallel(model)
        # The one call that moves DDP's gradient averaging onto the service.
        state = tps.HookState(conn["host"], conn["port"], conn["secret"], job=conn["job"],
                              mode=a.consistency)
        model.register_comm_hook(state, tps.comm_hook)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    elif a.backend == "gloo":
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % conn["port"],
                                rank=rank, world_size=a.workers)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
        params = list(model.parameters())
        flat = torch.zeros(sum(p.numel() for p in params))
    else:
        import tessera_paramsvc.torch as tps
        opt = tps.ServiceOptimizer(model, conn["host"], conn["port"], conn["secret"],
                                   job=conn["job"], workers=a.workers, rank=rank, lr=a.lr,
                                   momentum=a.momentum, mode=a.consistency)
    shard = torch.arange(rank, xtr.shape[0], a.workers)
    steps = len(shard) // a.batch
    times = []
    it = 0
    for epoch in range(a.epochs):
        order = shard[torch.randperm(len(shard), generator=torch.Generator().manual_seed(100 * epoch + rank))]
        for b in range(steps):
            if a.max_iters and it >= a.max_iters:
                break
            idx = order[b * a.batch:(b + 1) * a.batch]
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = loss_fn(model(xtr[idx]), ytr[idx])
            loss.backward()
            if a.backend == "gloo":
                # One flat allreduce per step (what DDP's bucketing does), then the local SGD step.
                off = 0
                for p in params:
                    flat[off:off + p.numel()].copy_(p.grad.view(-1))
                    off += p.numel()
                dist.all_reduce(flat)
                flat /= a.workers
                off = 0
                for p in params:
                    p.grad.view(-1).copy_(flat[off:off + p.numel()])
                    off += p.numel()
            opt.step()
            times.append((time.perf_counter() - t0) * 1000)
            it += 1
    result = {"rank": rank, "times": times}
    if rank == 0:
        with torch.no_grad():
            result["accuracy"] = (model(xte).argmax(1) == yte).float().mean().item()
            result["final_loss"] = loss_fn(model(xtr), ytr).item()
        if a.backend == "paramsvc":
            result["counters"] = state.counters() if state else opt.counters()
    if state is not None:
        state.close()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    out.put(result)


def run(a, backend):
    a.backend = backend
    conn = {"port": free_port()}
    server = None
    tmp = None
    if backend == "paramsvc":
        import tessera_paramsvc
        tmp = tempfile.NamedTemporaryFile("w", suffix=".token", delete=False)
        tmp.write(secrets.token_hex(24))
        tmp.close()
        if a.port:
            conn.update(host=a.host, port=a.port)
        else:
            server, host, port = tessera_paramsvc.serve(a.bin_dir, cores=a.cores, token_file=tmp.name)
            conn.update(host=host, port=port)
        conn["secret"] = open(tmp.name).read().strip() if not a.secret else a.secret
        conn["job"] = "mlp-%d-%s" % (os.getpid(), secrets.token_hex(4))
        conn["dist_port"] = free_port()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    t0 = time.perf_counter()
    procs = [ctx.Process(target=worker, args=(r, a, conn, out)) for r in range(a.workers)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in procs:
            results.append(out.get(timeout=a.timeout))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        if tmp is not None:
            os.unlink(tmp.name)
    wall = time.perf_counter() - t0
    times = sorted(t for r in results for t in r["times"][1:])  # The first step warms up.
    r0 = next(r for r in results if r["rank"] == 0)
    pct = lambda q: times[min(len(times) - 1, int(q * len(times)))] if times else None
    row = {"backend": backend, "mode": a.mode if backend == "paramsvc" else "allreduce",
           "workers": a.workers, "hidden": a.hidden,
           "model_mb": round(sum(p.numel() for p in make_model(a.hidden).parameters()) * 4 / 2**20, 3),
           "accuracy": r0["accuracy"], "final_loss": r0["final_loss"],
           "iter_ms_p50": pct(0.5), "iter_ms_p99": pct(0.99), "iters": len(r0["times"]),
           "wall_s": wall}
    if "counters" in r0:
        row["counters"] = r0["counters"]
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["paramsvc", "gloo", "both"], default="both")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--model_mb", type=float, default=0, help="Size the MLP to this many MB instead of --hidden")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--mode", choices=["optimizer", "hook"], default="optimizer",
                   help="On the service: the optimizer (ServiceOptimizer), or DDP's gradient "
                        "averaging (comm_hook) with torch.optim.SGD in the workers")
    p.add_argument("--consistency", default="sync",
                   help="sync, async (optimizer only) or bounded(s)")
    p.add_argument("--max_iters", type=int, default=0, help="Stop each worker after this many steps")
    p.add_argument("--tolerance", type=float, default=0.02, help="Allowed accuracy difference")
    p.add_argument("--bin-dir", "--bin_dir", dest="bin_dir", default=None,
                   help="Directory of the tessera command (default: tessera on PATH)")
    p.add_argument("--cores", type=int, default=2, help="Cores of the service it starts")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="Use a running service instead of starting one")
    p.add_argument("--secret", default="", help="Its shared secret (with --port)")
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    if a.workers < 1 or a.workers > 64 or a.epochs < 1 or a.batch < 1:
        p.error("--workers must be 1..64, --epochs and --batch positive")
    if a.mode == "hook" and a.consistency == "async":
        p.error("--mode hook takes --consistency sync or bounded(s)")
    if a.model_mb > 0:
        a.hidden = hidden_for(a.model_mb)
    backends = ["paramsvc", "gloo"] if a.backend == "both" else [a.backend]
    rows = [run(a, b) for b in backends]
    for r in rows:
        print(json.dumps(r), flush=True)
    if len(rows) == 2:
        diff = abs(rows[0]["accuracy"] - rows[1]["accuracy"])
        verdict = {"accuracy_diff": diff, "tolerance": a.tolerance, "ok": diff <= a.tolerance}
        print(json.dumps(verdict), flush=True)
        return 0 if verdict["ok"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
