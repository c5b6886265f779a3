# Two commands matter: `make demo` and `make test`. Both install what they need first
# (idempotently) on a fresh Debian machine as root.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# fuse3 + libfuse3-dev, pkg-config, a compiler and Python headers: pyfuse3 builds from source.
# PostgreSQL for SQLStore's tests; a Java runtime for Spark (installed only if `java` is absent);
# librocksdb-dev for the Spark export's native RocksDB scanner (src/stores/rocksdb/_scan.c);
# libsqlite3-dev (its sqlite3ext.h) for the SQLite store's VFS (src/stores/sqlite/_recvfs.c);
# shellcheck and systemd (systemd-analyze) check vagrant/'s provisioning script and units.
APT_PACKAGES := etcd-server etcd-client fuse3 libfuse3-dev pkg-config build-essential python3-dev postgresql librocksdb-dev libsqlite3-dev shellcheck systemd
SCANNER := src/stores/rocksdb/rocksdb-scan
SQLITE_VFS := src/stores/sqlite/_recvfs.so
STAMP := $(VENV)/.installed

.PHONY: demo test deps apt venv scanner sqlite-vfs protos check-protos lint typecheck check-install bench bench-peers chaos cluster clean

deps: apt venv scanner sqlite-vfs

scanner: $(SCANNER)

sqlite-vfs: $(SQLITE_VFS)

# The package build compiles both (setup.py), skipping one it cannot build; these rebuild a
# stale one, and fail with the compiler's message where the install skipped.
$(SQLITE_VFS): src/stores/sqlite/_recvfs.c src/stores/cbuild.py $(STAMP) | apt
	$(PY) -m gazette.stores.sqlite.native build

$(SCANNER): src/stores/rocksdb/_scan.c src/stores/cbuild.py $(STAMP) | apt
	$(PY) -m gazette.stores.rocksdb.scan build

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py | apt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP) $(wildcard $(SCANNER) $(SQLITE_VFS))

protos: venv
	$(PY) tools/gen_protos.py

check-protos: venv
	$(PY) tools/gen_protos.py --check

lint: venv
	$(VENV)/bin/ruff check src tests bench tools examples
	$(VENV)/bin/ruff format --check src tests bench tools examples
	$(VENV)/bin/lint-imports

# mypy sees the `gazette` package through a link (setuptools maps it onto src/; mypy cannot).
TYPECHECK_LINK := build/typecheck/gazette

$(TYPECHECK_LINK):
	mkdir -p $(dir $@) && ln -sfn ../../src $@

typecheck: venv $(TYPECHECK_LINK)
	$(VENV)/bin/mypy

test: deps lint typecheck
	$(PY) tools/gen_protos.py --check
	$(VENV)/bin/pytest -q --durations=15

# `make demo SECURE=1`: the same with TLS and authorization on everywhere (docs/security.md).
demo: deps
	$(PY) examples/demo.py $(if $(SECURE),--secure)

# Runs every bench/*.py --quick, one at a time, and writes their figures to bench/RESULTS.md.
bench: deps
	$(PY) bench/results.py

# Opt-in (needs PyPI and Debian): our consumer and broker side by side with Bytewax and NATS
# JetStream (bench/peers.py), installing them first when absent (.peers-venv/, nats-server).
# `make bench-peers QUICK=1` for a run of well under a minute.
bench-peers: deps
	$(PY) bench/peers.py $(if $(QUICK),--quick)

# Opt-in (needs PyPI): install the built wheel into fresh virtualenvs, client-only and [sqlite].
check-install: venv
	$(PY) tools/check_install.py

chaos: deps
	$(VENV)/bin/pytest -q -m chaos

# Opt-in: etcd, brokers and S3 on hosts made of network namespaces (gazette.testing.netns;
# root, iproute2, nsenter). Faults use policy routing and link state: no firewall package.
# Then the fault suite (tools/cluster/run.py, docs/cluster.md): stream-sum and an appender on
# five hosts through every fault of the schedule; its table and JSON line on stdout.
# `make cluster SECURE=1`: the fault suite with TLS and authorization on (run.py --secure).
cluster: deps
	$(VENV)/bin/pytest -q -m cluster
	$(PY) tools/cluster/run.py $(if $(SECURE),--secure)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache $(SCANNER) $(SQLITE_VFS)
