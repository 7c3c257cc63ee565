"""EXPERIMENTS.md's tables are what the experiments print: each generated block equals the rendering of the
full run's rows stored next to the doc (``experiments/NAME.json``). A quick run of every experiment (in
the other files of this folder) checks that the code still produces rows of that shape and trend."""

from __future__ import annotations

import importlib
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
