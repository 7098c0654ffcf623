"""Library uploads loaded directly through ``kcoral_server.worker.libraries``.

The shared object is a real CPU library built by ``tvm_ffi.cpp.build_inline`` with g++
(see conftest); no GPU is needed.
"""

from __future__ import annotations

import gc
import hashlib
import platform
import sys

import pytest
from kcoral_server.worker.failures import InstructionFailure
from kcoral_server.worker.libraries import Libraries, LibraryFunction, library_function

UNAVAILABLE = "library uploads require a GPU worker"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_built_library_loads_and_its_exports_can_be_called(cpu_library: bytes) -> None:
    libraries = Libraries(UNAVAILABLE)
    module = libraries.load(digest(cpu_library), memoryview(cpu_library))
    add_one = library_function(module, "add_one")
    assert isinstance(add_one, LibraryFunction)
    assert add_one(41) == 42
    assert library_function(module, "scale_sum")(2, 3, 4) == 20
    assert repr(add_one) == "<library function add_one>"


def test_the_same_digest_is_loaded_once_per_worker(cpu_library: bytes) -> None:
    libraries = Libraries(UNAVAILABLE)
    first = libraries.load(digest(cpu_library), cpu_library)
    second = libraries.load(digest(cpu_library), b"not even looked at: the digest is cached")
    assert first is second
    assert len(libraries) == 1


def test_the_cache_keeps_at_most_its_capacity_and_drops_the_least_recently_used(
    cpu_library: bytes,
) -> None:
    libraries = Libraries(UNAVAILABLE, capacity=2)
    libraries.load("a" * 64, cpu_library)
    libraries.load("b" * 64, cpu_library)
    libraries.load("a" * 64, cpu_library)  # "a" is now the most recent
    libraries.load("c" * 64, cpu_library)
    assert "a" * 64 in libraries
    assert "b" * 64 not in libraries
    assert "c" * 64 in libraries
    assert len(libraries) == 2


def test_the_default_capacity_is_32_libraries() -> None:
    assert Libraries(UNAVAILABLE).capacity == 32


def test_a_bound_function_keeps_working_after_its_library_left_the_cache(
    cpu_library: bytes,
) -> None:
    libraries = Libraries(UNAVAILABLE, capacity=1)
    add_one = library_function(libraries.load("d" * 64, cpu_library), "add_one")
    libraries.load("e" * 64, cpu_library)  # evicts "d"
    libraries.clear()
    gc.collect()
    assert "d" * 64 not in libraries
    assert add_one(1) == 2


def test_a_missing_export_fails_with_compile(cpu_library: bytes) -> None:
    module = Libraries(UNAVAILABLE).load(digest(cpu_library), cpu_library)
    with pytest.raises(InstructionFailure) as info:
        library_function(module, "no_such_function")
    assert info.value.kind == "compile"
    assert "no_such_function" in info.value.message


def test_a_missing_export_says_where_a_plain_c_function_goes(cpu_library: bytes) -> None:
    # a C library built with gcc loads as a library, then only 'library has no export'
    module = Libraries(UNAVAILABLE).load(digest(cpu_library), cpu_library)
    with pytest.raises(InstructionFailure) as info:
        library_function(module, "add")
    assert info.value.message == (
        "library has no export 'add': a library upload exports TVM-FFI functions "
        "(TVM_FFI_DLL_EXPORT_TYPED_FUNC, tvm_ffi.cpp.build); call a plain C function with "
        "ctypes.CDLL from a module instead, the .so sent with upload_file"
    )


def test_bytes_that_are_not_a_shared_object_fail_with_compile() -> None:
    pytest.importorskip("tvm_ffi")
    data = b"\x7fELF but not really a shared object"
    with pytest.raises(InstructionFailure) as info:
        Libraries(UNAVAILABLE).load(digest(data), data)
    assert info.value.kind == "compile"
    assert info.value.message.startswith("cannot load library:")


def _with_header(library: bytes, offset: int, field: bytes) -> bytes:
    return library[:offset] + field + library[offset + len(field) :]


