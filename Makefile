# Every install step lives here: `make test` and `make chaos` work on a fresh clone.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# Debian packages the faults need: libfuse for faultfs, libfiu for errno injection, e2fsprogs for
# the loop-mounted ext4 images; docker.io (dockerd, started by the harness on first use), nftables,
# iproute2 and util-linux (nsenter) for nodes and partitions. Installed when missing and when we
# are root; otherwise the scenarios that need them are skipped, loudly, with the reason. chromium:
# the report's test renders it in a real (headless) browser. slurm-wlm and munge: slurmctld, slurmd
# and the clients (sbatch, srun, scontrol) for the private Slurm cluster, munged where its build
# lacks auth/none.
SYSTEM_PACKAGES := fuse3 libfuse3-3 fiu-utils libfiu0 e2fsprogs mount docker.io nftables iproute2 util-linux chromium \
                   slurm-wlm munge stress-ng
SYSTEM_STAMP    := $(VENV)/.system-packages

.PHONY: setup test chaos chaos-examples chaos-compat compat bench coverage mutation clean

setup: $(STAMP) $(SYSTEM_STAMP)

$(SYSTEM_STAMP): Makefile
	@mkdir -p $(VENV)
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -z "$$missing" ]; then touch $@; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "WARNING: missing Debian packages: $$missing (need root and apt-get); storage scenarios will be skipped" >&2; \
	else \
	  echo "installing $$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends $$missing >/dev/null \
	    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; \
	  touch $@; \
	fi

# Re-installs when pyproject.toml (the ranges) or constraints.txt (the exact versions CI runs)
# changes. The constraints pin torch to the CPU wheel that lies on this machine's disk, which
# keeps pip from reaching for a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[all,test,bench,examples,mutation]' 2>&1 | { grep -v "is ignored" || true; }
	$(PY) -c "import torch, torchdata; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

# make test (CI): every test but those marked nightly, in minutes; make test-full (nightly): all of
# them, the planted bugs against more scenarios than the one that catches each (those where the
# reference's coverage-measured run reaches a function the bug replaces; tests/planted_selection.py).
# Its first step measures those scenarios and their golden runs into MATRIX_DIR, side by side, and
# again only when the trainer or the scenarios changed; no test waits for it.
# Both print each phase's time and the slowest tests and files, and keep every test's time in
# reports/timings/ (test.json, test-full.json; the run before as *.prev.json, which the next run
# compares against).
# Four workers on two cores: many tests spend part of their time waiting on other processes (a grace
# period, a requeue, a rank's exit), which two workers left idle; six fill the CPU and are slower
# again (docs/benchmarks.md#wall-time-of-the-suites).
TEST_WORKERS ?= 4
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -p tests.timings
test: setup
	$(PYTEST) -m "not nightly" --timings-json reports/timings/test.json tests toxiproxy_server/tests

MATRIX_DIR ?= reports/matrix
.PHONY: test-full
test-full: setup
	$(PY) -m tests.planted_selection $(MATRIX_DIR)
	CKPT_CHAOS_MATRIX_COVERAGE=$(abspath $(MATRIX_DIR)) \
	  $(PYTEST) --timings-json reports/timings/test-full.json tests toxiproxy_server/tests

# Coverage of ckpt_chaos/ under make test's selection, lines and branches, in every process the
# tests start (coverage.py's .pth; tests/coverage.ini), each line tagged with the test that reached
# it: reports/coverage/test.json, the HTML in reports/coverage/test-html/. A test that runs coverage
# itself (tests/test_trainer_coverage.py) or installs a venv of its own (tests/test_packaging.py) may fail
# under it; the figures stand, the failures are listed.
COV_DIR := $(CURDIR)/reports/coverage
.PHONY: test-coverage
test-coverage: setup
	rm -rf $(COV_DIR)/test $(COV_DIR)/test-html && mkdir -p $(COV_DIR)/test
	-COVERAGE_FILE=$(COV_DIR)/test/.coverage COVERAGE_PROCESS_START=$(CURDIR)/tests/coverage.ini \
	  $(PYTEST) -p tests.coverage_contexts -m "not nightly" --timings-json reports/timings/test-coverage.json \
	  tests toxiproxy_server/tests
	cd $(COV_DIR)/test && COVERAGE_FILE=.coverage $(CURDIR)/$(PY) -m coverage combine --quiet --rcfile $(CURDIR)/tests/coverage.ini .
	COVERAGE_FILE=$(COV_DIR)/test/.coverage $(PY) -m coverage json --quiet --rcfile tests/coverage.ini -o $(COV_DIR)/test.json
	COVERAGE_FILE=$(COV_DIR)/test/.coverage $(PY) -m coverage html --quiet --rcfile tests/coverage.ini --show-contexts -d $(COV_DIR)/test-html
	@$(PY) -c "import json; t = json.load(open('$(COV_DIR)/test.json'))['totals']; \
	  print(f\"ckpt_chaos/ under make test: lines {t['covered_lines']}/{t['num_statements']} \" \
	        f\"({t['covered_lines'] / t['num_statements']:.2%}), branches {t['covered_branches']}/{t['num_branches']} \" \
	        f\"({t['covered_branches'] / t['num_branches']:.2%})\")"

