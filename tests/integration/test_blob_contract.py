"""The blob contract, checked against every backend: memory, a local directory and S3, over
HTTP and over HTTPS with a private CA.

The S3 backend talks HTTP(S) to a real S3 endpoint (``moto_server``, see tests/support/s3.py)
through the same client as production. A few tests at the end concern one backend only:
crash leftovers in the directory backend, outages of the S3 server, URL parsing.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import urllib3
from minio import Minio

from tests.support.s3 import ACCESS_KEY, SECRET_KEY, S3Server, unique_bucket
from tests.support.tls_certs import CertificateSet
from tidemark.blob import Blob, DirectoryBlob, S3Settings, open_blob
from tidemark.blob import directory as directory_module
from tidemark.errors import (
    FailedPrecondition,
    Indeterminate,
    InvalidArgument,
    NotFound,
    Unavailable,
)

MiB = 1024 * 1024
BACKENDS = [
    "memory",
    "directory",
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("s3-tls", marks=pytest.mark.s3),
]


def _value(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture(params=BACKENDS)
def blob_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL for an empty store of each backend; opening it twice reaches the same data."""
    if request.param == "memory":
        return f"memory://contract-{uuid.uuid4().hex}"
    if request.param == "directory":
        return (tmp_path / "blobs").as_uri()
    fixture = "s3_server" if request.param == "s3" else "tls_s3_server"
    server: S3Server = request.getfixturevalue(fixture)
    # A prefix inside the bucket, so the tests also check that keys are mapped in and out.
    return server.url(unique_bucket(), "tenant-1/blobs")


@pytest.fixture
async def blob(blob_url: str) -> AsyncIterator[Blob]:
    async with await open_blob(blob_url) as store:
        yield store


def _backend(blob_url: str) -> str:
    return blob_url.split(":", 1)[0]


# --- values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [b"", b"x", bytes(range(256)) * 3, b"\x00" * 1000],
    ids=["empty", "one-byte", "all-byte-values", "zeros"],
)
async def test_put_then_get_returns_the_same_bytes(blob: Blob, value: bytes) -> None:
    await blob.put("batches/b1.parquet", value)

    assert await blob.get("batches/b1.parquet") == value
    assert await blob.get_existing("batches/b1.parquet") == value
    assert await blob.list() == ["batches/b1.parquet"]


async def test_large_value_round_trips(blob: Blob, blob_url: str) -> None:
    # 8 MiB is above the S3 client's 5 MiB multipart threshold: two parts (5 + 3 MiB).
    value = _value(8 * MiB, seed=1)

    await blob.put("large/value", value)

    assert await blob.get("large/value") == value
    if _backend(blob_url) == "s3":
        settings = S3Settings.from_url(blob_url)
        http = urllib3.PoolManager(ca_certs=settings.ca) if settings.ca else None
        client = Minio(
            settings.endpoint, ACCESS_KEY, SECRET_KEY, secure=settings.secure, http_client=http
        )
        stat = client.stat_object(settings.bucket, settings.prefix + "large/value")
        assert stat.size == len(value)
        assert stat.etag is not None and stat.etag.endswith("-2"), "expected a 2-part upload"


async def test_put_replaces_an_existing_value(blob: Blob) -> None:
    await blob.put("k", b"first")
    await blob.put("k", b"second, longer value")

    assert await blob.get("k") == b"second, longer value"
    assert await blob.list() == ["k"]

    await blob.put("k", b"3")
    assert await blob.get("k") == b"3"


async def test_missing_key_reads_as_none_or_not_found(blob: Blob) -> None:
    await blob.put("present", b"here")

    assert await blob.get("absent") is None
    assert await blob.get("present/below") is None
    with pytest.raises(NotFound, match="absent"):
        await blob.get_existing("absent")


async def test_delete_is_idempotent(blob: Blob) -> None:
    await blob.put("a/doomed", b"1")
    await blob.put("a/kept", b"2")

    await blob.delete("a/doomed")
    assert await blob.get("a/doomed") is None
    assert await blob.list() == ["a/kept"]

    await blob.delete("a/doomed")
    await blob.delete("never/written")
    await blob.delete("a/kept/below")
    assert await blob.list() == ["a/kept"]
    assert await blob.get("a/kept") == b"2"


