"""A TCP forwarder run as its own process: ``python -m tests.support.tcp_proxy LISTEN_PORT
TARGET_HOST:TARGET_PORT``.

The chaos suite puts one in front of the S3 endpoint and kill -9s it to crash "the S3
endpoint" as its clients see it (connections reset, new ones refused until it is back). The
test S3 server (moto) keeps its objects in memory only, so killing the server itself would
destroy the data a real object store keeps durably; that would test moto, not Tidemark.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(listen_port: int, target_host: str, target_port: int) -> None:
    async def handle(
        client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _pipe(client_reader, target_writer), _pipe(target_reader, client_writer)
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port, reuse_address=True)
    print(listen_port, flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--log-format"]:  # as ServiceProcess starts every service
        args = args[2:]
    listen_port = int(args[0])
    host, port = args[1].rsplit(":", 1)
    asyncio.run(serve(listen_port, host, int(port)))


if __name__ == "__main__":
    main()
