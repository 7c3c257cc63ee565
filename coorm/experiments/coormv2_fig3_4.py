"""CooRMv2 Fig. 3 and Fig. 4: the AMR model alone (§II-C), no RMS.

* **Fig. 3**: end-time increase ``T_static(n_eq) / T_dynamic - 1`` when the equivalent static allocation
  replaces the dynamic one, per target efficiency; quartiles over working-set profiles (seeds). Profiles
  without an equivalent static allocation (above ~0.8, see :mod:`coorm.launchers.amr_model`) are counted in
  ``missing``. The paper: at most 2.5%, and ``n_eq`` exists for ``e_t < 0.8``.
* **Fig. 4**: for a 75% target, the static node counts a user may choose per maximum data size ``Smax``:
  at least ``ceil(Smax / M)`` (not running out of memory) and at most the count whose area is 110% of
  ``A(75%)``; the upper bound depends on the profile (quartiles over seeds), ``safe_hi`` is the largest
  count good for every profile (none when the memory bound is above it).

* **The memory per node** (``figure`` = ``memory``): the paper gives none. Its only constraints are that
  ``n_eq`` "exists for e_t < 0.8" (§II-C) and that a static choice must not "run out of memory" (Fig. 4).
  Without a memory bound ``n_eq`` always exists (:mod:`coorm.launchers.amr_model`), so the 0.8 is where
  ``n_eq`` drops below ``ceil(Smax / M)``. Per target, the rows give ``Smax / n_eq`` (no memory bound) over
  the profiles, in GiB: the per-node working set ``M`` below which ``n_eq`` no longer exists at that target
  -- what the paper's "< 0.8" says about ``M``, and how far our 4 GiB is from it.

One CSV and one PNG, ``figure`` = ``fig3``, ``fig4`` or ``memory`` on each row.
"""

from __future__ import annotations

from pathlib import Path

from coorm.experiments.common import md_table, quartiles, save, write_csv
from coorm.launchers import amr_model as model

NAME = "coormv2-fig3-4"

TIB = model.MIB_PER_TIB
FULL = dict(
    targets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9),
    smax_tib=(0.125, 0.25, 0.5, 1.0, 2.0, 3.16, 4.0, 6.0, 8.0, 12.0, 16.0),
    seeds=range(100),
)
QUICK = dict(targets=(0.3, 0.5, 0.75, 0.85), smax_tib=(0.5, 3.16, 16.0), seeds=range(10))
MEMORY_TARGETS = (0.7, 0.75, 0.78, 0.79, 0.8, 0.81, 0.82, 0.85)
GIB = 1024.0


def fig3_rows(targets, seeds) -> list[dict]:
    seeds = list(seeds)
    rows = []
    for p in model.fig3(targets, seeds):
        row = {"figure": "fig3", "target_efficiency": p.target, "profiles": len(seeds), "missing": p.missing}
        row |= {f"increase_pct_{k}": 100.0 * v for k, v in quartiles(p.increases).items()}
        rows.append(row)
    return rows


def fig4_rows(smax_tib, seeds, target: float = 0.75) -> list[dict]:
    seeds = list(seeds)
    rows = []
    for p in model.fig4([s * TIB for s in smax_tib], seeds, target=target):
        his = [r[1] for r in p.per_profile if r is not None]
        row = {"figure": "fig4", "smax_tib": p.smax_mib / TIB, "profiles": len(seeds),
               "no_choice": sum(r is None for r in p.per_profile), "memory_min_nodes": p.memory_min}
        row |= {f"max_nodes_{k}": v for k, v in quartiles(his).items()}
        row["safe_hi"] = p.safe[1] if p.safe is not None else None
        rows.append(row)
    return rows


def memory_rows(targets, seeds) -> list[dict]:
    """Per target: ``Smax / n_eq`` without a memory bound, over profiles (GiB per node): with less memory
    per node than that, the profile's ``n_eq`` cannot hold its peak working set."""
    profiles = [model.working_set(seed) for seed in seeds]
    rows = []
    for target in targets:
        per_node = []
        for sizes in profiles:
            n_eq = model.equivalent_static_allocation(sizes, target, None)
            assert n_eq is not None  # without a memory bound it always exists
            per_node.append(max(sizes) / n_eq / GIB)
        row = {"figure": "memory", "target_efficiency": target, "profiles": len(profiles),
               "assumed_gib": model.MEM_PER_NODE_MIB / GIB,
               "missing_with_assumed": sum(g > model.MEM_PER_NODE_MIB / GIB for g in per_node)}
        row |= {f"gib_per_node_{k}": v for k, v in quartiles(per_node).items()}
        rows.append(row)
    return rows


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg = QUICK if quick else FULL
    rows = (fig3_rows(cfg["targets"], cfg["seeds"]) + fig4_rows(cfg["smax_tib"], cfg["seeds"])
            + memory_rows(MEMORY_TARGETS if not quick else (0.75, 0.8, 0.85), cfg["seeds"]))
    write_csv(out / f"{NAME}.csv", rows)
    _plot(out / f"{NAME}.png", rows)
    return rows


