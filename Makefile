# gaugebook: build the book and run every test from a fresh machine with only Python 3 (and npm).
#
#   make book   set up .venv if needed, execute every notebook (CPU) and build _build/html
#   make test   set up .venv if needed, then: unit tests, the strict book build from a clean
#               _build (it executes every notebook and fails on any cell that raises), the
#               headless-Chromium check of the pages, and the release artefacts (sdist and wheel
#               built, checked by twine), two chapters of the Colab edition run as in Colab
#               (test-colab), and Binder's install steps in a fresh virtual environment
#               (test-binder)
#   make test-notebooks  only run every notebook under nbval, two at a time (about 4 min): the
#               quick check while editing chapters; make test leaves it out, because its strict
#               build executes every notebook anyway
#   make test-roundoff  test-notebooks twice more, with ATen's AVX2 and its generic (unvectorised)
#               CPU kernels (about 10 min): a chapter's statement that holds only with one
#               processor's round-off fails here before CI lands on another processor
#   make colab  write the Colab edition book/colab/ from the executed book in _build (after
#               `make book` or `make test`)
#
# The set-up is stamped (.venv/.installed, _vendor/.installed): re-running only redoes what changed.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.NOTPARALLEL:

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is installed first and alone, pinned, so that nothing resolves an unpinned (CUDA) build.
# On a machine without the local CPU wheel, add e.g.
#   TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_VERSION := 2.13.0
TORCH := torch==$(TORCH_VERSION)
TORCH_PIP_ARGS ?=
CONSTRAINTS := .ci/requirements.txt
VENV_STAMP := $(VENV)/.installed

# JavaScript that the rendered book serves itself (see _config.yml: html_extra_path, mathjax_path,
# nb_ipywidgets_js). Only these files are copied out of node_modules.
VENDOR := _vendor
VENDOR_STAMP := $(VENDOR)/.installed
MATHJAX := node_modules/mathjax
# MathJax 4's font (a package of its own): tex-chtml.js holds its metrics, the pages load its
# woff2 files and the glyph ranges it loads on demand from mathjax/fonts/ (the pages' MathJax
# configuration, _config.yml, points `loader.paths.fonts` there instead of a CDN).
MATHJAX_FONT := node_modules/@mathjax/mathjax-newcm-font
WIDGETS := node_modules/@jupyter-widgets/html-manager/dist

# matplotlib's own configuration and font cache for every command here: a cache that another
# matplotlib wrote (it is shared per user, keyed by a version that releases share) can lack this
# one's bundled fonts, and then figures set their math in a fallback font and every page prints
# "findfont" warnings.
export MPLCONFIGDIR := $(CURDIR)/$(VENV)/mplconfig

# Two workers on two cores: one BLAS thread each, or the notebooks fight over the cores.
PARALLEL_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

HTML_INDEX := _build/html/index.html

.PHONY: help venv assets book colab test test-unit test-notebooks test-roundoff test-book \
	test-rendered test-package test-colab test-binder clean distclean

help:
	@echo "make book   build the rendered book (executes every notebook on CPU): $(HTML_INDEX)"
	@echo "make test   unit tests, strict book build (executes every notebook), headless-Chromium check,"
	@echo "            sdist and wheel (python -m build, twine check), Colab simulation (test-colab)"
	@echo "            and Binder's install steps in a fresh venv (test-binder)"
	@echo "make test-notebooks  only run every notebook (nbval, two at a time; make test's build also does)"
	@echo "make test-roundoff   test-notebooks with ATen's AVX2 kernels, then with its generic ones"
	@echo "make colab  write the Colab edition (book/colab/) from the executed book in _build"
	@echo "make venv   only set up $(VENV) (python3 -m venv; pinned torch; -e \".[book,dev,kernels]\")"
	@echo "make assets only copy MathJax and the widget embedder into $(VENDOR)/ (npm ci)"
	@echo "make clean  remove _build, $(VENDOR), dist and build; make distclean also removes $(VENV), node_modules"

