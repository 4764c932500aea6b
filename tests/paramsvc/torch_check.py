#!/usr/bin/env python3
"""Checks tessera_paramsvc.torch against PyTorch itself, with a real service and real
processes. Run by tests/paramsvc/torch_test.cc; prints one JSON line per check and exits 1 when
a check fails.

  hook:      W DistributedDataParallel workers (gloo on loopback) train the same seeded model
             on the same data twice, with DDP's own allreduce and with comm_hook on the
             service; the final parameters must match.
  lr:        ServiceOptimizer with torch.optim.lr_scheduler.StepLR against torch.optim.SGD
             with the same scheduler (one worker): the same parameters after every step, and
             the decayed lr visibly changes the step.
  resume:    ServiceOptimizer trained N steps with a scheduler, against one trained k steps,
             saved (model, optimizer and scheduler state dicts), rebuilt from them in a new
             model and optimizer, and trained the remaining N - k: the same parameters.
  momentum:  ServiceOptimizer's state_dict carries the momentum buffers: trained k steps on a
             service, saved through torch.save, resumed on a fresh service (another process)
             from a new model and optimizer, and trained the remaining N - k: the same
             parameters as torch.optim.SGD with momentum (within --atol) and bit-identical to
             an uninterrupted run on the service; the saved buffers are torch's; the state dict
             loads into torch.optim.SGD too; without the buffers the run diverges. Adam's
             moments make the same round trip (bit-identical to the uninterrupted run).
  errors:    bad arguments get a ValueError that names the problem.
"""
import argparse
import io
import json
import os
import secrets
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tessera_paramsvc
import tessera_paramsvc.torch as tps


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data(rank, steps, batch=16, dim=32, classes=5):
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(steps, batch, dim, generator=g)
    y = x[:, :, :classes].argmax(2)  # Learnable: the loss falls within a few steps.
    return x, y


def model():
    torch.manual_seed(42)
    # 1.1 MB: above DDP's first bucket (1 MB), so even the first step has two buckets.
    return torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 5))


def ddp_worker(rank, a, port, svc, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=a.workers)
    # Small buckets: several per step, and DDP rebuilds them after the first iteration.
    ddp = torch.nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.01)
    state = None
    if svc is not None:
        state = tps.HookState(svc["host"], svc["port"], svc["secret"], job=svc["job"],
                              mode=a.mode)
        ddp.register_comm_hook(state, tps.comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=a.momentum)
    x, y = data(rank, a.steps)
    losses = []
    for t in range(a.steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x[t]), y[t])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # Plain lists: a tensor in a queue is shared memory of a process that is about to exit.
    result = {"rank": rank, "params": [p.detach().tolist() for p in ddp.parameters()],
              "losses": losses}
    if state is not None:
        result["counters"] = state.counters()
        result["jobs"] = len(state._clients)
        state.close()
    dist.barrier()
    dist.destroy_process_group()
    out.put(result)


def run_ddp(a, svc):
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=ddp_worker, args=(r, a, port, svc, out)) for r in range(a.workers)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=a.timeout) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for r in results:
        r["params"] = [torch.tensor(p) for p in r["params"]]
    return sorted(results, key=lambda r: r["rank"])


