"""Blob store on S3 or any S3-compatible service (MinIO, AWS), through the ``minio`` client.

URL: ``s3://BUCKET[/PREFIX]?endpoint=HOST:PORT&secure=false&region=REGION``. Keys live under
``PREFIX/`` inside the bucket, so several stores can share one bucket. Query parameters:

* ``endpoint`` (default ``s3.amazonaws.com``), ``secure`` (HTTPS; default true),
  ``region`` (default: asked of the server);
* ``ca``: with HTTPS, the PEM file of the CA that signed the server's certificate (a private
  MinIO, say); without it the server is verified against ``SSL_CERT_FILE`` or certifi's roots.
  A server whose certificate does not verify fails every call with ``Unavailable`` saying so;
* ``connect_timeout`` and ``read_timeout`` in seconds (defaults 2 and 10; the read timeout
  bounds each wait for the next bytes, not a whole transfer) and ``retries`` (default 2):
  how long an unreachable server can hold a caller up before it gets
  :class:`~tidemark.errors.Unavailable`. A stopped server (connection refused) fails a call
  in well under a second; a hung one in at most (retries + 1) x read_timeout plus a little
  backoff. Nothing waits without a timeout.

Credentials come from the environment, never from the URL: ``TIDEMARK_S3_ACCESS_KEY`` and
``TIDEMARK_S3_SECRET_KEY`` (and optionally ``TIDEMARK_S3_SESSION_TOKEN``), else
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``); with none set,
requests are anonymous.

Atomicity is S3's own: an object becomes visible only when its single PUT, or the completion
of its multipart upload, succeeds. The client switches to multipart uploads (5 MiB parts)
above 5 MiB. The bucket is created when the store is opened if it does not exist.

Failures: a server that cannot be reached raises ``Unavailable`` (nothing happened). A write
whose request may have reached the server before the failure raises
:class:`~tidemark.errors.Indeterminate`; for blobs that is benign (keys are written once, so
a retry writes the same bytes), but callers must not assume the write is absent.
"""

from __future__ import annotations

import asyncio
import builtins
import io
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import certifi
import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, ResponseError, SSLError

from tidemark.blob.base import (
    MAX_KEY_BYTES,
    Blob,
    is_key_segment,
    validate_key,
    validate_prefix,
)
from tidemark.errors import (
    FailedPrecondition,
    Indeterminate,
    Internal,
    InvalidArgument,
    TidemarkError,
    Unavailable,
)

_T = TypeVar("_T")

_DEFAULT_ENDPOINT = "s3.amazonaws.com"
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_QUERY_PARAMETERS = {
    "endpoint",
    "secure",
    "region",
    "ca",
    "connect_timeout",
    "read_timeout",
    "retries",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# Error codes a server uses for "busy or broken, try again later".
_TRANSIENT_CODES = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
}
_CREDENTIAL_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
}


@dataclass(frozen=True)
class S3Settings:
    """Where and how to reach the bucket; built from a URL by :meth:`from_url`."""

    bucket: str
    prefix: str = ""  # "" or ends with "/"
    endpoint: str = _DEFAULT_ENDPOINT
    secure: bool = True
    region: str | None = None
    ca: str | None = None
    """PEM file of the CA HTTPS certificates are verified against (None: the usual roots)."""
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    connect_timeout: float = 2.0
    read_timeout: float = 10.0
    retries: int = 2

    @classmethod
    def from_url(cls, url: str, environ: Mapping[str, str] | None = None) -> S3Settings:
        """Parse an ``s3://`` URL; credentials come from ``environ`` (default: the process
        environment). Raises ``InvalidArgument`` for anything malformed."""
        parts = urlsplit(url)
        if parts.scheme != "s3":
            raise InvalidArgument(f"not an s3:// URL: {url!r}")
        bucket = parts.netloc
        if not _BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
            raise InvalidArgument(
                f"invalid S3 bucket name {bucket!r} in {url!r}: 3-63 lowercase letters, "
                "digits, '.' and '-'"
            )
        prefix = unquote(parts.path).strip("/")
        if prefix:
            validate_key(prefix)  # the same rules as keys: no empty, '.' or '..' segments
            prefix += "/"

        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
        unknown = set(query) - _QUERY_PARAMETERS
        if unknown:
            raise InvalidArgument(f"unknown S3 URL parameters {sorted(unknown)} in {url!r}")
        single: dict[str, str] = {}
        for name, values in query.items():
            if len(values) != 1:
                raise InvalidArgument(f"S3 URL parameter {name!r} given more than once")
            single[name] = values[0]

        env = os.environ if environ is None else environ
        access_key, secret_key, session_token = _credentials(env)
        secure = _flag("secure", single.get("secure", "true"))
        return cls(
            bucket=bucket,
            prefix=prefix,
            endpoint=_endpoint(single.get("endpoint", _DEFAULT_ENDPOINT)),
            secure=secure,
            region=single.get("region") or None,
            ca=_ca_file(single.get("ca", ""), secure),
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
            connect_timeout=_positive("connect_timeout", single.get("connect_timeout", "2")),
            read_timeout=_positive("read_timeout", single.get("read_timeout", "10")),
            retries=_count("retries", single.get("retries", "2")),
        )


