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
