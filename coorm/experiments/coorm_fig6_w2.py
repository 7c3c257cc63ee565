"""Where Fig. 6's W2 bytes go (``coorm experiment coorm-fig6-w2``): W2 at nC = 5 re-run on two of Fig. 6's
packs, with what each application was told (views, starts, ends: ``AppRecord.notification_bytes``), the
share of it the CEM applications received, the application-seconds waited (start minus arrival, summed) and
the makespan.

Why: our W2 exceeds the paper's "below 60 MB" on its heavier packs, and Fig. 6's rows (quartiles of
totals) cannot say whether the excess is the views sent to a longer queue or something else. The runs are
:func:`coorm.experiments.coorm_fig6.w2_traffic`: the very simulations of Fig. 6 (same workload, seeds and
platform), so their totals are Fig. 6's.
"""

from __future__ import annotations

from pathlib import Path

from coorm.experiments.common import md_table, save, write_csv
from coorm.experiments.coorm_fig6 import (
    PACK,
    QUICK,
    Task,
    pack_jobs,
    pack_numbers,
    require_trace,
    run_tasks,
    w2_traffic,
)

NAME = "coorm-fig6-w2"
# Fig. 6's packs are pack_numbers(3); its first two (30 and 92 of the Atlas log) gave its lightest and its
# heaviest W2 run at nC = 5, where its W2 maximum peaks (tests/experiments/test_fig6_w2.py checks both against
# the stored Fig. 6). Two runs of W2, about 25 and 80 s of CPU on this machine
FULL = dict(clusters=5, of=3, packs=(0, 1), jobs=PACK)
# quick: Fig. 6's quick packs, which the shipped sample holds (the tests need no download), at one of its
# quick nC
_FIG6_QUICK: dict = QUICK
QUICK_W2 = dict(clusters=_FIG6_QUICK["clusters"][1], of=_FIG6_QUICK["packs"],
                packs=tuple(range(_FIG6_QUICK["packs"])), jobs=_FIG6_QUICK["jobs"])


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg: dict = QUICK_W2 if quick else FULL
    require_trace()
    numbers = pack_numbers(cfg["of"])
    tasks = [Task("W2", cfg["clusters"], numbers[i], tuple(pack_jobs(numbers[i], cfg["jobs"])))
             for i in cfg["packs"]]
    rows = sorted(run_tasks(w2_traffic, tasks), key=lambda r: r["bytes"])
    out = Path(out)
    write_csv(out / f"{NAME}.csv", rows)
    plot(out / f"{NAME}.png", rows)
    return rows


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"pack {r['pack']}" for r in rows]
    to_cems = [r["cem_notification_bytes"] / 1e6 for r in rows]
    to_others = [(r["notification_bytes"] - r["cem_notification_bytes"]) / 1e6 for r in rows]
    rest = [(r["bytes"] - r["notification_bytes"]) / 1e6 for r in rows]
    ax.bar(labels, to_cems, label="notifications to the CEMs")
    ax.bar(labels, to_others, bottom=to_cems, label="notifications to the others")
    ax.bar(labels, rest, bottom=[a + b for a, b in zip(to_cems, to_others, strict=True)],
           label="requests, cluster info, the rest")
    ax.set_ylabel("MB")
    ax.set_title(f"W2, nC = {rows[0]['clusters']}: where the bytes go")
    ax.legend(fontsize=8)
    save(fig, path)


def markdown(rows: list[dict]) -> dict[str, str]:
    """The runs, lightest first, and how the heaviest compares with the lightest."""
    runs = sorted(rows, key=lambda r: r["bytes"])
    nc = runs[0]["clusters"]

    def share(r: dict, key: str) -> str:
        return f"{r[key] / 1e6:.2f} MB ({100 * r[key] / r['bytes']:.0f} %)"

    table = md_table(
        (f"W2, nC = {nc}", "total", "notifications (views, starts, ends), % of the total", "of which to the CEMs",
         "application-seconds waited", "bytes per application-second waited", "makespan"),
        [(f"pack {r['pack']}", f"{r['bytes'] / 1e6:.2f} MB", share(r, "notification_bytes"),
          share(r, "cem_notification_bytes"), f"{r['app_seconds_waited'] / 1e6:.2f} M",
          f"{r['bytes'] / r['app_seconds_waited']:.1f}", f"{r['makespan']:,.0f} s") for r in runs])
    light, heavy = runs[0], runs[-1]
    text = (f"The heaviest run against the lightest: {heavy['app_seconds_waited'] / light['app_seconds_waited']:.1f}"
            f" times the application-seconds waited, {heavy['bytes'] / light['bytes']:.1f} times the bytes, "
            f"{(heavy['bytes'] / heavy['app_seconds_waited']) / (light['bytes'] / light['app_seconds_waited']):.1f}"
            " times the bytes per application-second waited.")
    return {NAME: table + "\n\n" + text}
