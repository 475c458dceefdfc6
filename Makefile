# make setup: .venv with torch (the CPU wheel: a looser spec pulls a CUDA build) and every extra
# (torch, hf, notebooks, dev). Two commands for a fresh machine: make lab (open the kit), make test (run
# every test); both run make setup first.
# make test-upstream: loadkit against vLLM 0.34.0 and 0.28.0 (their own code; fetches the wheels once).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.loadkit-installed
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: lab test test-deep test-upstream upstream-drift setup lint data clean notebooks

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[torch,hf,notebooks,dev]'
	touch $@

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg \
		--ignore=tests/upstream tests notebooks
	$(BIN)/python tests/upstream/fetch.py --version 0.34.0
	$(BIN)/python -m pytest -m fast_upstream tests/upstream

# The wheel is cached outside the repo (tests/upstream/fetch.py); no index fails it, never skips.
test-upstream: $(STAMP)
	$(BIN)/python tests/upstream/fetch.py
	$(BIN)/python -m pytest tests/upstream

# make upstream-drift VLLM=X.Y.Z [SINCE=A.B.C]: which upstream functions loadkit mirrors changed
# since the pinned reference (or SINCE), then the differential suite against X.Y.Z, counted
# per property (tests/upstream/drift.py; docs/fidelity.md).
upstream-drift: $(STAMP)
	@test -n "$(VLLM)" || { echo "make upstream-drift: say which release, VLLM=X.Y.Z" >&2; exit 2; }
	$(BIN)/python tests/upstream/drift.py $(VLLM) $(if $(SINCE),--since $(SINCE),)

# make test's property tests with random seeds and ten times the examples (tests/conftest.py).
# pytest's exit 5 (nothing collected) is an error here, not a silent pass.
test-deep: $(STAMP)
	$(BIN)/python -m pytest --hypothesis-profile=deep -m hypothesis --ignore=tests/upstream tests; \
	status=$$?; \
	if [ $$status = 5 ]; then echo "make test-deep: no property tests collected" >&2; exit 1; fi; \
	exit $$status

# Execute the notebooks in place (NB=01_pooling_probe.ipynb for one), then drop the widget views
# that have no saved state, so readers without a kernel see each chart's picture.
NB ?= $(notdir $(wildcard notebooks/*.ipynb))
notebooks: $(STAMP)
	cd notebooks && for nb in $(NB); do \
	  ../$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.store_widget_state=False $$nb || exit 1; done
	$(BIN)/python -m loadkit_notebooks.saved $(addprefix notebooks/,$(NB))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV)
