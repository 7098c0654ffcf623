"""Output capture and truncation (SERVER §9, PROTOCOL §4.1 `output_limit_bytes`)."""

from __future__ import annotations

from e2e_support import module_program

import kcoral

NOISY = (
    "import os, subprocess, sys\n"
    "print('loaded')\n"
    "print('load-err', file=sys.stderr)\n"
    "def noisy():\n"
    "    print('from print')\n"
    "    os.write(1, b'from os.write\\n')\n"
    "    os.write(2, b'err os.write\\n')\n"
    "    subprocess.run(['sh', '-c', 'echo from child; echo child err >&2'], check=True)\n"
    "    subprocess.run([sys.executable, '-c', 'print(\"from python child\")'], check=True)\n"
    "    return 1\n"
)


def test_prints_at_load_os_write_and_child_processes_are_all_captured(client):
    result = client.execute(module_program(NOISY, "noisy"))
    assert result.completed, result.error
    assert result.stdout == ("loaded\nfrom print\nfrom os.write\nfrom child\nfrom python child\n")
    assert result.stderr == "load-err\nerr os.write\nchild err\n"
    assert (result.stdout_truncated, result.stderr_truncated) == (False, False)


def test_each_stream_is_cut_at_the_limit_and_flagged(client):
    source = (
        "import os\n"
        "def spam():\n"
        "    os.write(1, b'a' * 100)\n"
        "    os.write(2, b'b' * 10)\n"
        "    return 0\n"
    )
    result = client.execute(module_program(source, "spam"), output_limit_bytes=10)
    assert (result.stdout, result.stdout_truncated) == ("a" * 10, True)
    assert (result.stderr, result.stderr_truncated) == ("b" * 10, False)


def test_invalid_utf8_is_replaced_and_a_limit_inside_a_character_does_not_break_decoding(
    client,
):
    source = "import os\ndef f():\n    os.write(1, b'ok\\xff' + 'é'.encode())\n"
    result = client.execute(module_program(source, "f"), output_limit_bytes=4)
    assert result.stdout.startswith("ok\ufffd") and result.stdout_truncated


def test_output_limit_zero_disables_capture(client):
    result = client.execute(module_program(NOISY, "noisy"), output_limit_bytes=0)
    assert result.completed, result.error
    assert (result.stdout, result.stderr) == ("", "")
    assert (result.stdout_truncated, result.stderr_truncated) == (False, False)


def test_output_of_a_failed_program_is_kept(client):
    source = "def f():\n    print('before the failure')\n    raise RuntimeError('x')\n"
    result = client.execute(module_program(source, "f"))
    assert result.status == "FAILED"
    assert result.stdout == "before the failure\n"
    assert "RuntimeError" not in result.stdout


def test_the_server_default_limit_applies_and_a_larger_request_is_clamped(server_factory):
    server = server_factory("--output-limit-bytes", "5", "--max-output-limit-bytes", "8")
    source = "import os\ndef f():\n    os.write(1, b'x' * 50)\n"
    with kcoral.Client(server.url) as c:
        default = c.execute(module_program(source, "f"))
        clamped = c.execute(module_program(source, "f"), output_limit_bytes=10**9)
    assert (default.stdout, default.stdout_truncated) == ("x" * 5, True)
    assert (clamped.stdout, clamped.stdout_truncated) == ("x" * 8, True)
