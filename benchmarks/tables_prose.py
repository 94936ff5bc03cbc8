"""Figures the README's prose reads out of a results file, generated like the tables (benchmarks/tables.py).

PROSE maps a section name to the results files it reads and the function that writes its lines;
tables.py registers each beside its own tables, so `tables.py --check` holds these to their results too.
"""

from __future__ import annotations


def t_groups_families(d: dict) -> list[str]:
    """The best heterogeneous layout's lead over the best equal-sized one, per family over both seeds."""
    leads: dict[str, dict[str, list[float]]] = {}
    for doc in d.values():
        for c in doc["cells"]:
            lead = leads.setdefault(c["family"], {"wide": [], "any": []})
            lead["wide"].append(c["wide_vs_best_equal"])
            lead["any"].append(c["hetero_vs_best_equal"])

    def pct(kind: str) -> str:
        return ", ".join(f"{family} {100 * (min(v[kind]) - 1):.1f}-{100 * (max(v[kind]) - 1):.1f}%"
                         for family, v in leads.items())

    return [f"Over both seeds, the best layout faster than the best equal-sized split, per family: with every "
            f"decode engine EP8 or wider {pct('wide')}; with the leftover GPUs as narrower decode engines "
            f"beside the wide ones {pct('any')}."]


PROSE = {
    "groups-families": (["groups.json", "groups-seed1.json"], t_groups_families),
}
