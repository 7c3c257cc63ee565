"""``coorm dashboards push`` against an HTTP double of Grafana: a real HTTP server on a free port that
implements the few endpoints grafana-client calls (``GET``/``POST /api/folders``, ``POST /api/dashboards/db``),
answers the way Grafana does (401 without the right bearer token, 403 for a viewer, 409/412 on conflicts),
and records every request, so that the tests check the API calls the command makes."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from coorm.cli.main import app

DIR = Path(__file__).resolve().parents[2] / "dashboards"
TOKEN = "glsa_coorm_test_token"


class GrafanaDouble:
    def __init__(self, token: str = TOKEN, prefix: str = "", read_only: bool = False):
        self.token, self.prefix, self.read_only = token, prefix, read_only
        self.requests: list[dict] = []
        self.folders: list[dict] = []
        self.dashboards: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.url = ""

    # what the tests look at
    def calls(self, method: str, path: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == method and r["path"] == self.prefix + path]

    def handle(self, method: str, path: str, headers: dict, body) -> tuple[int, object]:
        with self.lock:
            self.requests.append({"method": method, "path": path, "headers": headers, "body": body})
            if headers.get("authorization") != f"Bearer {self.token}":
                return 401, {"message": "invalid API key", "messageId": "api-key.invalid", "statusCode": 401}
            if not path.startswith(self.prefix + "/api/"):
                return 404, {"message": "Not found"}
            route = (method, path[len(self.prefix):])
            if route == ("GET", "/api/folders"):
                return 200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in self.folders]
            if method != "GET" and self.read_only:
                return 403, {"message": "You'll need additional permissions to perform this action.",
                             "accessErrorId": "ACE0000000001"}
            if route == ("POST", "/api/folders"):
                return self._create_folder(body)
            if route == ("POST", "/api/dashboards/db"):
                return self._save_dashboard(body)
            return 404, {"message": "Not found"}

    def _create_folder(self, body) -> tuple[int, object]:
        if not isinstance(body, dict) or not body.get("title"):
            return 400, {"message": "folder title cannot be empty"}
        if any(f["title"].casefold() == body["title"].casefold() or f["uid"] == body.get("uid") for f in self.folders):
            return 409, {"message": "a folder with the same name already exists"}
        uid = body.get("uid") or f"f{len(self.folders) + 1:08d}"
        folder = {"id": 100 + len(self.folders), "uid": uid, "title": body["title"], "version": 1,
                  "url": f"{self.prefix}/dashboards/f/{uid}/{_slug(body['title'])}", "hasAcl": False,
                  "canSave": True, "canEdit": True, "canAdmin": True, "canDelete": True}
        self.folders.append(folder)
        return 200, folder

    def _save_dashboard(self, body) -> tuple[int, object]:
        d = body.get("dashboard") if isinstance(body, dict) else None
        if not isinstance(d, dict) or not d.get("title"):
            return 400, {"message": "Dashboard title cannot be empty", "status": "empty-name"}
        folder_uid = body.get("folderUid")
        if folder_uid and not any(f["uid"] == folder_uid for f in self.folders):
            return 400, {"message": "folder not found", "status": "folder-not-found"}
        uid = d.get("uid") or f"d{len(self.dashboards) + 1:08d}"
        old = self.dashboards.get(uid)
        if d.get("id") is not None and (old is None or old["id"] != d["id"]):
            return 404, {"message": "Dashboard not found", "status": "not-found"}
        if old is not None and not body.get("overwrite"):
            return 412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
        version = old["version"] + 1 if old else 1
        dash_id = old["id"] if old else 1 + len(self.dashboards)
        self.dashboards[uid] = {"id": dash_id, "version": version, "folderUid": folder_uid, "dashboard": d}
        slug = _slug(d["title"])
        return 200, {"id": dash_id, "uid": uid, "url": f"{self.prefix}/d/{uid}/{slug}", "status": "success",
                     "version": version, "slug": slug, "folderUid": folder_uid}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, reply = double.handle(self.command, urlsplit(self.path).path, headers, body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *args) -> None:  # quiet
                pass

        return Handler


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _serve(double: GrafanaDouble):
    server = ThreadingHTTPServer(("127.0.0.1", 0), double.handler())  # listening from here on: no wait needed
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    double.url = f"http://127.0.0.1:{server.server_port}{double.prefix}"
    return server, thread


@pytest.fixture
def grafana():
    double = GrafanaDouble()
    server, thread = _serve(double)
    yield double
    server.shutdown()
    server.server_close()
    thread.join(10)


def push(url: str, *args: str, token: str = TOKEN):
    return CliRunner().invoke(app, ["dashboards", "push", "--url", url, "--token", token, *args],
                              env={"COLUMNS": "250", "GRAFANA_URL": None, "GRAFANA_TOKEN": None})


def _files() -> dict[str, dict]:
    return {(d := json.loads(f.read_text()))["uid"]: d for f in sorted(DIR.glob("*.json"))}


def test_push_creates_the_folder_and_uploads_every_dashboard(grafana):
    run = push(grafana.url, "--dir", str(DIR))
    assert run.exit_code == 0, run.output
    # every call carries the token
    assert grafana.requests and all(r["headers"]["authorization"] == f"Bearer {TOKEN}" for r in grafana.requests)
    # the folder is looked up, then created once, with a stable uid
    assert grafana.requests[0]["method"] == "GET" and grafana.requests[0]["path"] == "/api/folders"
    created = grafana.calls("POST", "/api/folders")
    assert [c["body"] for c in created] == [{"title": "CooRM", "uid": "coorm"}]
    folder = grafana.folders[0]
    # every file, as it is (uid kept, no id), overwriting, into that folder
    posts = grafana.calls("POST", "/api/dashboards/db")
    files = _files()
    assert len(files) == 5 and len(posts) == len(files)
    by_uid = {p["body"]["dashboard"]["uid"]: p["body"] for p in posts}
    assert set(by_uid) == set(files)
    for uid, body in by_uid.items():
        assert body["overwrite"] is True
        assert body["folderUid"] == folder["uid"] and body["folderId"] == folder["id"]
        assert body["dashboard"]["id"] is None
        assert body["dashboard"] == {**files[uid], "id": None}
    assert set(grafana.dashboards) == set(files)
    # the table of what was pushed: titles, uids and Grafana's links
    for uid, d in files.items():
        assert d["title"] in run.output and uid in run.output
        assert f"{grafana.url}/d/{uid}/{_slug(d['title'])}" in run.output
    assert "5 dashboards pushed" in run.output


def test_a_second_push_reuses_the_folder_and_overwrites(grafana):
    assert push(grafana.url, "--dir", str(DIR)).exit_code == 0
    first = len(grafana.requests)
    run = push(grafana.url, "--dir", str(DIR))
    assert run.exit_code == 0, run.output
    second = grafana.requests[first:]
    assert not [r for r in second if r["path"] == "/api/folders" and r["method"] == "POST"]
    posts = [r for r in second if r["path"] == "/api/dashboards/db"]
    assert len(posts) == 5 and all(p["body"]["folderUid"] == "coorm" and p["body"]["overwrite"] for p in posts)
    assert len(grafana.folders) == 1
    assert {d["version"] for d in grafana.dashboards.values()} == {2}


def test_an_existing_folder_of_that_title_is_reused(grafana):
    grafana.folders.append({"id": 7, "uid": "x1y2z3", "title": "CooRM"})
    run = push(grafana.url, "--dir", str(DIR))
    assert run.exit_code == 0, run.output
    assert not grafana.calls("POST", "/api/folders")
    posts = grafana.calls("POST", "/api/dashboards/db")
    assert len(posts) == 5
    assert {(p["body"]["folderUid"], p["body"]["folderId"]) for p in posts} == {("x1y2z3", 7)}


def test_another_folder_and_dir(grafana, tmp_path):
    d = json.loads((DIR / "queue.json").read_text())
    (tmp_path / "queue.json").write_text(json.dumps({**d, "id": 42}))  # an id from another Grafana
    run = push(grafana.url, "--dir", str(tmp_path), "--folder", "HPC Ops")
    assert run.exit_code == 0, run.output
    assert [c["body"] for c in grafana.calls("POST", "/api/folders")] == [{"title": "HPC Ops", "uid": "hpc-ops"}]
    [post] = grafana.calls("POST", "/api/dashboards/db")
    assert post["body"]["dashboard"] == {**d, "id": None}
    assert post["body"]["folderUid"] == "hpc-ops"


def test_panels_can_be_pointed_at_another_datasource(grafana):
    run = push(grafana.url, "--dir", str(DIR), "--datasource", "P1809F7CD0C75ACF3")
    assert run.exit_code == 0, run.output
    posts = grafana.calls("POST", "/api/dashboards/db")
    assert len(posts) == 5
    for p in posts:
        text = json.dumps(p["body"]["dashboard"])
        assert '"uid": "prometheus"' not in text
        d = p["body"]["dashboard"]
        assert {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"} == d["panels"][1]["datasource"]
        assert all(t["datasource"]["uid"] == "P1809F7CD0C75ACF3"
                   for panel in d["panels"] for t in panel.get("targets", []))
        original = _files()[d["uid"]]
        assert text.count("P1809F7CD0C75ACF3") == json.dumps(original).count('"uid": "prometheus"')


def test_a_refused_token_fails_readably_and_posts_nothing(grafana):
    run = push(grafana.url, "--dir", str(DIR), token="wrong")
    assert run.exit_code != 0
    assert "token refused" in run.output and "401" in run.output
    assert "Traceback" not in run.output and "wrong" not in run.output
    assert grafana.requests and all(r["headers"]["authorization"] == "Bearer wrong" for r in grafana.requests)
    assert not [r for r in grafana.requests if r["method"] != "GET"]
    assert not grafana.folders and not grafana.dashboards


def test_a_viewer_token_is_told_it_cannot_write():
    double = GrafanaDouble(read_only=True)
    server, thread = _serve(double)
    try:
        run = push(double.url, "--dir", str(DIR))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert run.exit_code == 1
    assert "403" in run.output and "cannot write" in run.output
    assert not double.dashboards


def test_grafana_under_a_sub_path():
    double = GrafanaDouble(prefix="/grafana")
    server, thread = _serve(double)
    try:
        run = push(double.url, "--dir", str(DIR))  # http://host:port/grafana, no trailing slash
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert run.exit_code == 0, run.output
    assert all(r["path"].startswith("/grafana/api/") for r in double.requests)
    assert len(double.calls("POST", "/api/dashboards/db")) == 5
    assert f"{double.url}/d/coorm-overview/" in run.output


def test_a_missing_dir_errors_before_any_call(grafana, tmp_path):
    run = push(grafana.url, "--dir", str(tmp_path / "nope"))
    assert run.exit_code == 2
    assert "no dashboards folder" in run.output and "nope" in run.output
    assert grafana.requests == []


def test_an_invalid_file_errors_before_any_call(grafana, tmp_path):
    (tmp_path / "good.json").write_text((DIR / "queue.json").read_text())
    (tmp_path / "broken.json").write_text('{"uid": "x", "title": "X", "panels": [}')
    run = push(grafana.url, "--dir", str(tmp_path))
    assert run.exit_code == 2
    assert "broken.json" in run.output and "invalid JSON" in run.output
    assert grafana.requests == []


def test_an_unreachable_grafana_is_reported():
    with socket.socket() as s:  # a port nothing listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = push(f"http://127.0.0.1:{port}", "--dir", str(DIR), "--timeout", "5")
    assert run.exit_code == 1
    assert "cannot reach Grafana" in run.output and "Traceback" not in run.output


def test_a_url_that_is_not_http_is_refused(grafana):
    run = push("grafana:3000", "--dir", str(DIR))
    assert run.exit_code == 2 and "--url" in run.output
    assert grafana.requests == []


def test_list_shows_every_dashboard_and_its_panels():
    run = CliRunner().invoke(app, ["dashboards", "list", "--dir", str(DIR)], env={"COLUMNS": "250"})
    assert run.exit_code == 0, run.output
    for f in sorted(DIR.glob("*.json")):
        d = json.loads(f.read_text())
        panels = sum(1 for p in d["panels"] if p["type"] != "row")  # none nested: no collapsed rows
        assert re.search(rf"{re.escape(f.name)}\s*│\s*{d['uid']}\s*│.*│\s*{panels}\s*│", run.output), run.output
