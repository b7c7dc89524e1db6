"""A small fake of the Hugging Face Hub for the ``hf://`` backend's tests, in a subprocess.

:class:`FakeHub` serves revision info, a paginated tree, paths-info and refs on 127.0.0.1, and
``resolve`` redirects to a "CDN" on a second port and host name (``localhost``), with fault
rules and a request log for both hosts; what it shares with the fault server is in
:mod:`servers.httpapp`.

``python -m servers.hub --repo ORG/NAME=DIR`` (from ``tests/``, or with ``PYTHONPATH=tests``)
runs one for manual use and prints its ``HF_ENDPOINT``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servers import httpapp
from servers.httpapp import (
    _control_routes,
    _error_maker_json,
    _error_maker_text,
    _listen,
    _logging_middleware,
    _PythonServer,
    _safe_file,
    _serve_file,
    _State,
)
from shardstream.testing.process import HOST

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["FakeHub", "main"]

_CDN_HOST = "localhost"  # same machine, other name and port: a different origin for clients
_SHA_RE = re.compile(r"[0-9a-f]{40}")
_LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"


class FakeHub(_PythonServer):
    """A small fake of the Hugging Face Hub for datasets, in a subprocess, on two origins.

    The Hub host is ``http://127.0.0.1:<port>`` (:attr:`endpoint`, for ``HF_ENDPOINT``); files
    are served by a "CDN" at ``http://localhost:<cdn_port>`` (:attr:`cdn_url`), a different
    origin, so clients following a redirect there must drop ``Authorization``. A dataset repo
    ``ORG/NAME`` maps commit shas (40 lowercase hex digits) to directories whose files are the
    commit's files (read at request time); branches (``main``, ``refs/convert/parquet``, ...)
    map to shas and can be moved at run time.

    Hub host endpoints (REV: a branch or full sha, possibly URL-encoded as
    ``refs%2Fconvert%2Fparquet``; private repos answer 401 without ``Authorization: Bearer
    <token>``; errors are JSON ``{"error": ...}`` with ``X-Error-Code`` ``RepoNotFound``,
    ``RevisionNotFound`` or ``EntryNotFound``, as the real Hub sends):

    - ``GET /api/datasets/ORG/NAME[/revision/REV]``: ``{"id", "sha", "private", "siblings",
      "lastModified", ...}`` (without REV: ``main``);
    - ``GET /api/datasets/ORG/NAME/tree/REV[/PATH]?recursive=true|false``: entries ``{"type":
      "file"|"directory", "path", "size", "oid"}``, files larger than ``lfs_threshold_bytes``
      also ``"lfs": {"oid": <sha256>, "size", "pointerSize"}``; sorted by path; pages of
      ``page_size`` entries linked by ``Link: <...&cursor=...>; rel="next"``; PATH may be
      URL-encoded as one segment (``data%2Ftrain``), as huggingface_hub sends it;
    - ``POST /api/datasets/ORG/NAME/paths-info/REV`` (form or JSON ``paths``): entries as in
      tree for the paths that exist;
    - ``GET /api/datasets/ORG/NAME/refs``: ``{"branches": [...], "converts": [...], "tags": []}``;
    - ``GET|HEAD /datasets/ORG/NAME/resolve/REV/PATH``: ``302`` to
      ``<cdn_url>/cdn/ORG/NAME/SHA/PATH?expires=...&signature=...`` with ``X-Repo-Commit``,
      ``X-Linked-Size``, ``X-Linked-Etag: "<etag the CDN serves>"`` (the sha256 for LFS files,
      the git blob sha1 otherwise) and ``ETag: "<git blob sha1>"`` (of the LFS pointer for LFS
      files); ``404`` with ``X-Error-Code: EntryNotFound`` for a missing file. With
      ``direct_small_files=True`` files not above ``lfs_threshold_bytes`` are served by the Hub
      host itself (200/206), as the real Hub does for files kept in git.

    The CDN checks only the URL's signature and expiry (``403`` otherwise), never
    ``Authorization``, and serves the bytes like :class:`FaultServer` (Range, ETag, If-Match).
    :meth:`requests` logs both hosts (``host`` is ``"hub"`` or ``"cdn"``); fault rules take a
    ``host`` key (``"hub"`` by default, ``"cdn"`` or ``"any"``); ``path_glob`` matches the
    request path on that host, except for ``change_etag`` where it matches ``/ORG/NAME/PATH``.

    Args:
        repos: ``{"ORG/NAME": {sha: directory}}``; ``main`` points to each repo's last sha.
        page_size: Tree entries per page.
        lfs_threshold_bytes: Files larger than this are LFS files (real Hub: 10 MiB).
        cdn_url_ttl_s: Seconds a CDN URL stays valid.
        direct_small_files: Serve non-LFS files from the Hub host instead of redirecting.
        startup_timeout_s: Seconds to wait for the subprocess to answer.

    Attributes:
        endpoint: The Hub host URL, ``http://127.0.0.1:<port>``.
        cdn_url: The CDN host URL, ``http://localhost:<cdn_port>``.
        port, cdn_port: The two TCP ports (both on 127.0.0.1).
    """

    _kind = "hub"
    _module = "servers.hub"
    _label = "fake Hub"
    _hosts = ("hub", "cdn")

    def __init__(
        self,
        repos: Mapping[str, Mapping[str, str | os.PathLike]] | None = None,
        *,
        page_size: int = 50,
        lfs_threshold_bytes: int = 10 * 1024 * 1024,
        cdn_url_ttl_s: float = 3600.0,
        direct_small_files: bool = False,
        startup_timeout_s: float = 20.0,
    ) -> None:
        super().__init__(startup_timeout_s)
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size!r}")
        self._config = {
            "repos": {repo_id: _repo_spec(repo_id, commits) for repo_id, commits in (repos or {}).items()},
            "page_size": int(page_size),
            "lfs_threshold_bytes": int(lfs_threshold_bytes),
            "cdn_url_ttl_s": float(cdn_url_ttl_s),
            "direct_small_files": bool(direct_small_files),
        }

    @property
    def endpoint(self) -> str:
        """The Hub host URL (for ``HF_ENDPOINT``); raises WebServerError if not running."""
        return f"http://{HOST}:{self.port}"

    @property
    def cdn_port(self) -> int:
        """The CDN host's TCP port; raises WebServerError if not running."""
        self.port  # noqa: B018 - raises when not running
        return int(self._ready["cdn_port"])

    @property
    def cdn_url(self) -> str:
        """The CDN host URL, ``http://localhost:<cdn_port>``; raises WebServerError if not running."""
        return f"http://{_CDN_HOST}:{self.cdn_port}"

    def env(self) -> dict[str, str]:
        """``{"HF_ENDPOINT": endpoint}``."""
        return {"HF_ENDPOINT": self.endpoint}

    @staticmethod
    def commit_sha(seed: str) -> str:
        """A made-up commit sha (40 hex digits) derived from ``seed``."""
        return hashlib.sha1(seed.encode()).hexdigest()

    def resolve_url(self, repo_id: str, revision: str, path: str) -> str:
        """The Hub URL of one file, as ``huggingface_hub.hf_hub_url`` builds it."""
        rev = urllib.parse.quote(revision, safe="")
        return f"{self.endpoint}/datasets/{repo_id}/resolve/{rev}/{urllib.parse.quote(path)}"

    def _child_args(self, tmp: Path) -> list[str]:
        config = tmp / "hub.json"
        config.write_text(json.dumps(self._config))
        return ["--config", str(config)]

    def start(self) -> FakeHub:
        return super().start()

    def add_repo(
        self,
        repo_id: str,
        commits: Mapping[str, str | os.PathLike] | None = None,
        *,
        branches: Mapping[str, str] | None = None,
        private: bool = False,
        token: str | None = None,
    ) -> None:
        """Adds (or replaces) a dataset repo.

        Args:
            repo_id: ``ORG/NAME``.
            commits: ``{sha: directory}``.
            branches: ``{branch: sha}``; default ``{"main": <last sha>}`` when there are commits.
            private: Answer 401 on the Hub host unless ``Authorization: Bearer <token>`` comes.
            token: The repo's token (required when private), e.g. ``"hf_..."``.
        """
        if private and not token:
            raise ValueError("a private repo needs a token")
        spec = _repo_spec(repo_id, commits or {}, branches=branches)
        spec.update(private=bool(private), token=token)
        self._control("POST", "repo", {"repo_id": repo_id, **spec})

    def add_commit(self, repo_id: str, sha: str, directory: str | os.PathLike, *, branch: str | None = None) -> None:
        """Adds commit ``sha`` (files: those under ``directory``) to a repo; moves ``branch`` to it if given."""
        _check_sha(sha)
        payload = {"repo_id": repo_id, "sha": sha, "directory": _dir(directory), "branch": branch}
        self._control("POST", "commit", payload)

    def set_branch(self, repo_id: str, branch: str, sha: str) -> None:
        """Points ``branch`` (e.g. ``"main"``, ``"refs/convert/parquet"``) of a repo at commit ``sha``."""
        _check_sha(sha)
        self._control("POST", "branch", {"repo_id": repo_id, "branch": branch, "sha": sha})

    def set_page_size(self, page_size: int) -> None:
        """Sets the number of tree entries per page."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size!r}")
        self._control("POST", "settings", {"page_size": int(page_size)})


def _check_sha(sha: str) -> None:
    if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
        raise ValueError(f"a commit sha must be 40 lowercase hex digits, got {sha!r}")


def _dir(directory: str | os.PathLike) -> str:
    path = Path(directory).resolve()
    if not path.is_dir():
        raise ValueError(f"commit directory {str(path)!r} is not a directory")
    return str(path)


def _repo_spec(
    repo_id: str, commits: Mapping[str, str | os.PathLike], *, branches: Mapping[str, str] | None = None
) -> dict[str, Any]:
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"repo_id must be 'ORG/NAME', got {repo_id!r}")
    for sha in commits:
        _check_sha(sha)
    shas = list(commits)
    if branches is None:
        branches = {"main": shas[-1]} if shas else {}
    for branch, sha in branches.items():
        if sha not in commits:
            raise ValueError(f"branch {branch!r} of {repo_id} points to {sha!r}, which is not one of its commits")
    return {
        "commits": {sha: _dir(d) for sha, d in commits.items()},
        "branches": dict(branches),
        "private": False,
        "token": None,
    }


class _Refused(Exception):
    """An error answer of the fake Hub, raised where a lookup fails and sent by :meth:`_Hub.handle_hub`."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


