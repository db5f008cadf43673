"""A pickle reader that can only build plain containers and scalars.

Flight Recorder dumps are pickles of dicts, lists, tuples, strings, numbers, booleans and None.
Nothing else is needed, so every global lookup (the way a pickle names a class or a function such
as ``os.system``) is refused: a malicious pickle runs no code and raises :class:`UnsafePickle`.
This is the only place rankstream reads pickles.
"""

from __future__ import annotations

import io
import pickle

__all__ = ["safe_loads", "UnsafePickle"]


class UnsafePickle(ValueError):
    """The data is not a plain-data pickle (it names a global, or it is corrupt)."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise UnsafePickle(f"refused to load {module}.{name}: only plain data is allowed in an FR dump")

    def persistent_load(self, pid):
        raise UnsafePickle("refused a persistent reference: only plain data is allowed in an FR dump")


def safe_loads(data: bytes):
    """Unpickle ``data`` allowing only dict, list, tuple, set, str, bytes, numbers, bool and None."""
    try:
        return _PlainDataUnpickler(io.BytesIO(data)).load()
    except UnsafePickle:
        raise
    except Exception as exc:  # truncated or corrupt: EOFError, UnpicklingError, ValueError, ...
        raise UnsafePickle(f"not a readable pickle: {type(exc).__name__}: {exc}") from None
