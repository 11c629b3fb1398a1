"""Real git repositories for workspace tests: a bare repository with a branch, a tag and
two commits, and a smart-HTTP server (``git http-backend``) with basic auth on 127.0.0.1."""
from __future__ import annotations

import base64
import contextlib
import http.server
import os
import pathlib
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Iterator

from baton_tools.testing.servers import free_port

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"}


def git(*args: str, cwd: pathlib.Path | None = None) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, check=True,
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


@dataclass
class Repo:
    """A bare repository: ``main`` has ``README.md`` and ``src/app.py`` (2 commits), tag
    ``v1`` is the first commit (``README.md`` only), branch ``feature`` adds ``FEATURE``."""

    bare: pathlib.Path
    first: str
    second: str
    feature: str


def make_repo(root: pathlib.Path, name: str = "repo.git") -> Repo:
    work = root / f"{name}-work"
    work.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(work))
    (work / "README.md").write_text("hello\n")
    git("add", "README.md", cwd=work)
    git("commit", "-qm", "first", cwd=work)
    first = git("rev-parse", "HEAD", cwd=work)
    git("tag", "v1", cwd=work)
    (work / "src").mkdir()
    (work / "src" / "app.py").write_text("print('app')\n")
    git("add", "src", cwd=work)
    git("commit", "-qm", "second", cwd=work)
    second = git("rev-parse", "HEAD", cwd=work)
    git("checkout", "-qb", "feature", cwd=work)
    (work / "FEATURE").write_text("feature\n")
    git("add", "FEATURE", cwd=work)
    git("commit", "-qm", "feature", cwd=work)
    feature = git("rev-parse", "HEAD", cwd=work)
    git("checkout", "-q", "main", cwd=work)
    bare = root / name
    git("clone", "-q", "--bare", str(work), str(bare))
    return Repo(bare, first, second, feature)


@dataclass
class GitHttpServer:
    """``git http-backend`` behind basic auth; ``authorizations`` records what clients sent."""

    root: pathlib.Path
    username: str
    token: str
    port: int = 0
    authorizations: list[str] = field(default_factory=list)

    def url(self, name: str = "repo.git") -> str:
        return f"http://127.0.0.1:{self.port}/{name}"


@contextlib.contextmanager
def git_http_server(root: pathlib.Path, username: str, token: str) -> Iterator[GitHttpServer]:
    """Serve the bare repositories under ``root`` over smart HTTP on 127.0.0.1."""
    info = GitHttpServer(root, username, token)
    expected = "Basic " + base64.b64encode(f"{username}:{token}".encode()).decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 -- the stdlib's name
            pass

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def _serve(self) -> None:
            auth = self.headers.get("Authorization") or ""
            info.authorizations.append(auth)
            if auth != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            env = {"PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1",
                   "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
                   "CONTENT_TYPE": self.headers.get("Content-Type") or "", "CONTENT_LENGTH": str(len(body)),
                   "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding") or "",
                   "GIT_PROTOCOL": self.headers.get("Git-Protocol") or "", "REMOTE_USER": username,
                   "REMOTE_ADDR": "127.0.0.1"}
            out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True,
                                 timeout=30).stdout
            head, _, rest = out.partition(b"\r\n\r\n")
            status, headers = 200, []
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "status":
                    status = int(value.strip().split()[0])
                elif name:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(rest)))
            self.end_headers()
            self.wfile.write(rest)

    info.port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", info.port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="git-http", daemon=True)
    thread.start()
    try:
        yield info
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
