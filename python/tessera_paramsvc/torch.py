"""PyTorch integration: an optimizer whose step() runs on the Parameter Service.

An existing loop changes by two lines:

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)          # before
    opt = tessera_paramsvc.torch.ServiceOptimizer(model, host, port, secret,   # after
              job="mnist", workers=4, rank=rank, lr=0.1, momentum=0.9)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

step() pushes every parameter's gradient to the service and loads the updated parameters
(SGD with momentum, or Adam, applied once per round on the averaged gradient by the
service) straight into the parameters' memory. Rank 0's initial parameters are the job's.
"""
import torch

from . import Client

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class ServiceOptimizer:
    def __init__(self, model, host, port, secret, *, job, workers, rank, lr, momentum=0.0,
                 weight_decay=0.0, optimizer="sgd", mode="sync", late="drop",
                 partition_bytes=1 << 20, timeout_ms=60000, reconnect_ms=30000):
        params = list(model.parameters()) if hasattr(model, "parameters") else list(model)
        for p in params:
            if p.dtype not in _DTYPES or p.device.type != "cpu" or not p.is_contiguous():
                raise ValueError("ServiceOptimizer needs contiguous CPU fp32/fp16/bf16 parameters")
        self.params = params
        self.client = Client(host, port, secret, timeout_ms, reconnect_ms)
        spec = {"name": job, "workers": workers, "mode": mode, "late": late,
                "optimizer": optimizer, "lr": lr, "momentum": momentum,
                "weight_decay": weight_decay, "partition_bytes": partition_bytes,
                "tensors": [{"name": "p%d" % i, "dtype": _DTYPES[p.dtype],
                             "shape": list(p.shape) or [1]} for i, p in enumerate(params)]}
        self.client.join(spec, rank)
        self._param_ptrs = [p.data.data_ptr() for p in params]
        if rank == 0:
            self.client.set_params(self._param_ptrs)
        self.client.barrier(0)
        with torch.no_grad():
            self.client.pull(self._param_ptrs)
        self._zeros = {}

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def step(self):
        grads = []
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                g = self._zeros.setdefault(i, torch.zeros_like(p))
            elif not g.is_contiguous():
                g = g.contiguous()
            grads.append(g)
        with torch.no_grad():
            self.client.push_pull([g.data_ptr() for g in grads], self._param_ptrs)

    def counters(self):
        return self.client.counters()

    def close(self):
        self.client.close()