# CHAOS_FLAGS=--strict (CI): a scenario this machine cannot run fails the suite instead of skipping.
# CHAOS_SUITE=full (nightly): every scenario, not only the default suite's.
# CHAOS_JOBS: scenarios side by side (run -n); those whose verdict hangs on wall-clock time still
# run alone, so the verdicts are a serial run's. CHAOS_JOBS=1: one after the other.
CHAOS_SUITE ?= default
CHAOS_JOBS  ?= auto
# Each phase's time, and each scenario's, go to reports/timings/chaos.json (.ci/times.py), compared
# with the run before at the end.
TIMES := $(PYTHON) .ci/times.py
chaos: setup
	@$(TIMES) start chaos
	$(TIMES) phase chaos "suite $(CHAOS_SUITE)" --suite-run reports/$(CHAOS_SUITE)/latest -- \
	  $(VENV)/bin/ckpt-chaos run --suite $(CHAOS_SUITE) -n $(CHAOS_JOBS) $(CHAOS_FLAGS)
	@$(TIMES) phase chaos "report in Chromium" -- bash -c 'if command -v chromium >/dev/null; then \
	  $(VENV)/bin/ckpt-chaos report reports/$(CHAOS_SUITE)/latest --no-plots --browser; \
	else echo "WARNING: no chromium here: the report was not checked in a browser (make setup installs it as root)" >&2; fi'
# Fault-schedule search against the reference trainer: a small fixed budget and seed (CI); a finding
# fails the target and is kept in the catalogue's regressions folder, where it joins the default
# suite. Nightly (make nightly): a 20-minute search with a seed that changes every night.
	$(TIMES) phase chaos search -- $(VENV)/bin/ckpt-chaos explore --budget 90s --shrink-budget 120s --seed 0 \
	  --no-database --regressions ckpt_chaos/scenarios/regressions
	@$(TIMES) summary chaos

# Third-party trainers, unmodified (examples/: a plain PyTorch DDP loop, Lightning, Accelerate), each
# under its scenarios through the automatic probe layer. A framework bug the harness shows is kept as
# a known failure (xfail): CI stays green while it is there and turns red the day it is fixed.
# EXAMPLES_SUITE=full (nightly): every scenario of those folders; CI's suite, examples, holds one per
# fault kind per trainer. Times: reports/timings/chaos-examples.json.
EXAMPLES := examples/plain_ddp/scenarios examples/lightning/scenarios examples/accelerate/scenarios
EXAMPLES_SUITE ?= examples
chaos-examples: setup
	@$(TIMES) start chaos-examples
	$(TIMES) phase chaos-examples "suite $(EXAMPLES_SUITE)" --suite-run reports/$(EXAMPLES_SUITE)/latest -- \
	  $(VENV)/bin/ckpt-chaos run --suite $(EXAMPLES_SUITE) $(addprefix --scenarios ,$(EXAMPLES)) -n $(CHAOS_JOBS) $(CHAOS_FLAGS)
	@$(TIMES) summary chaos-examples

# Training stacks audited in examples/ (docs/analyses/) that make setup leaves out, so that CI neither
# waits for them nor risks another torch: each extra goes into $(VENV) under constraints.txt, which pins
# torch, and torch must still be the release CI runs afterwards. Nightly, through chaos-compat.
STACKS ?= deepspeed,ray
.PHONY: stacks
stacks: setup
	$(PY) -m pip install --quiet -c constraints.txt -e '.[$(STACKS)]' 2>&1 | { grep -v "is ignored" || true; }
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"

