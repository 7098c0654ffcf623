"""Instruction semantics of a real CPU worker (PROTOCOL §5, §7.5, §7.6)."""

from __future__ import annotations

import hashlib

import pytest
from worker_harness import blob, blocking_env, call, function, give, launch, module, ref

ADD = "def add(a, b):\n    return a + b\n"


def test_module_load_output_is_captured_at_the_descriptor_level(shared_worker):
    source = (
        "import os, subprocess, sys\n"
        "print('printed at load')\n"
        "os.write(1, b'raw fd 1\\n')\n"
        "os.write(2, b'raw fd 2\\n')\n"
        "print('to stderr', file=sys.stderr)\n"
        "subprocess.run(['sh', '-c', 'echo from a child; echo child err >&2'], check=True)\n"
    )
    result = shared_worker.run([module("m", source)])
    assert result.finished.status == "COMPLETED", result.error
    assert result.stdout == "printed at load\nraw fd 1\nfrom a child\n"
    assert result.stderr == "raw fd 2\nto stderr\nchild err\n"


def test_output_goes_to_the_worker_streams_when_capture_is_disabled(start_worker):
    worker = start_worker()
    result = worker.run([module("m", "print('not captured')\n")], capture=False)
    assert result.finished.status == "COMPLETED"
    assert result.stdout == ""
    assert "not captured" in (worker.tmp / "worker.log").read_text()


def test_a_syntax_error_fails_the_upload_with_parse(shared_worker):
    result = shared_worker.run([module("m", "def broken(:\n")])
    error = result.error
    assert error["kind"] == "parse"
    assert error["message"].startswith("SyntaxError: ")
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (
        0,
        "upload",
        "m",
    )
    assert set(error) == {
        "kind",
        "message",
        "instruction_index",
        "instruction_op",
        "instruction_id",
        "traceback",
    }


def test_a_module_saved_with_a_byte_order_mark_loads_as_python_loads_the_file(shared_worker):
    # read with open(path, encoding="utf-8"), a BOM stays the first character: it failed
    # with parse 'SyntaxError: invalid non-printable character U+FEFF'
    source = "\ufeffdef add(a, b):\n    return a + b\n"
    result = shared_worker.run(
        [module("m", source), function("f", "m", "add"), call("r", "f", 2, 3), give("r", "r")]
    )
    assert result.finished.status == "COMPLETED", result.error
    assert result.value("r") == {"type": "integer", "value": 5}


def test_top_level_exceptions_are_classified_like_runs(shared_worker):
    failing = shared_worker.run([module("m", "x = 1 / 0\n")])
    assert failing.error["kind"] == "runtime"
    assert failing.error["message"] == "ZeroDivisionError: division by zero"
    asserting = shared_worker.run([module("m", "assert False, 'nope'\n")])
    assert asserting.error["kind"] == "correctness"
    assert asserting.error["message"] == "AssertionError: nope"


def test_a_failing_run_reports_the_uploaded_source_line_in_its_traceback(shared_worker):
    source = "def div(a, b):\n    return a / b\n"
    name = "<uploaded:" + hashlib.sha1(source.encode()).hexdigest()[:16] + ">"
    result = shared_worker.run(
        [module("m", source), function("div", "m", "div"), call("bad", "div", 1, 0)]
    )
    error = result.error
    assert error["kind"] == "runtime"
    assert error["message"] == "ZeroDivisionError: division by zero"
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (
        2,
        "run",
        "bad",
    )
    assert error["traceback"].startswith("Traceback (most recent call last):\n")
    assert f'File "{name}", line 2, in div\n    return a / b' in error["traceback"]
    assert (
        "kcoral_server" not in error["traceback"]
        and "server/kcoral_server/worker" not in error["traceback"]
    )


def test_a_missing_function_name_fails_with_parse(shared_worker):
    result = shared_worker.run([module("m", ADD), function("f", "m", "missing")])
    assert result.error["kind"] == "parse"
    assert result.error["instruction_index"] == 1


