"""Start a run from a pretrained Hugging Face Llama directory (`jobs.train --init-from DIR|gs://...`),
each host building its parameters straight into the run's sharding.

`jax.make_array_from_callback` asks each host for the block of a parameter that each of its devices
holds; `block_reads` maps that block to the slices of Hugging Face tensors it is made of (a block of
a stacked, transposed parameter such as `layers/wq` [layers, d_model, q] is one transposed slice of
each of several per-layer `q_proj.weight` [q, d_model] tensors: hf.LAYER_NAMES is the one place
that says which), and `Source` reads only those slices with safetensors' `get_slice` (the file is
memory-mapped: a slice reads its own bytes, never the whole tensor). A transposed parameter is
placed in Hugging Face's layout first (each block a stack of plain slices: no strided copy on the
host) and transposed by the devices, which briefly hold that parameter twice. Nothing is initialized
at random first, and no host holds more than its own blocks plus the one being assembled.

Parameters are float32, as in training: a bfloat16 or float16 source is upcast (exactly). A tied
head (`tie_word_embeddings`) is read from the embedding and trains apart from it from then on.

safetensors opens local files only: from gs://, each host first copies the directory's weight files
to a local temporary directory (`local_copy`), streamed through jobs.runtime.storage, and deletes
it once its arrays are placed. That costs every host the whole model's bytes in transfer and local
disk (under fsdp a host needs a block of every tensor, so of every file), once per run: a resumed run
reads its checkpoint instead.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jobs.runtime import storage
from jobs.train import hf
from jobs.train.model import ModelConfig, Params, shapes

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
SOURCE_DTYPES = ("F32", "BF16", "F16")


class HFImportError(ValueError):
    """A directory whose weights do not make this model; the message names the file or tensor."""


@dataclass(frozen=True)
class Read:
    """One slice of a Hugging Face tensor that goes into a device's block."""

    name: str  # the Hugging Face tensor
    index: tuple[slice, ...]  # in that tensor's own layout
    transposed: bool  # torch's [out, in] -> our [in, out]
    layer: int | None  # the block's row on its (stacked) layer axis; None: the read is the whole block


@dataclass
class ImportStats:
    """What an import read: per callback (parameter, its block's index, source bytes read; 0 for a
    block another device of the host already got), and how long the whole import took."""

    reads: list[tuple[str, tuple[tuple[int, int], ...], int]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes_read(self) -> int:
        return sum(n for _, _, n in self.reads)


def leaf_keys(tree: Params) -> list[str]:
    """`embed`, `layers/wq`, ...: a parameter's key as `block_reads` takes it (pure)."""
    return [f"layers/{k}" for k in tree["layers"]] + [k for k in tree if k != "layers"]


def _bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    """A callback's index with every slice's start and stop made explicit (pure)."""
    padded = tuple(index) + (slice(None),) * (len(shape) - len(index))
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(padded, shape, strict=True))


def block_reads(key: str, index: tuple[slice, ...], shape: tuple[int, ...], tied: bool) -> list[Read]:
    """The Hugging Face slices that make the block `index` of parameter `key` (global `shape`) (pure)."""
    index = _bounds(index, shape)
    if key == "embed":
        return [Read(hf.EMBED, index, False, None)]
    if key == "norm_f":
        return [Read(hf.NORM, index, False, None)]
    if key == "lm_head":  # ours [d, vocab]; theirs (or the tied embedding) [vocab, d]
        return [Read(hf.EMBED if tied else hf.HEAD, index[::-1], True, None)]
    theirs, transposed = hf.LAYER_NAMES[key.removeprefix("layers/")]
    layers, within = index[0], index[1:]
    return [
        Read(f"model.layers.{i}.{theirs}", within[::-1] if transposed else within, transposed, row)
        for row, i in enumerate(range(layers.start, layers.stop))
    ]


def hf_shapes(cfg: ModelConfig, tied: bool) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor the model reads, with the shape it must have (pure)."""
    ours = shapes(cfg)
    wanted = {hf.EMBED: ours["embed"], hf.NORM: ours["norm_f"]}
    if not tied:
        wanted[hf.HEAD] = ours["lm_head"][::-1]
    for name, (theirs, transposed) in hf.LAYER_NAMES.items():
        per_layer = ours["layers"][name][1:]
        for i in range(cfg.n_layers):
            wanted[f"model.layers.{i}.{theirs}"] = per_layer[::-1] if transposed else per_layer
    return wanted


def read_config(model_dir: str) -> dict[str, Any]:
    path = storage.join(model_dir, CONFIG_FILE)
    try:
        return dict(json.loads(storage.read_bytes(path)))
    except ValueError as err:
        raise HFImportError(f"{path} is not JSON ({err})") from None


def weight_files(model_dir: str) -> list[str]:
    """The directory's safetensors files: those its index names, else the one `model.safetensors`."""
    index = storage.join(model_dir, INDEX_FILE)
    if storage.exists(index):
        return sorted(set(json.loads(storage.read_bytes(index))["weight_map"].values()))
    if storage.exists(storage.join(model_dir, SINGLE_FILE)):
        return [SINGLE_FILE]
    raise HFImportError(f"{model_dir} has neither {SINGLE_FILE} nor {INDEX_FILE}")


