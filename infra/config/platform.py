"""The platform's rules (infra.rules) applied to a whole environment: one line per problem, naming
the field; errors refuse the config, warnings are risks the config chose to accept."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra import images, rules

if TYPE_CHECKING:
    from infra.config import Environment


def platform_problems(env: Environment) -> tuple[list[str], list[str]]:
    """(errors, warnings) from the platform rules (infra.rules), one line each, naming the field."""
    errors: list[str] = []
    warnings: list[str] = []
    for i, group in enumerate(env.slice_groups):
        at = f"slice_groups[{i}]"
        zone_field = f"{at}.zone" if group.zone else "zone"
        zone = env.group_zone(group)
        if problem := rules.zone_in_cluster(env.region, zone):
            errors.append(f"{zone_field}: {problem}")
        if group.capacity_kind == "queued-provisioning":
            serves = env.serving is not None and env.serving.slice_group == group.name
            if problem := rules.queued_provisioning(env.mode, env.kueue is not None, group.name, group.slices, group.rayjob_slices, serves):
                errors.append(f"{at}.capacity: {problem}")
        if problem := rules.capacity_offered(group.generation, group.capacity_kind):
            errors.append(f"{at}.capacity: {problem}")
        elif problem := rules.zone_offers(group.generation, zone, group.capacity_kind):
            if group.capacity_kind == "reservation":
                warnings.append(f"{zone_field}: {rules.unlisted_reserved_zone(group.generation, zone)}")
            elif group.unlisted_zone_ok:
                warnings.append(f"{zone_field}: {problem}; accepted because {at}.unlisted_zone_ok is true")
            else:
                errors.append(f"{zone_field}: {problem}; if Google has added it since, set {at}.unlisted_zone_ok: true")
        if problem := rules.ray_knows(group.generation, group.topology):
            warnings.append(f"{at}.topology: {problem}")
        cpu, memory = group.requests
        for field, problem in rules.requests_fit(group.shape.machine_type, cpu, memory).items():
            errors.append(f"{at}.{field}: {problem}")
    features = rules.required_versions(env.mode, {g.generation for g in env.slice_groups}, {g.capacity_kind for g in env.slice_groups})
    if problem := rules.version_covers(env.gke_min_version, features):
        errors.append(f"gke_min_version: {problem}")
    if env.kueue is not None and not any(g.rayjob_slices for g in env.slice_groups):
        errors.append(
            "kueue: no slice group leaves slices to RayJobs, so Kueue would have no TPU quota to admit one against: "
            "set rayjob_slices on the groups RayJobs take"
        )
    workers = {g.generation: env.ray.worker_image(g.generation) for g in env.slice_groups}
    for field, image in (("ray.image", env.ray.image), *((f"ray.tpu_images.{g}", i) for g, i in workers.items())):
        if problem := images.published(image):
            errors.append(f"{field}: {problem}")
    for problem in rules.images_agree(env.ray.image, workers):
        errors.append(f"ray: {problem}")
    if env.serving is not None and env.serving.slice_group in {g.name for g in env.slice_groups}:
        group = env.slice_group(env.serving.slice_group)
        if problem := rules.serving_budget(group.name, group.slices, env.serving.replicas, group.rayjob_slices):
            errors.append(f"serving.replicas: {problem}")
    return errors, warnings