def test_get_function_on_a_non_module_handle_is_unavailable_on_a_cpu_worker(shared_worker):
    sha, data = blob(b"abc")
    result = shared_worker.run(
        [
            {"op": "upload", "kind": "bytes", "id": "b", "blob": sha},
            function("f", "b", "anything"),
        ],
        [(sha, data)],
    )
    assert result.error["kind"] == "unavailable"
    assert result.error["message"] == "get_function expects an uploaded module or library handle"


def test_cuda_source_modules_bind_descriptors_and_check_names(shared_worker):
    source = "__global__ void k() {}\n"
    probe = "def describe(d):\n    return [d.source, d.name]\n"
    result = shared_worker.run(
        [
            module("cu", source, language="cuda"),
            function("k", "cu", "k"),
            module("py", probe),
            function("describe", "py", "describe"),
            call("d", "describe", ref("k")),
            give("d", "d"),
        ]
    )
    assert result.finished.status == "COMPLETED", result.error
    assert result.value("d") == {
        "type": "array",
        "value": [{"type": "string", "value": source}, {"type": "string", "value": "k"}],
    }
    for bad in ("main", "1k", "a-b"):
        program = [module("cu", source, language="cuda"), function("f", "cu", bad)]
        failed = shared_worker.run(program)
        assert failed.error["kind"] == "parse", bad


def test_running_a_handle_that_is_not_callable_fails_with_runtime(shared_worker):
    result = shared_worker.run([module("m", "x = 5\n"), function("x", "m", "x"), call("y", "x")])
    assert result.error["kind"] == "runtime"
    assert result.error["message"] == "handle 'x' is not callable"


def test_execution_errors_keep_their_own_kind_and_message(shared_worker):
    source = (
        "from kcoral.errors import ExecutionError\n"
        "def check():\n    raise ExecutionError('correctness', 'max error 0.5 > 0.01')\n"
    )
    result = shared_worker.run([module("m", source), function("c", "m", "check"), call("r", "c")])
    assert result.error["kind"] == "correctness"
    assert result.error["message"] == "max error 0.5 > 0.01"


def test_system_exit_and_keyboard_interrupt_never_end_the_worker(shared_worker):
    source = (
        "import sys\n"
        "def leave():\n    sys.exit(3)\n"
        "def interrupt():\n    raise KeyboardInterrupt('stop')\n"
    )
    left = shared_worker.run([module("m", source), function("f", "m", "leave"), call("r", "f")])
    assert left.error["kind"] == "runtime"
    assert left.error["message"] == "SystemExit: 3"
    assert left.ready_again
    interrupted = shared_worker.run(
        [module("m", source), function("f", "m", "interrupt"), call("r", "f")]
    )
    assert interrupted.error["message"] == "KeyboardInterrupt: stop"
    assert shared_worker.proc.poll() is None


def test_async_functions_are_awaited_on_one_loop_per_worker(shared_worker):
    source = (
        "import asyncio\n"
        "async def loop_id(x):\n"
        "    await asyncio.sleep(0)\n"
        "    return [id(asyncio.get_running_loop()), x]\n"
        "class Later:\n"
        "    def __await__(self):\n"
        "        return (yield from asyncio.sleep(0, result=7).__await__())\n"
        "def awaitable():\n    return Later()\n"
    )
    program = [
        module("m", source),
        function("f", "m", "loop_id"),
        function("g", "m", "awaitable"),
        call("a", "f", 1),
        call("b", "g"),
        give("a", "a"),
        give("b", "b"),
    ]
    first = shared_worker.run(program)
    second = shared_worker.run(program)
    assert first.finished.status == "COMPLETED", first.error
    assert first.value("b") == {"type": "integer", "value": 7}
    loop_ids = [r.value("a")["value"][0]["value"] for r in (first, second)]
    assert loop_ids[0] == loop_ids[1]


