# Lazarus — every target does its own set-up on a bare Debian machine:
# Debian packages (etcd, redis) when missing, the virtual environment, and the
# pinned dependencies from requirements/constraints.txt.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONSTRAINTS := requirements/constraints.txt
DEB_PACKAGES := etcd-server etcd-client redis-server iproute2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PACKAGES := lazarus lazarus_dev coordinator node_agent reconcile
PYTEST_ARGS ?=

.PHONY: help setup system-deps venv test lint typecheck pytest demo chaos-soak chaos-soak-fan-in proto lock bench sim fuzz clean image container-drill

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

setup: system-deps venv  ## install Debian packages and the virtual environment

system-deps:  ## install etcd, etcdctl, redis-server and iproute2 from Debian when missing
	@missing=""; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	command -v etcdctl >/dev/null 2>&1 || missing="$$missing etcd-client"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
	  echo ">> installing Debian packages:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

venv: $(STAMP)  ## create .venv with the pinned dependencies

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Python >= 3.11 is required (found $$($(PYTHON) --version))"; exit 1; }
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV) || { \
	  echo ">> python3 -m venv failed; installing python3-venv"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	@touch $(STAMP)

test: setup lint typecheck pytest  ## ruff, mypy, then the whole pytest suite (unit + integration)

lint: venv  ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv  ## mypy on the four packages
	$(VENV)/bin/mypy $(PACKAGES)

pytest: setup  ## unit and integration tests against real etcd / redis
	$(VENV)/bin/pytest $(PYTEST_ARGS)

demo: setup  ## every recovery drill on a fresh local cluster (see README)
	$(VENV)/bin/lazarus drill all --run-dir .run/demo

chaos-soak: setup  ## 20 seeded chaos drills of 60 s in a row (about 40 min; not in make test)
	$(VENV)/bin/lazarus drill chaos --seed 1 --seeds 20 --duration 60 --run-dir .run/chaos

chaos-soak-fan-in: setup  ## the same 20 seeds with --fan-in: followers hold and forward Sessions (about 45 min)
	$(VENV)/bin/lazarus drill chaos --fan-in --seed 1 --seeds 20 --duration 60 --run-dir .run/chaos-fan-in

proto: venv  ## regenerate lazarus/v1 stubs from proto/
	$(PY) -m lazarus_dev.protogen

bench: setup  ## run the benchmarks, write bench/results/*.json and bench/README.md
	$(PY) bench/checkpoint_bench.py
	$(PY) bench/langgraph_bench.py
	$(PY) bench/failover_bench.py
	$(PY) bench/heartbeat_bench.py
	$(PY) bench/recovery_bench.py
	$(PY) bench/reconcile_bench.py
	$(PY) bench/retention_bench.py

fuzz: setup  ## the coordinator fuzz test for 10 minutes (make test runs it for 45 s)
	LAZARUS_FUZZ_S=600 $(VENV)/bin/pytest -x -s --timeout 900 tests/integration/test_hardening_fuzz.py

# Container images with podman and no registry (deploy/podman/): a base image
# made from Debian packages, the Lazarus image on it (every Dockerfile stage
# takes BASE_IMAGE), and etcd / Redis images from Debian's packages.
BASE_IMAGE ?= localhost/lazarus-base:bookworm
IMAGE ?= localhost/lazarus
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
ETCD_IMAGE ?= localhost/lazarus-etcd
REDIS_IMAGE ?= localhost/lazarus-redis
CONTAINER_DRILL_ARGS ?=

image:  ## podman (installed when missing), a Debian base image, the Lazarus, etcd and Redis images
	deploy/podman/setup-host.sh
	deploy/podman/debian-base.sh $(BASE_IMAGE)
	podman build -f deploy/Dockerfile --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE):$(IMAGE_TAG) .
	deploy/podman/service-image.sh $(BASE_IMAGE) $(ETCD_IMAGE) etcd-server etcd-client
	deploy/podman/service-image.sh $(BASE_IMAGE) $(REDIS_IMAGE) redis-server
	podman run --rm $(IMAGE):$(IMAGE_TAG) version

container-drill: venv  ## etcd, Redis, 3 coordinators, 3 node agents as podman containers from the chart; drills kill-node, kill-leader
	$(PY) deploy/podman/container_drill.py --image $(IMAGE):$(IMAGE_TAG) \
	  --etcd-image $(ETCD_IMAGE) --redis-image $(REDIS_IMAGE) $(CONTAINER_DRILL_ARGS)

SEEDS ?= 5000
SHAPE ?= default
sim: setup  ## fleet simulator: SEEDS seeds (default 5000) of SHAPE; records seeds/s in bench/README.md
	$(PY) bench/fleetsim_bench.py --seeds $(SEEDS) --shape $(SHAPE)

lock: ## re-resolve dependencies from pyproject ranges into requirements/constraints.txt
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q --upgrade pip && .lock-venv/bin/pip install -q -e '.[dev]'
	.lock-venv/bin/pip freeze --exclude-editable | grep -v '^lazarus' > $(CONSTRAINTS)
	rm -rf .lock-venv

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