@contextlib.contextmanager
def local_copy(model_dir: str) -> Iterator[Path]:
    """The directory itself when local; from gs://, its weight files (and index) streamed to a
    temporary local directory, deleted on exit."""
    if not storage.is_remote(model_dir):
        yield Path(model_dir)
        return
    import pyarrow.fs

    fs, path = storage.filesystem(model_dir)
    names = weight_files(model_dir) + ([INDEX_FILE] if storage.exists(storage.join(model_dir, INDEX_FILE)) else [])
    into = Path(tempfile.mkdtemp(prefix="hf-import-"))
    try:
        for name in names:
            pyarrow.fs.copy_files(
                f"{path}/{name}", str(into / name), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem()
            )
        yield into
    finally:
        shutil.rmtree(into, ignore_errors=True)


class Source:
    """A local Hugging Face directory's safetensors files, open (memory-mapped) for slicing."""

    def __init__(self, directory: Path):
        import ml_dtypes

        # safetensors' numpy slices name their dtype by string, and numpy knows no "bfloat16" of
        # its own: ml_dtypes' (JAX's) under that name lets a bfloat16 slice read as one, in place.
        np.sctypeDict.setdefault("bfloat16", ml_dtypes.bfloat16)
        self.directory = directory
        index = directory / INDEX_FILE
        if index.is_file():
            try:
                files = dict(json.loads(index.read_text())["weight_map"])
            except (ValueError, KeyError, TypeError) as err:
                raise HFImportError(f"{index} is not a safetensors index ({type(err).__name__}: {err})") from None
        elif (directory / SINGLE_FILE).is_file():
            files = dict.fromkeys(self._opened(SINGLE_FILE).keys(), SINGLE_FILE)
        else:
            raise HFImportError(f"{directory} has neither {SINGLE_FILE} nor {INDEX_FILE}")
        self.file_of: dict[str, str] = files
        self._open: dict[str, Any] = {}

    def _opened(self, file: str) -> Any:
        """`file` open (memory-mapped); a missing or damaged file named in one line."""
        from safetensors import SafetensorError, safe_open

        try:
            return safe_open(self.directory / file, "numpy")
        except (OSError, SafetensorError) as err:
            raise HFImportError(f"{self.directory / file} does not open as safetensors ({' '.join(str(err).split())})") from None

    def _handle(self, name: str) -> Any:
        file = self.file_of[name]
        if file not in self._open:
            self._open[file] = self._opened(file)
        return self._open[file]

    def header(self, name: str) -> tuple[str, tuple[int, ...]]:
        """A tensor's dtype and shape, from its file's header (no data read)."""
        if name not in self.file_of:
            raise HFImportError(f"tensor {name} is missing from {self.directory}")
        view = self._handle(name).get_slice(name)
        return view.get_dtype(), tuple(view.get_shape())

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The slice `index` of tensor `name`, in its stored dtype."""
        self.header(name)  # a missing tensor named
        return np.asarray(self._handle(name).get_slice(name)[index])

    def check(self, cfg: ModelConfig, tied: bool) -> None:
        """Every tensor the model needs is there, in a dtype and shape it takes (headers only)."""
        for name, shape in hf_shapes(cfg, tied).items():
            dtype, found = self.header(name)
            if dtype not in SOURCE_DTYPES:
                raise HFImportError(f"tensor {name} is {dtype}; one of {', '.join(SOURCE_DTYPES)} imports")
            if found != tuple(shape):
                raise HFImportError(f"tensor {name} is {list(found)}, config.json makes it {list(shape)}")

    def close(self) -> None:
        self._open.clear()


def read_block(source: Source, reads: list[Read], block_shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """A device's block in float32 and in Hugging Face's layout (a transposed parameter's last two
    axes swapped: the device transposes it, `import_params`), assembled from its reads, and the
    source bytes they read."""
    nbytes = 0
    if len(reads) == 1 and reads[0].layer is None:  # the piece is the block: no second copy
        piece = source.read(reads[0].name, reads[0].index)
        return piece.astype(np.float32, copy=False), piece.nbytes
    block = np.empty(block_shape, np.float32)
    for r in reads:
        piece = source.read(r.name, r.index)
        nbytes += piece.nbytes
        block[... if r.layer is None else r.layer] = piece  # a contiguous copy; the upcast, exactly
        del piece  # one piece alive at a time
    return block, nbytes


def _swap_last(items: tuple) -> tuple:
    return (*items[:-2], items[-1], items[-2])


def _theirs(sharding: Any, ndim: int) -> Any:
    """`sharding` for the parameter in Hugging Face's layout (its last two axes swapped)."""
    import jax

    if not isinstance(sharding, jax.sharding.NamedSharding):  # one device, or replicated: the same either way
        return sharding
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*_swap_last(spec)))


