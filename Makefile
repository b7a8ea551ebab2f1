# The project's commands. `make demo` runs the main job end to end on the local stack,
# `make test` runs the test suite against a stack of its own that it starts and stops.
# Every target installs what it needs first (Python venv from the lock, jars via Maven,
# Debian's PostgreSQL server and Chromium packages).

SHELL := /bin/bash
# Every Python process here (pytest's workers, the fleets, Airflow's CLI and services, Spark's
# drivers) imports Airflow, PySpark or the runtime; with the bytecode cache off (a machine's
# PYTHONDONTWRITEBYTECODE) each compiled them again (docs/getting-started.md, "The test suite").
unexport PYTHONDONTWRITEBYTECODE
PY := .venv/bin/python
BROKERS ?= 1
SECURITY ?= plaintext
SPARK ?= local
GATEWAY ?= none
GATEWAY_VENV := .local/litellm-venv
MVN := mvn -q -B -s infra/maven-settings.xml
# The environments are installed by uv from their locks: several times faster than pip on two
# cores (its downloads run side by side and its cache is linked, not unpacked again).
UV := uv==0.13.9
TEST_ENV := set -a && source .local/test/stack.env && set +a
DEV_ENV := set -a && source .local/dev/stack.env && set +a
# make test runs pytest on TEST_WORKERS workers (TEST_WORKERS=1: one process): fewer left cores
# idle while tests waited on services, more made gate decisions and the UI's waits fail on a
# busy machine (tests/conftest.py; the times: docs/getting-started.md, "The test suite").
TEST_WORKERS ?= 3
XDIST := -n 2 --dist loadscope --no-loadscope-reorder
# ruff, the import contracts (pyproject.toml; plugins/ on the path, as Airflow puts it) and the
# type check: no services; half a minute for mypy on a fresh clone, seconds once its cache is warm.
LINT := .venv/bin/ruff check . && PYTHONPATH=plugins .venv/bin/lint-imports --no-logo && .venv/bin/mypy
# The modules with serial tests: collecting only them spares the serial phase collecting the
# whole suite again (about ten seconds).
SERIAL_MODULES = $(shell grep -rlE "mark\.serial" tests --include='test_*.py')
TEST_RUN := $(if $(filter 1,$(TEST_WORKERS)),.venv/bin/pytest -q -rfEs --durations=25,\
  ( .venv/bin/pytest -q -rfEs --durations=25 -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder \
    -m "not serial"; r=$$?; .venv/bin/pytest -q -rfEs --durations=5 -m serial $(SERIAL_MODULES) || r=1; exit $$r ))

.PHONY: deps venv gateway-venv jars postgres-server browser up down status demo capacity bench bench-smoke gate-stats canary canary-stats tiers shared-quota limit-matrix faults test test-unit test-fast lint airflow

deps: venv jars postgres-server browser

venv: .venv/.installed
.venv/.installed: requirements.lock
	@test -x $(PY) || python3.11 -m venv .venv
	$(PY) -m pip install -q $(UV)
	.venv/bin/uv pip install -q --offline --python $(PY) -r requirements.lock 2>/dev/null || \
	  .venv/bin/uv pip install -q --python $(PY) -r requirements.lock
	$(PY) -m pip check
	@touch $@

# LiteLLM's proxy (GATEWAY=litellm) in an environment of its own: it pins what Airflow pins differently.
gateway-venv: $(GATEWAY_VENV)/.installed
$(GATEWAY_VENV)/.installed: infra/litellm/requirements.lock | .venv/.installed
	@test -x $(GATEWAY_VENV)/bin/python || python3.11 -m venv $(GATEWAY_VENV)
	.venv/bin/uv pip install -q --python $(GATEWAY_VENV)/bin/python -r infra/litellm/requirements.lock
	$(GATEWAY_VENV)/bin/python -m pip check
	@touch $@

jars: .local/jars/kafka/.resolved .local/jars/spark/.resolved
.local/jars/kafka/.resolved: infra/kafka/pom.xml
	rm -rf .local/jars/kafka
	$(MVN) -f infra/kafka/pom.xml dependency:copy-dependencies
	@touch $@
.local/jars/spark/.resolved: infra/spark/pom.xml
	rm -rf .local/jars/spark
	$(MVN) -f infra/spark/pom.xml dependency:copy-dependencies
	@touch $@

# Debian's PostgreSQL server (see infra/postgres_server.py for why this one).
postgres-server:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; }

# Debian's Chromium for the UI test (browser downloads by test tools are not used).
browser:
	@test -x /usr/bin/chromium || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# SECURITY=sasl_ssl: Kafka over SASL_SSL with SCRAM users and ACLs (see infra/kafka_cluster.py).
# SPARK=cluster: a Spark standalone master and worker, `spark_default` pointing at it.
# GATEWAY=litellm: LiteLLM's proxy in front of the AI stand-in (see infra/ai_gateway.py).
up: deps $(if $(filter litellm,$(GATEWAY)),gateway-venv)
	SECURITY=$(SECURITY) SPARK=$(SPARK) GATEWAY=$(GATEWAY) $(PY) -m infra.stack up --brokers $(BROKERS)

down:
	@test -x $(PY) && $(PY) -m infra.stack down || true

status:
	$(PY) -m infra.stack status

# The main job: pipeline_tuning end to end (SCALE=1 for real AI latencies).
demo: up
	$(DEV_ENV) && $(PY) -m infra.demo

# The capacity search: pipeline_capacity on the flow configuration (SCALE, default 0.3).
capacity: up
	$(DEV_ENV) && $(PY) -m infra.capacity