def markdown(rows: list[dict]) -> dict[str, str]:
    """EXPERIMENTS.md's Fig. 3, Fig. 4 and memory tables, from :func:`run`'s rows."""
    f3 = [r for r in rows if r["figure"] == "fig3"]
    f4 = [r for r in rows if r["figure"] == "fig4"]
    mem = [r for r in rows if r["figure"] == "memory"]

    def pct(r: dict, k: str) -> str:
        v = r[f"increase_pct_{k}"]
        return "—" if v != v else f"{v:.2f}"

    fig3 = md_table(
        ("target efficiency", "end-time increase %, median [q1–q3]", "max %", "profiles without n_eq",
         "paper"),
        [(f"{r['target_efficiency']:g}",
          "—" if r["missing"] == r["profiles"] else
          f"{pct(r, 'median')} [{pct(r, 'q1')}–{pct(r, 'q3')}]", pct(r, "max"),
          f"{r['missing']}/{r['profiles']}",
          "n_eq exists; increase ≤ 2.5%" if r["target_efficiency"] < 0.8 else "no n_eq")
         for r in f3])

    def nodes(r: dict, k: str) -> str:
        v = r[f"max_nodes_{k}"]
        return "—" if v != v else f"{v:.0f}"

    fig4 = md_table(
        ("Smax (TiB)", "min nodes (memory)", "max nodes, median [q1–q3]", "max nodes, min–max over profiles",
         "safe range", "profiles with no choice"),
        [(f"{r['smax_tib']:g}", r["memory_min_nodes"],
          "—" if r["no_choice"] == r["profiles"] else f"{nodes(r, 'median')} [{nodes(r, 'q1')}–{nodes(r, 'q3')}]",
          "—" if r["no_choice"] == r["profiles"] else f"{nodes(r, 'min')}–{nodes(r, 'max')}",
          "none" if r["safe_hi"] is None else f"{r['memory_min_nodes']}–{r['safe_hi']}",
          f"{r['no_choice']}/{r['profiles']}")
         for r in f4])
    memory = md_table(
        ("target efficiency", "GiB per node below which n_eq does not exist: min", "median", "max",
         f"profiles without n_eq at {mem[0]['assumed_gib']:g} GiB" if mem else "", "paper"),
        [(f"{r['target_efficiency']:g}", f"{r['gib_per_node_min']:.2f}", f"{r['gib_per_node_median']:.2f}",
          f"{r['gib_per_node_max']:.2f}", f"{r['missing_with_assumed']}/{r['profiles']}",
          "n_eq exists" if r["target_efficiency"] < 0.8 else "no n_eq")
         for r in mem])
    return {"coormv2-fig3": fig3, "coormv2-fig4": fig4, "coormv2-fig3-memory": memory}


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib.pyplot as plt

    f3 = [r for r in rows if r["figure"] == "fig3" and r["missing"] < r["profiles"]]
    f4 = [r for r in rows if r["figure"] == "fig4"]
    fig, (a3, a4) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = [r["target_efficiency"] for r in f3]
    a3.plot(x, [r["increase_pct_median"] for r in f3], marker="o", label="median")
    a3.fill_between(x, [r["increase_pct_q1"] for r in f3], [r["increase_pct_q3"] for r in f3], alpha=0.2,
                    label="q1-q3")
    a3.plot(x, [r["increase_pct_max"] for r in f3], ls="--", marker=".", label="max")
    a3.axhline(2.5, color="grey", lw=0.8, ls=":", label="paper: at most 2.5%")
    a3.set_xlabel("target efficiency")
    a3.set_ylabel("end-time increase (%)")
    a3.set_title("Fig. 3: static (n_eq) instead of dynamic")
    x = [r["smax_tib"] for r in f4 if r["max_nodes_median"] == r["max_nodes_median"]]
    k = [r for r in f4 if r["max_nodes_median"] == r["max_nodes_median"]]
    a4.plot([r["smax_tib"] for r in f4], [r["memory_min_nodes"] for r in f4], marker="o",
            label="min (memory)")
    a4.plot(x, [r["max_nodes_median"] for r in k], marker="o", label="max (110% of A(75%)), median")
    a4.fill_between(x, [r["max_nodes_min"] for r in k], [r["max_nodes_max"] for r in k], alpha=0.2,
                    label="max: min-max over profiles")
    a4.set_xscale("log")
    a4.set_yscale("log")
    a4.set_xlabel("Smax (TiB)")
    a4.set_ylabel("node-count")
    a4.set_title("Fig. 4: static allocation choices, 75% target")
    for ax in (a3, a4):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, path)