class _Hub:
    """The fake Hub's repos and answers (server side)."""

    def __init__(self, config: Mapping[str, Any], state: _State, cdn_base: str) -> None:
        self.repos: dict[str, dict[str, Any]] = {k: dict(v) for k, v in config.get("repos", {}).items()}
        self.page_size = int(config.get("page_size", 50))
        self.lfs_threshold = int(config.get("lfs_threshold_bytes", 10 * 1024 * 1024))
        self.ttl_s = float(config.get("cdn_url_ttl_s", 3600.0))
        self.direct_small_files = bool(config.get("direct_small_files", False))
        self.state = state
        self.cdn_base = cdn_base
        self.secret = secrets.token_bytes(32)
        self._hashes: dict[str, tuple[int, int, tuple[str, str | None, int | None]]] = {}

    # -- control --------------------------------------------------------------------------

    def control_repo(self, body: Mapping[str, Any]) -> dict[str, Any]:
        repo_id = body["repo_id"]
        self.repos[repo_id] = {k: body[k] for k in ("commits", "branches", "private", "token")}
        return {"ok": True}

    def control_commit(self, body: Mapping[str, Any]) -> dict[str, Any]:
        repo = self.repos[body["repo_id"]]
        repo["commits"][body["sha"]] = body["directory"]
        if body.get("branch"):
            repo["branches"][body["branch"]] = body["sha"]
        return {"ok": True}

    def control_branch(self, body: Mapping[str, Any]) -> dict[str, Any]:
        repo = self.repos[body["repo_id"]]
        if body["sha"] not in repo["commits"]:
            raise ValueError(f"{body['sha']} is not a commit of {body['repo_id']}")
        repo["branches"][body["branch"]] = body["sha"]
        return {"ok": True}

    def control_settings(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if "page_size" in body:
            self.page_size = max(1, int(body["page_size"]))
        return {"page_size": self.page_size}

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    def error(status: int, code: str | None, message: str, extra: Mapping[str, str] | None = None) -> web.Response:
        headers = {"X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        return _error_maker_json(status, message, headers)

    def repo(self, request: web.Request, repo_id: str) -> dict[str, Any]:
        """The repo ``repo_id``; raises _Refused (404, or 401 for a private repo without its token)."""
        repo = self.repos.get(repo_id)
        if repo is None:
            raise _Refused(self.error(404, "RepoNotFound", "Repository not found"))
        if repo.get("private") and request.headers.get("Authorization") != f"Bearer {repo.get('token')}":
            raise _Refused(self.error(401, "RepoNotFound", "Invalid username or password."))
        return repo

    def commit(self, request: web.Request, repo_id: str, rev: str | None) -> tuple[dict[str, Any], str]:
        """The repo and the sha of the commit ``rev`` (a branch or a sha) names; raises _Refused."""
        repo = self.repo(request, repo_id)
        if rev is None or rev == "":
            raise _Refused(self.error(404, "RevisionNotFound", "Invalid rev id: "))
        sha = repo["branches"].get(rev)
        if sha is None and rev in repo["commits"]:
            sha = rev
        if sha is None:
            raise _Refused(self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}"))
        return repo, sha

    def _file_ids_sync(self, path: Path) -> tuple[str, str | None, int | None]:
        """``(git blob oid, sha256 if LFS, LFS pointer size)`` of a file, cached by mtime and size."""
        st = path.stat()
        cached = self._hashes.get(str(path))
        if cached is not None and cached[:2] == (st.st_mtime_ns, st.st_size):
            return cached[2]
        lfs = st.st_size > self.lfs_threshold
        digest = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % st.st_size)
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        if lfs:
            pointer = _LFS_POINTER.format(oid=digest.hexdigest(), size=st.st_size).encode()
            oid = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
            ids = (oid, digest.hexdigest(), len(pointer))
        else:
            ids = (digest.hexdigest(), None, None)
        self._hashes[str(path)] = (st.st_mtime_ns, st.st_size, ids)
        return ids

    async def file_info(self, repo_id: str, rel: str, path: Path) -> dict[str, Any]:
        """The tree entry of a file, with its etag (``etag``: what the CDN serves)."""
        oid, sha256, pointer_size = await asyncio.get_running_loop().run_in_executor(None, self._file_ids_sync, path)
        epoch = self.state.etag_epoch(f"/{repo_id}/{rel}")
        if epoch:  # as if the file was replaced
            oid = hashlib.sha1(f"{oid}:{epoch}".encode()).hexdigest()
            sha256 = None if sha256 is None else hashlib.sha256(f"{sha256}:{epoch}".encode()).hexdigest()
        entry: dict[str, Any] = {"type": "file", "oid": oid, "size": path.stat().st_size, "path": rel}
        if sha256 is not None:
            entry["lfs"] = {"oid": sha256, "size": entry["size"], "pointerSize": pointer_size}
        return entry

    @staticmethod
    def dir_info(sha: str, rel: str) -> dict[str, Any]:
        return {
            "type": "directory",
            "oid": hashlib.sha1(f"tree:{sha}:{rel}".encode()).hexdigest(),
            "size": 0,
            "path": rel,
        }

    @staticmethod
    def walk(base: Path, recursive: bool) -> list[tuple[str, bool]]:
        """``(relative posix path under base, is_dir)`` of the entries under ``base``."""
        out = []
        if recursive:
            for dirpath, dirnames, filenames in os.walk(base):
                rel_dir = Path(dirpath).relative_to(base)
                out += [((rel_dir / d).as_posix(), True) for d in dirnames]
                out += [((rel_dir / f).as_posix(), False) for f in filenames]
        else:
            out = [(p.name, p.is_dir()) for p in base.iterdir()]
        return out

    @staticmethod
    def rel_path(segments: list[str]) -> str | None:
        """Decoded repo path from raw URL segments; None if it has ``..``."""
        parts = [p for s in segments if s for p in urllib.parse.unquote(s).split("/") if p and p != "."]
        if any(p == ".." or "\0" in p for p in parts):
            return None
        return "/".join(parts)

    def sign(self, repo_id: str, sha: str, rel: str, expires: int) -> str:
        msg = f"{repo_id}\n{sha}\n{rel}\n{expires}".encode()
        return hmac.new(self.secret, msg, hashlib.sha256).hexdigest()[:40]

    # -- Hub host ---------------------------------------------------------------------------

    async def handle_hub(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self.route_hub(request)
        except _Refused as refused:
            return refused.response

    async def route_hub(self, request: web.Request) -> web.StreamResponse:
        segs = request.rel_url.raw_path.split("/")[1:]
        if len(segs) >= 4 and segs[:2] == ["api", "datasets"]:
            repo_id = f"{urllib.parse.unquote(segs[2])}/{urllib.parse.unquote(segs[3])}"
            rest = segs[4:]
            op = rest[0] if rest else ""
            if op in ("", "revision") and request.method in ("GET", "HEAD"):
                rev, tail = _split_revision(rest[1:]) if op else ("main", [])
                if any(tail):
                    return self.error(404, None, "Not Found")
                return await self.info(request, repo_id, rev)
            if op == "tree" and request.method in ("GET", "HEAD"):
                rev, tail = _split_revision(rest[1:])
                return await self.tree(request, repo_id, rev, tail)
            if op == "paths-info" and request.method == "POST":
                rev, tail = _split_revision(rest[1:])
                return await self.paths_info(request, repo_id, rev)
            if op == "refs" and request.method in ("GET", "HEAD"):
                return self.refs(request, repo_id)
        if len(segs) >= 6 and segs[0] == "datasets" and segs[3] == "resolve" and request.method in ("GET", "HEAD"):
            repo_id = f"{urllib.parse.unquote(segs[1])}/{urllib.parse.unquote(segs[2])}"
            rev, tail = _split_revision(segs[4:])
            return await self.resolve(request, repo_id, rev, tail)
        return self.error(404, None, "Not Found")

    async def info(self, request: web.Request, repo_id: str, rev: str | None) -> web.Response:
        from aiohttp import web

        repo, sha = self.commit(request, repo_id, rev)
        base = Path(repo["commits"][sha])
        files = sorted(rel for rel, is_dir in self.walk(base, True) if not is_dir)
        stamp = datetime.datetime.fromtimestamp(base.stat().st_mtime, tz=datetime.timezone.utc)
        iso = stamp.strftime("%Y-%m-%dT%H:%M:%S.000Z")
        org, name = repo_id.split("/")
        body = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "author": org,
            "sha": sha,
            "lastModified": iso,
            "createdAt": iso,
            "private": bool(repo.get("private")),
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "description": f"Fake dataset {name}",
            "siblings": [{"rfilename": rel} for rel in files],
            "usedStorage": sum((base / rel).stat().st_size for rel in files),
        }
        return web.json_response(body)

    async def tree(self, request: web.Request, repo_id: str, rev: str | None, tail: list[str]) -> web.Response:
        from aiohttp import web

        repo, sha = self.commit(request, repo_id, rev)
        rel = self.rel_path(tail)
        base = Path(repo["commits"][sha])
        target = base / rel if rel else base
        if rel is None or not target.is_dir():
            return self.error(404, "EntryNotFound", f"Entry not found: {rel}", {"X-Repo-Commit": sha})
        recursive = request.query.get("recursive", "false").lower() in ("1", "true")
        names = sorted((f"{rel}/{p}" if rel else p, is_dir) for p, is_dir in self.walk(target, recursive))
        offset = 0
        cursor = request.query.get("cursor")
        if cursor:
            try:
                offset = int(json.loads(base64.urlsafe_b64decode(cursor.encode()))["offset"])
            except (ValueError, KeyError, TypeError):
                return self.error(400, None, "Invalid cursor")
        page = names[offset : offset + self.page_size]
        entries = []
        for path, is_dir in page:
            entries.append(self.dir_info(sha, path) if is_dir else await self.file_info(repo_id, path, base / path))
        headers = {}
        if offset + self.page_size < len(names):
            token = base64.urlsafe_b64encode(json.dumps({"offset": offset + self.page_size}).encode()).decode()
            headers["Link"] = f'<{request.url.update_query(cursor=token)}>; rel="next"'
        return web.json_response(entries, headers=headers)

    async def paths_info(self, request: web.Request, repo_id: str, rev: str | None) -> web.Response:
        from aiohttp import web

        repo, sha = self.commit(request, repo_id, rev)
        if request.content_type == "application/json":
            body = await request.json()
            paths = body.get("paths") or []
            paths = [paths] if isinstance(paths, str) else list(paths)
        else:
            paths = (await request.post()).getall("paths", [])
        base, out = Path(repo["commits"][sha]), []
        for raw in paths:
            rel = self.rel_path([str(raw)])
            if rel is None:
                continue
            target = base / rel if rel else base
            if rel and target.is_dir():
                out.append(self.dir_info(sha, rel))
            elif rel and target.is_file():
                out.append(await self.file_info(repo_id, rel, target))
        return web.json_response(out)

    def refs(self, request: web.Request, repo_id: str) -> web.Response:
        from aiohttp import web

        repo = self.repo(request, repo_id)
        body: dict[str, list[dict[str, str]]] = {"branches": [], "converts": [], "tags": []}
        for name, sha in sorted(repo["branches"].items()):
            if name.startswith("refs/convert/"):
                body["converts"].append({"name": name.split("/", 2)[2], "ref": name, "targetCommit": sha})
            elif not name.startswith("refs/"):
                body["branches"].append({"name": name, "ref": f"refs/heads/{name}", "targetCommit": sha})
        return web.json_response(body)

    async def resolve(self, request: web.Request, repo_id: str, rev: str | None, tail: list[str]) -> web.StreamResponse:
        from aiohttp import web

        repo, sha = self.commit(request, repo_id, rev)
        rel = self.rel_path(tail)
        path = None if not rel else _safe_file(Path(repo["commits"][sha]), rel)
        if path is None:
            return self.error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
        info = await self.file_info(repo_id, rel, path)
        linked_etag = info["lfs"]["oid"] if "lfs" in info else info["oid"]
        if self.direct_small_files and "lfs" not in info:
            return await _serve_file(request, path, info["oid"], {"X-Repo-Commit": sha})
        expires = int(time.time() + self.ttl_s)
        location = (
            f"{self.cdn_base}/cdn/{urllib.parse.quote(repo_id)}/{sha}/{urllib.parse.quote(rel)}"
            f"?expires={expires}&signature={self.sign(repo_id, sha, rel, expires)}"
        )
        headers = {
            "Location": location,
            "X-Repo-Commit": sha,
            "X-Linked-Size": str(info["size"]),
            "X-Linked-Etag": f'"{linked_etag}"',
            "ETag": f'"{info["oid"]}"',
        }
        return web.Response(status=302, headers=headers, text=f"Found. Redirecting to {location}")

    # -- CDN host ---------------------------------------------------------------------------

    async def handle_cdn(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, headers={"Allow": "GET, HEAD"}, text="Method Not Allowed\n")
        segs = request.rel_url.raw_path.split("/")[1:]
        if len(segs) < 5 or segs[0] != "cdn":
            return web.Response(status=404, text="Not Found\n")
        repo_id = f"{urllib.parse.unquote(segs[1])}/{urllib.parse.unquote(segs[2])}"
        sha, rel = segs[3], self.rel_path(segs[4:])
        try:
            expires = int(request.query.get("expires", ""))
        except ValueError:
            expires = -1
        signature = request.query.get("signature", "")
        if rel is None or not hmac.compare_digest(signature, self.sign(repo_id, sha, rel, expires)):
            return web.Response(status=403, text="AccessDenied: bad signature\n")
        if expires < time.time():
            return web.Response(status=403, text="AccessDenied: request has expired\n")
        directory = self.repos.get(repo_id, {}).get("commits", {}).get(sha)
        path = None if directory is None or not rel else _safe_file(Path(directory), rel)
        if path is None:
            return web.Response(status=404, text="NoSuchKey\n")
        info = await self.file_info(repo_id, rel, path)
        etag = info["lfs"]["oid"] if "lfs" in info else info["oid"]
        return await _serve_file(request, path, etag)


def _split_revision(segments: list[str]) -> tuple[str | None, list[str]]:
    """Splits raw URL segments into (decoded revision, rest); ``refs/x/y`` may come unencoded."""
    if not segments or not segments[0]:
        return None, []
    if segments[0] == "refs" and len(segments) >= 3:
        rev = "refs/" + urllib.parse.unquote(segments[1]) + "/" + urllib.parse.unquote(segments[2])
        return rev, segments[3:]
    return urllib.parse.unquote(segments[0]), segments[1:]


def _hub_apps(config: Mapping[str, Any], cdn_port: int) -> tuple[web.Application, web.Application]:
    from aiohttp import web

    state = _State(("hub", "cdn"))
    hub = _Hub(config, state, f"http://{_CDN_HOST}:{cdn_port}")
    hub_app = web.Application(middlewares=[_logging_middleware(state, "hub", _error_maker_json)])
    controls = {
        "repo": hub.control_repo,
        "commit": hub.control_commit,
        "branch": hub.control_branch,
        "settings": hub.control_settings,
    }
    _control_routes(hub_app, state, controls)
    hub_app.router.add_route("*", "/{tail:.*}", hub.handle_hub)
    cdn_app = web.Application(middlewares=[_logging_middleware(state, "cdn", _error_maker_text)])
    cdn_app.router.add_route("*", "/{tail:.*}", hub.handle_cdn)
    return hub_app, cdn_app


def _make_apps(
    args: argparse.Namespace, sock: socket.socket, ready: dict[str, Any]
) -> tuple[list[tuple[web.Application, socket.socket]], list[str]]:
    config: dict[str, Any] = {}
    if args.config:
        config = json.loads(Path(args.config).read_text())
    else:
        config = {"page_size": args.page_size, "repos": {}}
        for spec in args.repo:
            repo_id, _, directory = spec.partition("=")
            sha = FakeHub.commit_sha(str(Path(directory).resolve()))
            config["repos"][repo_id] = _repo_spec(repo_id, {sha: directory})
    cdn_sock = _listen(args.cdn_port)
    ready["cdn_port"] = cdn_sock.getsockname()[1]
    hub_app, cdn_app = _hub_apps(config, ready["cdn_port"])
    port = sock.getsockname()[1]
    notes = [f"HF_ENDPOINT=http://{HOST}:{port} (CDN: http://{_CDN_HOST}:{ready['cdn_port']})"]
    return [(hub_app, sock), (cdn_app, cdn_sock)], notes


def main(argv: list[str] | None = None) -> None:
    """Runs the fake Hub until Ctrl-C or SIGTERM, printing its ``HF_ENDPOINT`` (``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m servers.hub", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", action="append", default=[], metavar="ORG/NAME=DIR", help="a dataset (one commit)")
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--config", help=argparse.SUPPRESS)  # JSON written by FakeHub
    parser.add_argument("--cdn-port", type=int, default=0)
    httpapp.main("hub", parser, _make_apps, argv)


if __name__ == "__main__":
    main()
