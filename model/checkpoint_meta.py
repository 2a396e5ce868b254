"""What a weights file (`torch.save` of `Trainer.state_dict`) holds, read without torch: `study verify` without
`--deep` checks a done run's weights with it (present, this project's, of the shapes its config makes).

A torch file is a zip archive: `<name>/data.pkl`, a pickle whose tensors refer to storages kept beside it
(`<name>/data/<key>`). The pickle is read by an unpickler that resolves only the globals a state dict
holds (OrderedDict, torch's tensor-rebuild function and storage types: each bound here to a stand-in that
records shape and dtype) and refuses any other, so no code of the file runs, as with
`torch.load(weights_only=True)`. Each storage is read from the archive (its CRC checked) and must hold
the bytes its tensors span. Tensors come back as `TensorMeta` (shape, dtype), never as data.
"""
from __future__ import annotations

import collections
import io
import pickle
import zipfile
from typing import NamedTuple

class CheckpointError(ValueError):
    """A weights or checkpoint file that is refused (it would run code) or unreadable (damaged)."""


# storage type (as pickled: torch.<Name>Storage) -> bytes per element
ITEMSIZE = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
            "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1}


class TensorMeta(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


class _StorageType(NamedTuple):
    name: str


class _Storage(NamedTuple):
    kind: _StorageType
    key: str
    numel: int


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor without a storage")
    size, stride = tuple(size), tuple(stride)
    span = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else 0
    if span > storage.numel:
        raise pickle.UnpicklingError(f"a tensor of shape {size} spans past its storage ({storage.numel} elements)")
    return TensorMeta(size, storage.kind.name[:-len("Storage")].lower())


_GLOBALS = {("collections", "OrderedDict"): collections.OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
            **{("torch", name): _StorageType(name) for name in ITEMSIZE}}


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix, self.storages = archive, prefix, {}

    def find_class(self, module, name):
        try:
            return _GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}") from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"unsupported persistent id {str(pid)[:60]}")
        _, kind, key, _, numel = pid
        if key not in self.storages:
            data = self.archive.read(f"{self.prefix}data/{key}")  # KeyError: missing; BadZipFile: CRC
            if len(data) < numel * ITEMSIZE[kind.name]:
                raise pickle.UnpicklingError(f"storage {key} holds {len(data)} bytes, fewer than its {numel} elements")
            self.storages[key] = _Storage(kind, str(key), int(numel))
        return self.storages[key]


def checked_load(name: str, load, damaged: tuple[type[Exception], ...]) -> dict:
    """`load()`'s state dict, its failures as CheckpointError (the wording `read_state_meta` and
    model.train.load_state share): refused (it would run code), unreadable (`damaged`, or not a torch
    file) or not this project's."""
    try:
        sd = load()
    except pickle.UnpicklingError as e:
        # torch's own message goes on to suggest weights_only=False: keep only what it found
        lines = [ln.strip() for ln in str(e).splitlines()
                 if ln.strip() and not ln.startswith(("Weights only load failed", "Please file", "Check the doc"))]
        why = lines[0][:160] if lines else "not a torch checkpoint"
        raise CheckpointError(f"{name}: refused: holds objects other than tensors, numbers, strings, lists "
                              f"and dicts (a crafted or foreign file?): {why}") from None
    except damaged as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{name}: not a readable checkpoint (truncated or damaged?): {first}") from None
    except Exception as e:  # other bytes the unpickler trips on (KeyError, IndexError, TypeError...)
        raise CheckpointError(f"{name}: not a readable checkpoint (not a torch file: {type(e).__name__} "
                              f"{str(e)[:100]})") from None
    if not isinstance(sd, dict) or "model" not in sd:
        raise CheckpointError(f"{name}: not a checkpoint of this project (no 'model' entry)")
    return sd


def read_state_meta(data: bytes, name: str = "checkpoint") -> dict:
    """The state dict in the weights bytes `data`, tensors as `TensorMeta` (see `checked_load`)."""
    def load():
        z = zipfile.ZipFile(io.BytesIO(data))
        pkl = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkl) != 1:
            raise ValueError("no data.pkl in the archive")
        return _Unpickler(z.read(pkl[0]), z, pkl[0][:-len("data.pkl")]).load()

    return checked_load(name, load, (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError))
