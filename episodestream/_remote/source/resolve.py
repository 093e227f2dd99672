"""From a remote ``source`` to an fsspec filesystem, the dataset's root in it and a pinned revision.

Hub sources (``owner/name`` or ``hf://datasets/owner/name[@revision][/subfolder]``) resolve
``revision`` (default ``main``) once, here, to a commit sha; the root then names that sha, so every
process that unpickles the result reads the same bytes even if the branch moves. Other URLs go to
the fsspec filesystem of their scheme (``s3://`` s3fs, ``gs://`` gcsfs, ``file://``, ...), with
``storage_options`` and the clients' usual credential lookup (AWS/GCP environment and config).

Plain ``http(s)://`` servers list folders as HTML pages of links, without sizes: the listing then
asks each file's size (HEAD, else a ranged GET), in parallel.

Secrets (the Hub token, keys inside ``storage_options``, the ``user:password@`` of an http URL,
which becomes an ``Authorization`` header) are never put into a description, an error message, a
repr or a cache folder name; errors from the clients are re-raised with them redacted and their
chain cut, so no traceback shows a header either.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import logging
import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse, urlsplit

import fsspec
from fsspec.asyn import AsyncFileSystem

from episodestream._base.gc_pause import gc_paused
from episodestream._base.paths import CACHE_DIR_ENV, default_cache_dir  # noqa: F401  (re-exported)
from episodestream._base.redact import redact_secrets, redact_url
from episodestream._remote.source import hub_api
from episodestream._remote.transport.download import DownloadFetch, default_fetch, link_name_of
from episodestream._remote.transport.failures import error_line, status_of
from episodestream._remote.transport.hub_http import import_client as import_hub_client
from episodestream._remote.transport.hub_link import HubLink
from episodestream._remote.transport.request import DownloadError

DEFAULT_HUB_ENDPOINT = "https://huggingface.co"
CACHE_LIMIT_ENV = "EPISODESTREAM_CACHE_LIMIT"
CACHE_WAIT_ENV = "EPISODESTREAM_CACHE_WAIT_S"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
_SECRET_KEYS = ("token", "secret", "key", "password", "credential", "session", "authorization")
_HTTP = ("http", "https")
_SIZE_REQUESTS_IN_FLIGHT = 16  # concurrent HEADs while sizing an HTTP listing or looking files up
SUPPORTED_SOURCES = ("a local folder (or file:// URL), a Hub repo id 'owner/name', hf://datasets/owner/name, "
                     "s3://bucket/prefix, gs://bucket/prefix, http(s)://server/folder (a server that lists "
                     "folders), or another fsspec URL whose filesystem needs only the path and storage_options")

logger = logging.getLogger("episodestream.remote")


@dataclass(frozen=True)
class FileEntry:
    """One file of the listing: its size and a version (Hub blob id, S3 ETag, mtime) for cache keys."""

    size: int
    version: str


@dataclass(frozen=True)
class ResolvedSource:
    """Where a remote dataset is, as plain picklable data; ``filesystem()`` makes a client."""

    protocol: str  # fsspec protocol: "hf", "s3", "gs", "file", ...
    root: str  # the dataset root inside the filesystem, without protocol (http: the URL, without credentials)
    description: str  # for messages, e.g. "hf://datasets/lerobot/pusht@<sha>" (never a secret)
    cache_key: str  # the cache folder of this source (and revision)
    revision_sha: str | None = None  # Hub only: the commit every process reads
    endpoint: str | None = None  # Hub only
    token: Any = field(default=None, repr=False)
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def filesystem(self) -> fsspec.AbstractFileSystem:
        """A new client (not fsspec's per-process instance cache: each process makes its own)."""
        fs_class = client_class(self.protocol)  # a spawned worker's first: imported with the collector paused
        if self.protocol == "hf":  # a ``HubLink``: every Hub request is ours (``hub_api``, ``DownloadFetch``)
            return fs_class(endpoint=self.endpoint, token=self.token, skip_instance_cache=True,
                            **dict(self.storage_options))
        return fs_class(skip_instance_cache=True, **dict(self.storage_options))

    def secrets(self) -> list[str]:
        return _secrets(self.token, self.storage_options)

    def path(self, relpath: str) -> str:
        return f"{self.root}/{relpath}" if relpath else self.root


def client_class(protocol: str) -> type[fsspec.AbstractFileSystem]:
    """fsspec's filesystem class for ``protocol``, imported, the first time, with the cyclic collector
    paused; for ``hf``, ``HubLink`` (``_remote.transport.hub_link``), after importing the part of
    huggingface_hub our Hub requests use (``hub_http.import_client``: not ``HfFileSystem``, whose
    module imports ``huggingface_hub.hf_api`` for requests that are ours now).

    A client's first import (huggingface_hub with httpx, s3fs with aiobotocore and botocore) makes
    tens of thousands of objects in a burst, and in a trainer that has imported torch each burst
    sets off collections that walk its whole heap: there the collector, not the import, was most of
    what a process's first remote dataset paid before its first request (benchmarks/LOG.md, "The
    remote first batch from a cold process"). An import's modules, classes and functions live until
    the process ends, so the paused collector has next to nothing to find afterwards. Raises
    fsspec's ``ImportError`` / ``ValueError`` for a client that is not installed or not known.
    """
    with gc_paused():
        if protocol == "hf":
            import_hub_client()
            return HubLink
        return fsspec.get_filesystem_class(protocol)


def _secrets(token: Any, options: Mapping[str, Any]) -> list[str]:
    found = [token] if isinstance(token, str) and token else []

    def walk(value: Any, key: str = "") -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, str(k))
        elif isinstance(value, str) and len(value) >= 4 and any(s in key.lower() for s in _SECRET_KEYS):
            found.append(value)

    walk(options)
    return found