def check_hook(a, conn):
    svc = dict(conn, job="hook-%s" % secrets.token_hex(4))
    plain = run_ddp(a, None)
    hooked = run_ddp(a, svc)
    init = [p.detach() for p in model().parameters()]
    diff = max((p - q).abs().max().item() for r in hooked for p, q in
               zip(r["params"], plain[0]["params"]))
    moved = max((p - q).abs().max().item() for p, q in zip(plain[0]["params"], init))
    c = hooked[0]["counters"]
    # Training progress on a fixed set (all of rank 0's batches), before and after: the loss
    # of one batch at the first and the last step compares two different batches.
    x, y = data(0, a.steps)
    x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1)

    def eval_loss(params):
        m = model()
        with torch.no_grad():
            for p, q in zip(m.parameters(), params):
                p.copy_(q)
            return torch.nn.functional.cross_entropy(m(x), y).item()

    row = {"check": "hook", "mode": a.mode, "workers": a.workers, "steps": a.steps,
           "momentum": a.momentum, "bucket_jobs": hooked[0]["jobs"], "max_abs_diff": diff,
           "moved": moved, "loss_first": hooked[0]["losses"][0],
           "loss_last": hooked[0]["losses"][-1], "eval_before": eval_loss(init),
           "eval_after": eval_loss(hooked[0]["params"]),
           "eval_plain": eval_loss(plain[0]["params"]), "counters": c}
    if a.mode == "sync":
        row["ok"] = diff <= a.atol and moved > 100 * a.atol and c["pushes"] >= a.steps
    else:
        s = int(a.mode.split("(")[1].rstrip(")"))
        # A push more than s rounds stale (a worker can fall behind while the other closes
        # rounds) is dropped, never applied; every push is one or the other.
        row["ok"] = ((c["max_staleness"] <= s or c["dropped"] > 0) and
                     c["pushes"] == c["applied"] + c["dropped"] and c["pushes"] >= a.steps and
                     all(torch.isfinite(p).all() for p in hooked[0]["params"]) and
                     row["eval_before"] - row["eval_after"] >
                     0.5 * (row["eval_before"] - row["eval_plain"]))
    return row


def small_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batches(n):
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(n)]


def train(m, opt, sched, data, trace=None):
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        sched.step()
        if trace is not None:
            trace.append(torch.cat([p.detach().reshape(-1).clone() for p in m.parameters()]))


def service_opt(m, conn, job):
    return tps.ServiceOptimizer(m, conn["host"], conn["port"], conn["secret"], job=job,
                                workers=1, rank=0, lr=0.5, momentum=0.9)


def check_lr(a, conn):
    data = batches(a.steps)
    ref, svc = small_model(), small_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    svc_opt = service_opt(svc, conn, "lr-%s" % secrets.token_hex(4))
    ref_trace, svc_trace = [], []
    train(ref, ref_opt, torch.optim.lr_scheduler.StepLR(ref_opt, 2, gamma=0.1), data, ref_trace)
    train(svc, svc_opt, torch.optim.lr_scheduler.StepLR(svc_opt, 2, gamma=0.1), data, svc_trace)
    # The same run without the schedule differs: the lr is what the check sees.
    flat = small_model()
    flat_opt = service_opt(flat, conn, "flat-%s" % secrets.token_hex(4))
    flat_trace = []
    train(flat, flat_opt, torch.optim.lr_scheduler.StepLR(flat_opt, 1000, gamma=1.0), data, flat_trace)
    diff = max((p - q).abs().max().item() for p, q in zip(ref_trace, svc_trace))
    unscheduled = (flat_trace[-1] - ref_trace[-1]).abs().max().item()
    row = {"check": "lr", "steps": a.steps, "max_abs_diff": diff,
           "unscheduled_diff": unscheduled, "final_lr": svc_opt.param_groups[0]["lr"]}
    row["ok"] = diff <= a.atol and unscheduled > 100 * a.atol and abs(row["final_lr"] - 0.5 * 0.1 ** (a.steps // 2)) < 1e-12
    return row


def check_resume(a, conn):
    data = batches(a.steps)
    k = a.steps // 2
    whole = small_model()
    opt = service_opt(whole, conn, "whole-%s" % secrets.token_hex(4))
    train(whole, opt, torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5), data)
    job = "resumed-%s" % secrets.token_hex(4)
    first = small_model()
    opt = service_opt(first, conn, job)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5)
    train(first, opt, sched, data[:k])
    saved = {"model": first.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
    opt.close()
    # A new process would build everything again: another initial model, then the saved state.
    torch.manual_seed(99)
    second = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    second.load_state_dict(saved["model"])
    opt = service_opt(second, conn, job)
    opt.load_state_dict(saved["opt"])
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5)
    sched.load_state_dict(saved["sched"])
    train(second, opt, sched, data[k:])
    diff = max((p - q).abs().max().item() for p, q in zip(whole.parameters(), second.parameters()))
    moved = max((p - q).abs().max().item()
                for p, q in zip(small_model().parameters(), second.parameters()))
    row = {"check": "resume", "steps": a.steps, "resumed_at": k, "max_abs_diff": diff,
           "moved": moved, "lr": opt.param_groups[0]["lr"]}
    row["ok"] = diff <= a.atol and moved > 100 * a.atol
    return row


