"""A Hugging Face Hub on loopback, for ``botctl model pull`` (``HF_ENDPOINT`` points here).

It answers the calls ``huggingface_hub`` makes for a pull, in the Hub's shapes:
``GET /api/models/{org}/{name}[/revision/{rev}]`` (the model's commit and file
list) and ``HEAD``/``GET /{org}/{name}/resolve/{rev}/{path}`` (a file, with
``X-Repo-Commit``, ``ETag`` and ``Content-Length``), and refuses as the Hub does,
with ``X-Error-Code: RepoNotFound``, ``RevisionNotFound`` or ``EntryNotFound``.
A revision is a branch or tag name, or a commit; a file is served only from the
commit it belongs to. Every file request is recorded, so a test sees what was
fetched, and from which commit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import TracebackType

from aiohttp import web


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]]
    """Commit sha -> path -> content."""
    refs: dict[str, str]
    """Branch or tag -> commit sha."""


@dataclass(frozen=True)
class Fetched:
    method: str
    repo: str
    revision: str
    path: str


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    fetched: list[Fetched] = field(default_factory=list)
    base_url: str = ""
    _runner: web.AppRunner | None = None

    def add_model(self, repo_id: str, files: dict[str, bytes], *, tag: str | None = None) -> str:
        """Push ``files`` as a new commit of ``repo_id``'s ``main`` (and ``tag``); its sha."""
        sha = hashlib.sha1(repr((repo_id, sorted(files.items()))).encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, Repo({}, {}))
        repo.commits[sha] = dict(files)
        repo.refs["main"] = sha
        if tag is not None:
            repo.refs[tag] = sha
        return sha

    def paths_fetched(self, method: str = "GET") -> list[str]:
        return sorted(f.path for f in self.fetched if f.method == method)

    async def __aenter__(self) -> FakeHub:
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}", self._model_info)
        app.router.add_get("/api/models/{org}/{name}/revision/{revision}", self._model_info)
        app.router.add_route("*", "/{org}/{name}/resolve/{revision}/{path:.+}", self._resolve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _commit(self, request: web.Request) -> tuple[str, str, Repo] | web.Response:
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        repo = self.repos.get(repo_id)
        if repo is None:
            return _refusal(404, "RepoNotFound", "Repository not found")
        revision = request.match_info.get("revision", "main")
        sha = repo.refs.get(revision, revision if revision in repo.commits else None)
        if sha is None:
            return _refusal(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo_id, sha, repo

    async def _model_info(self, request: web.Request) -> web.Response:
        found = self._commit(request)
        if isinstance(found, web.Response):
            return found
        repo_id, sha, repo = found
        return web.json_response(
            {
                "_id": sha[:24],
                "id": repo_id,
                "modelId": repo_id,
                "sha": sha,
                "private": False,
                "gated": False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": [{"rfilename": path} for path in sorted(repo.commits[sha])],
                "lastModified": "2027-01-01T00:00:00.000Z",
                "createdAt": "2027-01-01T00:00:00.000Z",
            }
        )

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        found = self._commit(request)
        if isinstance(found, web.Response):
            return found
        repo_id, sha, repo = found
        path = request.match_info["path"]
        self.fetched.append(Fetched(request.method, repo_id, request.match_info["revision"], path))
        content = repo.commits[sha].get(path)
        if content is None:
            return _refusal(404, "EntryNotFound", f"{path} does not exist on {sha}")
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{hashlib.sha1(content).hexdigest()}"',
            "Content-Length": str(len(content)),
            "Content-Type": "application/octet-stream",
        }
        if request.method == "HEAD":
            return web.Response(status=200, headers=headers)
        return web.Response(status=200, body=content, headers=headers)


def _refusal(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers={"X-Error-Code": code})
