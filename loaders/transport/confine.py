"""Paths a dataset's metadata names: filled from checked templates, and kept inside the dataset.

A dataset a stranger published is untrusted input, and so is every path its metadata names: LeRobot's
``meta/info.json`` ``data_path`` and ``video_path`` templates (and the feature names and chunk and file numbers
they are filled with), a shard index's ``shard`` column. Reading one must not become a way to read the host's other
files or to reach its network. So:

- a template is checked once, when the dataset opens (:class:`PathTemplate`): only the fields the format
  documents, plain (no attribute or item access, no conversion), integers with a format such as ``03d`` of width
  at most :data:`MAX_WIDTH`; then it is filled without ``str.format``;
- every path is checked before anything reads it (:class:`Confined`): relative, without ``..``, and, for a local
  directory, inside it once symbolic links are resolved (``os.path.realpath``, compared by
  ``os.path.commonpath``); a dataset in the Hugging Face hub cache (``.../snapshots/<revision>/``, whose files are
  links into the repository's ``blobs/``) may link into that ``blobs/`` folder. For a dataset at a URL the path
  stays under the same scheme, host and prefix: no ``..``, ``?``, ``#`` or backslash, after percent-decoding too;
- an index's shards (:func:`shard_outside`) lie inside the index's own folder, by the same rules; a local index
  never names a URL, so opening one never makes a network request.

Results are kept per distinct file, so checking costs per file, not per episode or per read.

    >>> PathTemplate("data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", ("chunk_index", "file_index"),
    ...              where="meta/info.json", field="data_path").fill(chunk_index=1, file_index=12)
    'data/chunk-001/file-012.parquet'
    >>> try:  # doctest: +NORMALIZE_WHITESPACE
    ...     PathTemplate("{chunk_index.__class__}", ("chunk_index",), where="meta/info.json", field="data_path")
    ... except UnsafePathError as err:
    ...     print(err)
    meta/info.json: data_path '{chunk_index.__class__}': field 'chunk_index.__class__' reaches into a value (attribute
    or item access); a template names its fields plainly, as {chunk_index}
"""

from __future__ import annotations

import os
import posixpath
import re
import string
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["MAX_WIDTH", "TRUSTED_ROOTS_ENV", "Confined", "PathTemplate", "UnsafePathError", "check_shards",
           "shard_outside", "shorten"]

MAX_WIDTH = 20
"""The widest integer field a path template may ask for (``{chunk_index:03d}`` asks for 3)."""

_INT_SPEC = re.compile(r"(0?)([1-9][0-9]*)?d")
_URL_UNSAFE = ("?", "#", "\\")


class UnsafePathError(ValueError):
    """A path in a dataset's metadata that mmfeed will not read: a template it will not fill, or a file outside the
    dataset. The message names the metadata file, the field and the value (shortened)."""


