"""The ``coorm`` command."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(help="CooRM: a resource manager where applications cooperate through their launchers.",
                  no_args_is_help=True)
protocol = typer.Typer(help="The wire protocol.", no_args_is_help=True)
app.add_typer(protocol, name="protocol")


@app.command()
def demo(nodes: int = typer.Option(32, min=24, help="nodes of the demo cluster")) -> None:
    """Run the NEA + malleable interaction (CooRMv2 Fig. 8) through the scheduling cores, narrated."""
    from cli.demo import run

    run(Console(), nodes)


@app.command()
def simulate(
    scenario: Path = typer.Argument(..., exists=True, dir_okay=False, help="scenario YAML file"),
    out: Path = typer.Option(Path("out"), "--out", help="folder for summary.json and the plots"),
    validate: bool = typer.Option(False, help="check the cores' invariants after every event (slower)"),
) -> None:
    """Run SCENARIO in virtual time through the real cores and launchers; write summary.json and PNGs."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from simulator.run import run_scenario
    from simulator.scenario import load

    console = Console()
    try:
        spec = load(scenario)
    except Exception as e:  # a readable refusal, not a traceback
        console.print(f"[red]invalid scenario {scenario}:[/red] {e}")
        raise typer.Exit(2) from None
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[state]}"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=None, state="")

        def progress(sim) -> None:
            done = sum(1 for lau in sim.launchers.values() if lau.finished)
            bar.update(task, state=f"t={sim.now:,.0f}s, {done}/{len(sim.launchers)} apps done")

        summary = run_scenario(spec, out, progress=progress, validate=validate)
    table = Table(title=f"{scenario.name}: {len(summary['apps'])} applications")
    for col in ("app", "kind", "submitted", "started", "ended", "NP node·s", "P node·s", "waste"):
        table.add_column(col, justify="right" if col not in ("app", "kind") else "left")
    for a in summary["apps"][:40]:
        ns = a["node_seconds"]
        table.add_row(a["name"], a["kind"], f"{a['submitted']:g}", "-" if a["started"] is None else f"{a['started']:g}",
                      "-" if a["ended"] is None else f"{a['ended']:g}", f"{ns['non_preemptible']:,.0f}",
                      f"{ns['preemptible']:,.0f}", f"{a['waste']:,.0f}")
    console.print(table)
    t = summary["totals"]
    console.print(f"makespan {t['makespan']:,.0f} s, utilisation {t['utilisation']:.1%}, {t['messages']:,} messages "
                  f"({t['bytes']:,} bytes), {t['passes']:,} passes, scheduling CPU {t['scheduling_cpu_s']:.2f} s")
    console.print(f"wrote {out / 'summary.json'}, {out / 'utilisation.png'}, {out / 'allocations.png'}")


EXPERIMENTS = ("coorm_fig6", "coorm_fig7", "coormv2_fig3_4", "coormv2_fig9", "coormv2_fig10", "coormv2_fig11")


def _experiments() -> dict:
    import importlib

    found = {}
    for module in EXPERIMENTS:
        try:
            mod = importlib.import_module(f"experiments.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"experiments.{module}":
                raise  # a real import error inside the experiment, not a missing experiment
            continue
        found[mod.NAME] = mod
    return found


@app.command()
def experiment(
    name: str = typer.Argument(..., help="an experiment's name, or 'all'; 'list' shows them"),
    out: Path = typer.Option(Path("out/experiments"), "--out", help="folder for the CSV and PNG files"),
    quick: bool = typer.Option(False, "--quick", help="fewer seeds and points (minutes instead of more)"),
) -> None:
    """Reproduce a paper's experiment: writes NAME.csv and NAME.png (medians and quartiles over seeds)."""
    import time

    known = _experiments()
    if name == "list":
        for n, mod in sorted(known.items()):
            typer.echo(f"{n}: {(mod.__doc__ or '').strip().splitlines()[0]}")
        return
    chosen = sorted(known) if name == "all" else [name]
    for n in chosen:
        if n not in known:
            typer.echo(f"unknown experiment {n}; known: {', '.join(sorted(known))}", err=True)
            raise typer.Exit(2)
        t0 = time.perf_counter()
        rows = known[n].run(out, quick=quick)
        typer.echo(f"{n}: {len(rows)} points in {time.perf_counter() - t0:.1f} s -> {out / (n + '.csv')}")


@protocol.command("schema")
def schema(out: Path | None = typer.Option(None, help="write one NAME.json per message into this folder")) -> None:
    """Print (or write) the JSON Schema of every wire message, for launchers in other languages."""
    from shared.protocol import json_schemas

    schemas = json_schemas()
    if out is None:
        typer.echo(json.dumps(schemas, indent=2))
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, s in schemas.items():
        (out / f"{name}.json").write_text(json.dumps(s, indent=2) + "\n")
    typer.echo(f"wrote {len(schemas)} schemas to {out}")


if __name__ == "__main__":
    app()
