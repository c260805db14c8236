# Everything a user runs goes through this file; each target installs the
# pinned environment into .venv first (only Python 3.11 and pip are needed).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: install train test benchmark clean-venv

# requirements.lock is fully pinned and hashed; TFF 0.87.0 asks for
# jaxlib==0.4.14, which the registry lacks, so the lock was compiled with
# jaxlib overridden to 0.4.13 (see requirements-override.txt) and is
# installed with --no-deps so pip does not re-resolve that pin.
$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# Trains PFedRec on MovieLens-100K with the paper's settings and prints the
# results table. Extra flags: make train ARGS="--rounds=5".
train: $(STAMP)
	$(BIN)/python -m tff_fedrec.programs.train --flagfile=programs/presets/pfedrec_ml100k.flags $(ARGS)

# The whole test suite; .ci/run calls exactly this. Two pytest-xdist
# workers, one per core of the CI machine: most of the time goes to
# subprocesses that import TensorFlow, which one core cannot overlap.
# --dist loadgroup keeps the tests that share a trained run (marked
# xdist_group) on one worker, so that run is trained once.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup $(ARGS)

benchmark: $(STAMP)
	$(BIN)/python -m tff_fedrec.programs.benchmark $(ARGS)

# Regenerates requirements.lock from requirements.in (needs uv on PATH).
lock:
	uv pip compile requirements.in --override requirements-override.txt --python-version 3.11 --generate-hashes --no-header -o requirements.lock

clean-venv:
	rm -rf $(VENV)
