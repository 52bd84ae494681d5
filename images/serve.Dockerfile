# The project's serving image (the RayService's head and TPU workers): Ray's CPU image plus the vLLM
# TPU engine and Ray Serve LLM's other requirements (images/serve-requirements.txt), and the repo's
# jobs/ and infra/, so no replica pip-installs vLLM at start. vllm-tpu brings its own JAX and libtpu
# (tpu-inference 0.29.0: jax 0.11.0, libtpu 0.0.44), newer than the training image's: serving and
# training are separate Ray clusters. vllm-tpu 0.29.0 ships only a cp312 wheel.
#
#   docker build -f images/serve.Dockerfile --build-arg BASE_IMAGE=rayproject/ray:2.60.0-py312 .
ARG BASE_IMAGE=rayproject/ray:2.60.0-py312
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG BASE_NAME=${BASE_IMAGE}
LABEL org.opencontainers.image.title="ray-tpu-gke serving (Ray Serve LLM + vLLM TPU)" \
      org.opencontainers.image.base.name="${BASE_NAME}" \
      org.opencontainers.image.base.digest="${BASE_IMAGE}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY images/serve-requirements.txt /tmp/ray-tpu-gke/requirements.txt
# Ray stays the base's (its installed version becomes a constraint).
RUN pip list --format=freeze | grep -iE '^ray==' > /tmp/ray-tpu-gke/base-pins.txt \
    && pip install --no-cache-dir -c /tmp/ray-tpu-gke/base-pins.txt -r /tmp/ray-tpu-gke/requirements.txt \
    && python -c "import vllm, ray.serve.llm" \
    && rm -rf /tmp/ray-tpu-gke

WORKDIR /home/ray/ray-tpu-gke
COPY --chown=1000:100 infra ./infra
COPY --chown=1000:100 jobs ./jobs
ENV PYTHONPATH=/home/ray/ray-tpu-gke
