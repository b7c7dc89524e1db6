"""The Hugging Face Hub as a read-only store: ``hf://datasets/ORG/NAME[@REVISION]/path``.

Built on :class:`~shardstream.storage.http.HttpStore` (ranged GETs, retries, version checks),
with what the Hub adds:

- **A pinned revision.** A branch or tag (``main`` by default; ``refs/convert/parquet`` may
  be written ``refs%2Fconvert%2Fparquet``) is turned into its commit sha once, when the store
  is made (``GET /api/datasets/ORG/NAME/revision/REV``), and every URL the store hands out
  names that sha, so DataLoader workers and later epochs read that commit even after the
  branch moves. A dataset made from an ``hf://`` URL pins it in the process that makes it.
- **Files** are read from ``{HF_ENDPOINT}/datasets/ORG/NAME/resolve/SHA/PATH``, which the Hub
  answers with a redirect to its storage or CDN; the redirect target is kept for a few minutes
  (and dropped when it expires), so parts of a shard do not each ask the Hub again.
- **Listing** by the tree API (``/api/datasets/ORG/NAME/tree/SHA/PATH``), page by page as its
  ``Link: rel="next"`` header says.
- **Credentials:** ``HF_TOKEN`` (else ``HUGGING_FACE_HUB_TOKEN``, else the token file that
  ``huggingface-cli login`` writes: ``HF_TOKEN_PATH``, else ``$HF_HOME/token``, else
  ``~/.cache/huggingface/token``) is sent as ``Authorization: Bearer`` to the Hub's host only,
  never to the host it redirects to, and never printed. ``HF_ENDPOINT`` (default
  ``https://huggingface.co``) names the Hub.

The Hub rate-limits resolve and tree requests per IP: their 429 answers are waited out as
their ``Retry-After`` says (:class:`~shardstream.config.RequestConfig`).
"""

from __future__ import annotations

import concurrent.futures
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from ..config import FetchConfig, RequestConfig, hf_endpoint, hf_token
from ..errors import ShardNotFoundError, StorageConnectionError, StorageError
from . import loop
from .http import HttpStore

__all__ = ["HfStore", "hf_endpoint", "hf_token", "parse_hf_url", "pin_hf_urls"]

_SHA = re.compile(r"[0-9a-f]{40}")


def parse_hf_url(url: str) -> tuple[str, str, str]:
    """``"hf://datasets/ORG/NAME@REV/a/b"`` -> ``("ORG/NAME", "REV", "a/b")`` (REV ``main`` when
    absent, %-decoded).

    Raises:
        ValueError: not of that form (says how to write it).
    """
    head, _, rest = url.partition("://")
    parts = [p for p in rest.split("/") if p]
    if head.lower() != "hf" or len(parts) < 3 or parts[0] != "datasets":
        raise ValueError(
            f"{url!r}: write Hugging Face Hub datasets as hf://datasets/ORG/NAME[@REVISION]/PATH "
            "(models and spaces hold no datasets)"
        )
    name, _, revision = parts[2].partition("@")
    if not name:
        raise ValueError(f"{url!r}: no dataset name after hf://datasets/{parts[1]}/")
    return f"{parts[1]}/{name}", unquote(revision) if revision else "main", "/".join(parts[3:])


def _revision_url(repo: str, revision: str, path: str) -> str:
    spelled = quote(revision, safe="")
    return f"hf://datasets/{repo}@{spelled}/{path}".rstrip("/")


