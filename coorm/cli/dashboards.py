"""``coorm dashboards``: the Grafana dashboards of ``dashboards/`` -- list them, push them into a Grafana.

The pure helpers are what the tests (and the live test against a real Prometheus) use to read the
dashboards' queries: :func:`load_dashboards`, :func:`panel_queries`, :func:`render_query` (Grafana's
variables substituted, so that a query can be sent to Prometheus's HTTP API as is), and a small PromQL
tokenizer behind :func:`metric_names`, :func:`selectors` and :func:`grouping_labels`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin, urlparse

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="The Grafana dashboards (dashboards/*.json): list them, push them into a Grafana.",
                  no_args_is_help=True)

REPO_DASHBOARDS = Path(__file__).resolve().parents[1] / "dashboards"


class DashboardError(Exception):
    """A dashboards folder that cannot be used: missing, empty, or a file that is not a dashboard."""


# --- reading the dashboards ---------------------------------------------------------------------------------


def _load(directory: Path) -> list[tuple[Path, dict]]:
    directory = Path(directory)
    if not directory.is_dir():
        raise DashboardError(f"no dashboards folder at {directory}")
    files = sorted(directory.glob("*.json"))
    if not files:
        raise DashboardError(f"no dashboard (*.json) in {directory}")
    out = []
    for f in files:
        try:
            d = json.loads(f.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DashboardError(f"{f}: invalid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
        if isinstance(d, dict) and isinstance(d.get("dashboard"), dict):  # an export wrapped with its meta
            d = d["dashboard"]
        if not (isinstance(d, dict) and d.get("uid") and d.get("title") and isinstance(d.get("panels"), list)):
            raise DashboardError(f"{f}: not a Grafana dashboard (it needs a uid, a title and panels)")
        out.append((f, d))
    return out


def load_dashboards(directory: Path | str) -> list[dict]:
    """Every ``*.json`` dashboard of ``directory``, by file name; :class:`DashboardError` if the folder is
    missing or empty, or a file is not valid JSON or not a dashboard."""
    return [d for _f, d in _load(Path(directory))]


def iter_panels(dashboard: dict) -> Iterator[dict]:
    """Every panel, rows included, and the panels of collapsed rows (which Grafana nests in the row)."""
    for p in dashboard.get("panels", []):
        yield p
        yield from iter_panels(p)


def panel_queries(dashboard: dict) -> list[str]:
    """Every ``targets[].expr`` of every panel (nested ones too), in order."""
    return [t["expr"] for p in iter_panels(dashboard) for t in p.get("targets", []) if t.get("expr")]


# --- Grafana's variables ------------------------------------------------------------------------------------

# what a query would get over a short time range; the dashboard's own variables default to ".*", which
# matches everything as long as the dashboard uses them as regular expressions (label=~"$cluster")
BUILTIN_VARIABLES = {
    "__rate_interval": "1m", "__rate_interval_ms": "60000",
    "__range": "5m", "__range_s": "300", "__range_ms": "300000",
    "__interval": "15s", "__interval_ms": "15000",
}
_VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)(?::[\w]+)?\}|\[\[([A-Za-z_]\w*)(?::[\w]+)?\]\]|\$([A-Za-z_]\w*)")


def render_query(expr: str, variables: dict[str, str] | None = None) -> str:
    """``expr`` with Grafana's variables (``$v``, ``${v}``, ``${v:fmt}``, ``[[v]]``) replaced: by
    ``variables`` first, then the built-ins (``$__rate_interval`` → ``1m``, ``$__range`` → ``5m``,
    ``$__interval`` → ``15s``...), any other (a dashboard's template variable) by ``.*``."""
    values = {**BUILTIN_VARIABLES, **(variables or {})}

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return values.get(name, ".*")

    return _VARIABLE.sub(sub, expr)


# --- a small PromQL tokenizer -------------------------------------------------------------------------------

AGGREGATIONS = frozenset({"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                          "bottomk", "topk", "quantile", "limitk", "limit_ratio"})
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = GROUPING | {"and", "or", "unless", "offset", "bool", "atan2", "inf", "nan"}

_UNIT = r"(?:ms|[smhdwy])"
_TOKEN = re.compile(
    r"""(?P<ws>\s+|\#[^\n]*)
      | (?P<var>\$\{[^}]*\}|\$[A-Za-z_]\w*|\[\[[A-Za-z_]\w*(?::\w+)?\]\])
      | (?P<range>\[[^\[\]]*\])
      | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
      | (?P<num>(?:0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(?:"""
    + _UNIT + r"(?:\d+" + _UNIT + r""")*)?)
      | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
      | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^=<>@,(){}])""",
    re.VERBOSE)


def tokens(expr: str) -> list[tuple[str, str]]:
    """``(kind, text)`` pairs: kind is ``ident``, ``str`` (unquoted), ``num`` (numbers and durations),
    ``range`` (a whole ``[...]``), ``var`` (a Grafana variable left in) or ``op``; ValueError on a
    character PromQL does not have."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"unexpected {expr[pos]!r} at {pos} in {expr!r}")
        pos = m.end()
        kind = m.lastgroup
        text = m.group()
        if kind == "ws":
            continue
        if kind == "str":
            text = text[1:-1] if text[0] == "`" else re.sub(r"\\(.)", r"\1", text[1:-1])
        out.append((kind, text))
    return out


def _skip_group(toks: list[tuple[str, str]], i: int, open_: str, close: str) -> tuple[int, list]:
    """From the opening token at ``i``: the index after its matching close, and the tokens inside."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j] == ("op", open_):
            depth += 1
        elif toks[j] == ("op", close):
            depth -= 1
            if depth == 0:
                return j + 1, toks[i + 1:j]
    raise ValueError(f"unbalanced {open_!r}")


def _matchers(inner: list[tuple[str, str]]) -> tuple[str | None, list[tuple[str, str, str]]]:
    """A ``{...}`` selector's contents: its quoted metric name if any, and its ``(label, op, value)``."""
    name = None
    out = []
    k = 0
    while k < len(inner):
        kind, text = inner[k]
        if kind == "ident" and k + 2 < len(inner) and inner[k + 1][0] == "op" and inner[k + 2][0] in ("str", "var"):
            out.append((text, inner[k + 1][1], inner[k + 2][1]))
            k += 3
        elif kind == "str" and k + 2 < len(inner) and inner[k + 1][1] in ("=", "!=", "=~", "!~"):
            out.append((text, inner[k + 1][1], inner[k + 2][1]))  # a quoted label name (Prometheus 3)
            k += 3
        elif kind == "str":
            name = text  # {"metric.name"}
            k += 1
        elif (kind, text) == ("op", ","):
            k += 1
        else:
            raise ValueError(f"bad label matcher near {text!r}")
    for label, op, value in out:
        if label == "__name__" and op == "=":
            name = value
    return name, out


def selectors(expr: str) -> list[tuple[str | None, list[tuple[str, str, str]]]]:
    """The vector selectors of ``expr``: ``(metric name or None, [(label, op, value), ...])``, skipping
    function and aggregation names, keywords, grouping label lists, strings, numbers and ranges."""
    toks = tokens(expr)
    out = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if kind == "ident":
            low = text.lower()
            if low in GROUPING and nxt == ("op", "("):
                i, _ = _skip_group(toks, i + 1, "(", ")")
                continue
            if low in KEYWORDS or low in AGGREGATIONS or nxt == ("op", "("):
                i += 1
                continue
            if nxt == ("op", "{"):
                i, inner = _skip_group(toks, i + 1, "{", "}")
                out.append((text, _matchers(inner)[1]))
            else:
                out.append((text, []))
                i += 1
            continue
        if (kind, text) == ("op", "{"):
            i, inner = _skip_group(toks, i, "{", "}")
            out.append(_matchers(inner))
            continue
        i += 1
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` refers to (``foo``, ``foo{...}``, ``{__name__="foo"}``)."""
    return {name for name, _m in selectors(expr) if name}


def grouping_labels(expr: str) -> set[str]:
    """The labels named in ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` lists."""
    toks = tokens(expr)
    out: set[str] = set()
    i = 0
    while i < len(toks):
        if toks[i][0] == "ident" and toks[i][1].lower() in GROUPING and toks[i + 1:i + 2] == [("op", "(")]:
            i, inner = _skip_group(toks, i + 1, "(", ")")
            out |= {text for kind, text in inner if kind in ("ident", "str")}
            continue
        i += 1
    return out


# --- the commands -------------------------------------------------------------------------------------------


def _directory(directory: Path | None) -> Path:
    """``--dir``, else ./dashboards, else the dashboards next to this checkout (an editable install)."""
    if directory is not None:
        return directory
    return Path("dashboards") if Path("dashboards").is_dir() else REPO_DASHBOARDS


def _fail(console: Console, message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


DIR_OPTION = typer.Option(None, "--dir", help="folder of the dashboards' JSON files [default: ./dashboards]",
                          show_default=False)


@app.command("list")
def list_(directory: Path | None = DIR_OPTION) -> None:
    """The dashboards of the folder: file, uid, title, panels and queries."""
    console = Console()
    try:
        loaded = _load(_directory(directory))
    except DashboardError as e:
        raise _fail(console, str(e), 2) from None
    table = Table(title=f"{len(loaded)} dashboards in {_directory(directory)}")
    for col in ("file", "uid", "title", "panels", "queries"):
        table.add_column(col, justify="right" if col in ("panels", "queries") else "left", overflow="fold")
    for f, d in loaded:
        panels = sum(1 for p in iter_panels(d) if p.get("type") != "row")
        table.add_row(f.name, d["uid"], d["title"], str(panels), str(len(panel_queries(d))))
    console.print(table)


DATASOURCE = {"type": "prometheus", "uid": "prometheus"}  # what every panel, target and variable names


def retarget(obj, uid: str):
    """A copy of a dashboard (or any part of it) whose Prometheus datasource references name ``uid``."""
    if isinstance(obj, dict):
        if obj == DATASOURCE:
            return {**obj, "uid": uid}
        return {k: retarget(v, uid) for k, v in obj.items()}
    if isinstance(obj, list):
        return [retarget(v, uid) for v in obj]
    return obj


def folder_uid(title: str) -> str:
    """The uid ``push`` gives a folder it creates: the title as a slug (``CooRM`` → ``coorm``)."""
    return re.sub(r"[^a-z0-9_-]+", "-", title.lower()).strip("-")[:40] or "coorm"


def ensure_folder(api, title: str) -> dict:
    """The Grafana folder of that title (or of its slug uid), created if there is none."""
    uid = folder_uid(title)
    for f in api.folder.get_all_folders() or []:
        if f.get("uid") == uid or str(f.get("title", "")).casefold() == title.casefold():
            return f
    return api.folder.create_folder(title, uid=uid)


def push_dashboards(api, dashboards: list[dict], folder_title: str) -> tuple[dict, list[dict]]:
    """Create or overwrite every dashboard in the folder; the folder and Grafana's replies."""
    folder = ensure_folder(api, folder_title)
    replies = []
    for d in dashboards:
        body = {"dashboard": {**d, "id": None}, "folderUid": folder["uid"], "overwrite": True,
                "message": "coorm dashboards push"}
        if folder.get("id") is not None:
            body["folderId"] = folder["id"]
        replies.append(api.dashboard.update_dashboard(body) or {})
    return folder, replies


@app.command()
def push(
    url: str = typer.Option(..., "--url", envvar="GRAFANA_URL", help="Grafana's base URL, e.g. http://grafana:3000"),
    token: str = typer.Option(..., "--token", envvar="GRAFANA_TOKEN",
                              help="a service account token with the Editor role", show_default=False),
    folder: str = typer.Option("CooRM", "--folder", help="the Grafana folder to put them in (created if missing)"),
    directory: Path | None = DIR_OPTION,
    datasource: str = typer.Option("prometheus", "--datasource",
                                   help="uid of the Grafana's Prometheus datasource the panels should query"),
    timeout: float = typer.Option(10.0, "--timeout", help="seconds per HTTP request"),
) -> None:
    """Provision the dashboards into an existing Grafana (through grafana-client): the folder is created if
    missing, each dashboard created or overwritten (same uid, so links keep working)."""
    import niquests
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaUnauthorizedError

    console = Console()
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise typer.BadParameter(f"{url!r} is not an http(s) URL", param_hint="--url")
    try:
        loaded = _load(_directory(directory))
    except DashboardError as e:
        raise _fail(console, str(e), 2) from None
    base = url if url.endswith("/") else url + "/"  # grafana-client glues the path prefix to "api"
    api = GrafanaApi.from_url(base, credential=token, timeout=timeout)
    try:
        dashboards = [d if datasource == DATASOURCE["uid"] else retarget(d, datasource) for _f, d in loaded]
        fold, replies = push_dashboards(api, dashboards, folder)
    except GrafanaUnauthorizedError:
        raise _fail(console, f"token refused by {url} (HTTP 401): check --token") from None
    except GrafanaClientError as e:
        hint = " (the token's role cannot write dashboards or folders)" if e.status_code == 403 else ""
        raise _fail(console, f"Grafana at {url} refused (HTTP {e.status_code}): {e.message}{hint}") from None
    except GrafanaException as e:
        raise _fail(console, f"Grafana at {url} failed: {e.message}") from None
    except niquests.exceptions.RequestException as e:
        raise _fail(console, f"cannot reach Grafana at {url}: {e}") from None
    finally:
        api.client.s.close()
    table = Table(title=f"{len(replies)} dashboards pushed to folder {fold.get('title', folder)!r} of {url}")
    for col in ("title", "uid", "version", "url"):
        table.add_column(col, overflow="fold")
    for (_f, d), r in zip(loaded, replies, strict=True):
        link = urljoin(base, str(r["url"])) if r.get("url") else ""  # Grafana's url includes any sub-path
        table.add_row(d["title"], str(r.get("uid", d["uid"])), str(r.get("version", "")), link)
    console.print(table)
