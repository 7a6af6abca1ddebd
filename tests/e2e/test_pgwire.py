"""The PostgreSQL wire protocol front end with real clients and real processes: Debian's psql
(a README-style session and the \\d family), psycopg 3 (server-side parameters, executemany,
COPY both ways, SUBSCRIBE through a cursor and through COPY, cancel, errors with positions,
binary round trips), SQLAlchemy reflection, SCRAM and TLS, and bad bytes from hypothesis."""

from __future__ import annotations

import datetime
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import sqlalchemy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types import TypeInfo

from services.adapter.pgwire import codec
from tests.support.ports import free_port
from tests.support.sql_stack import SqlStack, sql_stack

PSQL = "/usr/bin/psql"


class PgStack:
    def __init__(self, stack: SqlStack, port: int, scram_port: int, tls_port: int) -> None:
        self.stack = stack
        self.port = port
        self.scram_port = scram_port
        self.tls_port = tls_port

    def url(self, port: int | None = None, user: str = "tidemark") -> str:
        return f"postgresql://{user}@127.0.0.1:{port or self.port}/tidemark"


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgStack]:
    directory = tmp_path_factory.mktemp("pgwire")
    passwords = directory / "passwords"
    passwords.write_text("# user:password\nalice:s3cret\n")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    with sql_stack(directory, adapters=0, engine="local", warm_up=False) as stack:
        port, scram_port, tls_port = free_port(), free_port(), free_port()
        stack.start_adapter("--pgwire-listen", f"127.0.0.1:{port}")
        stack.start_adapter(
            "--pgwire-listen", f"127.0.0.1:{scram_port}", "--pgwire-password-file", str(passwords)
        )
        stack.start_adapter(
            "--pgwire-listen", f"127.0.0.1:{tls_port}",
            "--pgwire-tls-cert", str(cert), "--pgwire-tls-key", str(key),
        )  # fmt: skip
        for p in (port, scram_port, tls_port):
            _wait_listening(p)
        yield PgStack(stack, port, scram_port, tls_port)


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def psql(pg: PgStack, *commands: str) -> str:
    args = [PSQL, pg.url(), "-X", "-v", "ON_ERROR_STOP=1"]
    for command in commands:
        args += ["-c", command]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_psql_session_and_describe_commands(pg: PgStack) -> None:
    out = psql(
        pg,
        "CREATE TABLE orders (id bigint NOT NULL, customer text, amount numeric(10,2))",
        "INSERT INTO orders VALUES (1, 'ann', 10.50), (2, 'bob', 3.25), (3, 'ann', 1.00)",
        "CREATE MATERIALIZED VIEW spend AS SELECT customer, sum(amount) AS total "
        "FROM orders GROUP BY customer",
        "CREATE VIEW big AS SELECT * FROM orders WHERE amount > 2",
        "CREATE INDEX spend_by_customer ON spend (customer)",
        "SELECT customer, total FROM spend ORDER BY customer",
    )
    assert "INSERT 0 3" in out
    assert " ann      | 11.50" in out and " bob      |  3.25" in out
    listing = psql(pg, "\\d")
    assert "public | orders | table             | tidemark" in listing
    assert "public | spend  | materialized view | tidemark" in listing
    assert "public | big    | view              | tidemark" in listing
    assert "| orders | table" in psql(pg, "\\dt") and "spend" not in psql(pg, "\\dt")
    assert "| big  | view" in psql(pg, "\\dv")
    assert "| spend | materialized view" in psql(pg, "\\dm")
    assert "spend_by_customer | index | tidemark | spend" in psql(pg, "\\di")
    assert "tidemark | tidemark | UTF8" in psql(pg, "\\l")
    assert "public | tidemark" in psql(pg, "\\dn")
    script = "\\copy orders FROM stdin\n4\tcy\t2.00\n\\.\nBEGIN;\nSELECT nosuch;\nSELECT 1;\n"
    script += "ROLLBACK;\nSELECT count(*) AS orders FROM orders;\n"
    session = subprocess.run(
        [PSQL, pg.url(), "-X"], input=script, capture_output=True, text=True, timeout=120
    )
    assert "COPY 1" in session.stdout and " orders \n--------\n      4\n" in session.stdout
    assert 'column "nosuch" does not exist' in session.stderr
    assert "current transaction is aborted" in session.stderr
    described = psql(pg, "\\d orders")
    assert 'Table "public.orders"' in described
    assert "id       | bigint        |           | not null |" in described
    assert "amount   | numeric(10,2) |           |          |" in described


