"""The GCS bucket for checkpoints and data: uniform access, versioned, never public, readable and
writable by the Ray pods' service account only."""

from __future__ import annotations

from cdktf_cdktf_provider_google.storage_bucket import StorageBucket, StorageBucketVersioning
from cdktf_cdktf_provider_google.storage_bucket_iam_member import StorageBucketIamMember
from constructs import Construct

from infra.config import Environment


class CheckpointBucket(Construct):
    def __init__(self, scope: Construct, id_: str, *, env: Environment, writer_email: str) -> None:
        super().__init__(scope, id_)
        self.bucket = StorageBucket(
            self,
            "bucket",
            name=env.bucket_name,
            location=env.bucket_location,
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            versioning=StorageBucketVersioning(enabled=True),
            force_destroy=env.bucket.force_destroy,
            labels=env.labels,
        )
        StorageBucketIamMember(
            self,
            "ray-object-admin",
            bucket=self.bucket.name,
            role="roles/storage.objectUser",
            member=f"serviceAccount:{writer_email}",
        )

    @property
    def url(self) -> str:
        return f"gs://{self.bucket.name}"
