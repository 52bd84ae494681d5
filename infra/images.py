"""The images the Ray pods run: Ray's published images (facts, with their sources) and the project's
own two images built FROM them (`images/tpu.Dockerfile`, `images/serve.Dockerfile`), where they are
pushed, and the script that builds them (`python -m infra images --env ENV | bash`, `make images`).

Why our own images: Ray's TPU image carries Ray, jax[tpu] and libtpu, paired by Ray's release, but
not what the jobs add (`jobs.train.REQUIREMENTS`: Orbax, tokenizers, safetensors, gcsfs), which a
runtime env would otherwise pip-install on every host at every start (minutes, and PyPI reachable
from private nodes just when a preempted job restarts). The TPU image adds exactly those, at the
repo's pins, and never reinstalls Ray or JAX over the base's pairing (the Dockerfile installs under
constraints read from the base itself); the serve image adds vllm-tpu and Ray Serve LLM's other
requirements to Ray's CPU image, as the RayService's runtime env would at every replica start.

Both go to the Artifact Registry repository `ray-tpu-gke` (cloudbuild.yaml's builder image lives
there too), which `python -m infra bootstrap` creates before the first build: Cloud Build's first
step pushes to it, before any Terraform runs.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from infra.platform_facts import Source

READ_ON = "2026-12-04"
ARTIFACT_REPOSITORY = "ray-tpu-gke"
TPU_IMAGE = "ray-tpu"  # the project's TPU worker image, in ARTIFACT_REPOSITORY
SERVE_IMAGE = "ray-serve-tpu"  # the project's serving image (RayService head and workers)
TPU_DOCKERFILE = "images/tpu.Dockerfile"
SERVE_DOCKERFILE = "images/serve.Dockerfile"
TPU_REQUIREMENTS_FILE = "images/tpu-requirements.txt"
SERVE_REQUIREMENTS_FILE = "images/serve-requirements.txt"
BUILD_DIR = "build/images"  # where the build writes each image's pushed reference (name@sha256:...)

RAY_RELEASE_PAGE = Source(
    "ray-project/ray release 2.60.0 (wheel ray/_version.py commit b7f4259e944bf6959f721b106adc366ddfa0c356); "
    "TPU images: PR #61175 (`push_ray_image --platform tpu`, tags `<version>-py3XY-tpu`), #62113 reverted by "
    "#62346 (2026-04-04: TPU images for every Python again), python/deplocks/base_deps/ray_base_deps_tpu_py3.{10,11,12,13}.lock",
    "https://github.com/ray-project/ray/pull/62346",
    READ_ON,
)
RAY_TPU_LOCK = Source(
    "ray-project/ray python/deplocks/base_deps/ray_base_deps_tpu_py3.12.lock (newest stored version, commit 01624ad4, "
    "after PR #63006 raised jax[tpu] to >= 0.8.2 for Ironwood; the 2.60.0 tag itself could not be read here)",
    "https://github.com/ray-project/ray/pull/63006",
    READ_ON,
)


@dataclass(frozen=True)
class RayRelease:
    """What one Ray release publishes as images, and what its TPU images carry."""

    version: str
    cpu_pythons: tuple[str, ...]  # rayproject/ray:<version>-py3XY (CPU)
    tpu_pythons: tuple[str, ...]  # rayproject/ray:<version>-py3XY-tpu
    tpu_packages: tuple[tuple[str, str], ...]  # (package, version) pinned in the TPU images' lock
    source: Source
    packages_source: Source

    def tpu_package(self, name: str) -> str:
        return dict(self.tpu_packages)[name]


RAY_RELEASES: dict[str, RayRelease] = {
    r.version: r
    for r in (
        RayRelease(
            "2.60.0",
            cpu_pythons=("3.10", "3.11", "3.12", "3.13"),
            tpu_pythons=("3.10", "3.11", "3.12", "3.13"),
            tpu_packages=(
                ("jax", "0.10.0"),
                ("jaxlib", "0.10.0"),
                ("libtpu", "0.0.40"),
                ("optax", "0.2.8"),
                ("orbax-checkpoint", "0.11.36"),
                ("flax", "0.12.7"),
            ),
            source=RAY_RELEASE_PAGE,
            packages_source=RAY_TPU_LOCK,
        ),
    )
}

# The base image's packages that our images never replace: Ray, and JAX with the libtpu Ray paired
# it with. The Dockerfiles read their installed versions and install everything else under them as
# pip constraints, so a requirement that would move one fails the build instead.
BASE_PINNED = ("ray", "jax", "jaxlib", "libtpu")
_RAYPROJECT = re.compile(r"^(docker\.io/)?rayproject/ray:(?P<tag>[^@]+)(@sha256:[0-9a-f]{64})?$")
_TAG = re.compile(r"^(?P<version>\d+\.\d+\.\d+)(-py(?P<py>3\d+))?(?P<variant>(-[a-z0-9]+)*)$")
# Our own images, by name wherever they were pushed: an image named ray-tpu in a repository named
# ray-tpu-gke was built from images/tpu.Dockerfile and carries the jobs' requirements.
_PROJECT_TPU_IMAGE = re.compile(rf"^[^/]+/[^/]+/{ARTIFACT_REPOSITORY}/{TPU_IMAGE}[:@]")


# The form of a reference to it, for errors.
PROJECT_TPU_IMAGE_FORM = (
    f"<registry>/{ARTIFACT_REPOSITORY}/{TPU_IMAGE}:<tag> or <registry>/{ARTIFACT_REPOSITORY}/{TPU_IMAGE}@sha256:<digest>, "
    f"e.g. us-docker.pkg.dev/PROJECT/{ARTIFACT_REPOSITORY}/{TPU_IMAGE}:dev (`make images` writes the digest to build/images/tpu.ref)"
)


_PROJECT_SERVE_IMAGE = re.compile(rf"^[^/]+/[^/]+/{ARTIFACT_REPOSITORY}/{SERVE_IMAGE}[:@]")
PROJECT_SERVE_IMAGE_FORM = (
    f"<registry>/{ARTIFACT_REPOSITORY}/{SERVE_IMAGE}:<tag> or <registry>/{ARTIFACT_REPOSITORY}/{SERVE_IMAGE}@sha256:<digest>, "
    f"e.g. us-docker.pkg.dev/PROJECT/{ARTIFACT_REPOSITORY}/{SERVE_IMAGE}:dev (`make images` writes the digest to build/images/serve.ref)"
)


def is_project_serve_image(image: str) -> bool:
    """Whether `image` is the project's serving image (images/serve.Dockerfile: vLLM, Ray Data's LLM
    processor and the repo's code), which batch inference runs in."""
    return bool(_PROJECT_SERVE_IMAGE.match(image))


