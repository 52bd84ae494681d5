# ray-tpu-gke. `make help` lists the targets. Every target runs `make setup` first (idempotent),
# so on a fresh machine `make demo` and `make test` are the only commands you need.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CHECKOV := .venv-checkov/bin/checkov
ENV ?= dev
STACK = ray-tpu-$(ENV)
CDKTF := npx --no-install cdktf

# cdktf/jsii housekeeping: no Node end-of-life banner, no plugin cache in ~/.terraform.d, and no
# dependence on whatever TF_CLI_CONFIG_FILE points at on this machine.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDKTF_DISABLE_PLUGIN_CACHE_ENV := true
export CHECKPOINT_DISABLE := 1
unexport TF_CLI_CONFIG_FILE

SETUP_STAMPS := $(VENV)/.installed .venv-checkov/.installed node_modules/.installed

.PHONY: serve-setup serve-demo serve-smoke serve-deploy finetune-demo
.PHONY: images rayjob kueue
.PHONY: help setup lint demo test test-fast test-slow test-all synth plan deploy deploy-ci destroy manifests show checkov bench clean \
	credentials apply-manifests submit smoke doctor state-bucket

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  variables: ENV=$(ENV) (one of: $$(ls infra/environments | sed 's/.yaml//' | tr '\n' ' '))"

setup: $(SETUP_STAMPS) ## create .venv, .venv-checkov and node_modules (idempotent)

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[jobs,dev]'
	touch $@