# The benchmark: every preset side by side, `durable` on a three-broker stack of its own
# (ports +2000, up for that scenario only), plus Kafka-level and Spark figures (PIPELINE=<spec
# name> for another pipeline than the reference one; BENCH_ARGS for more of bench.run's options).
bench: up
	$(DEV_ENV) && $(PY) -m bench.run $(if $(SCALE),--scale $(SCALE),) \
	  $(if $(PIPELINE),--pipeline $(PIPELINE),) $(BENCH_ARGS)

# The same, small.
bench-smoke:
	@$(MAKE) --no-print-directory bench BENCH_ARGS=--smoke

# The gate's statistics: false-promotion and false-rejection rates over many decisions.
gate-stats: up
	$(DEV_ENV) && $(PY) -m bench.gate_stats

# Canaries on live support tickets (bench/canary.py): a slower, dearer draft model rolled back, an
# identical candidate promoted, a candidate killed mid-step; canary-stats runs 20 of each kind.
# Airflow's hooks log every statement at info (a level their logger takes from Airflow's settings).
CANARY_ENV := $(DEV_ENV) && export AIRFLOW__LOGGING__LOGGING_LEVEL=WARNING
canary: up
	$(CANARY_ENV) && $(PY) -m bench.canary $(BENCH_ARGS)

canary-stats: up
	$(CANARY_ENV) && $(PY) -m bench.canary --stats 20 $(BENCH_ARGS)

# Support tickets that may wait drafted by the batch tier, against the same tickets all realtime
# (bench/tiers.py): cost per 1,000 by tier, interactive p99, deadline misses, fallbacks.
tiers: up
	$(DEV_ENV) && $(PY) -m bench.tiers $(BENCH_ARGS)

# Three pipelines on one provider quota, weights 2 : 1 : 1 (bench/shared_quota.py): backlogged
# under a concurrency and a requests-per-minute quota, then one of them idle for a minute.
shared-quota: up
	$(DEV_ENV) && $(PY) -m bench.shared_quota --binds concurrency,requests --idle 60 $(BENCH_ARGS)

# The adaptive concurrency limit against a simulated service over latency shapes, limit schedules
# and caller stalls (bench/limit_matrix.py): no services.
limit-matrix: venv
	$(PY) -m bench.limit_matrix

# Fault injection: a three-broker stack of its own (ports +20000), steady load, one fault after
# another (see bench/faults.py); the stack is stopped afterwards.
faults: deps
	@STACK=faults $(PY) -m infra.stack up --brokers 3; rc=$$?; \
	if [ $$rc -eq 0 ]; then set -a && source .local/faults/stack.env && set +a && \
	  $(PY) -m bench.faults $(if $(FAULTS),--faults $(FAULTS),) $(if $(PRESET),--preset $(PRESET),); rc=$$?; fi; \
	STACK=faults $(PY) -m infra.stack down; exit $$rc

# The UI on http://127.0.0.1:8080 with login (user admin, password printed at start and kept
# in .local/dev/airflow/passwords.json). Ctrl-C stops it.
airflow: up
	$(DEV_ENV) && .venv/bin/airflow standalone

lint: venv
	$(LINT)

# The unit tests need no service, but the Spark ones need the connector jars.
test-unit: venv .local/jars/spark/.resolved
	.venv/bin/pytest tests/unit -q

# The lint and the unit tests on two workers: no services. The lint runs beside the tests (both
# leave a core idle most of the time) and prints when they are done.
test-fast: venv .local/jars/spark/.resolved
	@mkdir -p .local; ( $(LINT) ) >.local/lint.out 2>&1 & lint=$$!; \
	.venv/bin/pytest tests/unit -q $(XDIST); rc=$$?; \
	wait $$lint || rc=1; cat .local/lint.out; exit $$rc

# The whole suite against a three-broker test stack (ports +10000, Spark on a standalone master),
# stopped afterwards whatever the outcome; the secured tests start a secured three-broker stack
# for their module (SASL_SSL, ports +22000) and stop it after it. The tests run on TEST_WORKERS
# workers (tests/conftest.py says which modules share one), then the `serial` ones
# alone (they stop a service of the stack, or count what a busy machine changes). The gateway's
# test starts LiteLLM's proxy of its own, from the gateway's environment. The lint and the docs'
# build run while the stack starts; a tree that fails them runs no test. Interrupted (SIGTERM,
# as a CI timeout sends it, or Ctrl-C), the tests, in a session of their own, are stopped and
# both stacks, with the Airflow the UI tests started, are stopped by the same run.
test: deps gateway-venv
	@stop() { STACK=secure $(PY) -m infra.stack down >/dev/null; STACK=test $(PY) -m infra.stack down; }; \
	run=; trap 'trap - TERM INT HUP; [ -n "$$run" ] && kill -TERM -- -$$run 2>/dev/null; wait; stop; exit 143' \
	  TERM INT HUP; \
	( $(LINT) && NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet ) & checks=$$!; \
	STACK=test SECURITY=plaintext SPARK=cluster $(PY) -m infra.stack up --brokers 3; rc=$$?; \
	wait $$checks || rc=1; \
	if [ $$rc -eq 0 ]; then setsid bash -c '$(TEST_ENV) && $(TEST_RUN)' & run=$$!; wait $$run; rc=$$?; fi; \
	stop; exit $$rc

# The documentation site (mkdocs.yml, pages in docs/) into .local/site; --strict fails on a broken
# link or anchor. Nothing is fetched while it builds.
.PHONY: docs
docs: venv
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