def is_project_tpu_image(image: str) -> bool:
    """Whether `image` is the project's TPU image (which carries `jobs.train.REQUIREMENTS`)."""
    return bool(_PROJECT_TPU_IMAGE.match(image))


def published(image: str) -> str | None:
    """None when `image` is not Ray's, or a Ray image tag that Ray's release publishes; else one
    sentence saying which tags of that release exist. A Ray version not read here is not checked."""
    match = _RAYPROJECT.match(image)
    if not match:
        return None
    tag = _TAG.match(match["tag"])
    if not tag:
        return f"{image} is not a Ray release tag (rayproject/ray:<version>-py3XY[-tpu])"
    release = RAY_RELEASES.get(tag["version"])
    if release is None:
        return None
    variant = tag["variant"] or ""
    py = tag["py"]
    pythons = release.tpu_pythons if variant == "-tpu" else release.cpu_pythons
    if variant not in ("", "-tpu", "-cpu"):
        return None  # the GPU variants (-cu128, ...) are not this repo's business
    tags = ", ".join(f"{release.version}-py{p.replace('.', '')}{variant}" for p in pythons)
    if py is None:
        # Ray's unsuffixed tags are its default Python (3.10), which TPU7x's jax[tpu] cannot run.
        return f"{image} names no Python; Ray {release.version} publishes {tags} (source: {release.source.cite()})"
    python = f"{py[0]}.{py[1:]}"
    if python not in pythons:
        return f"Ray {release.version} publishes no {image.rsplit(':', 1)[-1]} image; it publishes {tags} (source: {release.source.cite()})"
    return None


