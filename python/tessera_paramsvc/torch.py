"""PyTorch integration: an optimizer whose step() runs on the Parameter Service, and a DDP
communication hook that averages gradient buckets on it.

An existing loop changes by one line, the optimizer (schedulers, state_dict work as usual):

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)          # before
    opt = tessera_paramsvc.torch.ServiceOptimizer(model, host, port, secret,   # after
              job="mnist", workers=4, rank=rank, lr=0.1, momentum=0.9)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

step() pushes every parameter's gradient to the service and loads the updated parameters
(SGD with momentum, or Adam, applied once per round on the averaged gradient by the
service) straight into the parameters' memory. Rank 0's initial parameters are the job's.

A DistributedDataParallel loop changes by one call instead (see HookState):

    ddp.register_comm_hook(HookState(host, port, secret, job="mnist"), comm_hook)
"""
import queue
import threading
import warnings

import torch

from . import Client

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class ServiceOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step() runs on the service (one parameter group).

    Learning-rate schedulers work as with any optimizer: step() sends a changed
    param_groups[0]["lr"] to the service, which uses it for the rounds that close after it
    (in sync mode exactly the next round; every worker runs the same schedule). momentum,
    weight_decay and the optimizer kind are fixed when the job registers.

    The optimizer's state (momentum, Adam's moments) lives on the service, which checkpoints
    it with the parameters; state_dict() fetches it and load_state_dict() restores it, so a
    checkpoint resumes training exactly, on the same service or a fresh one:

    - state_dict() is a torch.optim.SGD (or Adam) state dict: "param_groups" (lr, momentum,
      the schedulers' initial_lr, ...) and "state" with each parameter's "momentum_buffer"
      (Adam: "exp_avg", "exp_avg_sq", "step") in fp32, as the service holds them, plus a
      "service" entry: the job's name, its versions and step counts per partition, and the
      service's fp32 copy of fp16/bf16 parameters.
    - load_state_dict(saved), called by every worker of the job after the model's own
      load_state_dict: rank 0 writes the model's parameters (or the saved fp32 copies), the
      saved optimizer state, versions and steps to the service (at an iteration boundary: before
      any worker steps), then all workers meet at a barrier and load the service's parameters.
      The service's optimizer state is the saved one from then on, even where the service had
      trained the job further (a warning says so). A state dict of another job is refused; a
      torch.optim.SGD/Adam state dict (no "service" entry) restores its buffers at the
      service's current versions.
    """

    def __init__(self, model, host, port, secret, *, job, workers, rank, lr, momentum=0.0,
                 weight_decay=0.0, optimizer="sgd", mode="sync", late="drop",
                 partition_bytes=1 << 20, timeout_ms=60000, reconnect_ms=30000):
        params = list(model.parameters()) if hasattr(model, "parameters") else list(model)
        if not params or isinstance(params[0], dict):
            raise ValueError("ServiceOptimizer takes a model or a list of tensors (one "
                             "parameter group: the service has one learning rate per job)")
        for p in params:
            if p.dtype not in _DTYPES or p.device.type != "cpu" or not p.is_contiguous():
                raise ValueError("ServiceOptimizer needs contiguous CPU fp32/fp16/bf16 parameters")
        if optimizer not in ("sgd", "adam"):
            raise ValueError("ServiceOptimizer: optimizer must be sgd or adam, not %r" % optimizer)
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        # The keys torch.optim.SGD/Adam have, so that a state dict of this optimizer loads into
        # them too (the service has neither dampening nor Nesterov momentum).
        extra = ({"dampening": 0, "nesterov": False} if optimizer == "sgd" else
                 {"betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False})
        defaults.update(extra)
        super().__init__(params, defaults)
        self.params = params
        self.job = job
        self.rank = rank
        self._kind = optimizer
        self._loads = 0  # load_state_dict calls: each has a barrier of its own
        self._fixed = {"momentum": momentum, "weight_decay": weight_decay}
        self._fixed.update(extra)
        self.client = Client(host, port, secret, timeout_ms, reconnect_ms)
        spec = {"name": job, "workers": workers, "mode": mode, "late": late,
                "optimizer": optimizer, "lr": lr, "momentum": momentum,
                "weight_decay": weight_decay, "partition_bytes": partition_bytes,
                "tensors": [{"name": "p%d" % i, "dtype": _DTYPES[p.dtype],
                             "shape": list(p.shape) or [1]} for i, p in enumerate(params)]}
        self.client.join(spec, rank)
        self._sent_lr = None  # The first step sends the lr: a job joined again may have another.
        self._param_ptrs = [p.data.data_ptr() for p in params]
        if rank == 0:
            self.client.set_params(self._param_ptrs)
        self.client.barrier(0)
        with torch.no_grad():
            self.client.pull(self._param_ptrs)
        self._zeros = {}

    def add_param_group(self, param_group):
        if self.param_groups:
            raise ValueError("ServiceOptimizer has one parameter group: the job's tensors are "
                             "fixed when it registers")
        super().add_param_group(param_group)

    def _sync_lr(self):
        group = self.param_groups[0]
        for k, v in self._fixed.items():
            if group[k] != v:
                raise ValueError("ServiceOptimizer: %s is fixed when the job registers (%r), "
                                 "not %r" % (k, v, group[k]))
        lr = group["lr"]
        if lr != self._sent_lr:
            if not (lr >= 0 and lr != float("inf")):
                raise ValueError("ServiceOptimizer: lr must be finite and >= 0, not %r" % lr)
            self.client.set_lr(lr)
            self._sent_lr = lr

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_lr()
        grads = []
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                g = self._zeros.setdefault(i, torch.zeros_like(p))
            elif not g.is_contiguous():
                g = g.contiguous()
            grads.append(g)
        self.client.push_pull([g.data_ptr() for g in grads], self._param_ptrs)
        return loss

    def _fetch(self):
        """The service's state: (fp32 parameters, buffers 1 and 2 per tensor, versions and steps
        per partition, has-buffer flags per tensor)."""
        flat = lambda: [torch.zeros(p.numel(), dtype=torch.float32) for p in self.params]
        master, m1, m2 = flat(), flat(), flat()
        versions, steps, has1, has2 = self.client.get_state(
            [t.data_ptr() for t in master], [t.data_ptr() for t in m1], [t.data_ptr() for t in m2])
        return master, m1, m2, versions, steps, has1, has2

    @torch.no_grad()
    def state_dict(self):
        d = super().state_dict()
        master, m1, m2, versions, steps, has1, has2 = self._fetch()
        state = {}
        for i, p in enumerate(self.params):
            if self._kind == "sgd" and has1[i]:
                state[i] = {"momentum_buffer": m1[i].view_as(p)}
            elif self._kind == "adam" and has1[i]:
                state[i] = {"step": torch.tensor(float(max(steps))), "exp_avg": m1[i].view_as(p),
                            "exp_avg_sq": m2[i].view_as(p)}
        d["state"] = state
        d["service"] = {"job": self.job, "version": min(versions), "versions": versions,
                        "steps": steps,
                        "master": {i: master[i].view_as(p) for i, p in enumerate(self.params)
                                   if p.dtype != torch.float32}}
        return d

    def _saved_buffer(self, state, i, key):
        t = state.get(i, {}).get(key)
        if t is None:
            return None
        t = torch.as_tensor(t).detach().reshape(-1).to(torch.float32).contiguous()
        if t.numel() != self.params[i].numel():
            raise ValueError("ServiceOptimizer.load_state_dict: %s of parameter %d has %d "
                             "elements, the parameter %d" % (key, i, t.numel(),
                                                            self.params[i].numel()))
        return t

    @torch.no_grad()
    def load_state_dict(self, state_dict):
        service = state_dict.get("service")
        if service is not None and (not isinstance(service, dict) or "job" not in service):
            raise ValueError("not a ServiceOptimizer state dict (a bad 'service' entry)")
        if service is not None and service["job"] != self.job:
            raise ValueError("the state dict is of job %r, this optimizer joined %r" %
                             (service["job"], self.job))
        if "param_groups" not in state_dict:
            raise ValueError("not an optimizer state dict (no 'param_groups')")
        saved = state_dict.get("state", {})
        if self._kind == "sgd" and any("exp_avg" in v for v in saved.values()):
            raise ValueError("ServiceOptimizer: an Adam state dict for an sgd job")
        if self._kind == "adam" and any("momentum_buffer" in v for v in saved.values()):
            raise ValueError("ServiceOptimizer: an SGD state dict for an adam job")
        # The groups (lr, initial_lr, ...) here; the optimizer state goes to the service.
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        for group in self.param_groups:  # A state dict from before a key existed
            for k, v in self.defaults.items():
                group.setdefault(k, v)
        self._loads += 1
        if self.rank == 0:
            _, _, _, now, now_steps, _, _ = self._fetch()
            parts = len(now)
            versions = list(service.get("versions", [])) if service else []
            steps = list(service.get("steps", [])) if service else []
            if len(versions) != parts or len(steps) != parts:
                versions, steps = now, now_steps  # A torch.optim state dict: the service's own
            master = service.get("master", {}) if service else {}
            params = []
            for i, p in enumerate(self.params):
                m = master.get(i)
                params.append((torch.as_tensor(m) if m is not None else p.detach())
                              .reshape(-1).to(torch.float32).contiguous())
            keep1 = self._kind == "adam" or self._fixed["momentum"] > 0
            key1 = "momentum_buffer" if self._kind == "sgd" else "exp_avg"
            m1 = [self._saved_buffer(saved, i, key1) if keep1 else None
                  for i in range(len(self.params))]
            m2 = [self._saved_buffer(saved, i, "exp_avg_sq") if self._kind == "adam" else None
                  for i in range(len(self.params))]
            if self._kind == "adam" and any((a is None) != (b is None) for a, b in zip(m1, m2)):
                raise ValueError("ServiceOptimizer.load_state_dict: exp_avg without exp_avg_sq")
            ptr = lambda ts: [t.data_ptr() if t is not None else None for t in ts]
            self.client.put_state(ptr(params), ptr(m1), ptr(m2), versions, steps)
            if min(now) > min(versions):
                warnings.warn("job %r was at version %d on the service: the state dict's "
                              "version %d replaces it" % (self.job, min(now), min(versions)))
        self.client.barrier(_LOAD_BARRIER + self._loads)
        self.client.pull(self._param_ptrs)

    def counters(self):
        return self.client.counters()

    def close(self):
        self.client.close()


# ---- DDP communication hook ----------------------------------------------------------------

class HookState:
    """The state of `comm_hook`: one worker's connections to the service, one job per bucket.

        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(HookState(host, port, secret, job="mlp"), comm_hook)

    Each distinct gradient bucket (DDP's index and size; DDP rebuilds its buckets once after
    the first iteration) is a service job named "<job>/bucket<index>-<numel>-<dtype>" with one
    tensor and the `average` optimizer: the service sums the bucket of every worker in fp32 and
    returns the average. mode: "sync" (every worker's bucket of the same step; the result
    equals an allreduce's) or "bounded(s)" (the push joins a round while it is at most s
    rounds stale, and the hook returns the newest average the service has without waiting,
    possibly one this push has not joined yet; a straggler does not stall the others, and the
    replicas may then apply different averages, which DDP does not check). A background
    thread talks to the service, so the backward pass goes on while a bucket is aggregated.

    world_size and rank default to torch.distributed's (default process group). Not for CUDA
    tensors: the hook needs CPU gradients (the gloo backend).
    """

    def __init__(self, host, port, secret, *, job, mode="sync", world_size=None, rank=None,
                 partition_bytes=4 << 20, timeout_ms=60000, reconnect_ms=30000):
        import torch.distributed as dist
        if not job or "/" in job:
            raise ValueError("HookState: job must be a non-empty name without '/'")
        if mode != "sync" and not mode.replace(" ", "").startswith("bounded"):
            raise ValueError("HookState: mode must be sync or bounded(s), not %r "
                             "(async would mix rounds in one bucket)" % mode)
        self.world_size = dist.get_world_size() if world_size is None else int(world_size)
        self.rank = dist.get_rank() if rank is None else int(rank)
        self.host, self.port, self.secret = host, int(port), secret
        self.job, self.mode, self.partition_bytes = job, mode, int(partition_bytes)
        self.timeout_ms, self.reconnect_ms = int(timeout_ms), int(reconnect_ms)
        self._clients = {}  # bucket key -> Client; added to by the communication thread only
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tessera-comm-hook", daemon=True)
        self._thread.start()

    def _client(self, bucket_index, tensor):
        key = (bucket_index, tensor.numel(), _DTYPES[tensor.dtype])
        c = self._clients.get(key)
        if c is None:
            c = Client(self.host, self.port, self.secret, self.timeout_ms, self.reconnect_ms)
            spec = {"name": "%s/bucket%d-%d-%s" % ((self.job,) + key), "workers": self.world_size,
                    "mode": self.mode, "optimizer": "average", "lr": 1.0,
                    "partition_bytes": self.partition_bytes,
                    "tensors": [{"name": "bucket", "dtype": key[2], "shape": [key[1]]}]}
            c.join(spec, self.rank)
            c.barrier(0)
            # The job's current version (a job of that name may have trained before).
            scratch = torch.empty_like(tensor)
            c.pull([scratch.data_ptr()])
            self._clients[key] = c
        return c

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            index, tensor, fut = item
            try:
                ptr = tensor.data_ptr()
                self._client(index, tensor).push_pull([ptr], [ptr])
                fut.set_result(tensor)
            except Exception as e:  # Reaches the training loop through the future.
                fut.set_exception(e)

    def submit(self, index, tensor):
        if tensor.device.type != "cpu" or tensor.dtype not in _DTYPES or not tensor.is_contiguous():
            raise ValueError("the Parameter Service hook needs contiguous CPU fp32/fp16/bf16 "
                             "buckets (DDP with the gloo backend), got %s %s" %
                             (tensor.device, tensor.dtype))
        if not self._thread.is_alive():
            raise RuntimeError("HookState is closed")
        fut = torch.futures.Future()
        self._queue.put((index, tensor, fut))
        return fut

    def counters(self):
        """The clients' counters summed over the bucket jobs (see Client.counters)."""
        total = {}
        for c in list(self._clients.values()):
            for k, v in c.counters().items():
                total[k] = max(total.get(k, 0), v) if k == "max_staleness" else total.get(k, 0) + v
        return total

    def close(self, release=True):
        """Stops the communication thread; release: every worker meets at a barrier of each
        bucket job and rank 0 frees the jobs on the service."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        for c in self._clients.values():
            if release:
                c.barrier(_CLOSE_BARRIER)
                if self.rank == 0:
                    c.release()
            c.close()
        self._clients.clear()


_CLOSE_BARRIER = 1 << 62
_LOAD_BARRIER = 1 << 61  # + the optimizer's load_state_dict count


def comm_hook(state, bucket):
    """A DDP communication hook (DistributedDataParallel.register_comm_hook(state, comm_hook),
    state a HookState): the bucket's gradients averaged by the Parameter Service, in place."""
    return state.submit(bucket.index(), bucket.buffer())
