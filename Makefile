# The two commands of the README: `make run` and `make test`. Each sets up .venv first if needed.
VENV := .venv
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: run test lint benchmark doctor docs model-matrix check-results gpu-extras gpu-check clean-env

run: $(STAMP)
	$(VENV)/bin/python binaries/train.py --flagfile=configs/default_run.flags $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadgroup --durations=15 tests $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check tff_clustered binaries tests examples scripts

benchmark: $(STAMP)
	$(VENV)/bin/python binaries/benchmark.py $(ARGS)

doctor: $(STAMP)
	$(VENV)/bin/python binaries/doctor.py $(ARGS)

# The documentation's tables that come from the code: docs/options.md and docs/algorithms.md's
# algorithm table (tests/test_docs.py checks that they are up to date).
docs: $(STAMP)
	$(VENV)/bin/python binaries/docs_tables.py $(ARGS)

# Every algorithm for one round with every model, on tiny data (tens of minutes on 2 cores).
model-matrix: $(STAMP)
	$(VENV)/bin/python binaries/model_matrix.py $(ARGS)

# Do the committed tables under results/ still reproduce? One cell of each, seed 0.
check-results: $(STAMP)
	$(VENV)/bin/python binaries/check_results.py $(ARGS)

$(STAMP): requirements/lock.txt setup.cfg scripts/bootstrap.sh
	bash scripts/bootstrap.sh

# Opt-in: TensorFlow's CUDA libraries, for --execution=in_process on an NVIDIA GPU (several GB).
gpu-extras: $(STAMP)
	$(VENV)/bin/python -m pip install -c requirements/lock.txt -r requirements/gpu.txt

# Does --execution=in_process train on the GPU, and how much faster than on the CPU?
gpu-check: $(STAMP)
	$(VENV)/bin/python binaries/gpu_check.py $(ARGS)

clean-env:
	rm -rf $(VENV)