def registry_location(region: str) -> str:
    """Artifact Registry's multi-region for a GKE region: nodes pull from their own continent."""
    for prefix in ("us", "europe", "asia"):
        if region.startswith(prefix + "-"):
            return prefix
    return region


def registry(project: str, region: str) -> str:
    """`<location>-docker.pkg.dev/<project>/ray-tpu-gke`, where both images (and the builder) go."""
    return f"{registry_location(region)}-docker.pkg.dev/{project}/{ARTIFACT_REPOSITORY}"


def repository_command(project: str, region: str) -> str:
    """The bootstrap line that creates the Artifact Registry repository when it is missing."""
    location = registry_location(region)
    describe = shlex.join(
        ["gcloud", "artifacts", "repositories", "describe", ARTIFACT_REPOSITORY, "--location", location, "--project", project]
    )
    create = shlex.join(
        [
            "gcloud",
            "artifacts",
            "repositories",
            "create",
            ARTIFACT_REPOSITORY,
            "--repository-format",
            "docker",
            "--location",
            location,
            "--project",
            project,
            "--description",
            "ray-tpu-gke: the Cloud Build builder, the TPU and serving images",
        ]
    )
    return f"{describe} >/dev/null 2>&1 || {create}\n"


@dataclass(frozen=True)
class ImageBuild:
    """One of our images: built FROM `base`, pushed as `name:tag`, its digest written to `ref_file`."""

    kind: str  # "tpu" or "serve"
    dockerfile: str
    base: str
    name: str
    tag: str

    @property
    def ref_file(self) -> str:
        return f"{BUILD_DIR}/{self.kind}.ref"


def project_builds(reg: str, tpu_base: str, serve_base: str, tag: str) -> list[ImageBuild]:
    """Our two images, pushed to the registry `reg` and tagged `tag` (Cloud Build passes its BUILD_ID)."""
    reg = reg.rstrip("/")
    return [
        ImageBuild("tpu", TPU_DOCKERFILE, tpu_base, f"{reg}/{TPU_IMAGE}", tag),
        ImageBuild("serve", SERVE_DOCKERFILE, serve_base, f"{reg}/{SERVE_IMAGE}", tag),
    ]


def build_script(builds: list[ImageBuild]) -> str:
    """Bash that resolves each base tag to its digest, builds FROM that digest (the tag and digest
    recorded in the image's labels), pushes, and writes the pushed `name@sha256:...` to
    `build/images/<kind>.ref` for the manifests stage."""
    lines = ["set -euo pipefail", f"mkdir -p {BUILD_DIR}"]
    for b in builds:
        image = f"{b.name}:{b.tag}"
        lines += [
            f"# {b.kind}: {b.dockerfile} FROM {b.base}",
            f"docker pull {shlex.quote(b.base)}",
            f"base_ref=$(docker inspect --format '{{{{index .RepoDigests 0}}}}' {shlex.quote(b.base)})",
            f'docker build --file {b.dockerfile} --build-arg BASE_IMAGE="$base_ref" --build-arg BASE_NAME={shlex.quote(b.base)} '
            f"--tag {shlex.quote(image)} .",
            f"docker push {shlex.quote(image)}",
            f"docker inspect --format '{{{{index .RepoDigests 0}}}}' {shlex.quote(image)} > {b.ref_file}",
            f'echo "{b.kind} image: $(cat {b.ref_file}) (FROM $base_ref)"',
        ]
    return "\n".join(lines) + "\n"
