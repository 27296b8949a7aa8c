"""The plugin's optimizer state as bytes inside the optimizer's state_dict.

save_state writes one file per rank into a folder; the optimizer's
state_dict() saves into a fresh scratch folder, reads the files back as uint8
tensors and removes the folder, so the dict is self-contained: torch.save puts
the state inside the checkpoint, a moved checkpoint resumes, and nothing is
left on disk. load_state_dict writes the files into another scratch folder
under the same names and calls load_state (a rank without its own file reads
rank 0's, as load_state does with folders). The plugin's file carries the
weights too (data and fp32 masters) besides the moments and the step, so
loading it restores the model as well.
"""
import os
import shutil
import tempfile

import torch


def _scratch(parent):
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix="protrain_state_", dir=parent)


def save_files(ad, scratch_parent=None):
    """{file name: uint8 tensor} of save_state's files for this rank."""
    d = _scratch(scratch_parent)
    try:
        ad.call("save_state", d.encode())
        out = {}
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            n = os.path.getsize(path)
            t = torch.empty(n, dtype=torch.uint8)
            with open(path, "rb") as f:
                if n and f.readinto(t.numpy()) != n:
                    raise RuntimeError("protrain: short read of the state file %s" % path)
            out[name] = t
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def load_files(ad, files, scratch_parent=None):
    """load_state from the bytes save_files returned."""
    if not isinstance(files, dict) or not files:
        raise ValueError("protrain: the optimizer state holds no plugin state files")
    d = _scratch(scratch_parent)
    try:
        for name, t in files.items():
            if os.path.basename(name) != name or not isinstance(t, torch.Tensor) or \
                    t.dtype != torch.uint8:
                raise ValueError("protrain: the optimizer state's file %r is not a plain file "
                                 "name with uint8 bytes" % (name,))
            with open(os.path.join(d, name), "wb") as f:
                f.write(t.detach().cpu().contiguous().numpy())
        ad.call("load_state", d.encode())
    finally:
        shutil.rmtree(d, ignore_errors=True)