# (what the bytes are, how they are made from a built x86-64 library, the message's words)
NOT_LOADABLE = {
    "built for arm64": (
        lambda library: _with_header(library, 18, (183).to_bytes(2, "little")),
        "it is built for AArch64 (arm64), 64-bit; this server's workers run x86-64, 64-bit: "
        "build it for x86-64, 64-bit",
    ),
    "32-bit": (
        lambda library: _with_header(library, 4, b"\x01"),
        "it is built for x86-64, 32-bit; this server's workers run x86-64, 64-bit",
    ),
    "no ELF file": (
        lambda library: b"int add(int a, int b) { return a + b; }\n",
        "it is not a shared library (an ELF file; its bytes begin b'int add('): upload the "
        ".so file the compiler or linker wrote",
    ),
    "an object file": (
        lambda library: _with_header(library, 16, (1).to_bytes(2, "little")),
        "it is an ELF relocatable object (.o), not a shared library: link it with -shared",
    ),
}


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64", reason="the words name x86-64"
)
@pytest.mark.parametrize(("make", "words"), NOT_LOADABLE.values(), ids=NOT_LOADABLE)
def test_a_library_no_worker_can_load_says_what_it_is_and_what_to_build(
    cpu_library: bytes, make, words: str
) -> None:
    # the loader skipped a library for another machine as absent: 'cannot open shared
    # object file: No such file or directory', after the worker's temporary path twice
    data = make(cpu_library)
    with pytest.raises(InstructionFailure) as info:
        Libraries(UNAVAILABLE).load(digest(data), data)
    assert info.value.kind == "compile"
    assert info.value.message.startswith(f"cannot load library: {words}")
    assert "kcoral-libraries-" not in info.value.message


def test_a_failed_load_is_not_cached_and_leaves_nothing_in_the_temporary_folder(
    tmp_path, monkeypatch
) -> None:
    pytest.importorskip("tvm_ffi")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    libraries = Libraries(UNAVAILABLE)
    with pytest.raises(InstructionFailure):
        libraries.load("f" * 64, b"garbage")
    assert len(libraries) == 0
    assert list(tmp_path.iterdir()) == []  # neither the file nor its folder (one per worker)


def test_a_loaded_library_leaves_nothing_in_the_temporary_folder(
    cpu_library: bytes, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    libraries = Libraries(UNAVAILABLE)
    libraries.load(digest(cpu_library), cpu_library)
    libraries.load("a" * 64, cpu_library)  # a second load, in a folder of its own again
    assert list(tmp_path.iterdir()) == []


def test_an_error_raised_by_an_export_reaches_the_caller(cpu_library: bytes) -> None:
    module = Libraries(UNAVAILABLE).load(digest(cpu_library), cpu_library)
    fail = library_function(module, "fail_on_negative")
    assert fail(3) == 3
    with pytest.raises(ValueError, match="negative input -1"):
        fail(-1)


def test_without_tvm_ffi_a_library_upload_is_unavailable(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tvm_ffi", None)  # makes `import tvm_ffi` fail
    with pytest.raises(InstructionFailure) as info:
        Libraries(UNAVAILABLE).load("0" * 64, b"whatever")
    assert info.value.kind == "unavailable"
    assert info.value.message == UNAVAILABLE


def test_a_handle_without_exports_fails_with_runtime() -> None:
    with pytest.raises(InstructionFailure) as info:
        library_function(object(), "add_one")
    assert info.value.kind == "runtime"


def test_a_library_whose_export_query_breaks_fails_with_runtime() -> None:
    class Broken:
        def get_function(self, name: str, query_imports: bool = False) -> None:
            raise AssertionError("not reached")

        def implements_function(self, name: str, query_imports: bool = False) -> bool:
            raise RuntimeError("module handle is gone")

    with pytest.raises(InstructionFailure) as info:
        library_function(Broken(), "add_one")
    assert info.value.kind == "runtime"
    assert "module handle is gone" in info.value.message


def test_an_export_that_cannot_be_bound_fails_with_compile() -> None:
    class Unbindable:
        def get_function(self, name: str, query_imports: bool = False) -> None:
            raise RuntimeError("symbol has the wrong calling convention")

        def implements_function(self, name: str, query_imports: bool = False) -> bool:
            return True

    with pytest.raises(InstructionFailure) as info:
        library_function(Unbindable(), "add_one")
    assert info.value.kind == "compile"
    assert "wrong calling convention" in info.value.message
