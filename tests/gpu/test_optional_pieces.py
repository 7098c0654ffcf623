"""``GET /v1/info`` ``optional``: what the ``kcoral[gpu]`` extra adds, with reasons when a
piece is missing (EXTENSIONS §1)."""

from __future__ import annotations

import importlib.util
import json
import urllib.request

from kcoral_server.front_door.optional_pieces import optional_pieces


def test_a_gpu_server_without_the_extra_says_what_is_missing_and_how_to_install_it() -> None:
    pieces = optional_pieces("gpu", {"torch": "2.11.0+cu130", "cuda": "13.0"})
    assert set(pieces) == {"library-upload", "cupti"}
    for piece in pieces.values():
        assert piece["available"] is False
        assert "pip install 'kcoral[gpu]'" in piece["reason"]
    assert "CUDA events" in pieces["cupti"]["reason"]


def test_a_gpu_server_with_the_extra_reports_both_pieces_available() -> None:
    pieces = optional_pieces("gpu", {"torch": "2.11", "tvm_ffi": "0.1.15", "cupti": "13.0.1"})
    assert pieces == {
        "library-upload": {"available": True, "reason": None},
        "cupti": {"available": True, "reason": None},
    }


def test_a_cpu_server_reports_library_uploads_only() -> None:
    assert optional_pieces("cpu", {"tvm_ffi": "0.1.15"}) == {
        "library-upload": {"available": True, "reason": None}
    }


def test_a_running_cpu_server_reports_its_optional_pieces(kcoral_server) -> None:
    with urllib.request.urlopen(kcoral_server.url + "/v1/info", timeout=30) as answer:
        info = json.load(answer)
    has_tvm_ffi = importlib.util.find_spec("tvm_ffi") is not None
    assert info["optional"]["library-upload"]["available"] is has_tvm_ffi
    assert set(info["optional"]) == {"library-upload"}