def test_psycopg_parameters_executemany_and_errors(pg: PgStack) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("CREATE TABLE people (id bigint, name text)")
        cur.executemany(
            "INSERT INTO people VALUES (%s, %s)", [(1, "ann"), (2, "bob"), (3, "o'hara")]
        )
        assert cur.execute(
            "SELECT id, name FROM people WHERE id >= %s ORDER BY id", (2,)
        ).fetchall() == [(2, "bob"), (3, "o'hara")]
        assert cur.execute("SELECT id FROM people WHERE name = %s", ("o'hara",)).fetchall() == [
            (3,)
        ]
        # A parameter is a value, never SQL.
        evil = "x'; DROP TABLE people; --"
        assert cur.execute("SELECT id FROM people WHERE name = %s", (evil,)).fetchall() == []
        with pytest.raises(psycopg.errors.UndefinedColumn) as failure:
            cur.execute("SELECT nosuch FROM people WHERE id = %s", (1,))
        assert failure.value.diag.statement_position == "8"
        assert failure.value.diag.message_primary == 'column "nosuch" does not exist'
        with pytest.raises(psycopg.errors.SyntaxError):
            cur.execute("SELEC 1")
        assert cur.execute("SELECT count(*) FROM people").fetchone() == (3,)
    # Prepared after a few executions, and deallocated when there are too many.
    with psycopg.connect(pg.url(), autocommit=True, prepare_threshold=1) as conn:
        conn.prepared_max = 2
        for round in range(3):
            for key in (1, 2, 3):
                row = conn.execute(f"SELECT name FROM people WHERE id = %s -- {key}", (key,))
                assert row.fetchone() == ({1: "ann", 2: "bob", 3: "o'hara"}[key],), round


def test_psycopg_transactions_report_their_status(pg: PgStack) -> None:
    with psycopg.connect(pg.url()) as conn:
        cur = conn.cursor()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        cur.execute("SELECT 1")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        with pytest.raises(psycopg.errors.UndefinedTable):
            cur.execute("SELECT * FROM nowhere")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.rollback()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        notices: list[tuple[str | None, ...]] = []
        conn.add_notice_handler(
            lambda n: notices.append((n.severity, n.sqlstate, n.message_primary))
        )
        conn.autocommit = True
        conn.execute("COMMIT")
        assert notices == [("WARNING", "25P01", "there is no transaction in progress")]


def test_psycopg_copy_in_and_out(pg: PgStack) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("CREATE TABLE copied (id bigint, note text)")
        with cur.copy("COPY copied FROM STDIN") as copy:
            for row in [(1, "a\tb"), (2, None), (3, "three")]:
                copy.write_row(row)
        assert cur.rowcount == 3
        with cur.copy("COPY (SELECT id, note FROM copied ORDER BY id) TO STDOUT") as copy:
            rows = list(copy.rows())
        assert rows == [("1", "a\tb"), ("2", None), ("3", "three")]
        # The client gives up in the middle (CopyFail): nothing is written.
        with pytest.raises(ZeroDivisionError):
            with cur.copy("COPY copied FROM STDIN") as copy:
                copy.write_row((4, "four"))
                raise ZeroDivisionError
        assert cur.execute("SELECT count(*) FROM copied").fetchone() == (3,)
        # A COPY whose data is bad fails whole, with the line it stopped at.
        with pytest.raises(psycopg.errors.InvalidTextRepresentation, match="line 2"):
            with cur.copy("COPY copied FROM STDIN") as copy:
                copy.write(b"5\tfive\nsix\t6\n")
        assert cur.execute("SELECT count(*) FROM copied").fetchone() == (3,)


