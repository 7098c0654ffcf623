"""Attack: another token holder reads or probes blobs it never uploaded (issue 16, point 6).

Both blob caches are content addressed, and PROTOCOL §9 lets a program name a blob by its
hash alone. On a server with named client tokens, bob names the hash of a file (disk cache)
or a ``bytes`` value (memory cache) that alice uploaded: before the fix he received alice's
bytes, and ``CACHE_MISS`` told him whether alice had uploaded them. Now his answer is the
same ``CACHE_MISS`` before and after alice's upload, and alice still hits her own cache.
"""

from __future__ import annotations

import os

import pytest
from identity_support import (
    TOKEN_A,
    TOKEN_B,
    bytes_program,
    execute,
    file_program,
    sha256,
    token_file,
)

import kcoral

FILE_SECRET = b"alice's private dataset\n" * 64
BYTES_SECRET = b"alice's private weights " * 64


def _with_file(program: kcoral.Program, data: bytes) -> None:
    module = program.upload(kind="module", source="def f(p):\n    return open(p, 'rb').read()\n")
    program.upload_file(blob=data, path="in.bin")
    fn = program.get_function(module=module, name="f", id="fn")
    program.return_(key="r", value=program.run(fn=fn, args=["in.bin"], id="r"))


def _with_bytes(program: kcoral.Program, data: bytes) -> None:
    module = program.upload(kind="module", source="def f(v):\n    return v\n")
    value = program.upload(kind="bytes", value=data, id="b")
    fn = program.get_function(module=module, name="f", id="fn")
    program.return_(key="r", value=program.run(fn=fn, args=[value], id="r"))


CASES = [
    pytest.param(FILE_SECRET, file_program, _with_file, id="disk-cached-file"),
    pytest.param(BYTES_SECRET, bytes_program, _with_bytes, id="memory-cached-bytes"),
]


@pytest.mark.parametrize(("secret", "by_hash", "upload"), CASES)
def test_another_identity_naming_a_cached_hash_gets_the_same_cache_miss_and_no_bytes(
    server_factory, tmp_path, secret, by_hash, upload
) -> None:
    tokens = token_file(tmp_path / "secrets")
    server = server_factory("--auth-token-file", str(tokens))
    blob = sha256(secret)

    before = execute(server.url, by_hash(blob), TOKEN_B)
    program = kcoral.Program()
    upload(program, secret)
    with kcoral.Client(server.url, token=TOKEN_A) as alice:
        assert alice.execute(program).results["r"] == secret  # now in alice's cache
    after = execute(server.url, by_hash(blob), TOKEN_B)

    assert secret not in after.raw
    assert after.status == 200 and after.json["status"] == "CACHE_MISS"
    assert after.json["missing_blobs"] == [blob]
    # No existence oracle: exactly the answer bob got before alice uploaded anything.
    assert after.error_without_request_id() == before.error_without_request_id()
    # Alice's own cache still works: by hash alone, her program runs on her bytes.
    mine = execute(server.url, by_hash(blob), TOKEN_A)
    assert mine.status == 200 and secret in mine.raw
    assert b"CACHE_MISS" not in mine.raw


def test_bobs_upload_of_the_same_bytes_lets_bob_use_them_afterwards(
    server_factory, tmp_path
) -> None:
    """Sharing the bytes is fine once bob has proven he holds them by sending them."""
    server = server_factory("--auth-token-file", str(token_file(tmp_path / "secrets")))
    blob = sha256(FILE_SECRET)
    for token in (TOKEN_A, TOKEN_B):
        sent = execute(server.url, file_program(blob), token, {blob: FILE_SECRET})
        assert sent.status == 200 and FILE_SECRET in sent.raw
        again = execute(server.url, file_program(blob), token)
        assert again.status == 200 and FILE_SECRET in again.raw
    # Each identity's copy lies in its own directory (names never resolve across them).
    stored = [p for p in server.disk_cache_dir.rglob(blob)]
    assert len(stored) == 2 and all(os.stat(p).st_mode & 0o777 == 0o600 for p in stored)


def test_holders_of_a_single_shared_token_share_one_cache(server_factory) -> None:
    """Documented (README "Security"): one bare token is one identity, ``default``."""
    server = server_factory(env={"KCORAL_AUTH_TOKEN": "shared-token-0123456789"})
    blob = sha256(FILE_SECRET)
    first = execute(server.url, file_program(blob), "shared-token-0123456789", {blob: FILE_SECRET})
    assert first.status == 200
    second = execute(server.url, file_program(blob), "shared-token-0123456789")
    assert second.status == 200 and FILE_SECRET in second.raw
