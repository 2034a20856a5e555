# One-word tasks. `make demo` and `make test` each set up the virtual environment first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-quick bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

# The main job on a generated model: inspect it, run it on the CPU against onnxruntime,
# optimize its layouts (gpu tiles) into an ONNX file, and run that file against onnxruntime.
demo: $(STAMP)
	$(BIN)/python -m tilefold.bench.models mlp --out build/mlp.onnx
	$(BIN)/tilefold inspect build/mlp.onnx
	$(BIN)/tilefold run build/mlp.onnx --compare onnxruntime
	$(BIN)/tilefold optimize build/mlp.onnx --target gpu --check -o build/mlp.gpu.onnx
	$(BIN)/tilefold run build/mlp.gpu.onnx --compare onnxruntime

# pytest runs with --rootdir=tests: the repository root is the package (it has __init__.py),
# and pytest would otherwise import it as a test package, which fails in a clone whose folder
# name is not a Python identifier (e.g. tilefold-main).
PYTEST := $(BIN)/python -m pytest --rootdir=tests

# Everything, the slow model-level tests included (what CI runs); hypothesis derandomized.
test: $(STAMP)
	HYPOTHESIS_PROFILE=ci $(PYTEST) -n 2 -q -m ''

# The quick subset for development: slow model-level tests left out.
test-quick: $(STAMP)
	$(PYTEST) -n 2 -q

bench: $(STAMP)
	$(BIN)/python -m tilefold.bench.cpu_models

clean:
	rm -rf $(VENV) build
