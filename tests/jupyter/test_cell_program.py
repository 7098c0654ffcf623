"""Building a cell's program and running its wrapper (in-process, no server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from kcoral_jupyter.cell_program import (
    CellSpec,
    build_cell,
    is_json_value,
    read_outcome,
    split_mapping,
)
from kcoral_jupyter.cell_source import CELL_FUNCTION, cell_file_name, wrapper_source

from kcoral import ProgramResult
from kcoral.errors import ProtocolError


def wrapper(source: str, outputs=()):
    namespace: dict = {}
    exec(compile(wrapper_source(source, list(outputs)), "<wrapper>", "exec"), namespace)
    return namespace[CELL_FUNCTION]


def test_inputs_are_split_into_tensors_bytes_json_literals_and_pickle() -> None:
    built = build_cell(
        CellSpec(
            source="y = 1\n",
            inputs={"t": np.zeros(3, np.float32), "b": b"xy", "j": {"$ref": "t"}, "s": {1}},
        )
    )
    ops = [(i["op"], i.get("kind"), i.get("id")) for i in built.program.instructions]
    assert ("upload", "tensor", "in:t") in ops and ("upload", "bytes", "in:b") in ops
    assert ("upload", "bytes", "in:pickled") in ops
    run = next(i for i in built.program.instructions if i["op"] == "run")
    assert run["args"][0] == {"j": {"$ref": "t"}}  # reference-shaped data stays literal
    assert run["args"][1] == ["t", "b"]
    assert built.serialization == "pickle" and built.pickled_inputs == ("s",)


def test_json_values_are_exact_json_types_only() -> None:
    assert is_json_value({"a": [1, 2.5, None, True, "x"]})
    assert not is_json_value((1, 2))
    assert not is_json_value(float("nan"))
    assert not is_json_value({1: "x"})


def test_file_mappings_default_to_the_base_name() -> None:
    assert split_mapping("data/x.bin") == ("data/x.bin", "x.bin")
    assert split_mapping("data/x.bin:in/y.bin") == ("data/x.bin", "in/y.bin")
    with pytest.raises(ValueError):
        split_mapping(":x")


def test_a_local_path_with_colons_is_sent_whole_or_cut_where_its_file_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: always cut at the first colon, so 'run_12:30.csv' was looked for as 'run_12'.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run_12:30.csv").write_text("t,v\n")
    assert split_mapping("run_12:30.csv") == ("run_12:30.csv", "run_12:30.csv")
    assert split_mapping("run_12:30.csv:in/run.csv") == ("run_12:30.csv", "in/run.csv")
    assert split_mapping("missing:in/x") == ("missing", "in/x")  # as before: the first colon


def test_the_wrapper_runs_the_body_as_module_code_and_returns_the_final_expression() -> None:
    cell = wrapper("import math\ndef f(v):\n    return math.sqrt(v) + k\nz = f(16)\nz * 2\n", ["z"])
    assert cell({"k": 1}, []) == {"outputs": {"z": 5.0}, "has_value": True, "value": 10.0}


def test_binary_inputs_are_bound_by_name() -> None:
    cell = wrapper("n = len(blob)\n", ["n"])
    assert cell({}, ["blob"], b"abcd")["outputs"] == {"n": 4}


def test_a_missing_output_fails_the_run_with_its_name() -> None:
    from kcoral.protocol.errors import ExecutionError

    with pytest.raises(ExecutionError, match="--out name 'missing' is not set by the cell"):
        wrapper("x = 1\n", ["missing"])({}, [])


def test_an_unencodable_final_value_comes_back_as_its_repr() -> None:
    out = wrapper("class P:\n    def __repr__(self):\n        return 'P!'\nP()\n")({}, [])
    assert out["display"] == {"text/plain": "P!"}


def test_an_unencodable_output_without_pickle_says_what_to_do() -> None:
    from kcoral.protocol.errors import ExecutionError

    with pytest.raises(ExecutionError, match="needs pickle"):
        wrapper("s = {1}\n", ["s"])({}, [])


def test_pickled_inputs_are_refused_outside_a_pickle_request() -> None:
    from kcoral.protocol.errors import ExecutionError
    from kcoral.protocol.pickle_envelope import dump_envelope

    with pytest.raises(ExecutionError, match="refusing to unpickle"):
        wrapper("x = 1\n")({}, [], dump_envelope({"s": {1}}))


def test_top_level_await_makes_the_run_a_coroutine() -> None:
    result = wrapper("import asyncio\nawait asyncio.sleep(0)\nv = 3\nv + 1\n", ["v"])({}, [])
    assert asyncio.iscoroutine(result)
    assert asyncio.run(result) == {"outputs": {"v": 3}, "has_value": True, "value": 4}


def test_tracebacks_name_the_cell_and_its_lines() -> None:
    source = "x = 1\nraise ValueError('boom')\n"
    with pytest.raises(ValueError) as info:
        wrapper(source)({}, [])
    import traceback

    frames = traceback.extract_tb(info.value.__traceback__)
    assert (cell_file_name(source), 2, "raise ValueError('boom')") in [
        (f.filename, f.lineno, f.line) for f in frames
    ]


@pytest.mark.parametrize("character", ["\x0c", "\x85", "\u2028"], ids=repr)
def test_a_character_python_does_not_end_a_line_at_keeps_the_cells_traceback_lines(
    character: str,
) -> None:
    # str.splitlines breaks at these characters, the compiler does not
    source = f"# page one{character} page two\nx = 1\nraise ValueError('boom')\n"
    with pytest.raises(ValueError) as info:
        wrapper(source)({}, [])
    import traceback

    frames = traceback.extract_tb(info.value.__traceback__)
    assert (cell_file_name(source), 3, "raise ValueError('boom')") in [
        (f.filename, f.lineno, f.line) for f in frames
    ]


def test_outcomes_decode_outputs_files_and_torch_when_asked() -> None:
    result = ProgramResult(
        status="COMPLETED",
        request_id="r",
        queue_ms=0.0,
        elapsed_ms=0.0,
        lease_wait_ms=0.0,
        lease_held_ms=0.0,
        results={
            "cell": {"outputs": {"y": np.ones(2, np.float32)}, "has_value": False},
            "file:a.txt": "FILE",
        },
        stdout="",
        stderr="",
        stdout_truncated=False,
        stderr_truncated=False,
    )
    built = build_cell(CellSpec(source="", outputs=["y"], return_files=["a.txt"]))
    outcome = read_outcome(result, built)
    assert outcome.files == {"a.txt": "FILE"} and not outcome.has_value
    # Issue 29.10: tensors come back in the library of the cell's -i tensors. A NumPy value
    # made remotely comes back as torch when the inputs were torch.
    torch = pytest.importorskip("torch")
    torch_built = build_cell(
        CellSpec(source="", inputs={"t": torch.ones(1)}, outputs=["y"], return_files=["a.txt"])
    )
    assert isinstance(read_outcome(result, torch_built).outputs["y"], torch.Tensor)
    result.results["cell"]["torch"] = ["y"]  # the wrapper says: y was a torch.Tensor remotely
    assert isinstance(read_outcome(result, built).outputs["y"], torch.Tensor)  # no -i: remote
    numpy_built = build_cell(CellSpec(source="", outputs=["y"], return_files=["a.txt"], numpy=True))
    assert isinstance(read_outcome(result, numpy_built).outputs["y"], np.ndarray)
    numpy_in = build_cell(CellSpec(source="", inputs={"x": np.ones(1)}, outputs=["y"]))
    result.results.pop("file:a.txt")
    assert isinstance(read_outcome(result, numpy_in).outputs["y"], np.ndarray)  # NumPy in
    both = build_cell(
        CellSpec(source="", inputs={"x": np.ones(1), "t": torch.ones(1)}, outputs=["y"])
    )
    assert isinstance(read_outcome(result, both).outputs["y"], torch.Tensor)  # both: remote


def test_torch_names_that_are_not_outputs_are_refused() -> None:
    result = ProgramResult(
        "COMPLETED",
        "r",
        0.0,
        0.0,
        0.0,
        0.0,
        {"cell": {"outputs": {}, "has_value": False, "torch": ["secret"]}},
        "",
        "",
        False,
        False,
    )
    with pytest.raises(ProtocolError, match="torch names"):
        read_outcome(result, build_cell(CellSpec(source="")))
