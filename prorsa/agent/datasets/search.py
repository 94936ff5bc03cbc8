"""`search`: a generated encyclopedia of a made-up world and multi-hop questions over it.

    make_corpus(seed=0) -> [Document]    ~300 short documents: people, cities, companies, provinces
    make_search(n, seed) -> [Task]       questions over make_corpus(seed) that need 2-3 lookups;
                                         the reference calls are the `search` queries of each hop

Names are built from syllables, so every entity is a token no other entity shares and BM25 can
find it; each question names one entity and asks about one two or three links away.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from prorsa.agent.datasets.base import Task, register
from prorsa.agent.tools.base import ToolCall
from prorsa.agent.tools.corpus import Document

SIZES = {"province": 12, "city": 60, "company": 50, "person": 180}
_ONSETS = "b d f g k l m n p r s t v z br dr gr kr tr st th sh".split()
_VOWELS = "a e i o u ai ei ou".split()
_CODAS = ["", "", "n", "r", "s", "l", "th", "k", "m"]
PROFESSIONS = ["chemist", "painter", "engineer", "historian", "surgeon", "composer", "architect",
               "botanist", "pilot", "lawyer", "astronomer", "weaver"]
INDUSTRIES = ["shipping", "textile", "software", "mining", "brewing", "glassware", "railway", "printing"]
EXPORTS = ["copper", "wool", "salt", "timber", "amber", "tea", "marble", "cotton", "olives", "tin",
           "silk", "barley"]


def _word(r: random.Random, used: set[str], syllables: int) -> str:
    while True:
        w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) for _ in range(syllables)) + r.choice(_CODAS)
        if w not in used:
            used.add(w)
            return w.capitalize()


@dataclass(frozen=True)
class World:
    provinces: dict  # name -> {"capital", "export"}
    cities: dict  # name -> {"province", "river", "year"}
    companies: dict  # name -> {"city", "year", "founder", "industry"}
    people: dict  # name -> {"city", "company", "profession"}


def make_world(seed: int = 0) -> World:
    r = random.Random(f"search-world:{seed}")
    used: set[str] = set()
    provinces = {_word(r, used, 2): {"export": r.choice(EXPORTS)} for _ in range(SIZES["province"])}
    names = sorted(provinces)
    # The first cities go one to each province, so that every province has a capital of its own.
    cities = {_word(r, used, 2): {"province": names[i] if i < len(names) else r.choice(names),
                                  "river": _word(r, used, 2), "year": r.randrange(900, 1900)}
              for i in range(SIZES["city"])}
    for name, p in provinces.items():
        p["capital"] = r.choice([c for c, v in cities.items() if v["province"] == name])
    people = {f"{_word(r, used, 2)} {_word(r, used, 2)}": {"city": r.choice(sorted(cities)),
                                                          "profession": r.choice(PROFESSIONS)}
              for _ in range(SIZES["person"])}
    companies = {_word(r, used, 3): {"city": r.choice(sorted(cities)), "year": r.randrange(1800, 2020),
                                     "founder": r.choice(sorted(people)), "industry": r.choice(INDUSTRIES)}
                 for _ in range(SIZES["company"])}
    for p in people.values():
        p["company"] = r.choice(sorted(companies))
    return World(provinces, cities, companies, people)


def make_corpus(seed: int = 0) -> list[Document]:
    w = make_world(seed)
    docs = [Document(f"province-{i}", n, f"{n} is a province whose capital is {v['capital']}. "
                                         f"Its main export is {v['export']}.")
            for i, (n, v) in enumerate(w.provinces.items())]
    docs += [Document(f"city-{i}", n, f"{n} is a city in the province of {v['province']}. It lies on "
                                     f"the {v['river']} river and was founded in {v['year']}.")
             for i, (n, v) in enumerate(w.cities.items())]
    docs += [Document(f"company-{i}", n, f"{n} is a {v['industry']} company headquartered in "
                                        f"{v['city']}. It was founded in {v['year']} by {v['founder']}.")
             for i, (n, v) in enumerate(w.companies.items())]
    docs += [Document(f"person-{i}", n, f"{n} is a {v['profession']} who was born in {v['city']} "
                                       f"and works for {v['company']}.")
             for i, (n, v) in enumerate(w.people.items())]
    return docs


def _q_person(n: str) -> str:
    return f"{n} born works"


def _q_city(n: str) -> str:
    return f"{n} city province river founded"


def _q_company(n: str) -> str:
    return f"{n} company headquartered founded"


def _q_province(n: str) -> str:
    return f"{n} province capital export"


def _question(w: World, r: random.Random, kind: str):
    """(question, answer, queries, hops) for one question of `kind`."""
    if kind in ("birth_province", "birth_export", "employer_year", "employer_founder"):
        person = r.choice(sorted(w.people))
        p = w.people[person]
        if kind == "birth_province":
            return (f"In which province was {person} born?", w.cities[p["city"]]["province"],
                    [_q_person(person), _q_city(p["city"])])
        if kind == "birth_export":
            prov = w.cities[p["city"]]["province"]
            return (f"What is the main export of the province where {person} was born?",
                    w.provinces[prov]["export"], [_q_person(person), _q_city(p["city"]), _q_province(prov)])
        c = w.companies[p["company"]]
        if kind == "employer_year":
            return (f"In what year was the company that {person} works for founded?", str(c["year"]),
                    [_q_person(person), _q_company(p["company"])])
        return (f"Who founded the company that {person} works for?", c["founder"],
                [_q_person(person), _q_company(p["company"])])
    company = r.choice(sorted(w.companies))
    city = w.companies[company]["city"]
    return (f"Which river runs through the city where {company} is headquartered?",
            w.cities[city]["river"], [_q_company(company), _q_city(city)])


KINDS = ("birth_province", "birth_export", "employer_year", "employer_founder", "hq_river")
INSTRUCTION = "Use the search tool to look things up. Give the final answer as \\boxed{ANSWER}."


@register("search")
def make_search(n: int, seed: int = 0) -> list[Task]:
    w = make_world(seed)
    tasks = []
    for i in range(n):
        r = random.Random(f"search:{seed}:{i}")
        kind = KINDS[i % len(KINDS)]
        question, answer, queries = _question(w, r, kind)
        tasks.append(Task(f"search-{seed}-{i}", "search", f"{question}\n{INSTRUCTION}", answer,
                          tuple(ToolCall("search", {"query": q}) for q in queries),
                          meta={"kind": kind, "hops": len(queries), "corpus_seed": seed}))
    return tasks
