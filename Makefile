# Two entry points for a fresh clone: `make demo` (the main job) and `make test`.
# Both build a local virtual environment in .venv; nothing needs installing by hand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch and torchvision are installed first, as a matched pair (a lone torchvision
# from PyPI does not run beside a different torch build).
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1

.PHONY: demo test test-slow venv browser clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/medclr demo $(ARGS)

# The browser test drives the app in headless Chromium (Debian's chromium + chromium-driver). Installed
# here when missing and we may (root with apt-get); otherwise that one test says how and is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; } || \
	  echo "headless Chromium not installed: the browser test will be skipped (apt-get install chromium chromium-driver)"

# The linter first ([tool.ruff] in pyproject.toml): seconds, and it names the line.
test: venv browser
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=2 $(PY) -m pytest -q --timeout=900 $(ARGS)

test-slow: venv
	OMP_NUM_THREADS=2 $(PY) -m pytest -q -m slow $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
