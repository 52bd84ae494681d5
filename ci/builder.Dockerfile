# The Cloud Build builder: every tool a stage needs, pinned here and nowhere else.
# Built by the first step of cloudbuild.yaml (cached), then used by every other step.
# The docker CLI for the images stage (`make images`): Cloud Build gives every step the host's
# docker daemon; only the client is needed here.
FROM docker:27.5.1-cli AS docker-cli

FROM python:3.11-slim-bookworm

ARG TERRAFORM_VERSION=1.9.8
ARG NODE_MAJOR=20
# cdktf-cli itself is pinned by package.json / package-lock.json (0.21.0), installed with `npm ci`.

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Debian's package versions move with the point release, and the builder is rebuilt on a cache miss
# only: pinning each would break the build at the next point release.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends \
        ca-certificates curl gnupg make git unzip \
    && curl -fsSL https://deb.nodesource.com/setup_${NODE_MAJOR}.x | bash - \
    && echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt cloud-sdk main" \
        > /etc/apt/sources.list.d/google-cloud-sdk.list \
    && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
    && apt-get update && apt-get install -y --no-install-recommends \
        nodejs google-cloud-cli kubectl google-cloud-cli-gke-gcloud-auth-plugin \
    && curl -fsSLo /tmp/tf.zip https://releases.hashicorp.com/terraform/${TERRAFORM_VERSION}/terraform_${TERRAFORM_VERSION}_linux_amd64.zip \
    && unzip /tmp/tf.zip -d /usr/local/bin && rm /tmp/tf.zip \
    && rm -rf /var/lib/apt/lists/*

COPY --from=docker-cli /usr/local/bin/docker /usr/local/bin/docker

ENV JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 \
    CDKTF_DISABLE_PLUGIN_CACHE_ENV=true \
    CHECKPOINT_DISABLE=1
