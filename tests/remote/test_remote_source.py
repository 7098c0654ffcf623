"""JSON-mode source capture and decoration checks (CLIENT_API.md §8)."""

from __future__ import annotations

import asyncio
import builtins

import pytest
import remote_samples as samples

from kcoral.remote import RemoteFunction
from kcoral.remote.source import dispatcher_name, json_module_source


def load(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<uploaded:test>", "exec"), namespace)
    return namespace


def make(fn, **options):
    return RemoteFunction(fn, client=object(), **options)


def test_the_uploaded_source_drops_annotations_defaults_and_keeps_the_body() -> None:
    source = json_module_source(samples.scaled_sum)
    assert source.startswith("from __future__ import annotations\n")
    assert "def scaled_sum(x, y, *rest, scale, **extra):" in source
    assert "# a comment in the body stays too" in source
    assert '"""Docstring stays."""' in source
    assert "2.5" not in source and "-> float" not in source


def test_the_dispatcher_calls_the_function_with_positional_and_keyword_values() -> None:
    namespace = load(json_module_source(samples.scaled_sum))
    invoke = namespace[dispatcher_name(samples.scaled_sum)]
    values = [{"value": 1}, {"value": 2.0}, {"value": 3}, {"value": 10}, {"value": "q"}]
    result = invoke(3, ["scale", "z"], [True] * 5, *values)
    assert result == {"total": 60.0, "extra": ["z"], "mean": 1.5}


def test_the_dispatcher_passes_non_literal_values_unchanged() -> None:
    invoke = load(json_module_source(samples.echo))[dispatcher_name(samples.echo)]
    assert invoke(2, [], [False, True], b"raw", {"value": {"$ref": "x"}}) == [
        [b"raw", {"$ref": "x"}],
        {},
    ]


def test_an_async_function_gets_an_async_dispatcher() -> None:
    source = json_module_source(samples.doubled)
    assert "async def _kcoral_invoke_doubled(" in source
    invoke = load(source)["_kcoral_invoke_doubled"]
    assert asyncio.run(invoke(1, [], [True], {"value": 21})) == 42


def test_a_function_may_call_itself_by_name() -> None:
    namespace = load(json_module_source(samples.factorial))
    assert namespace["_kcoral_invoke_factorial"](1, [], [True], {"value": 5}) == 120


def test_a_one_line_function_and_a_nested_class_are_captured() -> None:
    assert load(json_module_source(samples.one_liner))["one_liner"](1, 2) == 3
    assert load(json_module_source(samples.with_class))["with_class"](4) == 8


def test_the_function_named_like_a_dispatcher_parameter_is_not_hidden() -> None:
    def values(x):
        return x + 1

    # defined in this test file: capture works for nested functions without closures
    namespace = load(json_module_source(values))
    assert namespace["_kcoral_invoke_values"](1, [], [True], {"value": 1}) == 2


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (samples.make_closure(), "closure variables (offset)"),
        (lambda x: x, "lambda"),
        (samples.decorated, "other decorators (@fake_decorator)"),
        (samples.uses_module_global, "defined outside it (math)"),
        (samples.uses_constant, "defined outside it (LIMIT)"),
        (samples.uses_shadowed_builtin, "defined outside it (len)"),
    ],
)
def test_a_function_that_cannot_travel_as_source_is_rejected_with_the_reason(fn, words) -> None:
    with pytest.raises(ValueError, match="pickle") as info:
        make(fn)
    assert words in str(info.value)


def test_a_function_without_a_source_file_is_rejected() -> None:
    namespace: dict = {}
    exec("def hidden(x):\n    return x\n", namespace)
    with pytest.raises(ValueError, match="not available from a file"):
        make(namespace["hidden"])


def test_the_decorator_that_makes_the_remote_function_is_allowed() -> None:
    namespace: dict = {"client": type("C", (), {"function": staticmethod(lambda: lambda f: f)})}
    source = "@client.function()\ndef ok(x):\n    return x\n"
    import linecache

    linecache.cache["<kcoral-test-cell>"] = (len(source), None, source.splitlines(True), "x")
    exec(compile(source, "<kcoral-test-cell>", "exec"), namespace)
    assert "@client" not in json_module_source(namespace["ok"])


def test_a_refusal_for_other_decorators_names_only_the_others() -> None:
    # It said "has other decorators (@client.function(timeout=60), @fake_decorator)": the
    # decorator making the remote function is no other one.
    import linecache

    source = "@client.function(timeout=60)\n@fake_decorator\ndef both(x):\n    return x\n"
    linecache.cache["<kcoral-test-cell-3>"] = (len(source), None, source.splitlines(True), "x")
    client = type("C", (), {"function": staticmethod(lambda **options: lambda f: f)})
    namespace: dict = {"client": client, "fake_decorator": samples.fake_decorator}
    exec(compile(source, "<kcoral-test-cell-3>", "exec"), namespace)
    with pytest.raises(ValueError) as refused:
        make(namespace["both"])
    assert "has other decorators (@fake_decorator); they would be lost" in str(refused.value)


def test_a_notebook_open_wrapper_does_not_count_as_shadowing_a_builtin() -> None:
    import functools
    import linecache

    @functools.wraps(builtins.open)
    def modified_open(*args, **kwargs):
        return builtins.open(*args, **kwargs)

    source = "def reads(path):\n    with open(path) as f:\n        return f.read()\n"
    linecache.cache["<kcoral-test-cell-2>"] = (1, None, source.splitlines(True), "x")
    namespace: dict = {"open": modified_open}
    exec(compile(source, "<kcoral-test-cell-2>", "exec"), namespace)
    json_module_source(namespace["reads"])


@pytest.mark.parametrize("fn", [len, samples.cached, samples.generator, object()])
def test_something_that_is_not_a_plain_function_is_a_type_error(fn) -> None:
    with pytest.raises(TypeError):
        make(fn)


@pytest.mark.parametrize("serialization", ["json", "pickle"])
def test_a_generator_function_is_told_to_return_a_list(serialization: str) -> None:
    # remote-function soak: it said only that it cannot be one
    with pytest.raises(TypeError) as caught:
        make(samples.generator, serialization=serialization)
    assert str(caught.value) == "a generator function cannot be a remote function: return a list"


def test_cpu_only_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="cpu_only"):
        make(samples.echo, cpu_only=1)


@pytest.mark.parametrize("fn", [samples.takes_run_async, samples.takes_serialization])
def test_parameters_named_like_the_call_keywords_are_rejected(fn) -> None:
    with pytest.raises(ValueError, match="may not be named"):
        make(fn)
    with pytest.raises(ValueError, match="may not be named"):
        make(fn, serialization="pickle")


def test_pickle_mode_accepts_closures_and_lambdas() -> None:
    make(samples.make_closure(), serialization="pickle")
    make(lambda x: x, serialization="pickle")


def test_an_unknown_serialization_is_rejected() -> None:
    with pytest.raises(ValueError, match="serialization"):
        make(samples.echo, serialization="yaml")
    with pytest.raises(TypeError, match="serialization"):
        make(samples.echo, serialization=None)


def test_the_remote_function_carries_the_wrapped_metadata_and_runs_locally() -> None:
    remote = make(samples.scaled_sum)
    assert remote.__name__ == "scaled_sum"
    assert remote.__doc__ == "Docstring stays."
    assert remote.__wrapped__ is samples.scaled_sum
    assert remote.__module__ == samples.__name__
    assert remote.__annotations__ == samples.scaled_sum.__annotations__
    assert remote(1, 2, scale=1)["total"] == 3