def test_the_loop_is_made_when_a_program_first_needs_it_and_asyncio_hands_it_out(tmp_path):
    """A program that never awaits makes no loop (~0.8 ms of a fresh fork); one that asks
    asyncio for the current loop gets the worker's, which its awaits then run on."""
    source = (
        "import asyncio, os, warnings\n"
        "def epolls():\n"
        "    found = 0\n"
        "    for fd in os.listdir('/proc/self/fd'):\n"
        "        try:\n"
        "            found += 'eventpoll' in os.readlink(f'/proc/self/fd/{fd}')\n"
        "        except OSError:\n"
        "            pass  # the listing's own descriptor, closed by now\n"
        "    return found\n"
        "def current():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        loop = asyncio.get_event_loop()\n"
        "    return [id(loop), len(caught)]\n"
        "async def running():\n"
        "    return id(asyncio.get_running_loop())\n"
    )
    program = [module("m", source)]
    for name in ("epolls", "current", "running"):
        program.append(function(f"{name}_fn", "m", name))
    program += [call("before", "epolls_fn"), call("current", "current_fn")]
    program += [call("running", "running_fn"), call("after", "epolls_fn")]
    program += [give(key, key) for key in ("before", "current", "running", "after")]
    worker = launch(tmp_path)
    try:
        result = worker.run(program)
        assert result.finished.status == "COMPLETED", result.error
        assert result.value("before")["value"] == 0
        loop_id, warnings = (item["value"] for item in result.value("current")["value"])
        assert warnings == 0
        assert result.value("running")["value"] == loop_id
        assert result.value("after")["value"] == 1
    finally:
        worker.kill()


def test_returns_of_every_json_value_type_are_encoded(shared_worker):
    source = (
        "def values():\n"
        "    return {'none': None, 'flag': True, 'n': 42, 'x': 2.5, 's': 'text',\n"
        "            'list': [1, [2]], 'tuple': (3,), 'nested': {'k': 'v'}}\n"
        "def data():\n    return b'\\x00\\x01'\n"
    )
    result = shared_worker.run(
        [
            module("m", source),
            function("values", "m", "values"),
            function("data", "m", "data"),
            call("v", "values"),
            call("d", "data"),
            give("v", "v"),
            give("d", "d"),
            give("again", "d"),
        ]
    )
    assert result.finished.status == "COMPLETED", result.error
    node = result.value("v")["value"]
    assert node["none"] == {"type": "null"}
    assert node["flag"] == {"type": "boolean", "value": True}
    assert node["n"] == {"type": "integer", "value": 42}
    assert node["x"] == {"type": "number", "value": 2.5}
    assert node["tuple"] == {"type": "array", "value": [{"type": "integer", "value": 3}]}
    data_node, parts = result.returns["d"]
    assert data_node == {
        "type": "bytes",
        "part": "return:0",
        "sha256": hashlib.sha256(b"\x00\x01").hexdigest(),
    }
    assert parts == [b"\x00\x01"]
    assert result.value("again")["part"] == "return:1"  # part numbers run across returns


def test_an_unencodable_value_fails_with_serialization_and_keeps_earlier_returns(shared_worker):
    result = shared_worker.run(
        [
            module("m", ADD),
            function("add", "m", "add"),
            call("n", "add", 1, 2),
            give("n", "n"),
            give("module", "m"),
            give("never", "n"),
        ]
    )
    assert result.error["kind"] == "serialization"
    assert result.error["instruction_op"] == "return"
    assert result.error["instruction_id"] is None
    assert list(result.returns) == ["n"]


def test_bytes_uploads_become_bytes_handles(shared_worker):
    sha, data = blob(b"\xffpayload")
    source = "def kind(b):\n    return [type(b).__name__, len(b)]\n"
    result = shared_worker.run(
        [
            {"op": "upload", "kind": "bytes", "id": "b", "blob": sha},
            module("m", source),
            function("kind", "m", "kind"),
            call("k", "kind", ref("b")),
            give("k", "k"),
            give("b", "b"),
        ],
        [(sha, data)],
    )
    assert result.value("k")["value"] == [
        {"type": "string", "value": "bytes"},
        {"type": "integer", "value": 8},
    ]
    assert result.returns["b"][1] == [data]