def _userinfo(url: str) -> list[str]:
    """The ``user:password`` of a URL (and its parts, decoded too) as secrets to redact."""
    netloc = urlsplit(url).netloc
    if "@" not in netloc:
        return []
    userinfo = netloc.rsplit("@", 1)[0]
    password = userinfo.partition(":")[2]
    found = {userinfo, unquote(userinfo)} | ({password, unquote(password)} if len(password) >= 3 else set())
    return sorted(found, key=len, reverse=True)  # the longest first, so no part is left half-redacted


def _with_basic_auth(parsed: Any, options: dict) -> dict:
    """``storage_options`` with the URL's ``user:password`` as a Basic ``Authorization`` header on
    every request (fsspec's HTTP filesystem sends ``headers`` with each); the caller's own
    ``Authorization`` header wins."""
    if parsed.username is None:
        return options
    pair = f"{unquote(parsed.username)}:{unquote(parsed.password or '')}"
    headers = dict(options.get("headers") or {})
    headers.setdefault("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    return {**options, "headers": headers}


def _cache_key(*parts: str, readable: str) -> str:
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._]+", "_", readable).strip("_")[:80]
    return f"{slug}-{digest}"


def looks_like_hub_repo(source: str) -> bool:
    return bool(_REPO_ID.match(source))


