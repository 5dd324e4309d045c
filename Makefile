# Set-up is two commands: `make demo` and `make test`. Both install what they need.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CACHE ?= $(CURDIR)/.cache
export EAGLEPATCH_TEST_CACHE ?= $(CACHE)

.PHONY: install sshd test test-fast demo demo-server demo-server-stop bench safety-table clean

$(BIN)/eaglepatch: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,plot]'  # plot: the PNG chart tests run too
	@touch $@

install: $(BIN)/eaglepatch

# The end-to-end tests start a real OpenSSH server on 127.0.0.1, and one whose login shell is tcsh; install
# Debian's packages when they are missing.
sshd:
	@if [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/bin/tcsh ]; then \
	  echo "installing openssh-server and tcsh (Debian) for the end-to-end tests" >&2; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server tcsh >/dev/null) \
	  || { echo "could not install them: run 'apt-get install openssh-server tcsh' as root" >&2; exit 1; }; \
	fi

# The tests side by side (pytest-xdist, JOBS workers: most end-to-end tests wait on servers and sshd, not the CPU),
# then the few that measure rates on the CPU alone (marker serial). --dist loadscope: a file is one unit of work, a
# test class one of its own; --no-loadscope-reorder: the units are handed out in the collection's order, the longest
# files first (SLOW_FIRST in tests/e2e/conftest.py), so no long one starts last. On the 2-core machine the side-by-side
# phase took 593 s with 4 workers and 554-636 s with 6, but with 6 two tests that compare the stand-in's timed
# cycles failed in one of three runs (the CPU too contended): 4 it stays (2026-12-07).
JOBS ?= 4
test: install sshd
	$(BIN)/python -m pytest -q -p no:cacheprovider -rs -n $(JOBS) --dist loadscope --no-loadscope-reorder -m 'not serial'
	$(BIN)/python -m pytest -q -p no:cacheprovider -rs -m serial

test-fast: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m 'not e2e and not real'

demo: install
	$(BIN)/python -m eaglepatch.demo

# The tests' stand-in sglang server on this machine (no GPU), with the commands to try against it; ADAPTIVE=1: the
# stand-in of sglang's adaptive worker, for sweep --live.
demo-server: install
	$(BIN)/python tests/stubs/stand_in_sglang/demo_server.py start $(if $(ADAPTIVE),--adaptive)

demo-server-stop:
	$(BIN)/python tests/stubs/stand_in_sglang/demo_server.py stop

bench: install sshd
	$(BIN)/python benchmarks/run_all.py --out docs/benchmarks.md

# docs/safety.md's table of faults, as the crash tests observe them (eaglepatch killed at each step)
safety-table: install sshd
	EAGLEPATCH_SAFETY_TABLE=$(CACHE)/safety-rows.json $(BIN)/python -m pytest -q -p no:cacheprovider tests/e2e/test_crash_safety.py
	$(BIN)/python tests/e2e/safety.py $(CACHE)/safety-rows.json docs/safety.md

clean:
	rm -rf $(VENV) $(CACHE) build *.egg-info