def test_binary_round_trip_of_every_type(pg: PgStack) -> None:
    values = (
        True,
        -(2**62),
        1.25,
        Decimal("-12345.678"),
        "tëxt",
        b"\x00\xffbytes",
        datetime.date(1999, 12, 31),
        datetime.datetime(2024, 2, 29, 23, 59, 58, 123456),
    )
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        cur = conn.cursor(binary=True)
        cur.execute(
            "CREATE TABLE typed (b boolean, i bigint, f double precision, n numeric(12,3), "
            "t text, y bytea, d date, ts timestamp, j jsonb)"
        )
        cur.execute(
            "INSERT INTO typed VALUES (%b, %b, %b, %b, %b, %b, %b, %b, %s::jsonb)",
            (*values, '{"k": [1, 2]}'),
        )
        row = cur.execute("SELECT b, i, f, n, t, y, d, ts, j FROM typed").fetchone()
        assert row == (*values, {"k": [1, 2]})
        oids = [column.type_code for column in cur.description]
        assert oids == [16, 20, 701, 1700, 25, 17, 1082, 1114, 3802]
        text_row = conn.cursor().execute("SELECT b, i, f, n, t, y, d, ts, j FROM typed").fetchone()
        assert text_row == row


def test_subscribe_through_cursor_and_copy(pg: PgStack) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE feed (x bigint)")
        conn.execute("INSERT INTO feed VALUES (1)")
    with psycopg.connect(pg.url()) as conn:
        cur = conn.cursor()
        cur.execute("DECLARE c CURSOR FOR SUBSCRIBE feed")
        cur.execute("FETCH ALL c")
        first = cur.fetchall()
        assert [(diff, x) for _, diff, x in first] == [(1, 1)]
        assert [d.name for d in cur.description] == ["mz_timestamp", "mz_diff", "x"]
        with psycopg.connect(pg.url(), autocommit=True) as writer:
            writer.execute("INSERT INTO feed VALUES (2)")
        cur.execute("FETCH ALL c WITH (timeout = '30s')")
        assert [(diff, x) for _, diff, x in cur.fetchall()] == [(1, 2)]
        cur.execute("FETCH 1 c WITH (timeout = '0.2s')")
        assert cur.fetchall() == []
        conn.rollback()
        # WITH (PROGRESS, SNAPSHOT = false): progress rows, and only changes after the start.
        cur.execute("DECLARE p CURSOR FOR SUBSCRIBE feed WITH (PROGRESS, SNAPSHOT = false)")
        with psycopg.connect(pg.url(), autocommit=True) as writer:
            writer.execute("INSERT INTO feed VALUES (3)")
        data: list[tuple[Any, ...]] = []
        progressed = 0
        deadline = time.monotonic() + 60
        while not data and time.monotonic() < deadline:
            cur.execute("FETCH ALL p WITH (timeout = '5s')")
            assert [d.name for d in cur.description] == [
                "mz_timestamp", "mz_progressed", "mz_diff", "x"
            ]  # fmt: skip
            for row in cur.fetchall():
                if row[1]:
                    progressed += 1
                    assert row[2:] == (None, None)
                else:
                    data.append(row)
        assert [(diff, x) for _, _, diff, x in data] == [(1, 3)]
        assert progressed >= 1
        conn.rollback()
        # The cursor ended with its transaction; one declared WITH HOLD outlives it.
        with pytest.raises(psycopg.errors.InvalidCursorName):
            cur.execute("FETCH ALL c")
        conn.rollback()
        conn.autocommit = True
        cur.execute("DECLARE held CURSOR WITH HOLD FOR SELECT x FROM feed ORDER BY x")
        cur.execute("SELECT 1")
        cur.execute("FETCH 1 FROM held")
        assert cur.fetchall() == [(1,)]
        cur.execute("CLOSE held")
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        seen: list[tuple[str, ...]] = []
        cur = conn.cursor()
        with pytest.raises(psycopg.errors.QueryCanceled):
            with cur.copy("COPY (SUBSCRIBE feed) TO STDOUT") as copy:
                for row in copy.rows():
                    seen.append(row)
                    if len(seen) == 3:
                        conn.cancel_safe()
        assert sorted(r[1:] for r in seen) == [("1", "1"), ("1", "2"), ("1", "3")]