def resolve_source(source: str, *, revision: str | None, storage_options: Mapping[str, Any] | None,
                   hub_endpoint: str | None, token: Any, sender: DownloadFetch | None = None) -> ResolvedSource:
    """Resolve a URL or Hub repo id; Hub revisions become a commit sha (one request, sent by
    ``sender``: default ``default_fetch()``)."""
    options = dict(storage_options or {})
    parsed = urlparse(source)
    if parsed.scheme in ("", "hf"):
        if parsed.scheme == "":
            if not looks_like_hub_repo(source):
                raise FileNotFoundError(
                    f"source {source!r} is neither an existing local folder, nor a URL with a scheme "
                    f"(hf://, s3://, gs://, file://, ...), nor a Hub repo id like 'lerobot/pusht'.")
            try:
                return _resolve_hub(source, "", revision, options, hub_endpoint, token, sender)
            except (FileNotFoundError, PermissionError, ConnectionError) as error:
                # "data/my_robot" is a Hub repo id and a relative path alike: a user who meant a
                # local folder would otherwise read only of the Hub (or of a network error).
                raise type(error)(f"{error} ({source!r} was read as a Hub repo id because there is no local "
                                  f"folder {os.path.abspath(source)!r}; for a local dataset, check that "
                                  f"path.)") from None
        repo_id, subfolder, url_revision = _parse_hf_url(source)
        if url_revision is not None and revision is not None and url_revision != revision:
            raise ValueError(f"source {source!r} names revision {url_revision!r} but revision={revision!r} "
                             f"was passed; give it once.")
        return _resolve_hub(repo_id, subfolder, revision or url_revision, options, hub_endpoint, token,
                            sender)
    if revision is not None:
        raise ValueError(f"revision={revision!r} applies to Hub datasets; {source!r} is a "
                         f"{parsed.scheme}:// URL, read as it is. Pass revision=None.")
    if token is not None:
        raise ValueError(f"token= is for Hub datasets; pass credentials for {parsed.scheme}:// in "
                         f"storage_options (or the client's usual environment and config).")
    protocol = parsed.scheme
    shown = redact_url(source)
    try:
        fs_class = client_class(protocol)
    except (ImportError, ValueError) as error:
        hint = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}.get(protocol)
        raise ImportError(f"source {shown!r} needs the fsspec filesystem for {protocol}://"
                          + (f": pip install {hint}" if hint else "") + f" ({redact_secrets(str(error), _userinfo(source))}). "
                          f"Sources are {SUPPORTED_SOURCES}.") from None
    if protocol in _HTTP:
        # fsspec's HTTP paths are whole URLs. Credentials move from the URL to a header sent with
        # every request, so no path, log line or message of ours or fsspec's holds them.
        options = _with_basic_auth(parsed, options)
        root = redact_url(source).rstrip("/") if parsed.username is not None else source.rstrip("/")
        description = root
    else:
        root = fs_class._strip_protocol(source).rstrip("/")
        description = f"{protocol}://{root.lstrip('/')}" if protocol != "file" else f"file://{root}"
    identity = (protocol, root, repr(sorted((k, repr(v)) for k, v in options.items()
                                              if k in ("endpoint_url", "client_kwargs"))))
    # The folder is named after the description, which never holds credentials.
    resolved = ResolvedSource(protocol, root, description,
                              _cache_key(*identity, readable=f"{protocol}_{description.split('://', 1)[-1]}"),
                              storage_options=options)
    def cannot_make(why: str) -> ValueError:
        return ValueError(f"source {shown!r}: the fsspec filesystem for {protocol}:// cannot be made from this URL "
                          f"and storage_options ({why}). Sources are {SUPPORTED_SOURCES}.")

    needed = _missing_arguments(fs_class, options)
    if needed:  # refused before one is made (see _missing_arguments)
        raise cannot_make(f"its constructor needs {', '.join(needed)}, which the URL does not give it")
    try:
        resolved.filesystem()  # made again, per process, when read; this is the check that it can be
    except Exception as error:  # a bad option, a client that cannot start, ...
        raise cannot_make(f"{type(error).__name__}: {error_line(error, resolved.secrets())}") from None
    return resolved


def _missing_arguments(fs_class: type, options: Mapping[str, Any]) -> list[str]:
    """The constructor arguments of ``fs_class`` without a default that ``options`` do not give
    (ftp: ``host``). Checked before making one: a half-made instance's ``__del__`` can fail noisily
    (fsspec's FTPFileSystem prints an ignored AttributeError beside our error)."""
    try:
        # The class's own signature is its metaclass's (*args, **kwargs: fsspec caches instances), so read
        # __init__'s from the class (mypy: "unsound" for a subclass's __init__, the one wanted here).
        parameters = list(inspect.signature(fs_class.__init__).parameters.values())[1:]  # type: ignore[misc]
    except (TypeError, ValueError):  # no signature to read: let making one tell
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in kinds and p.default is p.empty and p.name not in options]


def _parse_hf_url(source: str) -> tuple[str, str, str | None]:
    # hf://datasets/owner/name[@revision][/path]; revisions may be percent-encoded ("refs%2Fpr%2F1").
    rest = source[len("hf://"):]
    parts = rest.split("/")
    if len(parts) < 3 or parts[0] != "datasets":
        raise ValueError(f"source {source!r}: Hub URLs look like hf://datasets/<owner>/<name>[@revision]"
                         f"[/folder] (episodestream reads dataset repos).")
    owner, name = parts[1], parts[2]
    revision = None
    if "@" in name:
        name, revision = name.split("@", 1)
        revision = unquote(revision)
    return f"{owner}/{name}", "/".join(p for p in parts[3:] if p), revision


def _hub_endpoint(hub_endpoint: str | None) -> str:
    # Read when needed: huggingface_hub reads HF_ENDPOINT once at import, too early for a process
    # (or a test) that sets it before building a dataset.
    return (hub_endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_HUB_ENDPOINT).rstrip("/")