async def test_a_reopened_store_sees_the_same_data(blob: Blob, blob_url: str) -> None:
    await blob.put("shards/u1/b1", b"batch one")

    async with await open_blob(blob_url) as again:
        assert await again.get("shards/u1/b1") == b"batch one"
        await again.delete("shards/u1/b1")

    assert await blob.get("shards/u1/b1") is None


# --- list ----------------------------------------------------------------------------------

KEYS = ["a/1", "a/2", "a/b/3", "a/b/c/4", "a1", "ab", "b/1", "shards/u7/x.parquet"]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("", sorted(KEYS)),
        ("a", ["a/1", "a/2", "a/b/3", "a/b/c/4", "a1", "ab"]),
        ("a/", ["a/1", "a/2", "a/b/3", "a/b/c/4"]),
        ("a/b", ["a/b/3", "a/b/c/4"]),
        ("a/b/", ["a/b/3", "a/b/c/4"]),
        ("a/b/c/4", ["a/b/c/4"]),
        ("b/1", ["b/1"]),
        ("shards/u7/x.", ["shards/u7/x.parquet"]),
        ("c", []),
        ("a/b/c/4/", []),
        ("a/x/", []),
    ],
)
async def test_list_returns_sorted_keys_with_the_prefix(
    blob: Blob, prefix: str, expected: list[str]
) -> None:
    shuffled = KEYS[:]
    random.Random(7).shuffle(shuffled)
    for key in shuffled:
        await blob.put(key, key.encode())

    assert await blob.list(prefix) == expected


async def test_list_follows_puts_and_deletes(blob: Blob) -> None:
    assert await blob.list() == []
    await blob.put("x/2", b"")
    await blob.put("x/1", b"")
    assert await blob.list("x/") == ["x/1", "x/2"]
    await blob.delete("x/1")
    assert await blob.list("x/") == ["x/2"]


# --- invalid input ---------------------------------------------------------------------------

INVALID_KEYS = [
    "",
    "/a",
    "a/",
    "a//b",
    ".",
    "..",
    "../escape",
    "a/../../escape",
    "./a",
    ".hidden",
    "a/.tmp-0123456789abcdef",
    "-leading-dash",
    "with space",
    "back\\slash",
    "nul\x00byte",
    "ümlaut",
    "x" * 1025,
]


@pytest.mark.parametrize("key", INVALID_KEYS)
async def test_invalid_keys_are_rejected(blob: Blob, key: str) -> None:
    with pytest.raises(InvalidArgument):
        await blob.put(key, b"v")
    with pytest.raises(InvalidArgument):
        await blob.get(key)
    with pytest.raises(InvalidArgument):
        await blob.delete(key)
    assert await blob.list() == []


@pytest.mark.parametrize("prefix", ["/", "/a", "a//", "..", "../", "a/../", ".x", "a/.t", "a b"])
async def test_invalid_prefixes_are_rejected(blob: Blob, prefix: str) -> None:
    with pytest.raises(InvalidArgument):
        await blob.list(prefix)


# --- atomicity -----------------------------------------------------------------------------


async def test_concurrent_readers_see_absent_or_a_whole_value(blob: Blob, blob_url: str) -> None:
    """Readers race a writer that keeps replacing a large value with another: every read
    returns nothing (before the first put) or one complete value, never a torn one."""
    size = 4 * MiB if _backend(blob_url) == "s3" else 8 * MiB
    rounds = 4 if _backend(blob_url) == "s3" else 12
    values = [b"A" * size, b"B" * size]
    writing = True

    async def write() -> None:
        nonlocal writing
        try:
            for i in range(rounds):
                await blob.put("hot/key", values[i % 2])
                await asyncio.sleep(0)  # the memory backend never yields by itself
        finally:
            writing = False

    async def read() -> list[str]:
        seen: list[str] = []
        while True:
            still_writing = writing
            data = await blob.get("hot/key")
            if data is None:
                seen.append("absent")
            elif data in values:
                seen.append(data[:1].decode())
            else:
                seen.append(f"torn: {len(data)} bytes, starting {data[:1]!r}")
            if not still_writing:
                return seen
            await asyncio.sleep(0)

    _, *reads = await asyncio.gather(write(), *(read() for _ in range(4)))

    outcomes = {outcome for seen in reads for outcome in seen}
    assert outcomes <= {"absent", "A", "B"}, outcomes
    assert outcomes & {"A", "B"}, "the readers never saw a value"
    assert await blob.get("hot/key") == values[(rounds - 1) % 2]


