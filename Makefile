# Two entry points for a fresh clone: `make demo` (the main job) and `make test`.
# Both build a local virtual environment in .venv; nothing needs installing by hand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch and torchvision are installed first, as a matched pair (a lone torchvision
# from PyPI does not run beside a different torch build).
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1

.PHONY: demo test test-slow venv clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/medclr demo $(ARGS)

test: venv
	OMP_NUM_THREADS=2 $(PY) -m pytest -q --timeout=900 $(ARGS)

test-slow: venv
	OMP_NUM_THREADS=2 $(PY) -m pytest -q -m slow $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
