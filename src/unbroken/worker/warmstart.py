"""A rank's next process starts its sharded steps warm: the shardings its predecessor computed.

A ``DTensor`` operator's output sharding is computed once per process and operator schema
(shapes, placements, mesh) and cached in the process. A fresh process computes each again in
its first step: for the small HSDP model of ``examples/train_sharded.py``, 53 schemas and
0.35 s of Python, most of a replacement's first step and of a recover-in-place's MTTR.
:class:`ShardingMemo` notes each sharding the process computes on its model's mesh. At a
commit that saw new ones, the rank writes them to its file in the pod's directory
(``UNBROKEN_WARM_DIR``, set by the node agent). The rank's next process on the node (an
in-place replacement, a restart of the pod's processes) reads the file and computes none of
them again: its first step costs what a step costs. A rank the zygote forks has its memo
started before its script runs (:func:`start`) and reads the file at the first sharding asked
for, whose mesh is then known (the script's ``fully_shard``); any other reads it in
:func:`unbroken.worker.init`, which gives the memo the model's mesh (:meth:`ShardingMemo.attach`).

Why a memo from another process is safe to use:

- a sharding is a function of the schema, the mesh and torch: the file names the torch version
  and the mesh (device type, ranks, dimension names), and a file that differs in either is not
  read (a world scaled in, another torch);
- an entry is used only for a schema equal to it, as torch's own cache compares them (the mesh
  in a loaded entry is this process's model mesh), so an entry no operator asks for is never
  used;
- the file is written by the rank's previous process into its pod's directory and read with
  an unpickler that builds the sharding classes, torch sizes and dtypes, and registered
  operators by name, nothing else: a file that is not what it says cannot run code, and any
  error reading it leaves the memo empty (the process computes its shardings as usual).

The replica transfer (:mod:`unbroken.worker.replica`) pickles nothing; this file is a cache
of the node, not training state: no digest, checkpoint or recovery depends on it.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from unbroken.worker import torchapi

logger = logging.getLogger(__name__)

FORMAT = 1

_SAFE_BUILTINS = frozenset({"tuple", "list", "dict", "set", "frozenset", "slice", "complex"})


class _OtherMesh(Exception):
    """An entry on a mesh other than the model's: not kept."""


def mesh_identity(mesh: DeviceMesh) -> tuple[Any, ...]:
    """What a sharding depends on of ``mesh``: device type, ranks by position, dimension
    names (not its process groups, nor the thread that built it)."""
    names = tuple(mesh.mesh_dim_names) if mesh.mesh_dim_names is not None else None
    return (mesh.device_type, tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()), names)


def _operator(name: str) -> torch._ops.OpOverload:
    """The registered operator ``name`` (``aten::mul.Tensor``, ``aten::relu``)."""
    namespace, _, rest = name.partition("::")
    packet, _, overload = rest.partition(".")
    found = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
    if not isinstance(found, torch._ops.OpOverload):
        raise pickle.UnpicklingError(f"{name!r} is not an operator")
    return found


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, mesh: DeviceMesh) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._mesh = mesh

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, DeviceMesh):
            if obj == self._mesh:  # the model's mesh, as this thread built it
                return ("mesh",)
            raise _OtherMesh
        if isinstance(obj, torch._ops.OpOverload):
            return ("op", obj.name())  # type: ignore[no-untyped-call]
        return None


class _Unpickler(pickle.Unpickler):
    """Builds what a sharding is made of and nothing else (see the module doc)."""

    def __init__(self, data: bytes, mesh: DeviceMesh | None) -> None:
        super().__init__(io.BytesIO(data))
        self._mesh = mesh

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        # torch.Size, dtypes, memory formats and layouts (a memory format names itself
        # "torch.preserve_format", found from whichever module pickle guessed).
        attribute = name[len("torch.") :] if name.startswith("torch.") else name
        if module == "torch" or (module.startswith("torch.") and attribute != name):
            found = getattr(torch, attribute, None) if "." not in attribute else None
            if found is torch.Size or isinstance(
                found, (torch.dtype, torch.memory_format, torch.layout)
            ):
                return found
        found = torchapi.sharding_class(module, name)
        if found is not None:
            return found
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a sharding")

    def persistent_load(self, pid: Any) -> Any:
        if pid == ("mesh",) and self._mesh is not None:
            return self._mesh
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "op":
            return _operator(str(pid[1]))
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")