# --- directory backend: crashes and files ----------------------------------------------------


@pytest.fixture
async def directory_blob(tmp_path: Path) -> AsyncIterator[DirectoryBlob]:
    store = await open_blob((tmp_path / "blobs").as_uri())
    assert isinstance(store, DirectoryBlob)
    async with store:
        yield store


async def test_directory_leftover_temp_file_is_neither_listed_nor_read(
    directory_blob: DirectoryBlob,
) -> None:
    """A writer that crashed mid-put leaves a partial temporary file behind."""
    root = directory_blob.root
    (root / "shards").mkdir()
    (root / "shards" / ".tmp-0123456789abcdef").write_bytes(b"partial contents of shards/b1")
    (root / ".tmp-fedcba9876543210").write_bytes(b"partial")

    assert await directory_blob.list() == []
    assert await directory_blob.get("shards/b1") is None

    await directory_blob.put("shards/b1", b"complete value")
    assert await directory_blob.get("shards/b1") == b"complete value"
    assert await directory_blob.list() == ["shards/b1"]
    assert await directory_blob.list("shards/") == ["shards/b1"]


async def test_directory_failed_put_keeps_the_old_value_and_no_temp_file(
    directory_blob: DirectoryBlob, monkeypatch: pytest.MonkeyPatch
) -> None:
    await directory_blob.put("d/key", b"old value")

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(directory_module.os, "fsync", disk_full)
    with pytest.raises(Unavailable, match="No space left"):
        await directory_blob.put("d/key", b"new value that never lands")
    monkeypatch.undo()

    assert await directory_blob.get("d/key") == b"old value"
    assert sorted(os.listdir(directory_blob.root / "d")) == ["key"]


async def test_directory_files_land_under_the_root_as_named(
    directory_blob: DirectoryBlob,
) -> None:
    await directory_blob.put("shards/u1/b7.parquet", b"data")

    assert (directory_blob.root / "shards" / "u1" / "b7.parquet").read_bytes() == b"data"
    assert not [p for p in directory_blob.root.rglob(".tmp-*")]


