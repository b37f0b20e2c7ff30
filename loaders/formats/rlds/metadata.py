"""An RLDS dataset's metadata as TFDS writes it, read and checked without TensorFlow.

``<root>/<name>/<version>/`` holds ``dataset_info.json`` (the splits, each with its ``shardLengths`` and
``filepathTemplate``; ``fileFormat`` "tfrecord"), ``features.json`` (the FeaturesDict tree) and the shards
``<name>-<split>.tfrecord-XXXXX-of-YYYYY``. :func:`locate` finds the version directory (the path itself, or the
highest version below a dataset directory), :func:`read_split` the shards of one split and :func:`read_leaves`
the features: one :class:`Leaf` per stored key, with what it is below ``steps`` (a value per step) or beside it
(a value per episode, ``episode_metadata/*``). :func:`decode_leaf` turns one key of a parsed record
(:func:`~mmfeed.loaders.formats.rlds.example.parse_example`) into numpy, in features.json's dtype, checking the
record against what features.json declares: a key missing, of another kind, or holding a count of values its
shape does not divide is a one-line ValueError naming the record and the key.

How TFDS stores each leaf (one ``tf.train.Example`` per episode, the steps of every key concatenated): numbers
of every float dtype as a float list (float32, even for float64), of every integer dtype and bool as an int64
list, strings (``Text``, string tensors) and pictures (``Image``: one JPEG or PNG per step) as bytes, tensors
with ``encoding`` "bytes" or "zlib" as their raw (compressed) bytes, one value per step, ``ClassLabel`` as int64,
and a ``Sequence`` of unknown length inside the steps as ``<key>/ragged_flat_values`` and
``<key>/ragged_row_lengths_0``.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from mmfeed.loaders.formats.rlds.example import BYTES, FLOAT, INT64, Values
from mmfeed.loaders.transport.confine import shorten
from mmfeed.loaders.transport.files import DatasetFiles

__all__ = ["Leaf", "check_record", "decode_leaf", "episode_length", "is_rlds_dir", "locate", "read_leaves",
           "read_split", "split_names"]

INFO, FEATURES = "dataset_info.json", "features.json"
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_MAX_SHARDS = 1 << 20


@dataclass(frozen=True)
class Leaf:
    """One stored feature. ``name``: how mmfeed names it (the path below ``steps``, levels joined by "."; above
    it, the whole path: ``episode_metadata.file_path``); ``key``: its key in the records; ``level``: "step" or
    "episode"; ``kind``: "tensor", "image", "text" or "ragged"; ``dtype`` and ``shape``: one step's (or the
    episode's) value as delivered; ``encoding``: "none", "bytes" or "zlib" (tensors)."""

    name: str
    key: str
    level: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    encoding: str = "none"

    @cached_property
    def stored(self) -> str:
        """The list kind the records hold it in."""
        if self.kind in ("image", "text") or self.encoding != "none":
            return BYTES
        return FLOAT if np.dtype(self.dtype).kind == "f" else INT64

    @cached_property
    def size(self) -> int:
        """Values in one step's (or the episode's) value."""
        return math.prod(self.shape)


def is_rlds_dir(files: DatasetFiles) -> bool:
    """Whether ``files``' root is an RLDS version directory (both metadata files there)."""
    return files.exists(INFO) and files.exists(FEATURES)


def locate(path: str) -> DatasetFiles | None:
    """The version directory ``path`` names: itself when it holds ``dataset_info.json`` and ``features.json``,
    else its highest-numbered subdirectory ``X.Y.Z`` that does (listing the folder; not over plain HTTP, which
    has no listing). None when neither."""
    files = DatasetFiles(path)
    if is_rlds_dir(files):
        return files
    found = files.glob(f"*/{INFO}")
    versions = []
    for relative in found or []:
        folder = relative.rsplit("/", 1)[0]
        match = _VERSION.match(folder)
        if match:
            versions.append((tuple(int(g) for g in match.groups()), folder))
    for _, folder in sorted(versions, reverse=True):
        inner = DatasetFiles(files.where(folder))
        if inner.exists(FEATURES):
            return inner
    return None


def split_names(files: DatasetFiles) -> list[str]:
    """The splits ``dataset_info.json`` lists, in its order."""
    info = files.read_json(INFO)
    splits = info.get("splits") if isinstance(info, Mapping) else None
    return [s["name"] for s in splits or [] if isinstance(s, Mapping) and isinstance(s.get("name"), str)]