class HfStore(HttpStore):
    """Files of a Hugging Face Hub dataset under ``hf://datasets/ORG/NAME[@REVISION]/PATH``,
    pinned to a commit when made (module doc). Read only.

    Args:
        url: ``hf://datasets/ORG/NAME[@REVISION][/PATH]``.
        fetch: accepted as by every store.
        requests: timeouts, attempts, pool size and redirects; default
            :class:`~shardstream.config.RequestConfig`.

    Raises:
        ValueError: a malformed URL. ShardNotFoundError: no such dataset or revision.
        StorageAccessError: the Hub refused the token (or wants one: a private or gated
            dataset). StorageConnectionError: the Hub cannot be reached.
    """

    label = "the Hub"

    def __init__(self, url: str, *, fetch: FetchConfig | None = None, requests: RequestConfig | None = None) -> None:
        self.repo, revision, self.path = parse_hf_url(url)
        endpoint = hf_endpoint()
        super().__init__(endpoint, fetch=fetch, requests=requests)
        self.endpoint = endpoint
        self.revision = revision if _SHA.fullmatch(revision) else self._pin(revision)
        self.url = _revision_url(self.repo, self.revision, self.path)

    def __repr__(self) -> str:
        return f"HfStore({self.url!r}, endpoint={self.endpoint!r})"

    def _pin(self, revision: str) -> str:
        future = loop.submit(self._commit_of(revision))
        try:
            return future.result(self.requests.request_limit_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise StorageConnectionError(
                f"{_revision_url(self.repo, revision, '')}: {self.endpoint} did not say which commit {revision!r} "
                f"is within {self.requests.request_limit_s:.0f} s; check HF_ENDPOINT and the network"
            ) from None

    async def _commit_of(self, revision: str) -> str:
        api = f"{self.endpoint}/api/datasets/{self.repo}/revision/{quote(revision, safe='')}"
        shown = _revision_url(self.repo, revision, "")
        try:
            info, _ = await self._get_json(api, shown)
        except ShardNotFoundError:
            raise ShardNotFoundError(
                f"{shown}: no such dataset or revision on {self.endpoint} (check ORG/NAME and the branch, tag or "
                "commit; a private dataset also answers so without a token: set HF_TOKEN)"
            ) from None
        sha = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(sha, str) or not _SHA.fullmatch(sha):
            raise StorageError(f"{shown}: {self.endpoint} gave no commit sha for revision {revision!r}")
        return sha

    async def _get_json(self, url: str, shown: str) -> tuple[Any, Any]:
        """GET ``url`` of the Hub's API: its parsed JSON body and its ``Link`` header's links."""
        response = await self._send("GET", url, headers={"Accept": "application/json"}, shown_url=shown)
        try:
            body = await response.read()
            links = response.links
        finally:
            response.release()
        try:
            value = json.loads(body)
        except ValueError as exc:
            raise StorageError(f"{shown}: {self.endpoint} answered with something other than JSON") from exc
        return value, links

    def _headers_for(self, url: str) -> dict[str, str]:
        """The token goes to the Hub's own host (scheme and port included) and nowhere else."""
        token = hf_token()
        hub = urlsplit(self.endpoint)
        target = urlsplit(url)
        if token and (target.scheme, target.netloc) == (hub.scheme, hub.netloc):
            return {"Authorization": f"Bearer {token}"}
        return {}

    def _access_hint(self) -> str:
        return (
            f"set HF_TOKEN (or run `huggingface-cli login`) to a token that can read {self.repo}; a gated "
            "dataset must also be accepted on its page first"
        )

    def _repo_path(self, name: str) -> str:
        return f"{self.path}/{name}" if self.path and name else self.path or name

    async def _object_url(self, name: str) -> str:
        return f"{self.endpoint}/datasets/{self.repo}/resolve/{self.revision}/{quote(self._repo_path(name))}"

    # -- listing --------------------------------------------------------------------------------

    def _tree(self, folder: str, *, recursive: bool) -> Iterator[dict[str, Any]]:
        """Entries under ``folder`` (a path in the repo) at the pinned commit, page by page; none
        when the folder does not exist."""
        url: str | None = (
            f"{self.endpoint}/api/datasets/{self.repo}/tree/{self.revision}/{quote(folder)}".rstrip("/")
            + f"?recursive={'true' if recursive else 'false'}"
        )
        shown = _revision_url(self.repo, self.revision, folder)
        first = True
        while url is not None:
            try:
                entries, links = loop.run(self._get_json(url, shown))
            except ShardNotFoundError:
                if first:  # no such folder: nothing under it
                    return
                raise  # a page after the first: never a silently shorter listing
            first = False
            if not isinstance(entries, list):
                raise StorageError(f"{shown}: {self.endpoint}'s tree API answered with no list of files")
            yield from entries
            url = str(links["next"]["url"]) if "next" in links else None

    def list_names(self, prefix: str = "") -> list[str]:
        """Sorted names of the files whose name (relative to this store) starts with ``prefix``."""
        folder = self._repo_path(prefix.rpartition("/")[0])
        root = f"{self.path}/" if self.path else ""
        names = [
            str(entry["path"])[len(root) :]
            for entry in self._tree(folder, recursive=True)
            if entry.get("type") == "file" and str(entry.get("path", "")).startswith(root)
        ]
        return sorted(name for name in names if name.startswith(prefix))

    def list_dir(self, prefix: str) -> Iterator[tuple[str, int, bool]]:
        """One folder level under ``prefix`` (``""`` or ending in ``/``): ``(name, size_bytes,
        is_dir)``, folders named with a trailing ``/``."""
        root = f"{self.path}/" if self.path else ""
        for entry in self._tree(self._repo_path(prefix.rstrip("/")), recursive=False):
            name = str(entry.get("path", ""))[len(root) :]
            if entry.get("type") == "directory":
                yield f"{name}/", 0, True
            else:
                yield name, int(entry.get("size") or 0), False


def pin_hf_urls(urls: list[str], *, requests: RequestConfig | None = None) -> list[str]:
    """``urls`` with each revision replaced by the commit sha it names now, asking the Hub once
    per dataset and revision (a brace pattern of 10^5 shards asks once), under ``requests``."""
    shas: dict[tuple[str, str], str] = {}
    pinned = []
    for url in urls:
        repo, revision, path = parse_hf_url(url)
        if (repo, revision) not in shas:
            shas[repo, revision] = HfStore(_revision_url(repo, revision, ""), requests=requests).revision
        pinned.append(_revision_url(repo, shas[repo, revision], path))
    return pinned