def _credentials(env: Mapping[str, str]) -> tuple[str | None, str | None, str | None]:
    for access_name, secret_name, token_name in (
        ("TIDEMARK_S3_ACCESS_KEY", "TIDEMARK_S3_SECRET_KEY", "TIDEMARK_S3_SESSION_TOKEN"),
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    ):
        access, secret = env.get(access_name), env.get(secret_name)
        if access or secret:
            if not (access and secret):
                raise InvalidArgument(f"set both {access_name} and {secret_name}, or neither")
            return access, secret, env.get(token_name) or None
    return None, None, None


def _endpoint(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?", value):
        raise InvalidArgument(f"S3 endpoint must be HOST or HOST:PORT, not {value!r}")
    return value


def _ca_file(path: str, secure: bool) -> str | None:
    if not path:
        return None
    if not secure:
        raise InvalidArgument("S3 URL parameter ca needs HTTPS (secure=true)")
    if not os.access(path, os.R_OK) or not os.path.isfile(path):
        raise InvalidArgument(f"S3 URL parameter ca: cannot read the CA file {path!r}")
    return path


def _flag(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise InvalidArgument(f"S3 URL parameter {name} must be true or false, not {value!r}")


def _positive(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number > 0:
        raise InvalidArgument(f"S3 URL parameter {name} must be a positive number of seconds")
    return number


def _count(name: str, value: str) -> int:
    if not value.isdigit():
        raise InvalidArgument(f"S3 URL parameter {name} must be a non-negative integer")
    return int(value)


def _http_pool(settings: S3Settings) -> urllib3.PoolManager:
    """Connections with hard timeouts and few retries, so an outage surfaces in seconds.

    Failed connection attempts are retried for every request (nothing was sent). Reads are
    retried only for idempotent requests whose retry cannot change the outcome (GET, HEAD,
    DELETE); a PUT or POST that fails after sending is reported, not silently repeated, so
    the error can say the outcome is unknown.
    """
    retry = urllib3.Retry(
        total=settings.retries,
        connect=settings.retries,
        read=settings.retries,
        status=settings.retries,
        other=0,
        redirect=0,
        backoff_factor=0.1,
        backoff_max=1.0,
        status_forcelist=[500, 502, 503, 504],
        allowed_methods=frozenset({"GET", "HEAD", "DELETE"}),
        raise_on_status=True,
    )
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=settings.connect_timeout, read=settings.read_timeout),
        retries=retry,
        # The client uploads multipart parts three at a time, next to concurrent callers.
        maxsize=16,
        cert_reqs="CERT_REQUIRED",
        ca_certs=settings.ca or os.environ.get("SSL_CERT_FILE") or certifi.where(),
    )


def _never_sent(exc: BaseException) -> bool:
    """Whether a transport failure happened before any request reached the server."""
    if isinstance(exc, MaxRetryError):
        exc = exc.reason if exc.reason is not None else exc
    # NewConnectionError and NameResolutionError are ConnectTimeoutErrors too; a failed TLS
    # handshake comes before any request.
    return isinstance(exc, ConnectTimeoutError | SSLError)


def _tls_failure(exc: BaseException) -> SSLError | None:
    reason = exc.reason if isinstance(exc, MaxRetryError) else exc
    return reason if isinstance(reason, SSLError) else None


class S3Blob(Blob):
    """Objects in an S3 bucket under a prefix; create instances with :meth:`open`."""

    def __init__(self, settings: S3Settings, client: Minio, http: urllib3.PoolManager) -> None:
        self._settings = settings
        self._client = client
        self._http = http

    @property
    def settings(self) -> S3Settings:
        return self._settings

    @classmethod
    async def open(cls, settings: S3Settings) -> S3Blob:
        """Connect, and create the bucket if it does not exist yet."""
        http = _http_pool(settings)
        client = Minio(
            settings.endpoint,
            access_key=settings.access_key,
            secret_key=settings.secret_key,
            session_token=settings.session_token,
            secure=settings.secure,
            region=settings.region,
            http_client=http,
        )
        blob = cls(settings, client, http)
        try:
            await blob._run("open bucket", "", blob._ensure_bucket_blocking, write=False)
        except BaseException:
            http.clear()
            raise
        return blob

    def _ensure_bucket_blocking(self) -> None:
        bucket = self._settings.bucket
        if self._client.bucket_exists(bucket):
            return
        try:
            self._client.make_bucket(bucket, location=self._settings.region)
        except S3Error as exc:
            if exc.code == "BucketAlreadyOwnedByYou":  # another opener won the race
                return
            if exc.code == "BucketAlreadyExists":
                raise FailedPrecondition(
                    f"S3 bucket {bucket!r} exists but belongs to someone else"
                ) from exc
            raise

    def _object_name(self, key: str) -> str:
        name = self._settings.prefix + validate_key(key)
        if len(name.encode()) > MAX_KEY_BYTES:
            raise InvalidArgument(
                f"blob key {key!r} plus the store's prefix exceeds {MAX_KEY_BYTES} bytes"
            )
        return name

    async def _run(self, operation: str, key: str, call: Callable[[], _T], *, write: bool) -> _T:
        """Run a blocking client call in a worker thread; translate its failures."""
        try:
            return await asyncio.to_thread(call)
        except TidemarkError:
            raise
        except Exception as exc:
            raise self._translate(exc, operation, key, write) from exc

    def _translate(self, exc: Exception, operation: str, key: str, write: bool) -> TidemarkError:
        where = f"S3 {self._settings.endpoint}/{self._settings.bucket}"
        what = f"{operation} {key!r}" if key else operation
        if isinstance(exc, S3Error):
            detail = f"{where}: {what} failed: {exc.code}: {exc.message}"
            if exc.code in _TRANSIENT_CODES:
                return Indeterminate(detail) if write else Unavailable(detail)
            if exc.code == "NoSuchBucket":
                return FailedPrecondition(f"{detail} (was the bucket deleted?)")
            if exc.code in _CREDENTIAL_CODES:
                return Internal(f"{detail} (check TIDEMARK_S3_ACCESS_KEY / TIDEMARK_S3_SECRET_KEY)")
            return Internal(detail)
        if isinstance(exc, MaxRetryError) and isinstance(exc.reason, ResponseError):
            # The server kept answering 5xx until the retries ran out.
            detail = f"{where}: {what} failed: server errors: {exc.reason}"
            return Indeterminate(detail) if write else Unavailable(detail)
        if isinstance(exc, (ServerError, InvalidResponseError)):
            detail = f"{where}: {what} failed: {exc}"
            return Indeterminate(detail) if write else Unavailable(detail)
        if (tls := _tls_failure(exc)) is not None:
            trusted = f"the CA in {self._settings.ca}" if self._settings.ca else "the usual roots"
            return Unavailable(
                f"{where}: {what} failed: TLS with the server failed ({tls}); its certificate "
                f"was checked against {trusted} (the URL's ca= parameter)"
            )
        if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
            if _never_sent(exc):
                return Unavailable(f"{where}: {what} failed: server unreachable: {exc}")
            detail = f"{where}: {what} failed: connection lost: {exc}"
            return Indeterminate(detail) if write else Unavailable(detail)
        return Internal(f"{where}: {what} failed: {type(exc).__name__}: {exc}")

    async def put(self, key: str, data: bytes) -> None:
        name = self._object_name(key)
        payload = bytes(data)

        def upload() -> None:
            self._client.put_object(self._settings.bucket, name, io.BytesIO(payload), len(payload))

        await self._run("put", key, upload, write=True)

    async def get(self, key: str) -> bytes | None:
        name = self._object_name(key)

        def download() -> bytes | None:
            try:
                response = self._client.get_object(self._settings.bucket, name)
            except S3Error as exc:
                if exc.code == "NoSuchKey":
                    return None
                raise
            try:
                # urllib3 checks the body against Content-Length, so a connection cut
                # mid-transfer raises instead of returning a prefix.
                return response.read()
            finally:
                response.close()
                response.release_conn()

        return await self._run("get", key, download, write=False)

    async def delete(self, key: str) -> None:
        name = self._object_name(key)
        # S3 answers a delete of a missing object with success: idempotent as required.
        await self._run(
            "delete",
            key,
            lambda: self._client.remove_object(self._settings.bucket, name),
            write=True,
        )

    async def list(self, prefix: str = "") -> builtins.list[str]:
        validate_prefix(prefix)
        strip = len(self._settings.prefix)

        def names() -> builtins.list[str]:
            found = self._client.list_objects(
                self._settings.bucket, prefix=self._settings.prefix + prefix, recursive=True
            )
            return [obj.object_name[strip:] for obj in found if obj.object_name is not None]

        keys = await self._run("list", prefix, names, write=False)
        # Objects other tools put under the prefix with names no key could have are not ours.
        return sorted(k for k in keys if all(is_key_segment(s) for s in k.split("/")))

    async def close(self) -> None:
        self._http.clear()
