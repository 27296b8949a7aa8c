"""protrain: Python host bindings for protrain_plugin.so (ctypes over host_api/protrain.h).

    import protrain            # the binding: protrain.Table, protrain.Error
    import protrain.torch      # the PyTorch host: protrain.torch.wrap(model, config=...)
"""
from ._plugin import Context, Error, Table, resolve, search_dirs  # noqa: F401
from . import _abi as abi  # noqa: F401

__all__ = ["Context", "Error", "Table", "resolve", "search_dirs", "abi"]
