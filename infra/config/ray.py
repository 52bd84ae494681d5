"""The config's `ray` section: versions and images, the namespace and service account, the head's
size, what every job adds, and who may reach the clusters."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from infra import catalog
from infra.config.fields import Image, LabelKey, LabelValue, Name, Quantity, Strict


class RayHead(Strict):
    cpu: Quantity = "4"
    memory: Quantity = "16Gi"


TPU_PYTHON = "py312"  # Ironwood's jax[tpu] needs Python >= 3.12; every Ray node runs one Python


class Peer(Strict):
    """Pods let in: every pod of `namespace`, the pods of the Ray namespace with `pod_labels`, or the
    pods with `pod_labels` in `namespace`."""

    namespace: Name | None = None
    pod_labels: dict[LabelKey, LabelValue] = {}

    @model_validator(mode="after")
    def _names_someone(self) -> Peer:
        if self.namespace is None and not self.pod_labels:
            raise ValueError("a peer needs a namespace, pod_labels or both, e.g. {namespace: ci} or {pod_labels: {app: gateway}}")
        return self


class RayAccess(Strict):
    """Who may reach the Ray clusters (infra.manifests.network_policy, README "Access")."""

    # `token`: Ray token authentication, the token in a Secret the KubeRay operator creates.
    auth: Literal["token"] = "token"
    # Pods allowed to the dashboard / Jobs API (8265) and Ray Client (10001). Default none:
    # `kubectl port-forward` (which network policies do not block) is the way in.
    dashboard_from: list[Peer] = []
    # Pods allowed to Ray Serve's HTTP port (8000), which Ray's token does not cover.
    serve_from: list[Peer] = []
    # A self-installed KubeRay operator's namespace. Default (None): the GKE add-on's operator,
    # which GKE hosts; its requests come from the control plane.
    operator_namespace: Name | None = None


class RayConfig(Strict):
    version: Annotated[str, Field(pattern=r"^2\.\d+\.\d+$")] = "2.60.0"
    # The head's image (CPU only).
    image: Image = "rayproject/ray:2.60.0-py312"
    # TPU worker images per generation, with jax[tpu] and libtpu in them. Default: Ray's prebuilt
    # TPU image, rayproject/ray:<version>-py312-tpu (jax 0.10 and libtpu, optax, orbax).
    tpu_images: dict[str, Image] = {}
    namespace: Name = "default"
    kubernetes_service_account: Name = "ray"
    head: RayHead = RayHead()
    # What every submitted job adds to the image (`make submit`): pip requirements and env vars.
    job_pip: list[Annotated[str, Field(min_length=1)]] = []
    job_env_vars: dict[Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")], str] = {}
    access: RayAccess = RayAccess()

    @field_validator("job_env_vars")
    @classmethod
    def _no_auth_in_jobs(cls, env_vars: dict[str, str]) -> dict[str, str]:
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            if key in env_vars:
                raise ValueError(f"{key} must not be set here: every Ray container gets the token from the cluster's Secret")
        return env_vars

    @field_validator("tpu_images")
    @classmethod
    def _known_generations(cls, images: dict[str, str]) -> dict[str, str]:
        return {catalog.generation(name).name: image for name, image in images.items()}

    @model_validator(mode="after")
    def _image_matches_version(self) -> RayConfig:
        for field, image in (("image", self.image), *((f"tpu_images.{g}", i) for g, i in self.tpu_images.items())):
            tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
            if image.startswith("rayproject/ray") and tag and not tag.startswith(self.version):
                raise ValueError(f"{field} {image!r} does not match version {self.version}: use rayproject/ray:{self.version}-...")
        return self

    @property
    def default_worker_image(self) -> str:
        """Ray's TPU image for this version: the base of the project's TPU image (infra.images)."""
        return f"rayproject/ray:{self.version}-{TPU_PYTHON}-tpu"

    def worker_image(self, generation: str) -> str:
        return self.tpu_images.get(generation) or self.default_worker_image