def shorten(value: Any, limit: int = 120) -> str:
    """``repr(value)`` of a string, cut to about ``limit`` characters (with how many there were) when longer."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[: limit - 20]!r}... ({len(text)} characters)"


class PathTemplate:
    """A path template from a dataset's metadata, checked once and filled fast.

    template: the template text (``"videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"``).
    fields: the field names it may use; each is an integer, except ``video_key`` (text, no format spec).
    where, field: the metadata file and its field, for the errors.

    Raises :class:`UnsafePathError` for anything but text with those fields: an unknown field, a positional one,
    attribute or item access (``{video_key.__class__}``, ``{x[0]}``), a conversion (``!r``), a format spec other
    than an integer one of width at most :data:`MAX_WIDTH` (``03d``), or a stray brace.
    """

    TEXT_FIELDS = frozenset({"video_key"})

    def __init__(self, template: Any, fields: Sequence[str], *, where: str, field: str) -> None:
        self.text, self.fields, self.where, self.field = template, tuple(fields), where, field
        if not isinstance(template, str):
            self._refuse(f"not a string but {type(template).__name__}")
        parts: list[tuple[str, str | None, str]] = []  # (literal text, field or None, format spec)
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as err:
            self._refuse(f"not a valid template ({err})")
        for literal, name, spec, conversion in parsed:
            if name is None:
                parts.append((literal, None, ""))
                continue
            if name == "" or name.isdigit():
                self._refuse(f"positional field {{{name}}}; {self._allowed()}")
            if "." in name or "[" in name:
                self._refuse(f"field {shorten(name, 40)} reaches into a value (attribute or item access); a template "
                             f"names its fields plainly, as {{{self.fields[0]}}}")
            if name not in self.fields:
                self._refuse(f"unknown field {shorten(name, 40)}; {self._allowed()}")
            if conversion is not None:
                self._refuse(f"field {{{name}}} has a conversion '!{conversion}', which a path template does not take")
            parts.append((literal, name, self._spec(name, spec or "")))
        # the template rebuilt from its checked parts alone (literal braces escaped again), for str.format's speed
        self._format = "".join(literal.replace("{", "{{").replace("}", "}}")
                               + ("" if name is None else "{" + name + (":" + spec if spec else "") + "}")
                               for literal, name, spec in parts)

    def _allowed(self) -> str:
        return f"{self.field} may use {', '.join('{' + f + '}' for f in self.fields)}"

    def _spec(self, name: str, spec: str) -> str:
        """The format spec of one field, checked: none for text, an integer one of bounded width otherwise."""
        if not spec:
            return ""
        match = _INT_SPEC.fullmatch(spec)
        if name in self.TEXT_FIELDS or match is None:
            what = "takes no format spec" if name in self.TEXT_FIELDS else "takes only an integer format such as 03d"
            self._refuse(f"field {{{name}}} has format spec {shorten(spec, 30)}; it {what}")
        if match.group(2) is not None and int(match.group(2)) > MAX_WIDTH:
            self._refuse(f"field {{{name}}} asks for width {int(match.group(2))}; at most {MAX_WIDTH}")
        return spec

    def _refuse(self, problem: str) -> None:
        raise UnsafePathError(f"{self.where}: {self.field} {shorten(self.text)}: {problem}")

    def fill(self, **values: Any) -> str:
        """The path for ``values`` (each field the template uses: ``video_key`` a str, the others ints)."""
        return self._format.format_map(values)

    def __repr__(self) -> str:
        return f"PathTemplate({self.text!r})"


MAX_PATH_CHARS, MAX_NAME_CHARS = 4096, 255
"""The longest relative path and file or folder name a dataset may name (Linux's PATH_MAX and NAME_MAX): a longer
one is refused by its spelling, before the operating system says ``File name too long`` with the whole name."""


def _lexical(relative: str, url: bool) -> str | None:
    """Why ``relative`` cannot name a file under a root by its spelling alone (None when it can)."""
    if not isinstance(relative, str) or not relative:
        return "it is empty" if relative == "" else f"it is not a string ({type(relative).__name__})"
    if "\0" in relative:
        return "it holds a NUL character"
    if len(relative) > MAX_PATH_CHARS or max(map(len, re.split(r"[\\/]", relative))) > MAX_NAME_CHARS:
        return (f"it is longer than a path may be ({len(relative)} characters; at most {MAX_PATH_CHARS}, "
                f"{MAX_NAME_CHARS} per name)")
    if "://" in relative:
        return "it is a URL"
    decoded = unquote(relative) if url else relative
    if decoded.startswith(("/", "\\")) or os.path.isabs(decoded) or re.match(r"[A-Za-z]:[\\/]", decoded):
        return "it is an absolute path"
    if ".." in re.split(r"[\\/]", decoded):
        return "it climbs out with '..'"
    if url and any(c in decoded for c in _URL_UNSAFE):
        return "it holds '?', '#' or a backslash, which a URL reads otherwise"
    return None


TRUSTED_ROOTS_ENV = "MMFEED_TRUSTED_ROOTS"
"""Folders (``os.pathsep``-separated) a dataset's symbolic links may lead into, beside the dataset itself: a user's
own layout such as ``videos/`` linked to another disk (``MMFEED_TRUSTED_ROOTS=/mnt/nvme/videos``)."""


def _allowed_roots(real_root: str) -> list[str]:
    """The real folders files of the dataset at ``real_root`` may lie in: itself, the folders the user trusts
    (:data:`TRUSTED_ROOTS_ENV`), and in the Hugging Face hub cache (``<repo>/snapshots/<revision>/...``, files
    linked into ``<repo>/blobs``) the repository's ``blobs``."""
    trusted = os.environ.get(TRUSTED_ROOTS_ENV, "")
    roots = [real_root, *(os.path.realpath(p) for p in trusted.split(os.pathsep) if p.strip())]
    folder = real_root
    while True:
        parent = os.path.dirname(folder)
        if parent == folder:
            return roots
        if os.path.basename(parent) == "snapshots":
            blobs = os.path.join(os.path.dirname(parent), "blobs")
            if os.path.isdir(blobs):
                roots.append(os.path.realpath(blobs))
            return roots
        folder = parent


def _within(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives
        return False


class Confined:
    """The files under one dataset root (a local directory or a URL) that may be read: :meth:`outside` says why a
    relative path may not, or None. Each distinct path is judged once; locally, each distinct folder's links are
    resolved once (and a file's own only where it is a link)."""

    def __init__(self, root: str, url: bool) -> None:
        self.root, self.url = root, url
        self._verdicts: dict[str, str | None] = {}
        self._folders: dict[str, tuple[str, bool]] = {}  # folder -> (real folder, inside)
        self._real: list[str] | None = None

    def outside(self, relative: str) -> str | None:
        """Why ``relative`` lies outside the root (``"it is an absolute path"``, ...), or None."""
        try:
            return self._verdicts[relative]
        except (KeyError, TypeError):
            pass
        reason = _lexical(relative, self.url)
        if reason is None and not self.url:
            reason = self._resolved(relative)
        if isinstance(relative, str):
            self._verdicts[relative] = reason
        return reason

    def _resolved(self, relative: str) -> str | None:
        if self._real is None:
            self._real = _allowed_roots(os.path.realpath(self.root))
        folder, name = os.path.split(os.path.join(self.root, relative))
        known = self._folders.get(folder)
        if known is None:  # the folder's links resolved once: where it really is, and whether that is inside
            real_folder = os.path.realpath(folder)
            known = self._folders[folder] = (real_folder, any(_within(real_folder, r) for r in self._real))
        real = os.path.join(known[0], name)
        if os.path.islink(real):
            real = os.path.realpath(real)
        elif known[1]:
            return None
        if any(_within(real, r) for r in self._real):
            return None
        return f"it resolves through a symbolic link to {shorten(real)}, which {TRUSTED_ROOTS_ENV} does not trust"

    def __getstate__(self) -> dict:
        return {"root": self.root, "url": self.url}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"], state["url"])


def shard_outside(index_path: str, shard: str, confined: Confined | None = None) -> str | None:
    """Why the ``shard`` value of the index at ``index_path`` names a file outside the index's folder (an absolute
    path, ``..``, a symbolic link out of it; a URL from a local index, or under another scheme, host or prefix
    than a remote index's own), or None. ``confined``: the index folder's :class:`Confined`, to reuse its
    verdicts over many shards."""
    index_path = os.fspath(index_path)
    remote = "://" in index_path and not index_path.startswith("file://")
    folder = posixpath.dirname(index_path) if remote else os.path.dirname(os.path.abspath(index_path))
    confined = confined or Confined(folder, remote)
    if isinstance(shard, str) and "://" in shard:
        if not remote:
            return "it is a URL, and a local index names only files beside it"
        prefix = folder.rstrip("/") + "/"
        if not shard.startswith(prefix) or urlsplit(shard)[:2] != urlsplit(index_path)[:2]:
            return "it is a URL under another scheme, host or folder than the index's own"
        shard = shard[len(prefix):]
    return confined.outside(shard)


def check_shards(index_path: str, shards: Sequence[str]) -> None:
    """Raise :class:`UnsafePathError` naming the index, the shard value and why, for the first of ``shards`` (an
    index's distinct ``shard`` values) outside the index's folder (:func:`shard_outside`)."""
    index_path = os.fspath(index_path)
    remote = "://" in index_path and not index_path.startswith("file://")
    folder = posixpath.dirname(index_path) if remote else os.path.dirname(os.path.abspath(index_path))
    confined = Confined(folder, remote)
    for shard in shards:
        reason = shard_outside(index_path, shard, confined)
        if reason is not None:
            raise UnsafePathError(f"{index_path}: column 'shard' names {shorten(shard)}, outside the index's folder "
                                  f"({reason}); an index reads only shards inside its own folder")
