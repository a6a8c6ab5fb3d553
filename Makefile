# Two entry points, both of which set up .venv on first use:
#   make run    the main job (until the engine lands: the head-rollout benchmark on CPU)
#   make test   the whole test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Development torch: the CUDA 13.0 build, matching nvcc 13.0, so the CUDA kernels compile.
TORCH_SPEC ?= torch==2.14.1
BUILD_DEPS := scikit-build-core pybind11 cmake ninja numpy
TEST_DEPS := pytest hypothesis scipy
SOURCES := $(shell find csrc python -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \)) \
           CMakeLists.txt pyproject.toml

.PHONY: run test bench clean

$(VENV)/.deps:
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)" $(BUILD_DEPS) $(TEST_DEPS)
	@touch $@

# Non-editable install against the venv's torch; build/ keeps objects between rebuilds.
$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PIP) install -q --no-build-isolation --no-deps .
	@touch $@

run: $(VENV)/.installed
	$(PY) benchmarks/bench_head.py --quick

test: $(VENV)/.installed
	$(PY) -m pytest tests -q

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_head.py

clean:
	rm -rf build $(VENV)/.installed