def test_literal_arguments_are_passed_unresolved(shared_worker):
    source = "def echo(*args):\n    return list(args)\n"
    result = shared_worker.run(
        [
            module("m", source),
            function("echo", "m", "echo"),
            call("e", "echo", [ref("m")], {"$ref": 5}, {"$ref": "m", "x": 1}),
            give("e", "e"),
        ]
    )
    assert result.finished.status == "COMPLETED", result.error
    first = result.value("e")["value"][0]
    assert first == {
        "type": "array",
        "value": [{"type": "object", "value": {"$ref": {"type": "string", "value": "m"}}}],
    }


def test_uploaded_modules_support_inspect_and_dataclasses(shared_worker):
    source = (
        "import dataclasses, inspect\n"
        "@dataclasses.dataclass\nclass Point:\n    x: int\n"
        "def own_source():\n    return inspect.getsource(own_source)\n"
        "def point():\n    return Point(3).x\n"
    )
    result = shared_worker.run(
        [
            module("m", source),
            function("s", "m", "own_source"),
            function("p", "m", "point"),
            call("src", "s"),
            call("pt", "p"),
            give("src", "src"),
            give("pt", "pt"),
        ]
    )
    assert result.finished.status == "COMPLETED", result.error
    assert result.value("src")["value"].startswith("def own_source():")
    assert result.value("pt")["value"] == 3


@pytest.mark.parametrize("character", ["\x0c", "\x0b", "\x1d", "\x85", "\u2028"], ids=repr)
def test_a_character_python_does_not_end_a_line_at_keeps_getsource_and_tracebacks_on_their_lines(
    shared_worker, character
):
    # str.splitlines breaks at these characters, the compiler does not
    source = (
        f"# page one{character} page two\n"
        "def fail():\n    raise ValueError('boom')\n"
        "def own_source():\n    import inspect\n    return inspect.getsource(own_source)\n"
    )
    result = shared_worker.run(
        [
            module("m", source),
            function("s", "m", "own_source"),
            call("src", "s"),
            give("src", "src"),
            function("f", "m", "fail"),
            call("failed", "f"),
        ]
    )
    assert result.value("src")["value"] == (
        "def own_source():\n    import inspect\n    return inspect.getsource(own_source)\n"
    )
    assert "line 3, in fail\n    raise ValueError('boom')" in result.error["traceback"]


def test_library_uploads_are_unavailable_on_a_cpu_worker_without_tvm_ffi(start_worker, tmp_path):
    worker = start_worker(env=blocking_env(tmp_path / "blocked", "tvm_ffi"))
    sha, data = blob(b"\x7fELF not really")
    result = worker.run(
        [{"op": "upload", "kind": "library", "id": "lib", "blob": sha}], [(sha, data)]
    )
    assert result.error["kind"] == "unavailable"
    assert result.error["message"] == "library uploads require a GPU worker"


def test_a_library_that_cannot_be_loaded_fails_with_compile(shared_worker):
    pytest.importorskip("tvm_ffi")
    sha, data = blob(b"\x7fELF not really a shared object")
    result = shared_worker.run(
        [{"op": "upload", "kind": "library", "id": "lib", "blob": sha}], [(sha, data)]
    )
    assert result.error["kind"] == "compile"


def test_a_cpu_only_run_is_a_plain_run_on_a_cpu_worker(shared_worker):
    result = shared_worker.run(
        [
            module("m", ADD),
            function("add", "m", "add", cpu_only=True),
            call("n", "add", 40, 2),
            give("n", "n"),
        ]
    )
    assert result.value("n") == {"type": "integer", "value": 42}
    assert "lease_acquire" not in result.trace()
