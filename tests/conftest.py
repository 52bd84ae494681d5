"""Shared test setup: nothing here may write outside tmp dirs or the repo's build/ directory."""

import os
import uuid
from collections.abc import Iterator

import pytest

# Outside tests/jobs nothing starts a Ray cluster; this only stops a stray `ray.init()` from writing
# ~/.ray/auth_token. tests/jobs/conftest.py turns token authentication on for the test clusters.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

GCS_BUCKET = "test-bucket"


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[str]:
    """A local Google Cloud Storage emulator (gcp-storage-emulator from PyPI, in memory, bucket
    `test-bucket`) for the whole session: its URL, for STORAGE_EMULATOR_HOST. One per session,
    because gcsfs caches its client by address."""
    from gcp_storage_emulator.server import create_server

    from jobs.runtime.net import free_port

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=GCS_BUCKET)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def gcs(gcs_emulator, monkeypatch) -> str:
    """gs://test-bucket/<unique prefix>, served by the emulator for this test (and the processes it
    starts, which inherit STORAGE_EMULATOR_HOST)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", gcs_emulator)
    return f"gs://{GCS_BUCKET}/{uuid.uuid4().hex[:8]}"