def _resolve_hub(repo_id: str, subfolder: str, revision: str | None, options: dict, hub_endpoint: str | None,
                 token: Any, sender: DownloadFetch | None) -> ResolvedSource:
    client_class("hf")  # imports huggingface_hub's HTTP stack and errors, the collector paused
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    endpoint = _hub_endpoint(hub_endpoint)
    secrets = _secrets(token, options)
    shown_revision = revision or "main"
    where = f"Hub dataset {repo_id!r} at {endpoint}"
    try:
        sha = hub_api.commit_sha(sender or default_fetch(), link_name_of("hf", endpoint), endpoint, repo_id,
                                 revision, token)
    except RevisionNotFoundError:
        raise FileNotFoundError(f"revision {shown_revision!r} not found in {where}: pass a branch, tag or "
                                f"commit sha that exists.") from None
    except RepositoryNotFoundError as error:
        status = status_of(error)
        raise FileNotFoundError(
            f"{where} not found" + (f" (HTTP {status})" if status else "") + ". Check the repo id; a private "
            "or gated dataset needs a token with access (token=, HF_TOKEN or `hf auth login`).") from None
    except HfHubHTTPError as error:
        status = status_of(error)
        message = error_line(error, secrets)
        if status in (401, 403):
            raise PermissionError(f"{where} refused the credentials given (HTTP {status}: {message}). Check "
                                  f"the token (token=, HF_TOKEN or `hf auth login`); it is not shown "
                                  f"here.") from None
        raise ConnectionError(f"Reading {where} (revision {shown_revision!r}) failed: {message}") from None
    except DownloadError as error:  # names the URL, the last status and the attempts (redacted)
        reached = error.status is not None
        raise ConnectionError(f"{'Reading' if reached else 'Could not reach'} {where}"
                              + (f" (revision {shown_revision!r}) failed" if reached else "") + f": {error}") from None
    except Exception as error:  # connection refused, DNS, timeouts: httpx's own classes, not OSError
        raise ConnectionError(f"Could not reach {where}: {type(error).__name__}: "
                              f"{redact_secrets(str(error), secrets)}") from None
    if not isinstance(sha, str) or not _COMMIT_SHA.fullmatch(sha):
        raise ConnectionError(f"{where} answered revision {shown_revision!r} without a commit sha ({sha!r}).")
    return _hub_source(repo_id, subfolder, sha, endpoint, token, options)


def _hub_source(repo_id: str, subfolder: str, sha: str, endpoint: str, token: Any, options: dict) -> ResolvedSource:
    root = f"datasets/{repo_id}@{sha}" + (f"/{subfolder}" if subfolder else "")
    description = f"hf://datasets/{repo_id}@{sha}" + (f"/{subfolder}" if subfolder else "")
    key = _cache_key(endpoint, repo_id, sha, subfolder, readable=f"hub_{repo_id}_{sha[:12]}_{subfolder}")
    return ResolvedSource("hf", root, description, key, revision_sha=sha, endpoint=endpoint, token=token,
                          storage_options=options)


def pinned_hub_source(source: str, *, revision: str | None, storage_options: Mapping[str, Any] | None,
                      hub_endpoint: str | None, token: Any) -> ResolvedSource | None:
    """What ``resolve_source`` will return, known without a request: a Hub source whose revision is
    a full commit sha (the commit request then only confirms it); None for anything else (a branch
    or tag, which only the Hub can pin, or a source ``resolve_source`` will refuse).

    ``open_remote_source`` lists ``meta/`` at that commit beside the commit request: nothing can
    move a commit, so the listing is the one it would make after the answer, a round trip sooner.
    A branch is never listed ahead so: had it moved between the two requests, the listing would
    not be of the commit every process reads."""
    parsed = urlparse(source)
    try:
        if parsed.scheme == "" and looks_like_hub_repo(source):
            repo_id, subfolder, url_revision = source, "", None
        elif parsed.scheme == "hf":
            repo_id, subfolder, url_revision = _parse_hf_url(source)
        else:
            return None
    except ValueError:  # a malformed hf:// URL: resolve_source says what is wrong
        return None
    if url_revision is not None and revision is not None:
        return None  # given twice: resolve_source refuses it (or takes it) with its own message
    sha = revision if revision is not None else url_revision
    if sha is None or not _COMMIT_SHA.fullmatch(sha):
        return None
    return _hub_source(repo_id, subfolder, sha, _hub_endpoint(hub_endpoint), token, dict(storage_options or {}))