# Trainers the probe layer finds hardest (examples/: a Hugging Face Trainer, a safetensors loop with a
# DeepSpeed-style latest pointer, a trainer that reads its checkpoint in C++), each with a planted bug,
# and the stacks (DeepSpeed's own save_checkpoint); the compat suite of every examples/*/scenarios
# folder. Not run by CI.
COMPAT := $(wildcard examples/*/scenarios)
chaos-compat: setup stacks
	$(VENV)/bin/ckpt-chaos run --suite compat $(addprefix --scenarios ,$(COMPAT)) -n $(CHAOS_JOBS) $(CHAOS_FLAGS)

# The idiom matrix (docs/idioms.md): each way of saving and resuming in examples/idioms/ under every fault
# that applies to it, held to the verdict examples/idioms/expect.py declares from the idiom's own calls.
# idioms (nightly): every cell, the table rewritten in IDIOMS_TABLE; idioms-sample: every idiom once and
# every fault kind once. IDIOMS_JOBS: cells side by side (ckpt-chaos run -n). Runs: build/idioms/.
IDIOMS_JOBS  ?= 2
IDIOMS_TABLE ?= docs/idioms.md
.PHONY: idioms idioms-sample
idioms: setup
	$(PY) examples/idioms/matrix.py run -n $(IDIOMS_JOBS) --out build/idioms/full --table $(IDIOMS_TABLE)
idioms-sample: setup
	$(PY) examples/idioms/matrix.py run --sample -n $(IDIOMS_JOBS) --out build/idioms/sample

# ckpt-chaos beside another torch release (nightly, not CI): a second venv, $(COMPAT_VENV), holds torch
# $(COMPAT_TORCH) (the CUDA build on this machine's disk, about 5.5 GB, which runs on the CPU; about 10 GB
# of disk in all) with the Lightning, Accelerate and transformers releases beside it. The ckpt-chaos wheel
# goes in with its core extras and must leave that torch as it is; the plain PyTorch and Lightning
# examples' kill-mid-write and SIGTERM scenarios must give the verdicts they give under $(VENV)'s torch.
# The table: benchmarks/results/compat.md; a verdict that differs fails the target.
COMPAT_VENV       := .venv-compat
COMPAT_TORCH      ?= 2.14.1
COMPAT_FRAMEWORKS ?= lightning==2.6.6 accelerate==1.15.0 transformers==5.24.0
compat: setup
	@if [ ! -x $(COMPAT_VENV)/bin/python ]; then \
	  free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); \
	  if [ "$$free" -lt 12 ]; then echo "make compat: $$free GiB free here; $(COMPAT_VENV) needs about 12" >&2; exit 1; fi; \
	  $(PYTHON) -m venv $(COMPAT_VENV); fi
	$(COMPAT_VENV)/bin/python -m pip install --quiet torch==$(COMPAT_TORCH) $(COMPAT_FRAMEWORKS) 2>&1 | { grep -v "is ignored" || true; }
	$(COMPAT_VENV)/bin/python -c "import torch; assert torch.__version__.split('+')[0] == '$(COMPAT_TORCH)', torch.__version__"
	$(PY) benchmarks/compat.py --venv $(VENV) --venv $(COMPAT_VENV)

# Nightly (hours; .ci/nightly, docs/ci.md): test-full, the full suite, the examples' full and compat
# suites, a 20-minute search seeded by the date, compat; every phase runs, and it fails if any did.
# NIGHTLY_SKIP_COMPAT=1: a compat this machine cannot run (disk, torch wheel) fails nothing.
.PHONY: nightly
nightly:
	CHAOS_JOBS=$(CHAOS_JOBS) COMPAT_VENV=$(COMPAT_VENV) COMPAT_TORCH=$(COMPAT_TORCH) .ci/nightly

# Which lines of the reference trainer's checkpoint path the default suite reaches, every process
# measured; the figures and each unreached line with its reason: benchmarks/results/trainer_coverage.md.
coverage: setup
	$(PY) benchmarks/trainer_coverage.py
	$(PY) benchmarks/report.py --tables

# Benchmarks: apart from the tests, several rounds, medians and ratios; figures kept in benchmarks/results.
bench: setup
	$(PY) benchmarks/launch_phases.py --rounds 5
	$(PY) benchmarks/scenario_cost.py --rounds 3 --explore-s 300
	$(PY) benchmarks/probe_layer.py --rounds 5
	$(PY) benchmarks/storage_stall.py --rounds 5
	$(PY) benchmarks/backend_startup.py --rounds 5
	$(PY) benchmarks/remote_upload.py --rounds 5
	$(PY) benchmarks/slurm_cluster.py --rounds 5 --default-rounds 1 --trainer-rounds 3
	$(PY) benchmarks/slurm_fanout.py --rounds 3
	$(PY) benchmarks/checkpoint_overhead.py --rounds 3
	$(PY) benchmarks/soak_goodput.py --rounds 3
	$(PY) benchmarks/explore_order.py --seeds 40
	$(PY) benchmarks/explore_planted.py --seeds 0 1 2 --budget 600 --shrink 90
	$(PY) benchmarks/audit_time.py --rounds 3
	$(PY) benchmarks/report.py

# Mutation score of the reference trainer's checkpoint path under the default suite (nightly, hours;
# docs/mutation.md). A sample: MUTATION_FLAGS="--files reference_trainer/checkpoint.py --limit 40".
# MUTATION_OPERATORS: core (cosmic-ray's own), checkpoint (ckpt_chaos/mutation/operators.py) or all.
# An example's own train.py under its own scenarios: MUTATION_FLAGS="--example plain_ddp".
MUTATION_FLAGS ?=
MUTATION_OPERATORS ?= core
mutation: setup
	$(PY) -m ckpt_chaos.mutation --operators $(MUTATION_OPERATORS) $(MUTATION_FLAGS)

# The checkpoint operators only: results in benchmarks/results/mutation-checkpoint.md.
.PHONY: mutation-checkpoint
mutation-checkpoint: setup
	$(PY) -m ckpt_chaos.mutation --operators checkpoint $(MUTATION_FLAGS)

clean:
	rm -rf $(VENV) $(COMPAT_VENV) runs .pytest_cache build *.egg-info
