# Tidemark build. `make test` and `make run` are the only commands a newcomer needs:
# both create the environment first when it is missing or stale.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
INSTALLED := $(VENV)/.installed
PROTOS    := $(wildcard protos/tidemark/v1/*.proto)
GENERATED := tidemark/v1/.generated

.PHONY: setup system-deps protos run test chaos lint format bench bench-oracle bench-storage bench-catalog bench-compute bench-tpch bench-tpch-spark bench-hydration bench-loading bench-pg-source bench-pgwire bench-wire bench-spill bench-steady bench-steady-io bench-scale clean

setup: $(INSTALLED) $(GENERATED)

$(INSTALLED): pyproject.toml
	@bash scripts/ensure-python-venv.sh "$(PYTHON)" "$(VENV)"
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

# Generated protobuf/gRPC modules live in tidemark/v1/ and are never committed.
$(GENERATED): $(PROTOS) $(INSTALLED)
	@bash scripts/generate-protos.sh "$(BIN)/python"
	@touch $@

protos: $(INSTALLED)
	@bash scripts/generate-protos.sh "$(BIN)/python"
	@touch $(GENERATED)

# Java for Spark and the etcd server for the integration tests, from Debian packages.
system-deps:
	@bash scripts/install-system-deps.sh

run: setup
	$(BIN)/tidemark up

test: setup system-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# kill -9 a random process every few seconds under a bank/list-append/insert/SUBSCRIBE workload,
# then check for lost or doubled writes and serializability anomalies; writes
# bench/results/chaos.json (a reduced run is part of `make test`: tests/e2e/test_chaos.py).
chaos: setup system-deps
	$(BIN)/python bench/chaos.py $(CHAOS_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: bench-oracle bench-storage bench-catalog bench-compute bench-tpch bench-tpch-spark bench-hydration bench-loading bench-pg-source bench-pgwire bench-wire bench-spill bench-steady bench-scale

bench-oracle: setup system-deps
	$(BIN)/python bench/oracle.py

bench-storage: setup system-deps
	$(BIN)/python bench/storage.py

bench-catalog: setup system-deps
	$(BIN)/python bench/catalog.py

bench-compute: setup system-deps
	$(BIN)/python bench/compute.py

bench-tpch: setup system-deps
	$(BIN)/python bench/tpch.py

# One-shot TPC-H Q1, 3, 5, 6, 9, 18 at scale factor 1 as Spark jobs, next to Spark SQL over the
# same Parquet; writes bench/results/tpch_spark.json.
bench-tpch-spark: setup system-deps
	$(BIN)/python bench/tpch_spark.py

# Benchmark (f): hydrating the join + aggregate view over 10^7 orders by Spark from storage's
# parts, next to Spark SQL recomputing it and to hydration through the driver; writes
# bench/results/hydration.json.
bench-hydration: setup system-deps
	$(BIN)/python bench/hydration.py --orders 10000000

bench-loading: setup system-deps
	$(BIN)/python bench/loading.py

bench-pg-source: setup system-deps
	$(BIN)/python bench/pg_source.py

bench-pgwire: setup system-deps
	$(BIN)/python bench/pgwire.py

# The driver's typed frames to its resident Spark tasks against pickle, and their round trip
# plaintext and over mTLS (a few seconds, no services).
bench-wire: setup
	$(BIN)/python bench/wire_codec.py

# Benchmark (i): the compute benchmark's join view, and a GROUP BY view whose state is all
# Reduce state, each with its state three times its memory budget, spilling to local disk,
# against the same view in memory; all checked against DuckDB.
bench-spill: setup
	$(BIN)/python bench/spill.py

# Benchmark (g): 1,000-row steps of the join + aggregate view at 10^6 orders on two resident
# tasks: step p50/p90, the driver's CPU per step and where it goes (cProfile), next to Spark SQL
# recomputing the view; writes bench/results/steady_state.json.
bench-steady: setup system-deps
	$(BIN)/python bench/steady_state.py

# The steady state through storage, the rows path against the tasks reading and writing
# parts (issue #14 item 1); writes bench/results/steady_io.json.
bench-steady-io: setup system-deps
	$(BIN)/python bench/steady_io.py

# Benchmark (h): the highest input rate the view keeps fresh (p99 <= 1 s) on a Spark
# standalone cluster of 1 and of 2 workers, with each process's CPU; writes
# bench/results/scale.json (about 8 minutes).
bench-scale: setup system-deps
	$(BIN)/python bench/scale.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
	rm -f tidemark/v1/*_pb2*.py tidemark/v1/*_pb2*.pyi $(GENERATED)
