"""EXPERIMENTS.md's tables are what the experiments print: each generated block equals the rendering of the
full run's rows stored next to the doc (``experiments/NAME.json``; a live form's, ``experiments/NAME-live.json``
under a line saying how the run was made). A quick run of every experiment (in the other files of this folder)
checks that the code still produces rows of that shape and trend."""

from __future__ import annotations

import importlib
import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from coorm.cli.main import EXPERIMENTS, app
from coorm.experiments import common
from tests.experiments.stored import DOC

# an experiment whose full run is not stored yet has no generated table in the doc (EXPERIMENTS.md says why)
NOT_STORED: set[str] = set()
# the experiments that render tables for EXPERIMENTS.md
RENDERING = [mod for mod in (importlib.import_module(f"coorm.experiments.{m}") for m in EXPERIMENTS)
             if hasattr(mod, "markdown")]
MODULES = [mod for mod in RENDERING if mod.NAME not in NOT_STORED]
# the experiments whose live form renders a table (``live_markdown``), and their live runs stored next to the doc
LIVE = {mod.NAME: mod for mod in (importlib.import_module(f"coorm.experiments.{m}") for m in EXPERIMENTS)
        if hasattr(mod, "live_markdown")}
LIVE_STORED = [json.loads(p.read_text()) for p in sorted((DOC.parent / "experiments").glob("*-live*.json"))]
PAPERS = {"coorm-fig6", "coorm-fig7", "fairstart-idle", "coormv2-fig3-4", "coormv2-fig9", "coormv2-fig10",
          "coormv2-fig11"}


def test_every_paper_experiment_renders_its_tables():
    assert PAPERS <= {m.NAME for m in RENDERING}


def test_an_experiment_not_stored_has_no_generated_table():
    text = DOC.read_text()
    for name in NOT_STORED:
        assert not common.results_path(DOC, name).exists(), f"{name} is stored: take it out of NOT_STORED"
        assert f"<!-- {name}:begin -->" not in text


@pytest.mark.parametrize("module", MODULES, ids=[m.NAME for m in MODULES])
def test_the_docs_tables_are_the_rendering_of_the_stored_results(module):
    text = DOC.read_text()
    blocks = module.markdown(common.load(DOC, module.NAME)["rows"])
    assert blocks
    for block, content in blocks.items():
        assert common.doc_block(text, block).strip("\n") == content.strip("\n"), (
            f"EXPERIMENTS.md's {block} table is not what the code renders: "
            f"coorm experiment {module.NAME} --stored --update-doc EXPERIMENTS.md")


def live_drift(text: str, data: dict) -> str | None:
    """What is wrong with the doc's table of a stored live run (None: it is the rendering of the stored rows)."""
    (block, content), = common.live_blocks(data, LIVE[data["experiment"]].live_markdown).items()
    if common.doc_block(text, block).strip("\n") != content.strip("\n"):
        model = f" --malleable-model {data['model']}" if data.get("model") else ""
        return (f"EXPERIMENTS.md's {block} table is not what the code renders from its stored run: "
                f"coorm experiment {data['experiment']} --live{model} --stored --update-doc EXPERIMENTS.md")
    return None


@pytest.mark.parametrize("data", LIVE_STORED, ids=[d["name"] for d in LIVE_STORED])
def test_the_docs_live_tables_are_the_rendering_of_the_stored_live_runs(data):
    variant = None if data.get("model", "psa") == "psa" else data["model"]
    assert data["live"] and data["name"] == common.live_name(data["experiment"], variant)
    assert data["rows"] and data["wall_s"] > 0 and data["revision"] and data["date_utc"]
    drift = live_drift(DOC.read_text(), data)
    assert drift is None, drift


def test_every_block_of_the_doc_is_rendered_from_a_stored_run():
    """A table between markers that no stored run renders would escape the checks above."""
    rendered = {b for mod in MODULES for b in mod.markdown(common.load(DOC, mod.NAME)["rows"])}
    rendered |= {d["name"] for d in LIVE_STORED}
    assert set(re.findall(r"^<!-- ([\w.-]+):begin -->$", DOC.read_text(), re.MULTILINE)) == rendered  # (own line)


def test_a_hand_edited_live_table_fails_and_stored_rendering_restores_it(tmp_path):
    doc = tmp_path / "EXPERIMENTS.md"
    shutil.copy(DOC, doc)
    shutil.copytree(DOC.parent / "experiments", tmp_path / "experiments")
    data = common.load(doc, "koala-pra-live")
    original = doc.read_text()
    table = common.doc_block(original, "koala-pra-live")
    edited = table.replace(" | 0 | ", " | 1 | ", 1)  # a "failed" or "shrinks" count of 0 made 1
    assert edited != table
    doc.write_text(original.replace(table, edited))
    assert live_drift(doc.read_text(), data) is not None
    result = CliRunner().invoke(app, ["experiment", "koala-pra", "--live", "--stored", "--update-doc", str(doc)])
    assert result.exit_code == 0, result.output
    assert doc.read_text() == original and live_drift(original, data) is None