# --- set-up -----------------------------------------------------------------------------------

venv: $(VENV_STAMP)

$(VENV_STAMP): pyproject.toml $(CONSTRAINTS)
	@start=$$(date +%s); \
	echo "Setting up $(VENV): $(TORCH) first, then -e \".[book,dev,kernels]\" pinned by $(CONSTRAINTS)"; \
	if [ ! -x $(BIN)/python ]; then $(PYTHON) -m venv $(VENV); fi; \
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) $(TORCH_PIP_ARGS) "$(TORCH)"; \
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e ".[book,dev,kernels]"; \
	$(BIN)/python -c "import torch; assert torch.__version__.split('+')[0] == '$(TORCH_VERSION)', torch.__version__"; \
	touch $@; \
	echo "[time] set up $(VENV): $$(( $$(date +%s) - start )) s"

assets: $(VENDOR_STAMP)

node_modules/.package-lock.json: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is required (Debian: apt-get install npm)" >&2; exit 1; }
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error

$(VENDOR_STAMP): node_modules/.package-lock.json Makefile
	rm -rf $(VENDOR)
	mkdir -p $(VENDOR)/mathjax/input/tex $(VENDOR)/mathjax/fonts/mathjax-newcm-font $(VENDOR)/jupyter-widgets
	cp $(MATHJAX)/tex-chtml.js $(VENDOR)/mathjax/
	cp -r $(MATHJAX)/input/tex/extensions $(VENDOR)/mathjax/input/tex/
	cp -r $(MATHJAX_FONT)/chtml $(VENDOR)/mathjax/fonts/mathjax-newcm-font/
	cp -r $(MATHJAX)/ui $(MATHJAX)/a11y $(MATHJAX)/sre $(VENDOR)/mathjax/
	cp $(MATHJAX)/LICENSE $(VENDOR)/mathjax/
	cp node_modules/requirejs/require.js $(VENDOR)/require.js
	cp $(WIDGETS)/embed-amd.js $(WIDGETS)/*.woff2 $(VENDOR)/jupyter-widgets/
	printf '%s\n' "Third-party JavaScript served by the rendered book (copied by 'make assets'):" \
	  "mathjax $$(node -p 'require("./node_modules/mathjax/package.json").version') (Apache-2.0)" \
	  "@mathjax/mathjax-newcm-font $$(node -p 'require("./node_modules/@mathjax/mathjax-newcm-font/package.json").version') (Apache-2.0)" \
	  "requirejs $$(node -p 'require("./node_modules/requirejs/package.json").version') (MIT)" \
	  "@jupyter-widgets/html-manager $$(node -p 'require("./node_modules/@jupyter-widgets/html-manager/package.json").version') (BSD-3-Clause)" \
	  > $(VENDOR)/THIRD_PARTY.txt
	touch $@

# --- the book ---------------------------------------------------------------------------------

book: $(VENV_STAMP) $(VENDOR_STAMP)
	@start=$$(date +%s); \
	$(BIN)/jupyter-book build --all .; \
	echo "[time] book build: $$(( $$(date +%s) - start )) s"; \
	echo "The book: $(CURDIR)/$(HTML_INDEX)"

# The Colab edition: one notebook per chapter, MyST turned into what Colab renders, glued values
# and figures written in from the build (see .ci/colab_edition.py). It reads _build, so run it
# after `make book` or `make test`; tests/test_colab_edition.py fails when it is stale.
colab: $(VENV_STAMP)
	@start=$$(date +%s); \
	$(BIN)/python .ci/colab_edition.py --build _build --out book/colab; \
	echo "[time] Colab edition: $$(( $$(date +%s) - start )) s"

# --- tests ------------------------------------------------------------------------------------

test: test-unit test-book test-rendered test-package test-colab test-binder
	@echo "All tests passed."

test-unit: $(VENV_STAMP)
	@start=$$(date +%s); \
	$(PARALLEL_ENV) $(BIN)/pytest -n 2 tests/; \
	echo "[time] unit tests: $$(( $$(date +%s) - start )) s"

test-notebooks: $(VENV_STAMP)
	@start=$$(date +%s); \
	$(PARALLEL_ENV) $(BIN)/pytest --nbval-lax --nbval-current-env -n 2 --dist loadfile book/; \
	echo "[time] notebooks (nbval): $$(( $$(date +%s) - start )) s"

# ATEN_CPU_CAPABILITY picks the kernels ATen dispatches to (avx512, avx2, default), so one
# machine can reproduce the round-off of others.
test-roundoff: $(VENV_STAMP)
	@for kernels in avx2 default; do \
		echo "== notebooks with ATEN_CPU_CAPABILITY=$$kernels"; \
		ATEN_CPU_CAPABILITY=$$kernels $(MAKE) --no-print-directory test-notebooks; \
	done

test-book: $(VENV_STAMP) $(VENDOR_STAMP)
	@start=$$(date +%s); \
	rm -rf _build; \
	$(BIN)/jupyter-book build . -W -n --keep-going; \
	echo "[time] strict book build: $$(( $$(date +%s) - start )) s"

test-rendered: $(VENV_STAMP)
	@start=$$(date +%s); \
	$(BIN)/python .ci/check_rendered.py _build/html; \
	echo "[time] rendered-page check: $$(( $$(date +%s) - start )) s"

# The release artefacts: sdist and wheel into dist/, their metadata checked as PyPI would, and the
# wheel must ship py.typed and carry the version of gaugebook/__init__.py (its one source).
# setuptools' build/ goes first: files left in build/lib from an earlier build would be packed.
test-package: $(VENV_STAMP)
	@start=$$(date +%s); \
	rm -rf dist build; \
	$(BIN)/python -m build --outdir dist . > dist.log 2>&1 || { cat dist.log; exit 1; }; \
	rm -rf build; \
	rm -f dist.log; \
	$(BIN)/twine check --strict dist/*; \
	version=$$($(BIN)/python -c "import gaugebook; print(gaugebook.__version__)"); \
	wheel=dist/gaugebook-$$version-py3-none-any.whl; \
	$(BIN)/python -m zipfile -l $$wheel | grep "gaugebook/py.typed" >/dev/null \
	  || { echo "$$wheel lacks gaugebook/py.typed" >&2; exit 1; }; \
	echo "[time] sdist and wheel of gaugebook $$version: $$(( $$(date +%s) - start )) s"

# Two Colab-edition chapters (one per Part, one reading results/) run as in Colab: a fresh venv
# with Colab's preinstalled packages, the install cell's Colab branch taken, the release
# installed from this clone as it would be from GitHub, outside the repository.
test-colab: $(VENV_STAMP)
	@start=$$(date +%s); \
	$(PARALLEL_ENV) TORCH_PIP_ARGS="$(TORCH_PIP_ARGS)" $(BIN)/python .ci/colab_simulation.py; \
	echo "[time] Colab simulation: $$(( $$(date +%s) - start )) s"

# Binder's install steps (environment.yml's pip section, then postBuild) in a fresh virtual
# environment that sees no other site-packages; every public module must import (about 2 min).
test-binder: $(VENV_STAMP)
	@start=$$(date +%s); \
	GAUGEBOOK_BINDER_TEST=1 TORCH_PIP_ARGS="$(TORCH_PIP_ARGS)" $(PARALLEL_ENV) \
	  $(BIN)/pytest -q tests/test_binder.py -k fresh_venv; \
	echo "[time] Binder install in a fresh venv: $$(( $$(date +%s) - start )) s"

# --- cleaning ---------------------------------------------------------------------------------

clean:
	rm -rf _build $(VENDOR) dist build

distclean: clean
	rm -rf $(VENV) node_modules