def read_split(files: DatasetFiles, split: str) -> tuple[str, list[str], list[int]]:
    """``(dataset name, shard paths relative to the version directory, records per shard)`` of ``split``, from
    ``dataset_info.json``; a split it does not list is a ValueError naming the splits it has."""
    info = files.read_json(INFO)
    where = files.where(INFO)
    if not isinstance(info, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(info).__name__}")
    name = info.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: missing or empty 'name'")
    file_format = info.get("fileFormat", "tfrecord")
    if file_format != "tfrecord":
        raise ValueError(f"{where}: fileFormat {shorten(file_format)}; mmfeed reads RLDS datasets written as "
                         "tfrecord")
    splits = info.get("splits")
    if not isinstance(splits, list) or not all(isinstance(s, Mapping) for s in splits):
        raise ValueError(f"{where}: 'splits' must be a list of objects")
    names = [s.get("name") for s in splits]
    if split not in names:
        raise ValueError(f"{where}: no split {split!r}; the dataset has {names} (pass split=)")
    entry = splits[names.index(split)]
    lengths = entry.get("shardLengths")
    if not isinstance(lengths, list) or not lengths or len(lengths) > _MAX_SHARDS:
        raise ValueError(f"{where}: split {split!r} has no 'shardLengths' list (1 to {_MAX_SHARDS} shards)")
    try:
        counts = [int(n) for n in lengths]  # JSON of a proto: int64 as strings
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: split {split!r}: shardLengths must be counts of episodes ({err})") from None
    if any(n < 0 for n in counts):
        raise ValueError(f"{where}: split {split!r}: a negative shard length in {counts[:8]}")
    template = entry.get("filepathTemplate") or _DEFAULT_TEMPLATE
    if not isinstance(template, str):
        raise ValueError(f"{where}: split {split!r}: filepathTemplate must be a string")
    total = len(counts)
    shards = []
    for k in range(total):
        relative = (template.replace("{DATASET}", name).replace("{SPLIT}", split)
                    .replace("{FILEFORMAT}", file_format).replace("{SHARD_X_OF_Y}", f"{k:05d}-of-{total:05d}")
                    .replace("{SHARD_INDEX}", f"{k:05d}").replace("{NUM_SHARDS}", f"{total:05d}"))
        reason = files.outside(relative)
        if reason is not None or "{" in relative:
            raise ValueError(f"{where}: split {split!r}: filepathTemplate {shorten(template)} names "
                             f"{shorten(relative)}, {reason or 'with a field mmfeed does not know'}; RLDS shards "
                             "lie beside dataset_info.json")
        shards.append(relative)
    return name, shards, counts


def _dims(node: Mapping, where: str) -> tuple[int, ...]:
    shape = node.get("shape") or {}
    dims = shape.get("dimensions") or [] if isinstance(shape, Mapping) else None
    if dims is None or not isinstance(dims, list):
        raise ValueError(f"{where}: a shape must be {{'dimensions': [...]}}, got {shorten(shape)}")
    try:
        return tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: shape dimensions must be integers, got {shorten(dims)}") from None


def _dtype(name: Any, where: str) -> str:
    if name == "string":
        return "object"
    try:
        dtype = np.dtype(name)
    except TypeError:
        dtype = None
    if not isinstance(name, str) or dtype is None or dtype.kind not in "biuf":
        raise ValueError(f"{where}: dtype {shorten(name)}, which mmfeed cannot read (bool, ints, uints, floats and "
                         "string are read)")
    return str(dtype)


def _leaf(path: list[str], level: str, node: Mapping, where: str, ragged: bool) -> Leaf:
    key = "/".join(path)
    name = ".".join(path[1:] if level == "step" else path)
    at = f"{where}: feature {key!r}"
    if "tensor" in node:
        tensor = node["tensor"]
        if not isinstance(tensor, Mapping):
            raise ValueError(f"{at}: 'tensor' must be an object")
        dtype, shape = _dtype(tensor.get("dtype"), at), _dims(tensor, at)
        encoding = tensor.get("encoding", "none") or "none"
        if encoding not in ("none", "bytes", "zlib"):
            raise ValueError(f"{at}: encoding {shorten(encoding)}; TFDS writes 'none', 'bytes' or 'zlib'")
        if any(d < 0 for d in shape) and not ragged:
            raise ValueError(f"{at}: shape {list(shape)} has a dimension of unknown size; mmfeed reads tensors of "
                             "static shape")
        if dtype == "object":
            if shape != () or encoding != "none":
                raise ValueError(f"{at}: string tensors of shape {list(shape)}; mmfeed reads one string a step")
            return Leaf(name, key, level, "ragged" if ragged else "text", "object", ())
        return Leaf(name, key, level, "ragged" if ragged else "tensor", dtype, shape, encoding)
    if "image" in node:
        image = node["image"]
        shape = _dims(image, at) if isinstance(image, Mapping) else ()
        if len(shape) != 3 or shape[2] != 3 or min(shape) <= 0 or image.get("dtype", "uint8") != "uint8":
            raise ValueError(f"{at}: an image of shape {list(shape)} and dtype {shorten(image.get('dtype'))}; mmfeed "
                             "reads uint8 colour pictures of known size ([H, W, 3])")
        if ragged or level != "step":
            raise ValueError(f"{at}: {'a sequence of pictures within a step' if ragged else 'a picture per episode'}"
                             "; mmfeed reads one picture a step")
        return Leaf(name, key, level, "image", "uint8", shape)
    if "text" in node:
        return Leaf(name, key, level, "ragged" if ragged else "text", "object", ())
    if "classLabel" in node:
        return Leaf(name, key, level, "ragged" if ragged else "tensor", "int64", ())
    raise ValueError(f"{at}: a feature of type {shorten(node.get('pythonClassName'))}, which mmfeed cannot read")