.venv-checkov/.installed: requirements-checkov.txt
	test -x .venv-checkov/bin/python || $(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

serve-setup: ## create .venv-serve (Ray Serve LLM + vLLM on CPU, ~4 GB; idempotent)
	scripts/setup_serve_env.sh

demo: setup ## bring up a simulated v6e 4x4 slice, run healthcheck + train through the Ray Jobs API, tear down
	$(PY) -m jobs.demo

lint: setup ## ruff (lint + format check), mypy on infra/ and jobs/ (config: pyproject.toml), hadolint on the Dockerfiles
	$(VENV)/bin/ruff check infra jobs tests bench scripts
	$(VENV)/bin/ruff format --check infra jobs tests bench scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/hadolint images/tpu.Dockerfile images/serve.Dockerfile ci/builder.Dockerfile

# A Ray driver whose raylet or GCS dies (or that trips one of Ray's own checks) exits at once with
# status 1 and no traceback, so pytest prints no summary: on any failure, print what Ray's
# processes logged before they died (scripts/ray_crash_report.py). PYTHONFAULTHANDLER: a crash after
# pytest's summary (at interpreter exit, where pytest's own faulthandler is off) still prints every
# thread's Python stack.
PYTEST = began=$$(date +%s); PYTHONFAULTHANDLER=1 $(PY) -m pytest $(1) || { status=$$?; $(PY) scripts/ray_crash_report.py $$began; exit $$status; }

test: setup serve-setup lint ## lint, then every test but the slow ones (about 12 minutes on 2 cores)
	$(call PYTEST,-m "not slow")

test-fast: setup ## the tests that need no synth, no Ray cluster and no vLLM (a few minutes)
	$(PY) -m pytest -m "not synth and not cluster and not vllm and not slow"

test-slow: setup serve-setup ## the slow tests alone: whole training runs (with a host killed or wedged, or from an imported model), vLLM end to end, `make demo`, RayJob deadlines and Ctrl-C (tens of minutes)
	$(call PYTEST,-m slow)

test-all: setup serve-setup lint ## lint, then every test
	$(call PYTEST,)

CDKTF_OUT ?= cdktf.out
synth: setup ## synthesize every environment's stack into cdktf.out/ (CDKTF_OUT=dir to move it)
	$(CDKTF) synth --output $(CDKTF_OUT)

plan: setup ## terraform plan for ENV (needs gcloud credentials)
	$(CDKTF) diff $(STACK)

deploy: setup ## cdktf deploy the ENV stack (needs gcloud credentials)
	$(CDKTF) deploy $(STACK)

deploy-ci: setup ## non-interactive deploy (Cloud Build); refuses local state
	@$(PY) -c "from infra.config import load_environment as l; import sys; sys.exit(0 if l('$(ENV)').state_bucket else 'error: $(ENV) has no state_bucket: CI must share state with laptops (set state_bucket in infra/environments/$(ENV).yaml)')"
	$(CDKTF) deploy $(STACK) --auto-approve

destroy: setup ## cdktf destroy the ENV stack
	$(CDKTF) destroy $(STACK)

manifests: setup ## print the ENV manifests: RayCluster, RayService, NetworkPolicies (pipe them to kubectl apply -f -)
	@$(PY) -m infra manifests --env $(ENV)

state-bucket: setup ## create ENV's image repository (Artifact Registry) and Terraform state bucket if missing (once, before the first build and deploy)
	$(PY) -m infra bootstrap --env $(ENV) | bash

# The project's images (images/*.Dockerfile): built FROM Ray's, pushed to the ray-tpu-gke Artifact
# Registry repository, their digests written to build/images/{tpu,serve}.ref. Needs docker and
# `gcloud auth configure-docker`. TPU_IMAGE / SERVE_IMAGE (name@sha256:...) then take the place of
# the config's images in apply-manifests, submit and smoke.
IMAGE_TAG ?= dev
REGISTRY ?=
TPU_IMAGE ?=
SERVE_IMAGE ?=
TPU_IMAGE_ARG = $(if $(TPU_IMAGE),--tpu-image $(TPU_IMAGE))
IMAGE_ARGS = $(TPU_IMAGE_ARG) $(if $(SERVE_IMAGE),--serve-image $(SERVE_IMAGE))
images: setup ## build and push ENV's TPU and serving images (docker; IMAGE_TAG, REGISTRY); their digests go to build/images/
	$(PY) -m infra images --env $(ENV) --tag $(IMAGE_TAG) $(if $(REGISTRY),--registry $(REGISTRY)) | bash

credentials: setup ## kubectl credentials for the ENV cluster (gcloud get-credentials)
	@$(PY) -m jobs.submit --env $(ENV) --print-credentials-command | bash

apply-manifests: credentials ## kubectl apply the ENV ServiceAccount, RayCluster, RayService and NetworkPolicies (TPU_IMAGE, SERVE_IMAGE)
	$(PY) -m infra manifests --env $(ENV) $(IMAGE_ARGS) | kubectl apply -f -

JOB ?= healthcheck
ARGS ?=
SMOKE_TIMEOUT ?= 1800
SUBMIT_TIMEOUT ?= 3600
submit: setup ## submit JOB (healthcheck, train) to ENV's RayCluster, or RAY_ADDRESS; ARGS="..." go to the job
	$(PY) -m jobs.submit $(JOB) --env $(ENV) $(TPU_IMAGE_ARG) -- $(ARGS)

PRIORITY ?=
rayjob: credentials ## run JOB as a RayJob of its own on ENV (queued by Kueue where the config has it, at PRIORITY): apply, follow, exit with the job's status; ARGS go to the job
	$(PY) -m jobs.submit $(JOB) --env $(ENV) $(TPU_IMAGE_ARG) $(if $(PRIORITY),--priority $(PRIORITY)) --rayjob --timeout $(SUBMIT_TIMEOUT) -- $(ARGS)

# Kueue is not a GKE add-on: installed once per cluster from its pinned release (server-side apply:
# its CRDs are too large for the client-side annotation), then the environment's queues.
KUEUE_VERSION := v0.19.2
kueue: credentials ## install Kueue $(KUEUE_VERSION) on ENV's cluster and wait for its controller (once per cluster)
	kubectl apply --server-side -f https://github.com/kubernetes-sigs/kueue/releases/download/$(KUEUE_VERSION)/manifests.yaml
	kubectl wait deploy/kueue-controller-manager -n kueue-system --for=condition=available --timeout=5m

smoke: setup ## healthcheck on the deployed ENV cluster: fails unless the slice is whole
	$(PY) -m jobs.submit healthcheck --env $(ENV) --timeout $(SMOKE_TIMEOUT) $(TPU_IMAGE_ARG)

doctor: setup ## compare the live ENV cluster and node pools with the config
	$(PY) -m infra.doctor --env $(ENV)

SERVE_MODEL := build/serve/trained-llama
serve-demo: setup serve-setup ## train a model on the simulated slice and export it (once), serve it with the real vLLM engine, query it, tear down
	test -f $(SERVE_MODEL)/config.json || $(PY) -m jobs.demo --export $(SERVE_MODEL) --train-steps 60
	.venv-serve/bin/python -m jobs.serve_demo --model-dir $(SERVE_MODEL)

FINETUNED_MODEL := build/serve/finetuned-llama
finetune-demo: setup serve-setup ## fine-tune the model serve-demo exports on the simulated slice (--init-from), export it, serve it with vLLM
	test -f $(SERVE_MODEL)/config.json || $(PY) -m jobs.demo --export $(SERVE_MODEL) --train-steps 60
	$(PY) -m jobs.demo --init-from $(SERVE_MODEL) --export $(FINETUNED_MODEL) --train-steps 20
	.venv-serve/bin/python -m jobs.serve_demo --model-dir $(FINETUNED_MODEL)

serve-smoke: setup serve-setup ## query ENV's deployed RayService (OpenAI API) through a port-forward
	.venv-serve/bin/python -m jobs.serve_smoke --env $(ENV)

serve-deploy: credentials ## upload infra/ and jobs/ to ENV's bucket, then apply the manifests (incl. the RayService)
	$(PY) -m jobs.serve --env $(ENV) --print-code-sync | bash
	$(PY) -m infra manifests --env $(ENV) $(IMAGE_ARGS) | kubectl apply -f -

show: setup ## summarise what ENV declares
	@$(PY) -m infra show --env $(ENV) $(IMAGE_ARGS)

checkov: synth ## checkov on every synthesized stack (justified skips: infra/checkov_scan.py)
	$(PY) -m infra.checkov_scan $(CDKTF_OUT) $(CHECKOV)

bench: setup serve-setup ## benchmarks: synth vs bare provider import, jobs vs bare JAX/Ray (and Ray Train's floor), a lost host's recovery, real text vs synthetic, checkpoint stall, HF import vs bare read, the 1b step exported for TPU and its remat FLOPs, Ray Serve LLM vs vllm serve (vLLM's own client), jobs.batch vs vllm.LLM.generate and its rerun, GPU MFU sweep
	$(PY) bench/synth_bench.py
	$(PY) bench/jobs_bench.py
	$(PY) bench/restart_bench.py
	$(PY) bench/checkpoint_bench.py
	$(PY) bench/import_bench.py
	$(PY) bench/step_export_bench.py
	@if command -v nvidia-smi >/dev/null 2>&1; then $(PY) bench/gpu_mfu.py; \
	else echo "gpu bench: no NVIDIA GPU here (bench/gpu_mfu.py: the 1b step's MFU, change by change, where there is one)"; fi
	.venv-serve/bin/python bench/serve_bench.py
	.venv-serve/bin/python bench/batch_bench.py
	.venv-serve/bin/python bench/batch_bench.py --model-size small
	.venv-serve/bin/python bench/batch_bench.py --model-size small --prompts 8192

clean: ## remove build outputs (keeps the venvs)
	rm -rf cdktf.out build .pytest_cache
