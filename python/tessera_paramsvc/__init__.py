"""Python client of Tessera's Parameter Service (ctypes over libtessera_paramsvc_c.so).

    from tessera_paramsvc import Client
    c = Client("127.0.0.1", 7800, secret)
    c.join({"name": "job", "workers": 4, "mode": "sync", "lr": 0.1,
            "tensors": [{"name": "w", "dtype": "fp32", "shape": [10, 10]}]}, rank)
    c.push_pull([grad_ptr, ...], [param_ptr, ...])   # raw pointers, one per tensor

The PyTorch integration is tessera_paramsvc.torch (an optimizer and a DDP communication hook).
The C library is found by the dynamic loader's search or in the standard library directories
(/usr/local/lib, /usr/lib and their multiarch directories, where `cmake --install` and the
Debian package put it), or, in a build tree, beside this package (build/python -> build/lib).
"""
import ctypes
import json
import os

__all__ = ["Client", "ServiceError", "load_library", "serve"]

_LIB = None


class ServiceError(RuntimeError):
    """A failed service call; .code is Tessera's StatusCode number."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


_LIB_NAME = "libtessera_paramsvc_c.so"


def load_library():
    global _LIB
    if _LIB is not None:
        return _LIB
    here = os.path.dirname(os.path.abspath(__file__))
    build_tree = os.path.join(here, "..", "..", "lib", _LIB_NAME)  # build/python -> build/lib
    errors = []
    lib = None
    # The build tree's copy; the loader's own search (its cache, LD_LIBRARY_PATH); then the
    # standard library directories an install puts it in, which the loader cache may not list
    # until ldconfig runs.
    import sysconfig
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    standard = [os.path.join(d, _LIB_NAME) for d in
                ("/usr/local/lib", "/usr/local/lib/" + multiarch, "/usr/lib/" + multiarch, "/usr/lib")
                if d and os.path.exists(os.path.join(d, _LIB_NAME))]
    for path in ([os.path.abspath(build_tree)] if os.path.exists(build_tree) else []) + \
            [_LIB_NAME] + standard:
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(str(e))
    if lib is None:
        raise OSError(_LIB_NAME + " not found: install Tessera "
                      "(cmake --install build, or the tessera Debian package), or add its lib directory to the "
                      "loader's path (" + "; ".join(errors) + ")")
    vp, ip, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    lib.tps_last_error.restype = cp
    lib.tps_connect.restype = vp
    lib.tps_connect.argtypes = [cp, ip, cp, ip, ip]
    lib.tps_close.argtypes = [vp]
    lib.tps_join.argtypes = [vp, cp, ip]
    lib.tps_set_params.argtypes = [vp, ctypes.POINTER(vp)]
    lib.tps_push_pull.argtypes = [vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
    lib.tps_push.argtypes = [vp, ctypes.POINTER(vp)]
    lib.tps_pull.argtypes = [vp, ctypes.POINTER(vp), ip]
    lib.tps_barrier.argtypes = [vp, ctypes.c_ulonglong]
    lib.tps_release.argtypes = [vp]
    lib.tps_set_lr.argtypes = [vp, ctypes.c_double]
    lib.tps_counters.argtypes = [vp, ctypes.POINTER(ctypes.c_ulonglong)]
    lib.tps_endpoint.argtypes = [vp, ctypes.c_char_p, ip]
    lib.tps_num_partitions.argtypes = [vp]
    fpp = ctypes.POINTER(ctypes.c_void_p)
    ullp = ctypes.POINTER(ctypes.c_ulonglong)
    lib.tps_get_state.argtypes = [vp, fpp, fpp, fpp, ctypes.POINTER(ip), ctypes.POINTER(ip),
                                  ullp, ullp]
    lib.tps_put_state.argtypes = [vp, fpp, fpp, fpp, ullp, ullp]
    lib.tps_min_version.restype = ctypes.c_ulonglong
    lib.tps_min_version.argtypes = [vp]
    lib.tps_status.restype = ctypes.c_longlong
    lib.tps_status.argtypes = [vp, ctypes.c_char_p, ctypes.c_longlong]
    _LIB = lib
    return lib


def _check(rc):
    if rc < 0:
        raise ServiceError(-rc, _LIB.tps_last_error().decode())
    return rc


def _ptrs(ptrs):
    arr = (ctypes.c_void_p * len(ptrs))()
    for i, p in enumerate(ptrs):
        arr[i] = p
    return arr


class Client:
    """One worker's connection to the service. Not thread-safe.

    secret: the cluster secret, or the text of a per-client credential file
    (`tessera token issue --client NAME ...`), which authenticates as that client.
    """

    def __init__(self, host, port, secret, timeout_ms=60000, reconnect_ms=30000):
        lib = load_library()
        self._h = lib.tps_connect(host.encode(), int(port), secret.encode(), int(timeout_ms),
                                  int(reconnect_ms))
        if not self._h:
            raise ServiceError(14, lib.tps_last_error().decode())

    def close(self):
        if self._h:
            _LIB.tps_close(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def join(self, spec, rank):
        _check(_LIB.tps_join(self._h, json.dumps(spec).encode(), int(rank)))

    def set_params(self, ptrs):
        """Initial values; False when the job already trained (pull instead)."""
        return _check(_LIB.tps_set_params(self._h, _ptrs(ptrs))) == 0

    def push_pull(self, grad_ptrs, param_ptrs):
        _check(_LIB.tps_push_pull(self._h, _ptrs(grad_ptrs), _ptrs(param_ptrs)))

    def push(self, grad_ptrs):
        _check(_LIB.tps_push(self._h, _ptrs(grad_ptrs)))

    def pull(self, param_ptrs, wait=False):
        _check(_LIB.tps_pull(self._h, _ptrs(param_ptrs), 1 if wait else 0))

    def barrier(self, iteration):
        _check(_LIB.tps_barrier(self._h, int(iteration)))

    def set_lr(self, lr):
        """The job's learning rate from its next round on (resent after a reconnect)."""
        _check(_LIB.tps_set_lr(self._h, float(lr)))

    def release(self):
        _check(_LIB.tps_release(self._h))

    def counters(self):
        out = (ctypes.c_ulonglong * 8)()
        _LIB.tps_counters(self._h, out)
        keys = ["pushes", "applied", "dropped", "late", "max_staleness", "rollbacks", "reconnects",
                "redirects"]
        return dict(zip(keys, list(out)))

    def endpoint(self):
        """The server the client talks to now, "HOST:PORT" (it follows the job's moves)."""
        buf = ctypes.create_string_buffer(300)
        _LIB.tps_endpoint(self._h, buf, 300)
        return buf.value.decode()

    def num_partitions(self):
        return _LIB.tps_num_partitions(self._h)

    def get_state(self, param_ptrs, mom_ptrs, mom2_ptrs):
        """The job's state on the service into per-tensor fp32 buffers (raw pointers, None to
        skip; zero them first): returns (versions, steps) per partition and (has_mom, has_mom2)
        per tensor."""
        n = len(param_ptrs)
        parts = self.num_partitions()
        has, has2 = (ctypes.c_int * n)(), (ctypes.c_int * n)()
        versions, steps = (ctypes.c_ulonglong * parts)(), (ctypes.c_ulonglong * parts)()
        _check(_LIB.tps_get_state(self._h, _ptrs(param_ptrs), _ptrs(mom_ptrs), _ptrs(mom2_ptrs),
                                  has, has2, versions, steps))
        return list(versions), list(steps), [bool(x) for x in has], [bool(x) for x in has2]

    def put_state(self, param_ptrs, mom_ptrs, mom2_ptrs, versions, steps):
        """Restores the job's state on the service at an iteration boundary: per-tensor fp32
        buffers (mom/mom2 entries None: no such state), per-partition versions and steps."""
        parts = self.num_partitions()
        if len(versions) != parts or len(steps) != parts:
            raise ValueError("put_state: %d partitions, %d versions and %d steps given" %
                             (parts, len(versions), len(steps)))
        v = (ctypes.c_ulonglong * parts)(*versions)
        s = (ctypes.c_ulonglong * parts)(*steps)
        _check(_LIB.tps_put_state(self._h, _ptrs(param_ptrs), _ptrs(mom_ptrs), _ptrs(mom2_ptrs), v, s))

    def min_version(self):
        return _LIB.tps_min_version(self._h)

    def status(self):
        n = _check(_LIB.tps_status(self._h, None, 0))
        buf = ctypes.create_string_buffer(n + 1)
        _check(_LIB.tps_status(self._h, buf, n + 1))
        return json.loads(buf.value.decode())


def serve(bin_dir=None, cores=2, extra=(), token_file=None):
    """Starts `tessera paramsvc serve --port 0` and returns (process, host, port).

    bin_dir: a directory holding the `tessera` command (a build's bin/); None: `tessera` on
    PATH.
    """
    import shutil
    import subprocess
    tessera = os.path.join(bin_dir, "tessera") if bin_dir else shutil.which("tessera")
    if not tessera or not os.access(tessera, os.X_OK):
        raise RuntimeError("the tessera command is not on PATH (install Tessera, or pass bin_dir)")
    cmd = [tessera, "paramsvc", "serve", "--port=0", "--cores=%d" % cores,
           "--log-level=warning"] + list(extra)
    if token_file:
        cmd.append("--auth-token-file=" + token_file)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("listening on "):
            host, port = line.split()[2].rsplit(":", 1)
            return proc, host, int(port)
    raise RuntimeError("tessera paramsvc serve exited before listening")
