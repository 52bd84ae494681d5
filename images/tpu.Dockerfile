# The project's TPU worker image: Ray's TPU image (Ray, jax[tpu] and the libtpu Ray paired it with)
# plus what the jobs add (images/tpu-requirements.txt = jobs.train.REQUIREMENTS at pyproject's pins)
# and the repo's jobs/ and infra/. Built by `make images` (Cloud Build's images stage), which pulls
# the base tag, resolves it to a digest and builds FROM that digest; both are recorded as labels.
#
#   docker build -f images/tpu.Dockerfile --build-arg BASE_IMAGE=rayproject/ray:2.60.0-py312-tpu .
ARG BASE_IMAGE=rayproject/ray:2.60.0-py312-tpu
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG BASE_NAME=${BASE_IMAGE}
# The JAX series our code and tests run (pyproject.toml's jax pin): the build fails on a base with
# another, rather than ship jobs to a JAX they were never run on.
ARG JAX_SERIES=0.10
LABEL org.opencontainers.image.title="ray-tpu-gke TPU worker" \
      org.opencontainers.image.base.name="${BASE_NAME}" \
      org.opencontainers.image.base.digest="${BASE_IMAGE}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY images/tpu-requirements.txt /tmp/ray-tpu-gke/requirements.txt
# Ray, jax, jaxlib and libtpu stay exactly as the base has them (infra.images.BASE_PINNED): their
# installed versions become constraints, so a requirement that would move one fails here.
RUN python -c "import jax, sys; sys.exit(0 if jax.__version__.startswith('${JAX_SERIES}.') else 'base JAX ' + jax.__version__ + ' is not ${JAX_SERIES}.x')" \
    && pip list --format=freeze | grep -iE '^(ray|jax|jaxlib|libtpu)==' > /tmp/ray-tpu-gke/base-pins.txt \
    && pip install --no-cache-dir -c /tmp/ray-tpu-gke/base-pins.txt -r /tmp/ray-tpu-gke/requirements.txt \
    && rm -rf /tmp/ray-tpu-gke

# The code a RayJob runs without uploading it (a job submitted with a working dir still runs its
# own copy: the working dir comes first on sys.path).
WORKDIR /home/ray/ray-tpu-gke
COPY --chown=1000:100 infra ./infra
COPY --chown=1000:100 jobs ./jobs
ENV PYTHONPATH=/home/ray/ray-tpu-gke
