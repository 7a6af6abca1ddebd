# One image for every Tidemark service: the process is chosen by the container's arguments,
# e.g. `docker run tidemark:0.1.0 python -m services.oracle --help`.
#
# The Debian release is pinned (bookworm): Java 17, which Spark 4 runs on, is packaged there,
# and the build and runtime stages must share one base so the virtualenv copied between them
# keeps working.

FROM python:3.11-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tidemark
ENV PATH=/opt/tidemark/bin:$PATH

# The protobuf and gRPC modules in tidemark/v1/ are never committed: they are generated here
# from protos/ by the same script `make protos` runs, with the code generators installed only
# in this stage.
RUN pip install "grpcio-tools>=1.70" "mypy-protobuf>=3.6"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY scripts/generate-protos.sh scripts/
COPY protos/ protos/
COPY tidemark/ tidemark/
COPY services/ services/
RUN bash scripts/generate-protos.sh /opt/tidemark/bin/python \
    && pip install . \
    && pip uninstall --yes grpcio-tools mypy-protobuf \
    && python -c "import tidemark.v1.storage_pb2_grpc, services.storage.core"


FROM python:3.11-slim-bookworm

# Java for the Spark driver inside the compute processes; tini as PID 1 reaps the processes
# Spark leaves behind (its JVM and Python workers) and forwards signals to the service.
RUN apt-get update \
    && apt-get install --yes --no-install-recommends openjdk-17-jre-headless tini \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --gid 10001 tidemark \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin tidemark

COPY --from=build /opt/tidemark /opt/tidemark

# HOME and the working directory are /tmp, the one writable place when the root filesystem
# is mounted read-only (the Kubernetes manifests mount an emptyDir there).
ENV PATH=/opt/tidemark/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
USER 10001:10001

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["tidemark", "--help"]
