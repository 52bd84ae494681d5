"""The config's `serving` section: an LLM served with Ray Serve LLM on a slice group."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, PositiveInt, field_validator

from infra.config.fields import Name, Strict


class Serving(Strict):
    """An LLM served with Ray Serve LLM (vLLM) on one slice group, as a KubeRay RayService."""

    # A `gs://` path in the environment's bucket (mounted with GCS FUSE) or a Hugging Face model id.
    model: Annotated[str, Field(min_length=1)]
    slice_group: Name
    max_model_len: Annotated[int, Field(ge=16, le=1_048_576)] = 2048
    replicas: PositiveInt = 1
    # The name of a Kubernetes Secret holding HF_TOKEN (a reference only: no token in our files).
    hf_token_secret: Name | None = None
    # An image with vllm-tpu baked in (images/serve.Dockerfile; `make images`, or SERVE_IMAGE=...).
    image: Annotated[str, Field(min_length=1)] | None = None
    # Development only: without an `image`, every replica start pip-installs vllm-tpu (minutes each
    # time). Off by default, so that the RayService of any other environment refuses to run without
    # the serving image (infra.serving.serve_pip).
    pip_install_vllm: bool = False

    @field_validator("model")
    @classmethod
    def _model_reference(cls, value: str) -> str:
        if value.startswith("gs://"):
            if not re.match(r"^gs://[a-z0-9][-_.a-z0-9]{1,61}[a-z0-9](/[^\s]+)+$", value):
                raise ValueError(f"{value!r} is not a gs://BUCKET/PATH to a model directory")
        elif not re.match(r"^[A-Za-z0-9][-_.A-Za-z0-9]*/[-_.A-Za-z0-9]+$", value):
            raise ValueError(f"{value!r} is neither a gs://BUCKET/PATH nor a Hugging Face id like org/name")
        return value

    @property
    def model_bucket(self) -> str | None:
        return self.model[5:].split("/", 1)[0] if self.model.startswith("gs://") else None
