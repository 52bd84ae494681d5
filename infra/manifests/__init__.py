"""Kubernetes manifests derived from the environment config (no cdktf import: answers in ~1 s)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    _BaseDumper = yaml.SafeDumper
else:  # libyaml's emitter where installed: ~10x faster, the same output
    _BaseDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _PlainDumper(_BaseDumper):
    """No `&id001` anchors: kubectl users read these manifests."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _block_strings(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    # Embedded YAML (a RayService's serveConfigV2, a RayJob's runtimeEnvYAML) reads best as a literal block.
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_PlainDumper.add_representer(str, _block_strings)


def dump_all(docs: list[dict[str, Any]]) -> str:
    """The documents as one YAML stream for `kubectl apply -f -`."""
    return yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False)