def test_a_stored_live_run_says_how_it_was_made_and_renders_from_the_store(tmp_path):
    """The store the CLI's --live --update-doc goes through, fed the rows of a live run the code made (the
    stored full run's), then the CLI's re-rendering of it."""
    import subprocess

    doc = tmp_path / "EXPERIMENTS.md"
    doc.write_text("before\n<!-- koala-pwa-load-live:begin -->\n<!-- koala-pwa-load-live:end -->\nafter\n")
    rows = common.load(DOC, "koala-pwa-load-live")["rows"]
    data = common.store_live(doc, "koala-pwa-load-live", "coorm experiment koala-pwa-load --live", lambda: rows,
                             experiment="koala-pwa-load")
    stored = json.loads((tmp_path / "experiments" / "koala-pwa-load-live.json").read_text())
    assert stored | {"rows": rows} == data and stored["rows"] == rows
    assert stored["revision"] == common.code_revision()
    if (DOC.parent / ".git").exists():  # (a checkout: the revision is its HEAD)
        head = subprocess.run(["git", "-C", str(DOC.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        assert stored["revision"].split("+")[0] == head
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", stored["date_utc"])
    assert len(stored["load_start"]) == len(stored["load_end"]) == 3 and stored["wall_s"] >= 0

    result = CliRunner().invoke(app, ["experiment", "koala-pwa-load", "--live", "--stored", "--update-doc",
                                      str(doc)])
    assert result.exit_code == 0, result.output
    block = common.doc_block(doc.read_text(), "koala-pwa-load-live")
    header, table = block.strip("\n").split("\n\n")
    assert f"revision `{stored['revision']}`" in header and f"run {stored['date_utc']} UTC" in header
    assert f"load average {stored['load_start'][0]:.2f} at its start" in header
    assert table == LIVE["koala-pwa-load"].live_markdown(rows)
    assert doc.read_text().startswith("before\n") and doc.read_text().endswith("\nafter\n")


def test_stored_refuses_a_run_never_stored_and_the_doc_takes_no_quick_live_run(tmp_path):
    doc = tmp_path / "EXPERIMENTS.md"
    doc.write_text("<!-- koala-pra-live:begin -->\n<!-- koala-pra-live:end -->\n")
    runner = CliRunner()
    for args, name in ((["koala-pra", "--live"], "koala-pra-live"), (["koala-pra"], "koala-pra"),
                       (["malleable-fraction", "--live", "--malleable-model", "negotiating"],
                        "malleable-fraction-live-negotiating")):
        result = runner.invoke(app, ["experiment", *args, "--stored", "--update-doc", str(doc)])
        assert result.exit_code == 2, result.output
        assert f"nothing stored in {tmp_path / 'experiments' / name}.json" in result.output
    result = runner.invoke(app, ["experiment", "koala-pra", "--live", "--quick", "--update-doc", str(doc)])
    assert result.exit_code == 2 and "no --quick with --update-doc" in result.output
    assert not (tmp_path / "experiments").exists()


def test_update_doc_rewrites_only_the_blocks_and_stored_rendering_is_stable(tmp_path):
    doc = tmp_path / "EXPERIMENTS.md"
    shutil.copy(DOC, doc)
    shutil.copytree(DOC.parent / "experiments", tmp_path / "experiments")
    begin, end = "<!-- fairstart-idle:begin -->", "<!-- fairstart-idle:end -->"
    original = doc.read_text()
    head, rest = original.split(begin)
    doc.write_text(head + begin + "\nstale\n" + rest.split(end)[0].replace("|", "!") + end + rest.split(end)[1])
    result = CliRunner().invoke(app, ["experiment", "fairstart-idle", "--stored", "--update-doc", str(doc)])
    assert result.exit_code == 0, result.output
    assert doc.read_text() == original


def test_blocks_need_their_markers_once():
    text = "a\n<!-- x:begin -->\nold\n<!-- x:end -->\nb\n"
    assert common.with_blocks(text, {"x": "new"}) == "a\n<!-- x:begin -->\nnew\n<!-- x:end -->\nb\n"
    with pytest.raises(KeyError):
        common.with_blocks(text, {"y": "new"})
    with pytest.raises(KeyError):
        common.doc_block(text + text, "x")


def test_intervals_are_seeded_and_cover_what_they_should():
    values = [0.0] * 50 + [100.0] * 10
    assert common.bootstrap_ci(values, seed=3) == common.bootstrap_ci(values, seed=3)
    lo, hi = common.bootstrap_ci(values)
    assert lo < 100 * 10 / 60 < hi
    assert common.wilson_ci(0, 60)[0] == 0 and 0.03 < common.wilson_ci(0, 60)[1] < 0.07
    lo, hi = common.wilson_ci(3, 60)
    assert lo < 0.05 < hi and lo > 0
