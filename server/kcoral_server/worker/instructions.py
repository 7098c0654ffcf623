"""What each instruction of a program does (PROTOCOL §5, §6.2): uploads, functions, runs and
returns, on the program's handle table, with the GPU lease taken and given back where §6.2
puts it. One ``Instructions`` per program; ``engine.ProgramExecution`` drives it and tears it
down (``close``)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kcoral.protocol.errors import ValidationError
from kcoral.protocol.paths import normalize_workspace_path
from kcoral.protocol.schema import GetFunction, Instruction, LiteralArg, Ref, Return, Run, Upload
from kcoral_server.processes.ipc import (
    FRAME_ENVELOPE_BYTES,
    ReturnProduced,
    ReturnTooLarge,
    encode,
)
from kcoral_server.worker.blobs import BlobMaps, hashed_parts_memfd
from kcoral_server.worker.cupti_guard import watch_cpu_only
from kcoral_server.worker.failures import (
    Attribution,
    InstructionFailure,
    classify,
    exception_text,
    format_user_traceback,
)
from kcoral_server.worker.files import Budget, UploadWriter, collect_file, collect_folder
from kcoral_server.worker.libraries import library_function
from kcoral_server.worker.modules import (
    CudaSourceModule,
    PythonModules,
    cuda_function,
    python_attribute,
)

if TYPE_CHECKING:
    from kcoral_server.worker.engine import Engine

NOT_A_MODULE = "get_function expects an uploaded module or library handle"
# what a file upload into .kcoral/ is told: it said only 'is reserved in the sandbox'
RESERVED_IN_THE_SANDBOX = (
    "is reserved: the sandbox keeps the worker's own files (its home, temporary files and "
    "caches) in .kcoral; upload it under another name"
)


class Instructions:
    """One program's handles and the instructions that make them."""

    def __init__(self, engine: Engine, max_response_bytes: int) -> None:
        self.engine = engine
        self.channel = engine.channel
        self.runtime = engine.runtime
        self.lease = engine.lease
        self.max_response_bytes = max_response_bytes
        self.handles: dict[str, Any] = {}
        self.module_kinds: dict[str, str] = {}  # handle id -> "python" | "cuda" | "library"
        self.cpu_only: set[str] = set()
        self.modules = PythonModules()
        self.blobs: BlobMaps | None = None  # set once the program's blobs are mapped
        self.workspace_fd: int | None = None  # ... and its workspace opened
        #: places a run of consecutive file uploads; closed by any other instruction
        self.upload_writer: UploadWriter | None = None
        self.part_index = 0  # next return:<i>
        self.part_bytes = 0  # bytes of all parts produced so far (file/folder budget)
        self.previous: Attribution | None = None  # the instruction before the current one
        #: a sticky device fault was found while the lease was given back
        self.poisoned = False

    def close(self) -> None:
        """Drop every handle and the program's modules, unmap its blobs, close its
        workspace."""
        self.handles.clear()
        self.module_kinds.clear()
        self.modules.teardown()
        if self.blobs is not None:
            self.blobs.close()
        self._close_upload_writer()
        if self.workspace_fd is not None:
            os.close(self.workspace_fd)
            self.workspace_fd = None

    def step(self, instruction: Instruction, previous: Attribution | None = None) -> None:
        """Carry out ``instruction``; ``previous`` is the instruction before it, which a
        device fault found while the lease is given back belongs to."""
        self.previous = previous
        if not (isinstance(instruction, Upload) and instruction.kind == "file"):
            self._close_upload_writer()  # what runs next may change the tree
        if isinstance(instruction, Upload):
            self._upload(instruction)
        elif isinstance(instruction, GetFunction):
            self._get_function(instruction)
        elif isinstance(instruction, Run):
            self._run(instruction)
        elif isinstance(instruction, Return):
            if instruction.kind == "value":
                self._return_value(instruction)
            else:
                self._return_path(instruction)
        else:
            raise InstructionFailure("engine", f"unknown instruction {instruction!r}")

    # ------------------------------------------------------------------ helpers

    def _call_user(self, call: Callable[[], Any]) -> Any:
        """Run uploaded code; every exception (SystemExit too) fails the instruction."""
        try:
            with self.engine.interrupts.user_code():  # a session's interrupt lands here
                result = call()
                if inspect.isawaitable(result):
                    result = self.engine.event_loop.get().run_until_complete(_awaited(result))
            return result
        except BaseException as exc:
            raise classify(exc) from None

    def _drain_and_release(self) -> None:
        """Finish outstanding GPU work, then give the lease back (§6.2)."""
        if not self.lease.held:
            return
        fault = self.runtime.drain()
        self.lease.release()
        if fault is not None:
            self.poisoned = self.poisoned or fault.sticky
            # the fault belongs to GPU work that already ran, not to this instruction
            raise InstructionFailure("runtime", fault.message, "", self.previous)

    def _close_upload_writer(self) -> None:
        if self.upload_writer is not None:
            self.upload_writer.close()
            self.upload_writer = None

    def _blob(self, sha256: str | None) -> memoryview:
        assert self.blobs is not None and sha256 is not None
        return self.blobs.get(sha256)

    def _resolve(self, ref: Ref) -> Any:
        try:
            return self.handles[ref.id]
        except KeyError:
            raise InstructionFailure("engine", f"handle '{ref.id}' does not exist") from None

    # ------------------------------------------------------------------ instructions

    def _upload(self, upload: Upload) -> None:
        kind = upload.kind
        if kind == "file":
            self._drain_and_release()
            path = upload.path or ""
            if self.engine.configure.sandbox == "bubblewrap" and path.split("/")[0] == ".kcoral":
                raise InstructionFailure("runtime", f"path {path!r} {RESERVED_IN_THE_SANDBOX}")
            assert self.workspace_fd is not None
            if self.upload_writer is None:
                self.upload_writer = UploadWriter(self.workspace_fd)
            self.upload_writer.write(path, self._blob(upload.blob))
            if upload.id is not None:
                self.handles[upload.id] = path
            return
        handle = upload.id
        assert handle is not None  # only a file upload may have no id (PROTOCOL §5.1)
        if kind == "module" and upload.language == "cuda":
            self.handles[handle] = CudaSourceModule(upload.source or "")
            self.module_kinds[handle] = "cuda"
        elif kind == "module":
            self.lease.acquire()
            module, code = self.modules.compile(upload.source or "")
            self._call_user(lambda: exec(code, module.__dict__))
            self.handles[handle] = module
            self.module_kinds[handle] = "python"
        elif kind == "tensor":
            self.lease.acquire()
            shape = tuple(upload.shape or ())
            data = self._blob(upload.blob)
            self.handles[handle] = self.runtime.tensor(data, upload.dtype or "", shape)
        elif kind == "bytes":
            self.handles[handle] = bytes(self._blob(upload.blob))
        elif kind == "library":
            self.lease.acquire()
            library = self.engine.libraries.load(upload.blob or "", self._blob(upload.blob))
            self.handles[handle] = library
            self.module_kinds[handle] = "library"
        else:
            raise InstructionFailure("engine", f"unknown upload kind {kind!r}")

    def _get_function(self, get: GetFunction) -> None:
        target = self._resolve(get.module)
        kind = self.module_kinds.get(get.module.id)
        if kind == "python":
            self.lease.acquire()
            value = self._call_user(lambda: python_attribute(target, get.name, get.module.id))
        elif kind == "cuda":
            value = cuda_function(target, get.name)
        elif kind == "library":
            self.lease.acquire()
            value = library_function(target, get.name)
        else:
            raise InstructionFailure(self.runtime.non_module_function_kind, NOT_A_MODULE)
        self.handles[get.id] = value
        if get.cpu_only:
            self.cpu_only.add(get.id)

    def _run(self, run: Run) -> None:
        function = self._resolve(run.fn)
        watched = run.fn.id in self.cpu_only
        if watched:
            self._drain_and_release()
        else:
            self.lease.acquire()
        if not callable(function):
            raise InstructionFailure("runtime", f"handle '{run.fn.id}' is not callable")
        args = [self._resolve(arg) if isinstance(arg, Ref) else _literal(arg) for arg in run.args]
        if not watched:
            self.handles[run.id] = self._call_user(lambda: function(*args))
            return
        with watch_cpu_only(self.runtime.device):  # PROTOCOL §6.2 cpu_only watch
            self.handles[run.id] = self._call_user(lambda: function(*args))

    def _return_value(self, ret: Return) -> None:
        self.lease.acquire()  # tensors on the GPU are copied to the host under the lease
        assert ret.value is not None
        value = self._resolve(ret.value)
        node, parts = _encode(value, self.part_index, self.max_response_bytes - self.part_bytes)
        self._send_return(ret, node, parts)

    def _return_path(self, ret: Return) -> None:
        self._drain_and_release()
        path = self._runtime_path(ret.path)
        budget = Budget(self.max_response_bytes - self.part_bytes)
        assert self.workspace_fd is not None
        if ret.kind == "file":
            data = collect_file(self.workspace_fd, path, budget)
            node: dict[str, Any] = _file_node(data, self.part_index)
            parts = [data]
        else:
            folder = collect_folder(self.workspace_fd, path, budget)
            files: dict[str, Any] = {}
            parts = []
            for relative, data in folder.files.items():
                files[relative] = _file_node(data, self.part_index + len(parts))
                parts.append(data)
            node = {"type": "folder", "files": files, "directories": folder.directories}
        self._send_return(ret, node, parts)

    def _runtime_path(self, path: str | Ref | None) -> str:
        if not isinstance(path, Ref):
            return normalize_workspace_path(path)  # literals were normalized at parse time
        value = self._resolve(path)
        if not isinstance(value, str):
            raise InstructionFailure(
                "serialization",
                f"path handle '{path.id}' holds {type(value).__name__}, not a string",
            )
        try:
            return normalize_workspace_path(value)
        except ValidationError as exc:
            raise InstructionFailure("serialization", f"invalid path: {exc}") from None

    def _send_return(self, ret: Return, node: dict[str, Any], parts: list[Any]) -> None:
        from kcoral.protocol.values import fill_part_hashes

        fd, lengths, digests = hashed_parts_memfd(parts)
        try:
            fill_part_hashes(node, self.part_index, digests)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        message = ReturnProduced(index=ret.index, key=ret.key, node=node, part_lengths=lengths)
        try:
            payload = encode(message)
            if len(payload) > self.max_response_bytes + FRAME_ENVELOPE_BYTES:
                # the front-end refuses a frame past that by breaking the channel
                payload = encode(ReturnTooLarge(index=ret.index, key=ret.key, length=len(payload)))
                self.channel.send_encoded(payload)
            else:
                self.channel.send_encoded(payload, [fd] if fd is not None else [])
        finally:
            if fd is not None:
                os.close(fd)
        self.part_index += len(parts)
        self.part_bytes += sum(lengths)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _encode(value: Any, first_part_index: int, budget: int) -> tuple[dict[str, Any], list[Any]]:
    from kcoral.protocol import values  # imported late: it is only needed for returns

    try:
        # unhashed: the parts are hashed while they are written out (``_send_return``)
        # bounded like a file return (PROTOCOL §5.4): a value past the response budget fails
        # alone, before its bytes are made, not the whole answer with 500 response_too_large
        return values.encode_value(value, first_part_index, hash_parts=False, part_budget=budget)
    except values.ValueEncodingError as exc:
        raise InstructionFailure("serialization", str(exc)) from None
    except InstructionFailure:
        raise
    except Exception as exc:  # e.g. a __dlpack__ of uploaded code that raises
        raise InstructionFailure(
            "serialization", exception_text(exc), format_user_traceback(exc)
        ) from None


def _literal(arg: LiteralArg | Any) -> Any:
    return arg.value if isinstance(arg, LiteralArg) else arg


def _file_node(data: bytes, part_index: int) -> dict[str, Any]:
    # ``sha256`` is filled in by ``_send_return`` while the part is written out
    return {"type": "file", "size": len(data), "part": f"return:{part_index}", "sha256": ""}