def test_psycopg_server_side_cursors(pg: PgStack) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE pages (x bigint)")
        conn.execute("INSERT INTO pages VALUES (1), (2), (3)")
    with psycopg.connect(pg.url()) as conn:
        named = conn.cursor("named")
        named.execute("SELECT x FROM pages ORDER BY x")
        assert named.fetchmany(2) == [(1,), (2,)]
        assert named.fetchall() == [(3,)]
        named.close()
        changes = conn.cursor("changes")
        changes.execute("SUBSCRIBE pages")
        assert sorted((diff, x) for _, diff, x in changes.fetchmany(3)) == [(1, 1), (1, 2), (1, 3)]


def test_cancel_from_another_thread(pg: PgStack) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE quiet (x bigint)")
        timer = threading.Timer(1.0, conn.cancel_safe)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("DECLARE q CURSOR WITH HOLD FOR SUBSCRIBE quiet")
            conn.execute("FETCH 5 q")
        assert time.monotonic() - started < 30
        assert conn.execute("SELECT 42").fetchone() == (42,)


def test_sqlalchemy_reflects_a_table(pg: PgStack) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE reflected (id bigint NOT NULL, label text, price numeric(8,2))")
    engine = sqlalchemy.create_engine(pg.url().replace("postgresql://", "postgresql+psycopg://"))
    try:
        inspector = sqlalchemy.inspect(engine)
        assert "reflected" in inspector.get_table_names()
        columns = inspector.get_columns("reflected")
        assert [(c["name"], str(c["type"]), c["nullable"]) for c in columns] == [
            ("id", "BIGINT", False),
            ("label", "TEXT", True),
            ("price", "NUMERIC(8, 2)", True),
        ]
        # Table reflection (keys, indexes, constraints, comments) and a query through it.
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("INSERT INTO reflected VALUES (1, 'pen', 2.50)"))
            conn.commit()  # Tidemark's transactions read before they write, not after
            table = sqlalchemy.Table("reflected", sqlalchemy.MetaData(), autoload_with=conn)
            assert [c.name for c in table.columns] == ["id", "label", "price"]
            query = sqlalchemy.select(table.c.label).where(table.c.id == 1)
            assert conn.execute(query).fetchall() == [("pen",)]
            conn.rollback()
    finally:
        engine.dispose()


def test_settings_show_and_set(pg: PgStack) -> None:
    with psycopg.connect(pg.url(), autocommit=True, application_name="tests") as conn:
        assert conn.info.parameter_status("server_version") == "15.0"
        assert conn.info.parameter_status("standard_conforming_strings") == "on"
        assert conn.execute("SHOW application_name").fetchone() == ("tests",)
        conn.execute("SET application_name = 'other'")
        assert conn.info.parameter_status("application_name") == "other"
        assert conn.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)
        assert conn.execute("SHOW client_encoding").fetchone() == ("UTF8",)
        assert conn.execute("SHOW server_version").fetchone() == ("15.0",)
        conn.execute("SET extra_float_digits = 3")  # what JDBC drivers send
        assert conn.execute("SELECT 0.1::double precision").fetchone() == (0.1,)
        # psycopg's type lookups read pg_type.
        jsonb = TypeInfo.fetch(conn, "jsonb")
        assert jsonb is not None and (jsonb.oid, jsonb.array_oid) == (3802, 3807)
        numeric = TypeInfo.fetch(conn, "numeric")
        assert numeric is not None and numeric.oid == 1700
        assert TypeInfo.fetch(conn, "hstore") is None
        assert conn.execute("SELECT current_schema(), current_database()").fetchone() == (
            "public",
            "tidemark",
        )