def train_plain(m, opt, data):
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()


def flat(m):
    return torch.cat([p.detach().reshape(-1).clone() for p in m.parameters()])


def check_momentum(a, conn):
    data = batches(a.steps)
    k = a.steps // 2
    hp = {"lr": 0.5, "momentum": 0.9, "weight_decay": 0.01}

    def svc(m, c, job, **kw):
        return tps.ServiceOptimizer(m, c["host"], c["port"], c["secret"], job=job, workers=1,
                                    rank=0, **dict(hp, **kw))

    # The reference: torch.optim.SGD with momentum; its buffers after k steps.
    ref = small_model()
    ref_opt = torch.optim.SGD(ref.parameters(), **hp)
    train_plain(ref, ref_opt, data[:k])
    ref_mid = [ref_opt.state[p]["momentum_buffer"].clone() for p in ref.parameters()]
    train_plain(ref, ref_opt, data[k:])
    # Uninterrupted on the service.
    whole = small_model()
    train_plain(whole, svc(whole, conn, "whole-%s" % secrets.token_hex(4)), data)
    # k steps on the service, then its state dicts through torch.save, and the service gone.
    job = "moving-%s" % secrets.token_hex(4)
    first = small_model()
    opt = svc(first, conn, job)
    train_plain(first, opt, data[:k])
    sd = opt.state_dict()
    buf_diff = max((sd["state"][i]["momentum_buffer"] - ref_mid[i]).abs().max().item()
                   for i in range(len(ref_mid)))
    blob = io.BytesIO()
    torch.save({"model": first.state_dict(), "opt": sd}, blob)
    opt.close()
    fresh, host, port = tessera_paramsvc.serve(a.bin_dir, cores=1, token_file=conn["token"])
    try:
        conn2 = dict(conn, host=host, port=port)
        blob.seek(0)
        saved = torch.load(blob)
        # A new process would build everything again: another initial model, then the state.
        torch.manual_seed(99)
        second = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        second.load_state_dict(saved["model"])
        opt2 = svc(second, conn2, job)
        opt2.load_state_dict(saved["opt"])
        train_plain(second, opt2, data[k:])
        resumed_versions = opt2.state_dict()["service"]["versions"]
        # Control: the same without the buffers (a fresh job) diverges.
        third = small_model()
        third.load_state_dict(saved["model"])
        stripped = dict(saved["opt"], state={}, service=dict(saved["opt"]["service"]))
        stripped["service"]["job"] = "control-%s" % secrets.token_hex(4)
        opt3 = svc(third, conn2, stripped["service"]["job"])
        opt3.load_state_dict(stripped)
        train_plain(third, opt3, data[k:])
        # Adam: its moments make the round trip too.
        adam_whole = small_model()
        train_plain(adam_whole, svc(adam_whole, conn, "adam-whole-%s" % secrets.token_hex(4),
                                    optimizer="adam", lr=0.01, momentum=0.0), data)
        adam_job = "adam-%s" % secrets.token_hex(4)
        adam_first = small_model()
        aopt = svc(adam_first, conn, adam_job, optimizer="adam", lr=0.01, momentum=0.0)
        train_plain(adam_first, aopt, data[:k])
        asd = aopt.state_dict()
        adam_keys = sorted(asd["state"][0].keys()) if asd["state"] else []
        adam_second = small_model()
        adam_second.load_state_dict(adam_first.state_dict())
        aopt2 = svc(adam_second, conn2, adam_job, optimizer="adam", lr=0.01, momentum=0.0)
        aopt2.load_state_dict(asd)
        train_plain(adam_second, aopt2, data[k:])
    finally:
        fresh.terminate()
        fresh.wait(timeout=30)
    # Interop: the service's state dict loads into torch.optim.SGD, which continues like the
    # reference.
    fourth = small_model()
    fourth.load_state_dict(saved["model"])
    t_opt = torch.optim.SGD(fourth.parameters(), **hp)
    t_opt.load_state_dict(saved["opt"])
    train_plain(fourth, t_opt, data[k:])
    row = {"check": "momentum", "steps": a.steps, "resumed_at": k,
           "saved_buffers_vs_torch": buf_diff,
           "resumed_vs_torch": (flat(second) - flat(ref)).abs().max().item(),
           "resumed_vs_uninterrupted": (flat(second) - flat(whole)).abs().max().item(),
           "bit_identical": bool(torch.equal(flat(second), flat(whole))),
           "without_buffers_vs_torch": (flat(third) - flat(ref)).abs().max().item(),
           "torch_sgd_from_service_state_vs_torch": (flat(fourth) - flat(ref)).abs().max().item(),
           "resumed_versions": resumed_versions,
           "adam_keys": adam_keys,
           "adam_bit_identical": bool(torch.equal(flat(adam_second), flat(adam_whole))),
           "adam_moved": (flat(adam_second) - flat(small_model())).abs().max().item()}
    row["ok"] = (buf_diff <= a.atol and row["resumed_vs_torch"] <= a.atol and row["bit_identical"]
                 and row["without_buffers_vs_torch"] > 100 * a.atol
                 and row["torch_sgd_from_service_state_vs_torch"] <= a.atol
                 and resumed_versions == [a.steps] * len(resumed_versions)
                 and adam_keys == ["exp_avg", "exp_avg_sq", "step"]
                 and row["adam_bit_identical"] and row["adam_moved"] > 100 * a.atol)
    return row


