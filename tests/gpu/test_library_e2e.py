"""Library uploads end to end through a real CPU server (EXTENSIONS §2: CPU mode loads
libraries with tvm_ffi when it is installed), plus the helpers inside uploaded code."""

from __future__ import annotations

import kcoral

HARNESS = """
from kcoral.builtins import benchmark

def measure(fn, x):
    return benchmark(fn, x, {"warmup": 2, "repeat": 3})

def call(fn, *args):
    return fn(*args)
"""


def test_a_library_upload_runs_and_benchmarks_its_exports_on_a_cpu_server(
    kcoral_server, cpu_library
) -> None:
    program = kcoral.Program()
    library = program.upload(kind="library", value=cpu_library)
    add_one = program.get_function(module=library, name="add_one")
    scale_sum = program.get_function(module=library, name="scale_sum")
    program.return_(key="answer", value=program.run(fn=add_one, args=[41]))
    program.return_(key="scaled", value=program.run(fn=scale_sum, args=[1, 2, 10]))
    harness = program.upload(kind="module", source=HARNESS)
    measure = program.get_function(module=harness, name="measure")
    program.return_(key="report", value=program.run(fn=measure, args=[add_one, 1]))
    with kcoral.Client(kcoral_server.url) as client:
        result = client.execute(program)
        again = client.execute(program)  # the library blob now comes from the server's cache
    assert result.status == "COMPLETED", result.error
    assert (result.results["answer"], result.results["scaled"]) == (42, 30)
    report = result.results["report"]
    assert report["clock"] == "cpu"
    assert (report["warmup"], report["repeat"]) == (2, 3)
    assert report["latency_ms_min"] <= report["latency_ms_median"] <= report["latency_ms_max"]
    assert again.status == "COMPLETED", again.error
    assert again.results["answer"] == 42


def test_a_missing_export_and_a_bad_object_fail_with_compile(kcoral_server, cpu_library) -> None:
    missing = kcoral.Program()
    library = missing.upload(kind="library", value=cpu_library)
    missing.get_function(module=library, name="not_exported")
    garbage = kcoral.Program()
    garbage.upload(kind="library", value=b"definitely not an ELF object")
    with kcoral.Client(kcoral_server.url) as client:
        first = client.execute(missing)
        second = client.execute(garbage)
    assert first.status == "FAILED"
    assert (first.error["kind"], first.error["instruction_index"]) == ("compile", 1)
    assert second.status == "FAILED"
    assert (second.error["kind"], second.error["instruction_index"]) == ("compile", 0)


def test_a_cpu_only_run_on_a_cpu_server_is_not_watched(kcoral_server) -> None:
    program = kcoral.Program()
    module = program.upload(kind="module", source="def f():\n    return 'ran'\n")
    f = program.get_function(module=module, name="f", cpu_only=True)
    program.return_(key="out", value=program.run(fn=f))
    with kcoral.Client(kcoral_server.url) as client:
        result = client.execute(program)
    assert result.status == "COMPLETED", result.error
    assert result.results == {"out": "ran"}