def test_scram_and_tls(pg: PgStack) -> None:
    url = f"postgresql://alice:s3cret@127.0.0.1:{pg.scram_port}/tidemark"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(f"postgresql://alice:wrong@127.0.0.1:{pg.scram_port}/tidemark")
    tls = f"postgresql://tidemark@127.0.0.1:{pg.tls_port}/tidemark?sslmode=require"
    with psycopg.connect(tls) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 2").fetchone() == (2,)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"postgresql://tidemark@127.0.0.1:{pg.port}/tidemark?sslmode=require")
    with pytest.raises(psycopg.OperationalError, match='database "nope" does not exist'):
        psycopg.connect(f"postgresql://tidemark@127.0.0.1:{pg.port}/nope")


def test_catalog_roles_log_in_with_their_passwords(pg: PgStack) -> None:
    """Roles made with CREATE ROLE authenticate through SCRAM against the verifier the catalog
    keeps; ALTER ROLE changes the password, NOLOGIN and DROP ROLE lock the role out."""
    admin = f"postgresql://alice:s3cret@127.0.0.1:{pg.scram_port}/tidemark"

    def connects(user: str, password: str) -> bool:
        try:
            url = f"postgresql://{user}:{password}@127.0.0.1:{pg.scram_port}/tidemark"
            with psycopg.connect(url) as conn:
                return conn.execute("SELECT 1").fetchone() == (1,)
        except psycopg.OperationalError as exc:
            assert "authentication failed" in str(exc), exc
            return False

    def run(sql: str) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql)

    run("CREATE ROLE bob WITH LOGIN PASSWORD 'pw-one'")
    run("CREATE ROLE carol PASSWORD 'pw-c'")  # CREATE ROLE: NOLOGIN unless LOGIN is given
    run("CREATE USER dave PASSWORD 'pw-d'")  # CREATE USER: LOGIN
    assert connects("bob", "pw-one") and not connects("bob", "wrong")
    assert not connects("carol", "pw-c") and connects("dave", "pw-d")
    run("ALTER ROLE bob PASSWORD 'pw-two'")
    assert not connects("bob", "pw-one") and connects("bob", "pw-two")
    run("ALTER ROLE bob NOLOGIN")
    assert not connects("bob", "pw-two")
    run("DROP ROLE dave")
    assert not connects("dave", "pw-d")
    with psycopg.connect(admin, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DuplicateObject):
            conn.execute("CREATE ROLE bob")
        with pytest.raises(psycopg.errors.UndefinedObject):
            conn.execute("ALTER ROLE nobody LOGIN")
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("CREATE ROLE erin PASSWORD 'never-shown' BADOPTION")
        # (psycopg quotes its own query under the error; the server's message never does.)
        assert "never-shown" not in (caught.value.diag.message_primary or "")


def _exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def _startup() -> bytes:
    body = struct.pack("!i", 196608) + b"user\0tidemark\0database\0tidemark\0\0"
    return struct.pack("!i", len(body) + 4) + body


def test_protocol_errors_close_the_connection(pg: PgStack) -> None:
    for bad in (
        struct.pack("!i", 1 << 30),  # oversized startup packet
        _startup() + b"Z" + struct.pack("!i", 4),  # unknown message type
        _startup() + b"Q" + struct.pack("!i", 1 << 30),  # oversized message
        _startup() + b"Q" + struct.pack("!i", 100) + b"SELECT",  # truncated
    ):
        answer = _exchange(pg.port, bad)
        assert b"08P01" in answer, answer
    assert _exchange(pg.port, _startup() + b"X\0\0\0\4").endswith(b"Z\0\0\0\5I")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(garbage=st.binary(min_size=1, max_size=300), after_startup=st.booleans())
