"""The Grafana dashboards of ``dashboards/``, offline: valid dashboards in Grafana's format, every query refers
only to metrics (and labels, and label values) that ``shared/metrics.py`` defines, every query parses as
PromQL (``promtool check rules`` on one recording rule per query); and the query helpers of
``cli/dashboards.py`` the live test relies on (``metric_names``, ``render_query``...)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from coorm.cli.dashboards import (
    DashboardError,
    grouping_labels,
    iter_panels,
    load_dashboards,
    metric_names,
    panel_queries,
    render_query,
    selectors,
    tokens,
)
from coorm.shared import metrics
from coorm.shared.requests import RequestType
from tests.programs import program

DIR = Path(__file__).resolve().parents[2] / "dashboards"
FILES = sorted(DIR.glob("*.json"))
EXPECTED = {"overview", "queue", "applications", "control-plane", "accounting"}
PANEL_TYPES = {"row", "timeseries", "stat", "bargauge", "table"}
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
SCRAPE_LABELS = {"job", "instance"}  # added by Prometheus on scrape


def _exported() -> dict[str, set[str]]:
    """Every series name ``shared/metrics.py`` makes a process export -> the labels it carries."""
    out: dict[str, set[str]] = {}
    for obj in metrics.defined():
        labels = set(obj._labelnames) | SCRAPE_LABELS
        if obj._type == "counter":
            out[obj._name + "_total"] = labels
        elif obj._type == "histogram":
            out.update({obj._name + "_bucket": labels | {"le"}, obj._name + "_sum": labels,
                        obj._name + "_count": labels})
        else:
            out[obj._name] = labels
    # prometheus-client's own process collector, and Prometheus's per-target series
    out.update({n: set(SCRAPE_LABELS) for n in ("process_cpu_seconds_total", "process_resident_memory_bytes", "up")})
    return out


EXPORTED = _exported()
TYPES = {t.value for t in RequestType}
# label values a query may name, per (metric, label): taken from the code wherever it names them
KNOWN_VALUES = {
    ("coorm_cluster_nodes", "state"): set(metrics.CLUSTER_NODE_STATES),
    ("coorm_waiting_estimated_start_seconds", "stat"): set(metrics.ESTIMATE_STATS),
    ("coorm_kills_total", "reason"): set(metrics.KILL_REASONS),
    ("coorm_agent_nodes", "state"): {"up", "down"},
    ("coorm_allocation_changes_total", "direction"): {"grow", "shrink"},
    ("coorm_agent_process_exits_total", "outcome"): {"ok", "failed", "killed"},
    **{(name, "type"): TYPES for name, labels in EXPORTED.items() if "type" in labels},
}


def _dashboards() -> list[tuple[str, dict]]:
    return [(f.stem, json.loads(f.read_text())) for f in FILES]


def _queries() -> list[tuple[str, str, str, str]]:
    """(dashboard file, panel title, refId, expr) of every query."""
    return [(name, p.get("title", ""), t.get("refId", ""), t["expr"])
            for name, d in _dashboards() for p in iter_panels(d) for t in p.get("targets", []) if t.get("expr")]


QUERIES = _queries()
QUERY_IDS = [f"{n}:{title}:{ref}" for n, title, ref, _e in QUERIES]


def _variable_query(v: dict) -> str:
    q = v.get("query")
    return q.get("query", "") if isinstance(q, dict) else (q or v.get("definition", ""))


# --- the dashboards as Grafana needs them --------------------------------------------------------------------


def test_the_five_dashboards_are_there_and_load():
    assert {f.stem for f in FILES} == EXPECTED
    loaded = load_dashboards(DIR)
    assert [d["uid"] for d in loaded] == [d["uid"] for _n, d in _dashboards()]


def test_dashboards_have_what_grafana_needs():
    uids, titles = set(), set()
    for name, d in _dashboards():
        assert re.fullmatch(r"coorm-[a-z-]+", d["uid"]) and len(d["uid"]) <= 40, name
        assert d["uid"] not in uids and d["title"] not in titles, f"{name}: uid or title reused"
        uids.add(d["uid"])
        titles.add(d["title"])
        assert d.get("id") is None, f"{name}: a fixed id would collide in another Grafana"
        assert "coorm" in d["tags"], name
        assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36, name
        assert d["refresh"] == "5s" and d["time"] == {"from": "now-15m", "to": "now"}, name
        ids = [p["id"] for p in iter_panels(d)]
        assert len(ids) == len(set(ids)), f"{name}: panel ids must be unique"
        assert any(p["type"] != "row" for p in iter_panels(d)), name
        for p in iter_panels(d):
            where = f"{name}: panel {p.get('title')!r}"
            assert p["type"] in PANEL_TYPES, where
            assert p.get("title"), where
            g = p["gridPos"]
            assert all(isinstance(g[k], int) for k in ("x", "y", "w", "h")), where
            assert 0 <= g["x"] and g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, where
            if p["type"] == "row":
                assert "targets" not in p, where
                continue
            assert p["datasource"] == DATASOURCE, where
            assert p["targets"], where
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)) and all(refs), f"{where}: refIds"
            for t in p["targets"]:
                assert t.get("datasource", DATASOURCE) == DATASOURCE, where
                assert isinstance(t.get("expr"), str) and t["expr"].strip(), where


def test_panels_do_not_overlap():
    for name, d in _dashboards():
        taken: dict[tuple[int, int], str] = {}
        for p in d["panels"]:  # the top level: nested panels of collapsed rows are laid out when expanded
            g = p["gridPos"]
            for y in range(g["y"], g["y"] + g["h"]):
                for x in range(g["x"], g["x"] + g["w"]):
                    assert (x, y) not in taken, f"{name}: {p['title']!r} overlaps {taken[(x, y)]!r}"
                    taken[(x, y)] = p["title"]


def test_variables_come_from_defined_metrics_and_are_regex_friendly():
    for name, d in _dashboards():
        variables = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
        used = {m for e in panel_queries(d) for m in re.findall(r"\$\{?([A-Za-z]\w*)", e)}
        assert used <= set(variables), f"{name}: queries use undefined variables {used - set(variables)}"
        for vname, v in variables.items():
            assert v["type"] == "query" and v["datasource"] == DATASOURCE, (name, vname)
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", _variable_query(v))
            assert m, f"{name}: variable {vname} is not a label_values() query"
            for metric in metric_names(m.group(1)):
                assert metric in EXPORTED and m.group(2) in EXPORTED[metric], (name, vname, metric)
            assert v.get("includeAll") and v.get("allValue") == ".*", f"{name}: {vname} needs All = .*"
            # used only as a regex (=~), so that .* and a multi-value (a|b) both work
            for e in panel_queries(d):
                for _name, matchers in selectors(e):
                    for _label, op, value in matchers:
                        if f"${vname}" in value or f"${{{vname}}}" in value:
                            assert op == "=~" and value in (f"${vname}", f"${{{vname}}}"), (name, e)


def _matched(expr: str) -> dict[str, str]:
    return {label: value for _n, ms in selectors(expr) for label, _op, value in ms}


def test_the_overview_stacks_the_papers_node_states_per_cluster():
    d = json.loads((DIR / "overview.json").read_text())
    assert {v["name"] for v in d["templating"]["list"]} == {"cluster"}
    util = [p for p in iter_panels(d) if p.get("repeat") == "cluster"]
    assert len(util) == 1, "one utilisation panel, repeated per cluster"
    util = util[0]
    # the five states that partition the up nodes, stacked, and 'up' itself as a line over them
    assert {_matched(t["expr"])["state"] for t in util["targets"]} == set(metrics.CLUSTER_NODE_STATES)
    assert all(_matched(t["expr"])["cluster"] == "$cluster" for t in util["targets"])
    assert util["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    up = [t for t in util["targets"] if _matched(t["expr"])["state"] == "up"][0]
    line = [o for o in util["fieldConfig"]["overrides"] if o["matcher"]["options"] == up["legendFormat"]]
    assert {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}} in line[0]["properties"]


def test_shrink_is_drawn_below_the_axis():
    d = json.loads((DIR / "applications.json").read_text())
    exprs = [t["expr"] for t in (t for p in iter_panels(d) for t in p.get("targets", []))
             if "coorm_allocation_changes_total" in t["expr"] and "rate(" in t["expr"]]
    shrink = [e for e in exprs if 'direction="shrink"' in e]
    grow = [e for e in exprs if 'direction="grow"' in e]
    assert shrink and grow and all(e.lstrip().startswith("-") for e in shrink)
    assert not any(e.lstrip().startswith("-") for e in grow)


# --- the queries against shared/metrics.py ------------------------------------------------------------------


@pytest.mark.parametrize(("dash", "title", "ref", "expr"), QUERIES, ids=QUERY_IDS)
def test_query_refers_only_to_defined_metrics_labels_and_values(dash, title, ref, expr):
    names = metric_names(expr)
    assert names, "a query without a metric"
    unknown = names - set(EXPORTED)
    assert not unknown, f"not defined in shared/metrics.py: {sorted(unknown)}"
    for name, matchers in selectors(expr):
        for label, op, value in matchers:
            assert label in EXPORTED[name], f"{name} has no label {label!r}"
            known = KNOWN_VALUES.get((name, label))
            if known is None or "$" in value or op not in ("=", "=~"):
                continue
            values = value.split("|") if op == "=~" else [value]
            assert all(re.fullmatch(r"[\w.-]+", v) for v in values), f"{name}: regex {value!r} not checkable"
            assert set(values) <= known, f"{name}{{{label}}}: {set(values) - known} not among {sorted(known)}"
    labels = set().union(*(EXPORTED[n] for n in names))
    assert grouping_labels(expr) <= labels, f"grouping by labels no metric has: {grouping_labels(expr) - labels}"
    ranges = {text for kind, text in tokens(expr) if kind == "range"}
    assert ranges <= {"[$__rate_interval]", "[$__range]"}, f"fixed ranges {ranges}: use Grafana's variables"
    assert set(re.findall(r"\b(?:i?rate)\([^\[]*(\[[^\]]*\])", expr)) <= {"[$__rate_interval]"}, \
        "rate() over $__rate_interval (increase() over $__range for totals over the dashboard's range)"


def test_every_metric_the_brief_names_is_shown_somewhere():
    shown = set().union(*(metric_names(e) for *_x, e in QUERIES))
    for obj in metrics.defined():
        assert any(n.startswith(obj._name) for n in shown), f"{obj._name} is on no dashboard"
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= shown


# --- PromQL syntax, offline: promtool parses the expressions of recording rules -------------------------------

def promtool_errors(exprs: dict[str, str], tmp_path: Path) -> str:
    """Run ``promtool check rules`` on one recording rule per expression (rendered as Prometheus would get
    it from Grafana); its complaints, '' when every expression parses."""
    names = {f"dashboard:q{i}": key for i, key in enumerate(exprs)}
    rules = [{"record": rec, "expr": render_query(exprs[key])} for rec, key in names.items()]
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}, sort_keys=False))
    run = subprocess.run([program("promtool"), "check", "rules", "--lint=none", str(path)], capture_output=True,
                         text=True, timeout=60)
    if run.returncode == 0:
        assert "SUCCESS" in run.stdout, run.stdout
        return ""
    out = run.stdout + run.stderr
    for rec, key in names.items():
        out = out.replace(f'"{rec}"', f"{rec} ({key})")
    return out or f"promtool exited with {run.returncode}"


def test_every_query_parses_as_promql(tmp_path):
    errors = promtool_errors({qid: e for qid, (*_x, e) in zip(QUERY_IDS, QUERIES, strict=True)}, tmp_path)
    assert errors == ""


def test_the_syntax_check_catches_a_broken_query(tmp_path):
    errors = promtool_errors({"good": "sum by (le) (rate(coorm_policy_pass_seconds_bucket[$__rate_interval]))",
                              "bad": "sum by (le (rate(coorm_policy_pass_seconds_bucket[$__rate_interval]))"},
                             tmp_path)
    assert "(bad)" in errors and "(good)" not in errors


# --- the helpers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "names"), [
    ("up", {"up"}),
    ('coorm_cluster_nodes{cluster=~"$cluster", state="up"}', {"coorm_cluster_nodes"}),
    ("sum by (le) (rate(coorm_policy_pass_seconds_bucket[$__rate_interval]))", {"coorm_policy_pass_seconds_bucket"}),
    ("histogram_quantile(0.99, sum by (le, type) (rate(a_bucket[5m])))", {"a_bucket"}),
    ("sum(rate(a_total[1m])) by (job) / ignoring(x) count without (instance) (b)", {"a_total", "b"}),
    ("a * on(instance) group_left(version) build_info", {"a", "build_info"}),
    ("a * on(instance) group_left b", {"a", "b"}),  # group_left without a label list
    ("a and b or c unless d", {"a", "b", "c", "d"}),
    ("a > bool 3", {"a"}),
    ("a offset 1h30m + b @ 1609746000 - c @ start()", {"a", "b", "c"}),
    ("max_over_time(deriv(a[5m:30s])[10m:1m])", {"a"}),  # subqueries
    ('{__name__="a", job="x"} / {__name__=~"regex.*"}', {"a"}),
    ('label_replace(up, "dst", "$1", "instance", "(.*):.*")', {"up"}),
    ('count_values("version", build_info)', {"build_info"}),
    ("topk(3, a) + quantile(0.9, b) + limitk(2, c)", {"a", "b", "c"}),
    ("job:request_rate:5m * 2", {"job:request_rate:5m"}),
    ("-a + 1e3 - 0x1F * .5 + Inf - NaN", {"a"}),
    ("vector(0) + time() + scalar(a)", {"a"}),
    ('sum(a{reason="by (x) rate(b)"})', {"a"}),  # words inside a string are not names
    ("a # a comment naming b\n + c", {"a", "c"}),
    ("abs(a)", {"a"}),
    ("sum without(le) (a_bucket)", {"a_bucket"}),
    ("a[$__range] ", {"a"}),
    ("sum by (job) (rate(a[${__rate_interval}]))", {"a"}),
])
def test_metric_names(expr, names):
    assert metric_names(expr) == names


def test_metric_names_of_a_name_that_looks_like_a_function_without_a_call():
    # a metric may be called "rate": only a name followed by "(" is a call
    assert metric_names("rate + sum(rate(x[1m]))") == {"rate", "x"}


def test_metric_names_refuses_what_is_not_promql():
    with pytest.raises(ValueError):
        metric_names("sum(a) ; drop table")
    with pytest.raises(ValueError):
        metric_names("sum(a{job='x'")


def test_selectors_and_grouping_labels():
    e = 'sum by (cluster, state) (coorm_cluster_nodes{cluster=~"$cluster", state!="up"}) / on(cluster) group_left x'
    assert selectors(e) == [("coorm_cluster_nodes", [("cluster", "=~", "$cluster"), ("state", "!=", "up")]),
                            ("x", [])]
    assert grouping_labels(e) == {"cluster", "state"}
    assert tokens('a{b="c\\"d"}') == [("ident", "a"), ("op", "{"), ("ident", "b"), ("op", "="), ("str", 'c"d'),
                                      ("op", "}")]


@pytest.mark.parametrize(("expr", "variables", "rendered"), [
    ('a{cluster=~"$cluster"}', None, 'a{cluster=~".*"}'),
    ('a{cluster=~"${cluster}"}', None, 'a{cluster=~".*"}'),
    ('a{cluster=~"${cluster:regex}"}', None, 'a{cluster=~".*"}'),
    ('a{cluster=~"[[cluster]]"}', None, 'a{cluster=~".*"}'),
    ('a{cluster=~"$cluster"}', {"cluster": "c0|c1"}, 'a{cluster=~"c0|c1"}'),
    ("rate(a[$__rate_interval])", None, "rate(a[1m])"),
    ("increase(a[$__range])", None, "increase(a[5m])"),
    ("increase(a[$__range]) / $__range_s", None, "increase(a[5m]) / 300"),
    ("avg_over_time(a[$__interval])", None, "avg_over_time(a[15s])"),
    ("increase(a[$__range])", {"__range": "1h"}, "increase(a[1h])"),
    ('label_replace(a, "d", "$1", "s", "(.*)")', None, 'label_replace(a, "d", "$1", "s", "(.*)")'),
    ('a{user=~"$user", cluster=~"$cluster"}', {"user": "alice"}, 'a{user=~"alice", cluster=~".*"}'),
])
def test_render_query(expr, variables, rendered):
    assert render_query(expr, variables) == rendered


def test_every_rendered_query_is_free_of_grafana_variables():
    for *_x, e in QUERIES:
        r = render_query(e)
        assert "$" not in r.replace('"$1"', ""), r
        assert metric_names(r) == metric_names(e)


def test_panel_queries_include_panels_nested_in_collapsed_rows():
    d = {"panels": [
        {"type": "row", "collapsed": True, "panels": [
            {"type": "timeseries", "targets": [{"refId": "A", "expr": "a"}, {"refId": "B", "expr": "b"}]}]},
        {"type": "stat", "targets": [{"refId": "A", "expr": "c"}, {"refId": "B"}]},
        {"type": "row", "collapsed": False, "panels": []},
    ]}
    assert panel_queries(d) == ["a", "b", "c"]


def test_load_dashboards_refuses_clearly(tmp_path):
    with pytest.raises(DashboardError, match="no dashboards folder"):
        load_dashboards(tmp_path / "missing")
    with pytest.raises(DashboardError, match=r"no dashboard \(\*\.json\)"):
        load_dashboards(tmp_path)
    (tmp_path / "a.json").write_text('{"uid": "x", "title": "X", "panels": [}')
    with pytest.raises(DashboardError, match=r"a\.json: invalid JSON \(line 1"):
        load_dashboards(tmp_path)
    (tmp_path / "a.json").write_text('{"title": "X", "panels": []}')
    with pytest.raises(DashboardError, match="not a Grafana dashboard"):
        load_dashboards(tmp_path)
    (tmp_path / "a.json").write_text('{"dashboard": {"uid": "x", "title": "X", "panels": []}, "meta": {}}')
    assert load_dashboards(tmp_path) == [{"uid": "x", "title": "X", "panels": []}]
