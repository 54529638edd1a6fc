# lilac — one Makefile for the engine, its tests, sanitizer builds and fuzz targets.
#
#   make            build/lilac (CPU backend; CUDA backend too where nvcc exists)
#   make test       install what the tests need, build everything (also under
#                   ASan+UBSan), run every test, end with "N passed, N failed"
#   make fuzz       libFuzzer targets (clang) in build/fuzz/
#   make NO_CUDA=1  skip the CUDA backend even where nvcc exists

CC      ?= gcc
ifeq ($(origin CC),default)
CC      := gcc
endif
# The CPU backend's matrix kernels choose their ISA at run time (cpuid), whatever CPU_ARCH says;
# the rest of the C is tuned for the machine that builds it. CPU_ARCH= gives a portable x86-64 build.
CPU_ARCH ?= -march=native
OPT     ?= -O2 $(CPU_ARCH)
WERROR  ?= -Werror
CFLAGS  := -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra $(WERROR) -fopenmp -MMD -MP $(EXTRA_CFLAGS)
LDLIBS  := -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -ledit -lm -lpthread -fopenmp

COMMA   := ,
BUILD   ?= build
LIB_SRC := $(filter-out src/cli/main.c,$(wildcard src/*/*.c src/*/*/*.c))
CLI_SRC := src/cli/main.c
TEST_SRC := $(wildcard tests/unit/test_*.c)

# --- CUDA: built only where nvcc exists; never needed for a CPU-only build ---
NVCC    ?= $(shell command -v nvcc 2>/dev/null)
CU_SRC  := $(wildcard src/backend/cuda/*.cu)
ifeq ($(NO_CUDA),1)
NVCC :=
endif
ifneq ($(NVCC),)
ifneq ($(CU_SRC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVFLAGS := -std=c++17 -O3 -g -lineinfo -MMD -MP -Xcompiler -Wall,-Wextra$(if $(WERROR),$(COMMA)-Werror),-fPIC \
           -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90 $(NVEXTRA)
CFLAGS  += -DLILAC_CUDA
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
CU_OBJ  := $(patsubst %.cu,$(BUILD)/%.o,$(CU_SRC))
endif
endif

LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC)) $(CU_OBJ)
TEST_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
# CUDA-vs-CPU tests: built wherever the CUDA backend is (CI compiles them), run on a GPU
# by tools/device/run.sh.
# tests/cuda/test_*.cu: kernel-level tests (include the kernel headers, compare with CPU loops);
# tests/cuda/bench_*.cu: kernel benchmarks (figures for docs/perf.md, no checks).
CUDA_TEST_CU := $(wildcard tests/cuda/test_*.cu tests/cuda/bench_*.cu)
CUDA_TEST_BIN := $(if $(CU_OBJ),$(BUILD)/cuda-tests/test_cuda $(patsubst tests/cuda/%.cu,$(BUILD)/cuda-tests/%,$(CUDA_TEST_CU)))

.PHONY: all test fuzz asan clean deps run emu-tests
all: $(BUILD)/lilac $(TEST_BIN) $(CUDA_TEST_BIN)

$(BUILD)/liblilac.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/lilac: $(BUILD)/src/cli/main.o $(BUILD)/liblilac.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/liblilac.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(BUILD)/liblilac.a $(LDLIBS)

$(BUILD)/cuda-tests/%: tests/cuda/%.c $(BUILD)/liblilac.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(BUILD)/liblilac.a $(LDLIBS)

$(BUILD)/cuda-tests/%: tests/cuda/%.cu $(BUILD)/liblilac.a
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Isrc -o $@ $< $(BUILD)/liblilac.a $(filter-out -fopenmp -L% -lcudart_static,$(LDLIBS)) -Xcompiler -fopenmp

# The CUDA emulator's tests (tests/cuda/emu): kernels of src/backend/cuda run on the CPU, built with g++
# (no nvcc, no GPU); tests/run.sh runs them. test_sample_emu is tests/cuda/test_sample.cu, the GPU test's
# source, on the emulator against the host sampler.
EMU_CXX   ?= g++
EMU_FLAGS := -std=c++20 -O1 -g -pthread -MMD -MP -Itests/cuda/emu -Isrc
EMU_BIN   := $(patsubst tests/cuda/emu/%.cc,$(BUILD)/emu-tests/%,$(wildcard tests/cuda/emu/test_*_emu.cc)) \
             $(BUILD)/emu-tests/test_sample_emu
emu-tests: $(EMU_BIN)

$(BUILD)/emu-tests/%: tests/cuda/emu/%.cc
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_FLAGS) -DLILAC_CUEMU -x c++ $< -lm -o $@

$(BUILD)/emu-tests/test_sample_emu: tests/cuda/test_sample.cu src/backend/cuda/cuda_sample.cu $(BUILD)/src/model/sampler.o \
                                    $(BUILD)/src/util/common.o
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_FLAGS) -ffp-contract=off -x c++ tests/cuda/test_sample.cu -x c++ src/backend/cuda/cuda_sample.cu -x none \
	    $(BUILD)/src/model/sampler.o $(BUILD)/src/util/common.o -lm -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

# Same sources under AddressSanitizer + UBSan (CUDA left out: the sanitizers
# and the CUDA runtime do not mix, and CI has no GPU).
asan:
	$(MAKE) BUILD=build/asan NO_CUDA=1 OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    EXTRA_CFLAGS="-fsanitize=address,undefined" all

# libFuzzer targets: clang only.
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)
FUZZ_BIN := $(patsubst fuzz/%.c,build/fuzz/%,$(FUZZ_SRC))
fuzz: $(FUZZ_BIN)
build/fuzz/%: fuzz/%.c $(LIB_SRC)
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -O1 -g -fsanitize=fuzzer,address,undefined -Wall -Wextra -Werror -fopenmp=libomp \
	    -Isrc -o $@ $< $(filter src/model/%.c src/util/%.c src/chat/content_part.c,$(LIB_SRC)) $(LDLIBS:-fopenmp=-fopenmp=libomp)

deps:
	bash tools/deps.sh

# The main job: build, then run lilac on MODEL (or $$LILAC_MODEL); without one, serve the
# demo model (`lilac demo`, ARGS= passes it serve options, e.g. ARGS="--port 8080").
MODEL ?= $(LILAC_MODEL)
run:
	bash tools/deps.sh --c-only
	$(MAKE) $(BUILD)/lilac
	@if [ -z "$(MODEL)" ]; then \
	    echo "make run: no MODEL= (or LILAC_MODEL): serving the demo model (random weights); make run MODEL=DIR runs the real one"; \
	    exec ./$(BUILD)/lilac demo $(ARGS); fi; \
	./$(BUILD)/lilac info --model "$(MODEL)" && \
	./$(BUILD)/lilac generate --model "$(MODEL)" --prompt "Hello! Who are you?" --chat --no-thinking --max-tokens 32 --timing

test: deps
	$(MAKE) all
	$(MAKE) asan
	$(MAKE) fuzz
	bash tests/run.sh

clean:
	rm -rf build

-include $(LIB_OBJ:.o=.d) $(BUILD)/src/cli/main.d $(EMU_BIN:=.d)