async def test_directory_put_now_writes_in_the_calling_thread_as_put_does(
    directory_blob: DirectoryBlob, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No thread hand-off: a resident task writes its step's part this way, from a request
    # loop with no event loop running.
    def no_thread(*args: object, **kwargs: object) -> None:
        raise AssertionError("put_now handed the write to a thread")

    monkeypatch.setattr(directory_module.asyncio, "to_thread", no_thread)
    directory_blob.put_now("shards/u1/p1", b"part")
    directory_blob.put_now("shards/u1/p1", b"part again")
    with pytest.raises(InvalidArgument):
        directory_blob.put_now("../escape", b"x")
    monkeypatch.undo()

    assert await directory_blob.get("shards/u1/p1") == b"part again"
    assert await directory_blob.list() == ["shards/u1/p1"]
    assert not [p for p in directory_blob.root.rglob(".tmp-*")]


async def test_directory_key_cannot_also_be_a_directory(directory_blob: DirectoryBlob) -> None:
    await directory_blob.put("a", b"file")
    await directory_blob.put("c/d", b"nested")

    with pytest.raises(FailedPrecondition, match="'a/b'"):
        await directory_blob.put("a/b", b"x")
    with pytest.raises(FailedPrecondition, match="'c'"):
        await directory_blob.put("c", b"x")

    assert await directory_blob.get("a") == b"file"
    assert await directory_blob.get("c") is None
    assert await directory_blob.list() == ["a", "c/d"]


# --- S3 backend: prefixes and outages --------------------------------------------------------


@pytest.mark.s3
async def test_s3_prefixes_in_one_bucket_are_separate_stores(s3_server: S3Server) -> None:
    bucket = unique_bucket()
    async with (
        await open_blob(s3_server.url(bucket, "one")) as one,
        await open_blob(s3_server.url(bucket, "two")) as two,
        await open_blob(s3_server.url(bucket)) as whole,
    ):
        await one.put("k", b"1")
        await two.put("k", b"2")

        assert await one.get("k") == b"1"
        assert await two.get("k") == b"2"
        assert await one.list() == ["k"]
        assert await whole.list() == ["one/k", "two/k"]


async def _expect_unavailable_everywhere(store: Blob) -> None:
    with pytest.raises(Unavailable, match="unreachable"):
        await store.put("new", b"value")
    with pytest.raises(Unavailable, match="unreachable"):
        await store.get("k")
    with pytest.raises(Unavailable, match="unreachable"):
        await store.delete("k")
    with pytest.raises(Unavailable, match="unreachable"):
        await store.list()


@pytest.mark.s3
@pytest.mark.timeout(60)  # a hang guard; the retries and timeouts should end it in seconds
async def test_s3_stopped_server_gives_unavailable_then_recovers(
    fresh_s3_server: S3Server,
) -> None:
    url = fresh_s3_server.url(unique_bucket(), "p")
    async with await open_blob(url) as store:
        await store.put("k", b"before")

        fresh_s3_server.stop()
        await _expect_unavailable_everywhere(store)
        with pytest.raises(Unavailable, match="unreachable"):
            await open_blob(url)

        # moto forgets everything on restart (see tests/support/s3.py): this checks that
        # the same store works again once the server is back, not that data survived.
        fresh_s3_server.start()
        async with await open_blob(url) as reopened:  # creates the bucket again
            assert await reopened.list() == []
        await store.put("k", b"after")
        assert await store.get("k") == b"after"
        assert await store.list() == ["k"]
        await store.delete("k")
        assert await store.get("k") is None


@pytest.mark.s3
@pytest.mark.timeout(60)
async def test_s3_server_stopped_during_writes_fails_them_cleanly(
    fresh_s3_server: S3Server,
) -> None:
    """Multipart uploads are in flight when the server dies: each fails with an
    UNAVAILABLE-class error (nothing hangs), and later writes succeed once it is back.
    (Whether a half-uploaded object stayed invisible cannot be checked here: moto loses
    all objects on restart. S3 exposes an object only when its upload completes.)"""
    url = fresh_s3_server.url(unique_bucket())
    value = _value(6 * MiB, seed=2)
    completed = 0
    first_completed = asyncio.Event()

    async def keep_writing() -> BaseException:
        nonlocal completed
        while True:
            try:
                await store.put(f"w/{uuid.uuid4().hex}", value)
            except Exception as exc:
                return exc
            completed += 1
            first_completed.set()

    async with await open_blob(url) as store:
        writers = [asyncio.create_task(keep_writing()) for _ in range(2)]
        await first_completed.wait()
        await asyncio.to_thread(fresh_s3_server.stop)
        failures = await asyncio.gather(*writers)

        assert all(isinstance(exc, Unavailable) for exc in failures), failures
        fresh_s3_server.start()
        async with await open_blob(url):
            pass
        await store.put("w/after", value)
        assert await store.get("w/after") == value


@pytest.mark.s3
@pytest.mark.timeout(60)
async def test_s3_frozen_server_times_out_instead_of_hanging(fresh_s3_server: S3Server) -> None:
    """A server that accepts connections but never answers (stopped with SIGSTOP): calls
    end after the read timeout; a write that was sent is reported as Indeterminate."""
    url = fresh_s3_server.url(unique_bucket()) + "&read_timeout=0.5&retries=0"
    async with await open_blob(url) as store:
        await store.put("k", b"before")

        fresh_s3_server.freeze()
        try:
            with pytest.raises(Unavailable, match="timed out"):
                await store.get("k")
            with pytest.raises(Indeterminate, match="timed out"):
                await store.put("k2", b"value")
        finally:
            fresh_s3_server.thaw()

        assert await store.get("k") == b"before"
        # Indeterminate means exactly this: the write may or may not have landed.
        assert await store.get("k2") in (None, b"value")


# --- URLs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "",
        "nonsense",
        "ftp://host/path",
        "file:relative/path",
        "file://otherhost/path",
        "file:///tmp/x?query=1",
        "memory://name/with/path",
        "s3://",
        "s3://UPPERCASE",
        "s3://ab",
        "s3://bucket/../escape",
        "s3://bucket/a//b",
        "s3://bucket?endpoint=host:port",
        "s3://bucket?endpoint=host:1&bogus=1",
        "s3://bucket?secure=maybe",
        "s3://bucket?retries=-1",
        "s3://bucket?connect_timeout=0",
        "s3://bucket?region=a&region=b",
    ],
)
async def test_malformed_urls_are_invalid_arguments(url: str) -> None:
    with pytest.raises(InvalidArgument):
        await open_blob(url)