def list_source(resolved: ResolvedSource, *, folder: str = "", fs: fsspec.AbstractFileSystem | None = None,
                sender: DownloadFetch | None = None) -> dict[str, FileEntry]:
    """Every file below the root (or below its ``folder``) with its size and version: one recursive
    listing (one request a page, each sent by ``sender``, default ``default_fetch()``: permits,
    retries). A ``folder`` that is absent or empty lists as ``{}``; the root holding no files is an
    error; a link that fails for good raises ``DownloadError``. ``fs``: a client of ``resolved`` to reuse."""
    fs = resolved.filesystem() if fs is None else fs
    sender = default_fetch() if sender is None else sender
    root = resolved.root.rstrip("/")
    below = f"{root}/{folder}" if folder else root
    try:
        if resolved.protocol == "hf":
            found = _hub_listing(resolved, folder, sender)
        else:
            found = sender.send(fs, lambda timeout_s: fs.find(below, detail=True, withdirs=False),
                                url=f"{resolved.description}/{folder}".rstrip("/"))
    except DownloadError:
        raise
    except Exception as error:  # each client has its own hierarchy (OSError, httpx, botocore)
        absent = isinstance(error, FileNotFoundError) or status_of(error) == 404
        if not (absent and (folder or resolved.protocol == "hf")):  # a Hub folder absent: "holds no files"
            raise _listing_error(error, resolved) from None
        found = {}
    infos = {}
    for path, info in found.items():
        path = fs._strip_protocol(path) if "://" in path else path
        if path.startswith(below + "/") and info.get("type", "file") == "file":
            infos[path[len(root) + 1:]] = info
    if not infos:
        if folder:
            return {}
        if resolved.protocol in _HTTP:
            _check_reachable(fs, resolved)
        raise FileNotFoundError(f"{resolved.description} holds no files: check the path (a LeRobot v3.0 dataset "
                                f"has meta/info.json below its root).")
    unsized = sorted(relpath for relpath, info in infos.items() if info.get("size") is None)
    if unsized:  # an HTML folder listing (plain HTTP servers) has links, not sizes
        infos.update(_sized(fs, resolved, unsized, sender))
    return {relpath: file_entry(info) for relpath, info in infos.items()}


def _hub_listing(resolved: ResolvedSource, folder: str, sender: DownloadFetch) -> dict[str, dict[str, Any]]:
    """``fs.find``'s answer for a Hub source, by its own requests (``hub_api.list_tree``)."""
    repo_id, in_repo = hub_repo_path(resolved)
    below = "/".join(p for p in (in_repo, folder) if p)
    assert resolved.endpoint is not None and resolved.revision_sha is not None  # a resolved Hub source
    found = hub_api.list_tree(sender, link_name_of("hf", resolved.endpoint), resolved.endpoint, repo_id,
                              resolved.revision_sha, below, resolved.token)
    top = f"datasets/{repo_id}@{resolved.revision_sha}"
    return {f"{top}/{path}": info for path, info in found.items()}


def file_entry(info: Mapping[str, Any]) -> FileEntry:
    """A client's ``info`` of a file as a ``FileEntry``: listed or asked for alone, the same file
    gives the same entry (its cache names depend on it)."""
    version = next((str(info[k]) for k in ("blob_id", "ETag", "etag", "md5Hash", "generation", "mtime", "oid",
                                            "Last-Modified") if info.get(k)), "")
    return FileEntry(int(info["size"]), version)


def hub_repo_path(resolved: ResolvedSource) -> tuple[str, str]:
    """A Hub source's repo id and the folder inside the repo its root is (``""`` for the top):
    ``root`` is ``datasets/<owner>/<name>@<sha>[/<folder>]`` (``_resolve_hub``)."""
    owner, name_at_sha, *folder = resolved.root.split("/", 1)[1].split("/")
    return f"{owner}/{name_at_sha.split('@', 1)[0]}", "/".join(folder)


def _check_reachable(fs: fsspec.AbstractFileSystem, resolved: ResolvedSource) -> None:
    """Raise ``ConnectionError`` with the underlying error when the server cannot be reached.

    fsspec's ``find`` omits folders it fails to list (its walk's ``on_error="omit"``), so a refused
    connection, or https against a plain http server, comes back as an empty listing; listing the
    root alone, which raises, tells that apart from a folder that is truly empty or absent.
    """
    try:
        fs.ls(resolved.root, detail=False)
    except FileNotFoundError:  # reached, and the folder is not there: "holds no files" says so
        return
    except Exception as error:
        # aiohttp's connection and SSL errors are OSErrors without an HTTP status.
        if isinstance(error, OSError) and not isinstance(error, PermissionError) and status_of(error) is None:
            raise ConnectionError(
                f"Could not reach the server of {resolved.description}: {type(error).__name__}: "
                f"{error_line(error, resolved.secrets())}. Check the URL's scheme (http or https), host and "
                f"port, and that the server is running.") from None
        raise _listing_error(error, resolved) from None