@functools.lru_cache(maxsize=64)
def _transpose_to(sharding: Any) -> Any:
    """A compiled swap of the last two axes whose output is in `sharding`: on a TPU host the
    transpose runs on the chips, not in host memory (one pass over the bytes fewer on the host)."""
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda a: jnp.swapaxes(a, -1, -2), out_shardings=sharding)


def is_transposed(key: str) -> bool:
    return key == "lm_head" or (key.startswith("layers/") and hf.LAYER_NAMES[key[7:]][1])


def import_params(source: Source, cfg: ModelConfig, shardings: Params, tied: bool, stats: ImportStats | None = None) -> Params:
    """The model's parameters as global arrays in `shardings` (the run's tree of NamedShardings),
    each host reading only the blocks its devices hold. A transposed parameter is placed in
    Hugging Face's layout (each block a stack of plain slices), then transposed on the devices."""
    import jax

    stats = stats if stats is not None else ImportStats()
    started = time.perf_counter()
    tree = shapes(cfg)
    out: Params = {"layers": {}}
    for key in leaf_keys(tree):
        shape = tree["layers"][key[7:]] if key.startswith("layers/") else tree[key]
        sharding = shardings["layers"][key[7:]] if key.startswith("layers/") else shardings[key]
        swap = _swap_last if is_transposed(key) else (lambda items: items)
        blocks: dict[tuple[tuple[int, int], ...], np.ndarray] = {}  # devices of one host holding the same block read it once

        def callback(index, key=key, shape=shape, blocks=blocks, swap=swap):
            bounds = _bounds(swap(tuple(index)), shape)  # ours, from an index into Hugging Face's layout
            at = tuple((s.start, s.stop) for s in bounds)
            nbytes = 0
            if at not in blocks:
                blocks[at], nbytes = read_block(source, block_reads(key, bounds, shape, tied), swap(tuple(b - a for a, b in at)))
            stats.reads.append((key, at, nbytes))
            return blocks[at]

        if is_transposed(key):
            theirs = jax.make_array_from_callback(swap(shape), _theirs(sharding, len(shape)), callback)
            array = _transpose_to(sharding)(theirs)
            del theirs
        else:
            array = jax.make_array_from_callback(shape, sharding, callback)
        blocks.clear()
        if key.startswith("layers/"):
            out["layers"][key[7:]] = array
        else:
            out[key] = array
    jax.block_until_ready(out)
    stats.seconds = time.perf_counter() - started
    return out


def import_checkpoint(model_dir: str, cfg: ModelConfig, shardings: Params, stats: ImportStats | None = None) -> Params:
    """`--init-from`: the directory (local or gs://) read into `shardings`. `cfg` is the run's model,
    which jobs.train.config made from this directory's config.json (its seq_len may be shorter)."""
    _, tied = hf.parse_config(read_config(model_dir))
    with local_copy(model_dir) as directory:
        source = Source(directory)
        try:
            source.check(cfg, tied)
            return import_params(source, cfg, shardings, tied, stats)
        finally:
            source.close()


def check_headers(model_dir: str, cfg: ModelConfig) -> None:
    """`jobs.train`'s parse-time check of a local directory (headers only, no tensor read): every
    tensor `cfg` needs is there, in a dtype and shape it takes; HFImportError names the first that
    is not. A gs:// directory is checked by the workers, once they have their local copy."""
    _, tied = hf.parse_config(read_config(model_dir))
    source = Source(Path(model_dir))
    try:
        source.check(cfg, tied)
    finally:
        source.close()


def cache_note(model_dir: str) -> str:
    """What the import costs this host in transfer (for the log)."""
    if not storage.is_remote(model_dir):
        return "read in place"
    total = sum(size for path, size in storage.file_sizes(model_dir).items() if path.endswith(".safetensors"))
    return f"{total / 2**20:,.0f} MiB copied to this host's {os.environ.get('TMPDIR', '/tmp')} first"


def write_dir(directory: Path, config: dict[str, Any], tensors: dict[str, np.ndarray], shard_bytes: int = 0) -> list[str]:
    """A Hugging Face directory of `tensors` (numpy; the bench's and tests' sources without
    transformers): one `model.safetensors`, or shards of about `shard_bytes` with their index.
    The weight files written."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    if not shard_bytes:
        save_file(tensors, directory / SINGLE_FILE, metadata={"format": "pt"})
        return [SINGLE_FILE]
    groups: list[dict[str, np.ndarray]] = [{}]
    for name, array in tensors.items():
        if groups[-1] and sum(a.nbytes for a in groups[-1].values()) + array.nbytes > shard_bytes:
            groups.append({})
        groups[-1][name] = array
    files = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for name, group in zip(files, groups, strict=True):
        save_file(group, directory / name, metadata={"format": "pt"})
    weight_map = {tensor: name for name, group in zip(files, groups, strict=True) for tensor in group}
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2) + "\n")
    return files