class ShardingMemo:
    """The output shardings this process computed on its model's mesh, and its file."""

    def __init__(self, path: Path, mesh: DeviceMesh | None) -> None:
        self.path = path
        #: The model's mesh; None until the first sharding is asked for (a process that
        #: installed the memo before its script built the mesh, :func:`start`).
        self.mesh = mesh
        self._known: dict[Any, Any] = {}
        self._written = 0  # entries in the file (or read from it)
        self._read_tried = False
        self.loaded = 0
        self.hits = 0

    @classmethod
    def install(cls, path: Path, mesh: DeviceMesh) -> ShardingMemo | None:
        """Note every sharding computed from now on, first reading ``path`` if it is there;
        None: this torch offers no place to note them."""
        memo = cls._noting(path, mesh)
        if memo is not None:
            memo.load()
        return memo

    @classmethod
    def _noting(cls, path: Path, mesh: DeviceMesh | None) -> ShardingMemo | None:
        """A memo that notes every sharding computed from now on (None: this torch offers no
        place to note them)."""
        memo = cls(path, mesh)
        if not torchapi.wrap_sharding_propagation(memo._around):
            logger.debug("this torch has no sharding propagation to keep: no warm start")
            return None
        return memo

    def attach(self, mesh: DeviceMesh) -> None:
        """The model's mesh is ``mesh`` (``ub.init``): the file is read for it unless it was
        read for that mesh already, and written for it from now on."""
        known = self.mesh is not None and mesh_identity(self.mesh) == mesh_identity(mesh)
        self.mesh = mesh
        if not (known and self._read_tried):
            self.load()

    def _around(self, propagate: Callable[[Any], Any]) -> Callable[[Any], Any]:
        known = self._known

        def memoized(schema: Any) -> Any:
            if not self._read_tried and self.mesh is None:
                # The first sharding of a memo started before the mesh existed: the file is
                # read now, for the mesh this operator runs on (the script's fully_shard).
                self.mesh = torchapi.sharding_mesh(schema)
                if self.mesh is not None:
                    self.load()
            try:
                found = known.get(schema)
            except TypeError:  # symbolic shapes (torch.compile tracing): not hashable
                return propagate(schema)
            if found is not None:
                self.hits += 1
                return found
            result = propagate(schema)
            known[schema] = result
            return result

        return memoized

    def _header(self) -> dict[str, Any]:
        assert self.mesh is not None
        return {"format": FORMAT, "torch": str(torch.__version__), "mesh": mesh_identity(self.mesh)}

    def save_if_grown(self) -> bool:
        """Write the file when shardings were computed since it was last written or read;
        whether it was written. Never raises: a memo not written costs a warm start only."""
        if len(self._known) == self._written or self.mesh is None:
            return False
        entries = list(self._known.items())
        blobs = []
        for entry in entries:
            buffer = io.BytesIO()
            try:
                _Pickler(buffer, self.mesh).dump(entry)
            except _OtherMesh:
                continue
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                logger.debug("a sharding not kept: %s", e)
                continue
            blobs.append(buffer.getvalue())
        data = pickle.dumps((self._header(), blobs), protocol=pickle.HIGHEST_PROTOCOL)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, self.path)
        except OSError as e:
            logger.warning("the shardings of this rank were not written to %s: %s", self.path, e)
            tmp.unlink(missing_ok=True)
            return False
        self._written = len(entries)
        logger.debug("%d shardings written to %s", len(blobs), self.path)
        return True

    def load(self) -> int:
        """Take the shardings of ``path`` (written by this rank's previous process); how many."""
        self._read_tried = True
        if self.mesh is None:
            return 0
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as e:
            logger.warning("the shardings in %s were not read: %s", self.path, e)
            return 0
        try:
            header, blobs = _Unpickler(data, None).load()
            if header != self._header():
                logger.info(
                    "the shardings in %s are of another mesh or torch (%s): not used",
                    self.path,
                    header,
                )
                return 0
            entries = [_Unpickler(blob, self.mesh).load() for blob in blobs]
            for key, value in entries:
                torchapi.sharding_rehash((key, value))  # before the key goes into the dict
        except Exception as e:  # a file of any content: nothing of it is used
            logger.warning("the shardings in %s were not used: %s", self.path, e)
            return 0
        for key, value in entries:
            self._known.setdefault(key, value)
        self.loaded = len(entries)
        self._written = len(self._known)
        logger.info("rank starts warm: %d shardings read from %s", self.loaded, self.path)
        return self.loaded


_started: ShardingMemo | None = None


def start(path: Path) -> ShardingMemo | None:
    """This process's memo, noting shardings from now on and reading ``path`` when the first
    one is asked for (installed once; the zygote starts it in a rank before its script runs, so
    that the shardings of ``fully_shard`` itself are read too). None: this torch offers no
    place to note them."""
    global _started
    if _started is None:
        _started = ShardingMemo._noting(path, None)
    return _started


def path_of(warm_dir: Path, rank: int) -> Path:
    """The file of rank ``rank``'s shardings in its pod's directory."""
    return warm_dir / f"rank{rank}.shardings"
