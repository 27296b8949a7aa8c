"""Several ranks over torch.distributed: the host's collectives table
(pt_host_coll_v1, protrain.h ABI 1.6) that lets the plugin run its
collectives over the process group PyTorch already has, so `torchrun` starts
a data-parallel run without MPI.

Which group (group_for):
  - a default process group is initialised (the user's, e.g. by accelerate or
    their own init_process_group): it is used as is; rank and world come from
    it. It must move CPU tensors (gloo, or "cpu:gloo,cuda:nccl"): the plugin
    hands the table host memory;
  - none is, and torchrun's variables say WORLD_SIZE > 1 (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT; no Open MPI / PMI variable): the adapter
    initialises the default group with gloo from them (env://), once per
    process: later wraps use it like a group of the user's, and destroying it
    at the end (torch.distributed.destroy_process_group()) is the user's;
  - under mpirun (Open MPI's or PMI's variables) and with one process: no
    table; the plugin opens MPI itself as before (see _launcher_rank).
The table is for the host backend (the simulated device on the CPU); on cuda
the plugin refuses a table, so the CUDA session passes none.

The ops only move bytes (all_gather_into_tensor, all_to_all_single,
barrier on uint8 views of the plugin's buffers, no copy); the plugin adds in
rank order itself, so the sums are the same bits on every rank whatever gloo
does. A Python exception inside an op never crosses the C frames: it becomes
a non-zero return with "Type: message" written into the plugin's error
buffer (so last_error quotes it), and the exception is kept for the adapter
to chain. The deadline is the group's (init_process_group's timeout).
"""
import ctypes as C
import os

import torch
import torch.distributed as dist

from . import _abi as A

_MPI_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _view(ptr, n):
    """The n bytes at ptr as a uint8 CPU tensor sharing that memory."""
    return torch.frombuffer((C.c_uint8 * n).from_address(ptr), dtype=torch.uint8)


def group_for(cuda):
    """(rank, world) of the default process group the plugin should use,
    initialising it from torchrun's variables when needed; None when the
    plugin needs no table (one process, mpirun, or a CUDA session)."""
    if cuda or not dist.is_available():
        return None
    env = os.environ
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if any(v in env for v in _MPI_VARS) or int(env.get("WORLD_SIZE", "1")) <= 1:
        return None
    missing = [v for v in _TORCHRUN_VARS if v not in env]
    if missing:
        raise RuntimeError("protrain: WORLD_SIZE = %s but %s not set; start the ranks with "
                           "torchrun (or initialise torch.distributed yourself)"
                           % (env["WORLD_SIZE"], ", ".join(missing)))
    dist.init_process_group(backend="gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def check_backend():
    """Refuse a default group that cannot move CPU tensors (NCCL alone)."""
    backend = str(dist.get_backend())
    if "gloo" not in backend and "mpi" not in backend:
        raise RuntimeError(
            "protrain: the default process group's backend is %s, which cannot move the "
            "CPU buffers the plugin's collectives use on the host backend; initialise it "
            "with backend='gloo' (or 'cpu:gloo,cuda:nccl')" % backend)


class HostColl:
    """pt_host_coll_v1 over the default process group. Keep the object alive
    as long as the plugin context: the table and its ctypes callbacks live in
    it."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.exc = None
        self._cbs = (A.COLL_XFER(self._cb_gather), A.COLL_XFER(self._cb_a2a),
                     A.COLL_BARRIER(self._cb_barrier))
        t = A.pt_host_coll_v1()
        t.struct_size = C.sizeof(t)
        t.rank, t.world_size = rank, world
        t.all_gather, t.all_to_all, t.barrier = self._cbs
        self.table = t

    # ---- the ops (what a test may replace to play a faulty host) ----
    def gather(self, send, recv, n):
        dist.all_gather_into_tensor(_view(recv, n * self.world), _view(send, n))

    def all_to_all(self, send, recv, n):
        dist.all_to_all_single(_view(recv, n * self.world), _view(send, n * self.world))

    def barrier(self):
        dist.barrier()

    # ---- the C side: no exception crosses it ----
    def _guard(self, err, errlen, fn, *args):
        try:
            fn(*args)
            return 0
        except BaseException as e:   # never unwind through the plugin's C frames
            self.exc = e
            if err and errlen:
                msg = ("%s: %s" % (type(e).__name__, e)).encode(errors="replace")
                msg = msg[:int(errlen) - 1] + b"\0"
                C.memmove(err, msg, len(msg))
            return A.PT_ERR_CALLBACK

    def _cb_gather(self, user, send, recv, n, err, errlen):
        return self._guard(err, errlen, self.gather, send, recv, int(n))

    def _cb_a2a(self, user, send, recv, n, err, errlen):
        return self._guard(err, errlen, self.all_to_all, send, recv, int(n))

    def _cb_barrier(self, user, err, errlen):
        return self._guard(err, errlen, self.barrier)

    def take_exc(self):
        e, self.exc = self.exc, None
        return e