def test_garbage_never_stops_the_server(pg: PgStack, garbage: bytes, after_startup: bool) -> None:
    _exchange(pg.port, (_startup() if after_startup else b"") + garbage)
    with psycopg.connect(pg.url(), autocommit=True, connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


class RawClient:
    """Frontend messages by hand, backend messages read back as (type, body)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.buffer = b""
        self.sock.sendall(_startup())
        key = next(body for kind, body in self.until(b"Z") if kind == b"K")
        self.process_id = struct.unpack("!i", key[:4])[0]

    def send(self, kind: bytes, body: bytes) -> None:
        self.sock.sendall(kind + struct.pack("!i", len(body) + 4) + body)

    def read(self) -> tuple[bytes, bytes]:
        while len(self.buffer) < 5 or len(self.buffer) < 1 + _length(self.buffer):
            chunk = self.sock.recv(65536)
            assert chunk, "connection closed"
            self.buffer += chunk
        size = 1 + _length(self.buffer)
        kind, body = self.buffer[:1], self.buffer[5:size]
        self.buffer = self.buffer[size:]
        return kind, body

    def until(self, last: bytes) -> list[tuple[bytes, bytes]]:
        messages = []
        while True:
            message = self.read()
            messages.append(message)
            if message[0] == last:
                return messages

    def close(self) -> None:
        self.send(b"X", b"")
        self.sock.close()


def _length(buffer: bytes) -> int:
    return int(struct.unpack("!i", buffer[1:5])[0])


def _rows(messages: list[tuple[bytes, bytes]]) -> list[list[bytes | None]]:
    rows = []
    for kind, body in messages:
        if kind != b"D":
            continue
        (count,), offset, row = struct.unpack("!h", body[:2]), 2, []
        for _ in range(count):
            (size,) = struct.unpack("!i", body[offset : offset + 4])
            offset += 4
            row.append(None if size < 0 else body[offset : offset + size])
            offset += max(size, 0)
        rows.append(row)
    return rows


def test_extended_protocol_named_statements_portals_and_row_limits(pg: PgStack) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE numbers (n bigint)")
        conn.execute("INSERT INTO numbers VALUES (1), (2), (3), (4), (5)")
    client = RawClient(pg.port)
    try:
        # Parse a named statement with a given parameter type; Describe it; Flush.
        query = b"SELECT n FROM numbers WHERE n >= $1 ORDER BY n\0"
        client.send(b"P", b"s1\0" + query + struct.pack("!hI", 1, 20))
        client.send(b"D", b"Ss1\0")
        client.send(b"H", b"")
        kinds = [client.read()[0] for _ in range(3)]
        assert kinds == [b"1", b"t", b"T"]
        # Bind a named portal (text parameter 2, binary results), Execute 2 rows at a time.
        bind = b"p1\0s1\0" + struct.pack("!hh", 1, 0) + struct.pack("!hi", 1, 1) + b"2"
        client.send(b"B", bind + struct.pack("!hh", 1, 1))
        client.send(b"E", b"p1\0" + struct.pack("!i", 2))
        client.send(b"E", b"p1\0" + struct.pack("!i", 2))
        client.send(b"E", b"p1\0" + struct.pack("!i", 2))
        client.send(b"C", b"Pp1\0")
        client.send(b"S", b"")
        messages = client.until(b"Z")
        assert [k for k, _ in messages] == [
            b"2", b"D", b"D", b"s", b"D", b"D", b"s", b"C", b"3", b"Z"
        ]  # fmt: skip
        assert _rows(messages) == [[struct.pack("!q", n)] for n in (2, 3, 4, 5)]
        assert messages[-1][1] == b"I"
        # An error skips to Sync; the named statement survives; an unknown portal is 34000.
        client.send(b"E", b"nope\0" + struct.pack("!i", 0))
        client.send(b"B", b"\0s1\0" + struct.pack("!hhi", 0, 1, 1) + b"5" + struct.pack("!h", 0))
        client.send(b"S", b"")
        messages = client.until(b"Z")
        assert [k for k, _ in messages] == [b"E", b"Z"]
        assert codec.decode_fields(messages[0][1])["C"] == "34000"
        client.send(b"B", b"\0s1\0" + struct.pack("!hhi", 0, 1, 1) + b"5" + struct.pack("!h", 0))
        client.send(b"E", b"\0" + struct.pack("!i", 0))
        client.send(b"S", b"")
        messages = client.until(b"Z")
        assert _rows(messages) == [[b"5"]]
        assert (b"C", b"SELECT 1\0") in messages
        # Describing a write's portal does not run it; only Execute does.
        client.send(b"P", b"\0INSERT INTO numbers VALUES (6)\0" + struct.pack("!h", 0))
        client.send(b"B", b"\0\0" + struct.pack("!hhh", 0, 0, 0))
        client.send(b"D", b"P\0")
        client.send(b"S", b"")
        assert [k for k, _ in client.until(b"Z")] == [b"1", b"2", b"n", b"Z"]
        client.send(b"Q", b"SELECT count(*) FROM numbers\0")
        assert _rows(client.until(b"Z")) == [[b"5"]]
        # Unspecified parameter types are inferred from where the parameters stand.
        for sql, oids in (
            (b"SELECT n FROM numbers WHERE n > $1 AND $2::date IS NOT NULL", [20, 1082]),
            (b"INSERT INTO numbers (n) VALUES ($1)", [20]),
            (b"SELECT $1", [25]),
        ):
            client.send(b"P", b"\0" + sql + b"\0" + struct.pack("!h", 0))
            client.send(b"D", b"S\0")
            client.send(b"S", b"")
            messages = client.until(b"Z")
            description = next(body for kind, body in messages if kind == b"t")
            count = struct.unpack("!h", description[:2])[0]
            assert list(struct.unpack(f"!{count}I", description[2:])) == oids, sql
    finally:
        client.close()


def test_a_client_that_goes_away_ends_its_waiting_statement(pg: PgStack) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE idle (x bigint)")
    client = RawClient(pg.port)
    client.send(b"Q", b"DECLARE w CURSOR WITH HOLD FOR SUBSCRIBE idle\0")
    client.until(b"Z")
    client.send(b"Q", b"FETCH 1 w\0")  # waits: nothing ever arrives
    time.sleep(0.5)
    client.sock.close()
    # The adapter ends the statement (and the subscription) once it notices the client left.
    pg.stack.adapters[0].wait_for_record(
        lambda r: (
            r.get("event") == "pgwire_connection_closed"
            and r.get("process_id") == client.process_id
        ),
        timeout=20,
    )


def test_cancel_stops_the_statements_work_in_compute(pg: PgStack) -> None:
    compute = pg.stack.compute.compute()

    def stopped() -> list[dict[str, Any]]:
        return [r for r in compute.records() if r.get("event") == "one_shot_stopped"]

    numbers = ", ".join(f"({i})" for i in range(3000))
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE ca (x bigint); INSERT INTO ca VALUES {numbers}")
        conn.execute(f"CREATE TABLE cb (y bigint); INSERT INTO cb VALUES {numbers}")
        seen = len(stopped())
        timer = threading.Timer(1.5, conn.cancel_safe)
        timer.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT count(*) FROM ca CROSS JOIN cb")  # 9M pairs
        # The evaluation in the compute process stopped at its next check.
        deadline = time.monotonic() + 20
        while len(stopped()) <= seen and time.monotonic() < deadline:
            time.sleep(0.1)
        record = stopped()[seen]
        assert record["outcome"] == "Cancelled", record
        assert record["seconds_after_cancel"] < 1.0, record
        assert conn.execute("SELECT count(*) FROM ca").fetchone() == (3000,)