def test_s3_url_settings_and_credentials() -> None:
    env = {"AWS_ACCESS_KEY_ID": "aws-id", "AWS_SECRET_ACCESS_KEY": "aws-secret"}
    settings = S3Settings.from_url(
        "s3://my-bucket/tenant/a/?endpoint=minio:9000&secure=false&region=eu-west-1"
        "&connect_timeout=0.5&retries=0",
        environ=env,
    )
    assert (settings.bucket, settings.prefix) == ("my-bucket", "tenant/a/")
    assert (settings.endpoint, settings.secure, settings.region) == (
        "minio:9000",
        False,
        "eu-west-1",
    )
    assert (settings.connect_timeout, settings.read_timeout, settings.retries) == (0.5, 10.0, 0)
    assert (settings.access_key, settings.secret_key) == ("aws-id", "aws-secret")
    assert "aws-secret" not in repr(settings)

    tidemark_env = {**env, "TIDEMARK_S3_ACCESS_KEY": "tm-id", "TIDEMARK_S3_SECRET_KEY": "tm-s"}
    preferred = S3Settings.from_url("s3://my-bucket", environ=tidemark_env)
    assert (preferred.access_key, preferred.secret_key) == ("tm-id", "tm-s")
    assert (preferred.endpoint, preferred.secure, preferred.prefix) == (
        "s3.amazonaws.com",
        True,
        "",
    )

    anonymous = S3Settings.from_url("s3://my-bucket", environ={})
    assert anonymous.access_key is None and anonymous.secret_key is None
    with pytest.raises(InvalidArgument, match="TIDEMARK_S3_SECRET_KEY"):
        S3Settings.from_url("s3://my-bucket", environ={"TIDEMARK_S3_ACCESS_KEY": "only-id"})


@pytest.mark.s3
async def test_s3_over_https_needs_the_right_ca(tls_s3_server: S3Server, tmp_path: Path) -> None:
    """The private CA verifies the server; another CA, or the usual roots, fail every call
    with an error that says TLS failed and which CA was tried; plain HTTP gets no S3 answer."""
    assert tls_s3_server.tls is not None
    bucket = unique_bucket()
    url = tls_s3_server.url(bucket, "p")
    async with await open_blob(url) as store:
        await store.put("k", b"over https")
        assert await store.get("k") == b"over https"

    other = CertificateSet.create(tmp_path, "other")
    wrong_ca = url.replace(str(tls_s3_server.tls.ca_file), str(other.ca_file))
    with pytest.raises(Unavailable) as wrong:
        await open_blob(wrong_ca)
    assert "TLS with the server failed" in wrong.value.message
    assert "CERTIFICATE_VERIFY_FAILED" in wrong.value.message
    assert f"the CA in {other.ca_file}" in wrong.value.message

    usual_roots = url.split("&ca=")[0]
    with pytest.raises(Unavailable, match="checked against the usual roots"):
        await open_blob(usual_roots)

    plaintext = f"s3://{bucket}/p?endpoint={tls_s3_server.endpoint}&secure=false&retries=0"
    with pytest.raises((Unavailable, Indeterminate)):
        await open_blob(plaintext)


def test_s3_ca_parameter(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("pem")
    settings = S3Settings.from_url(f"s3://my-bucket?endpoint=minio:9000&ca={ca}", environ={})
    assert (settings.secure, settings.ca) == (True, str(ca))
    assert S3Settings.from_url("s3://my-bucket", environ={}).ca is None
    with pytest.raises(InvalidArgument, match="ca needs HTTPS"):
        S3Settings.from_url(f"s3://my-bucket?secure=false&ca={ca}", environ={})
    with pytest.raises(InvalidArgument, match="cannot read the CA file"):
        S3Settings.from_url(f"s3://my-bucket?ca={tmp_path / 'missing.crt'}", environ={})


async def test_named_memory_stores_are_shared_and_private_ones_are_not() -> None:
    name = f"memory://shared-{uuid.uuid4().hex}"
    async with await open_blob(name) as first, await open_blob(name) as second:
        await first.put("k", b"v")
        assert await second.get("k") == b"v"
    async with await open_blob("memory://") as one, await open_blob("memory://") as other:
        await one.put("k", b"v")
        assert await other.get("k") is None