def _walk(node: Any, path: list[str], level: str, where: str, out: list[Leaf], ragged: bool = False) -> None:
    if not isinstance(node, Mapping):
        raise ValueError(f"{where}: feature {'/'.join(path)!r} must be an object, got {type(node).__name__}")
    if "featuresDict" in node:
        features = (node["featuresDict"] or {}).get("features")
        if not isinstance(features, Mapping):
            raise ValueError(f"{where}: feature {'/'.join(path) or '(root)'!r}: featuresDict without 'features'")
        for key in sorted(features):
            if not isinstance(key, str) or not key or "/" in key or "." in key:
                raise ValueError(f"{where}: feature name {shorten(key)} under {'/'.join(path) or 'the root'} "
                                 "(names are non-empty, without '/' or '.')")
            _walk(features[key], [*path, key], level, where, out, ragged)
        return
    if "sequence" in node:
        sequence = node["sequence"]
        if not isinstance(sequence, Mapping) or "feature" not in sequence:
            raise ValueError(f"{where}: feature {'/'.join(path)!r}: 'sequence' without 'feature'")
        dataset = str(node.get("pythonClassName", "")).endswith("Dataset")
        if dataset or (level == "episode" and path == ["steps"]):
            if path != ["steps"]:
                raise ValueError(f"{where}: a nested dataset at {'/'.join(path)!r}; RLDS keeps its steps at 'steps'")
            _walk(sequence["feature"], path, "step", where, out)
            return
        try:
            length = int(sequence.get("length", -1))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: feature {'/'.join(path)!r}: sequence length must be an integer") from None
        if level != "step" or length >= 0 or ragged:
            raise ValueError(f"{where}: feature {'/'.join(path)!r}: a sequence of length {length} "
                             f"{'per episode' if level == 'episode' else 'in a sequence'}; mmfeed reads sequences "
                             "of unknown length within the steps (ragged)")
        _walk(sequence["feature"], path, level, where, out, ragged=True)
        return
    out.append(_leaf(path, level, node, where, ragged))


def read_leaves(files: DatasetFiles) -> list[Leaf]:
    """Every stored feature that ``features.json`` declares, in its (sorted) order; ValueError naming the file
    and the feature for anything mmfeed does not read."""
    where = files.where(FEATURES)
    tree = files.read_json(FEATURES)
    out: list[Leaf] = []
    _walk(tree, [], "episode", where, out)
    if not any(leaf.level == "step" for leaf in out):
        raise ValueError(f"{where}: no 'steps' dataset; an RLDS episode keeps its steps under 'steps'")
    return out


def _values(parsed: Mapping[str, Values], key: str, stored: str, where: str) -> Values:
    values = parsed.get(key)
    if values is None:
        raise ValueError(f"{where}: no key {key!r} in the record, which features.json declares")
    if values.kind != stored and len(values):
        raise ValueError(f"{where}: key {key!r} holds a {values.kind} list, features.json declares a feature "
                         f"stored as a {stored} list")
    return values


def episode_length(leaves: Sequence[Leaf], parsed: Mapping[str, Values], where: str) -> int:
    """Steps of one parsed record: ``len(steps/is_first)``, or what its first step feature of one value per step
    holds."""
    steps = [leaf for leaf in leaves if leaf.level == "step"]
    first = next((leaf for leaf in steps if leaf.key == "steps/is_first"), None)
    for leaf in ([first] if first is not None else []) + steps:
        if leaf.kind == "ragged":
            values = _values(parsed, f"{leaf.key}/ragged_row_lengths_0", INT64, where)
            return len(values)
        values = _values(parsed, leaf.key, leaf.stored, where)
        per_step = 1 if leaf.stored == BYTES else leaf.size
        if per_step:
            return len(values) // per_step
    return 0


def _typed(values: np.ndarray, dtype: str) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return values != 0
    return values.astype(dtype, copy=False)