def check_errors(a, conn):
    def refused(what, fn, words):
        try:
            fn()
        except ValueError as e:
            return {"case": what, "ok": all(w in str(e) for w in words), "message": str(e)}
        return {"case": what, "ok": False, "message": "accepted"}

    hook = lambda **kw: tps.HookState(conn["host"], conn["port"], conn["secret"],
                                      world_size=1, rank=0, **kw)
    state = hook(job="errs-%s" % secrets.token_hex(4))
    m = small_model()
    opt = service_opt(m, conn, "errs-%s" % secrets.token_hex(4))
    other = service_opt(small_model(), conn, "other-%s" % secrets.token_hex(4))

    def momentum_changed():
        opt.param_groups[0]["momentum"] = 0.5
        try:
            opt.step()
        finally:
            opt.param_groups[0]["momentum"] = 0.9

    cases = [
        refused("hook async", lambda: hook(job="x", mode="async"), ["sync or bounded", "async"]),
        refused("hook job name", lambda: hook(job="a/b"), ["without '/'"]),
        refused("hook fp64 bucket", lambda: state.submit(0, torch.zeros(4, dtype=torch.float64)),
                ["float64"]),
        refused("param groups", lambda: service_opt([{"params": list(m.parameters())}], conn, "g"),
                ["one parameter group"]),
        refused("momentum changed", momentum_changed, ["momentum", "fixed"]),
        refused("state dict of another job", lambda: opt.load_state_dict(other.state_dict()),
                ["other-", "errs-"]),
    ]
    state.close()
    return {"check": "errors", "cases": cases, "ok": all(c["ok"] for c in cases)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check", choices=["hook", "lr", "resume", "momentum", "errors"], required=True)
    p.add_argument("--bin_dir", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--mode", default="sync")
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        token = os.path.join(tmp, "secret")
        with open(token, "w") as f:
            f.write(secrets.token_hex(24))
        server, host, port = tessera_paramsvc.serve(a.bin_dir, cores=1, token_file=token)
        try:
            conn = {"host": host, "port": port, "secret": open(token).read().strip(),
                    "token": token}
            row = {"hook": check_hook, "lr": check_lr, "resume": check_resume,
                   "momentum": check_momentum, "errors": check_errors}[a.check](a, conn)
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(json.dumps(row), flush=True)
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