def _listing_error(error: BaseException, resolved: ResolvedSource) -> OSError:
    """A client's error listing the source as ours: refused, not found or failed, naming it."""
    status = status_of(error)
    message = error_line(error, resolved.secrets())
    if isinstance(error, PermissionError) or status in (401, 403):
        return PermissionError(f"Listing {resolved.description} was refused: {message}. Check the credentials "
                               f"(storage_options=, or the client's environment and config files); they are "
                               f"not shown here.")
    if isinstance(error, FileNotFoundError) or status == 404:
        return FileNotFoundError(f"{resolved.description} not found: {message}")
    return ConnectionError(f"Listing {resolved.description} failed: {type(error).__name__}: {message}")


def file_infos(fs: fsspec.AbstractFileSystem, resolved: ResolvedSource, relpaths: list[str],
               sender: hub_api.Sender) -> list[Any]:
    """``info`` of each file, or the error asking it raised (returned, not raised: one failure does
    not leave the others running): HEAD, else a GET's headers (fsspec's ``info``), else, on http, a
    ranged GET's ``Content-Range`` for the size. Each one request through ``sender`` (permits,
    retries), ``_SIZE_REQUESTS_IN_FLIGHT`` at a time."""

    def info(relpath: str) -> Any:
        url = resolved.path(relpath)
        try:
            return sender.send(fs, lambda timeout_s: _sized_info(fs, resolved, url), url=url)
        except Exception as error:
            return error

    if len(relpaths) < 2:
        return [info(relpath) for relpath in relpaths]
    with ThreadPoolExecutor(max_workers=min(_SIZE_REQUESTS_IN_FLIGHT, len(relpaths)),
                            thread_name_prefix="episodestream-info") as pool:
        return list(pool.map(info, relpaths))


def _sized_info(fs: fsspec.AbstractFileSystem, resolved: ResolvedSource, url: str) -> dict[str, Any]:
    found = dict(fs.info(url))
    if found.get("size") is None and resolved.protocol in _HTTP and isinstance(fs, AsyncFileSystem):
        found["size"] = fsspec.asyn.sync(fs.loop, ranged_size, fs, url)
    return found


def _sized(fs: fsspec.AbstractFileSystem, resolved: ResolvedSource, relpaths: list[str],
           sender: DownloadFetch) -> dict[str, dict]:
    """``info`` (with a size) of each file (``file_infos``); an error or a missing size raises."""
    results = file_infos(fs, resolved, relpaths, sender)
    infos = {}
    for relpath, result in zip(relpaths, results):
        where = f"{resolved.description}/{relpath}"
        if isinstance(result, BaseException):
            raise ConnectionError(f"Asking the size of {where} failed: {type(result).__name__}: "
                                  f"{error_line(result, resolved.secrets())}") from None
        if result.get("size") is None:
            raise OSError(f"{where}: the server gives no size for it (no Content-Length on HEAD or GET, no "
                          f"Content-Range on a ranged GET); episodestream needs file sizes to read byte ranges.")
        infos[relpath] = result
    if resolved.protocol in _HTTP and isinstance(fs, AsyncFileSystem):
        _warn_without_ranges(fs, resolved, relpaths)
    return infos


async def _first_byte(fs: Any, url: str) -> tuple[int, Any]:
    """Status and headers of a GET of ``url``'s first byte (the body is not read)."""
    options = dict(fs.kwargs)
    headers = {**options.pop("headers", {}), "Range": "bytes=0-0"}
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **options) as response:
        return response.status, response.headers


async def ranged_size(fs: Any, url: str) -> int | None:
    _, headers = await _first_byte(fs, url)
    total = headers.get("Content-Range", "").rpartition("/")[2]
    return int(total) if total.isdigit() else None


def _warn_without_ranges(fs: Any, resolved: ResolvedSource, relpaths: list[str]) -> None:
    """One ranged GET: a server that ignores ``Range`` works (reads are cut from whole bodies) but
    sends the whole file for every read, which a user should know."""
    try:
        status, _ = fsspec.asyn.sync(fs.loop, _first_byte, fs, resolved.path(relpaths[0]))
    except Exception:  # the reads will say what is wrong, naming the file
        return
    if status == 200:
        logger.warning("%s ignores HTTP Range requests (it answered a ranged GET of %s with the whole file): "
                       "every read downloads whole files. Serve it with a server that supports Range.",
                       resolved.description, relpaths[0])