def decode_leaf(leaf: Leaf, parsed: Mapping[str, Values], steps: int, where: str,
                picks: np.ndarray | None = None) -> Any:
    """The values of ``leaf`` in one parsed record of ``steps`` steps: ``[steps, *shape]`` for a step feature
    (only the steps ``picks`` where given), ``[*shape]`` for an episode's; pictures stay encoded (a list of
    bytes-like objects); ragged features are an object array of one 1-D array per step."""
    if leaf.kind == "ragged":
        flat = _values(parsed, f"{leaf.key}/ragged_flat_values", BYTES if leaf.dtype == "object" else
                       (FLOAT if np.dtype(leaf.dtype).kind == "f" else INT64), where)
        rows = _values(parsed, f"{leaf.key}/ragged_row_lengths_0", INT64, where).values
        if len(rows) != steps or (len(rows) and (rows.min() < 0 or int(rows.sum()) != len(flat))):
            raise ValueError(f"{where}: key {leaf.key!r}: row lengths {shorten(rows.tolist())} for {steps} steps "
                             f"and {len(flat)} values")
        bounds = np.concatenate([[0], np.cumsum(rows)])
        chosen = range(steps) if picks is None else picks.tolist()
        out = np.empty(len(chosen), dtype=object)
        for i, t in enumerate(chosen):
            part = flat.values[bounds[t]:bounds[t + 1]]
            out[i] = (np.array([bytes(v).decode("utf-8", "replace") for v in part], dtype=object)
                      if leaf.dtype == "object" else _typed(np.asarray(part), leaf.dtype))
        return out
    values = _values(parsed, leaf.key, leaf.stored, where)
    count = steps if leaf.level == "step" else 1
    if leaf.stored == BYTES:
        if len(values) != count:
            raise ValueError(f"{where}: key {leaf.key!r} holds {len(values)} values, "
                             f"{'one per step' if leaf.level == 'step' else 'one per episode'} is {count}")
        chosen = values.values if picks is None or leaf.level != "step" else [values.values[t] for t in picks]
        if leaf.kind == "image":
            return chosen
        if leaf.kind == "text":
            text = np.array([bytes(v).decode("utf-8", "replace") for v in chosen], dtype=object)
            return text if leaf.level == "step" else text[0]
        dtype = np.dtype(leaf.dtype).newbyteorder("<")
        nbytes = leaf.size * dtype.itemsize  # a Python int: a declared shape is never allocated before it is seen
        parts = []
        for i, blob in enumerate(chosen):
            raw = bytes(blob)
            if leaf.encoding == "zlib":  # inflated no further than the declared size (a small blob may inflate to GBs)
                try:
                    raw = zlib.decompressobj().decompress(raw, nbytes + 1)
                except zlib.error as err:
                    raise ValueError(f"{where}: key {leaf.key!r}: step {i} is not zlib data ({err})") from None
            if len(raw) != nbytes:
                raise ValueError(f"{where}: key {leaf.key!r}: a value of {len(raw)} bytes, {leaf.dtype} "
                                 f"{list(leaf.shape)} takes {nbytes}")
            parts.append(np.frombuffer(raw, dtype).reshape(leaf.shape))
        decoded = (np.stack(parts) if parts else np.zeros((0, *leaf.shape), dtype)).astype(leaf.dtype, copy=False)
        return decoded if leaf.level == "step" else decoded[0]
    array = values.values if len(values) else np.zeros(0, np.float32 if leaf.stored == FLOAT else np.int64)
    if len(array) != count * leaf.size:
        raise ValueError(f"{where}: key {leaf.key!r} holds {len(array)} values, {count} "
                         f"{'steps' if leaf.level == 'step' else 'value'} of {leaf.dtype} {list(leaf.shape)} take "
                         f"{count * leaf.size}")
    if leaf.level == "episode":
        return _typed(array, leaf.dtype).reshape(leaf.shape)
    array = array.reshape(steps, *leaf.shape)
    if picks is not None:
        array = array[picks]
    return _typed(array, leaf.dtype)


def check_record(leaves: Sequence[Leaf], parsed: Mapping[str, Values], where: str) -> int:
    """The steps of one parsed record, every leaf checked against features.json (:func:`decode_leaf`'s errors);
    pictures are not decoded."""
    steps = episode_length(leaves, parsed, where)
    for leaf in leaves:
        if leaf.kind == "image":
            _values(parsed, leaf.key, BYTES, where)
            if len(parsed[leaf.key]) != steps:
                raise ValueError(f"{where}: key {leaf.key!r} holds {len(parsed[leaf.key])} pictures for {steps} "
                                 "steps")
        else:
            decode_leaf(leaf, parsed, steps, where, picks=np.zeros(0, np.int64) if leaf.level == "step" else None)
    return steps

