#!/usr/bin/env bash
# Generate Python, gRPC and typing stubs from protos/ into tidemark/v1/.
set -euo pipefail
python="$1"
cd "$(dirname "$0")/.."
# The mypy-protobuf plugins are installed beside the interpreter.
export PATH="$(cd "$(dirname "$python")" && pwd):$PATH"
rm -f tidemark/v1/*_pb2*.py tidemark/v1/*_pb2*.pyi
"$python" -m grpc_tools.protoc -I protos \
  --python_out=. --grpc_python_out=. \
  --mypy_out=quiet:. --mypy_grpc_out=quiet:. \
  protos/tidemark/v1/*.proto
