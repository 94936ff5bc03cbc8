"""Small task datasets, generated deterministically from a seed (nothing is downloaded).

    base.py       Task, DATASETS, make_dataset(name, n, seed), write_jsonl, read_jsonl
    math_tir.py   `math-tir`: arithmetic and algebra problems meant to be solved with code
    search.py     `search`: a generated corpus of short documents (make_corpus) and multi-hop
                  questions over it
    swe_lite.py   `swe-lite`: small buggy Python functions, their unit tests and the known fix
    hf.py         a Hugging Face dataset on disk, its columns mapped to Task fields (hf_tasks)
    arith.py      `arith`: one- and two-digit sums, differences and products for the calculator
                  (the RL toy task)
"""

from prorsa.agent.datasets.base import DATASETS, Task, make_dataset, read_jsonl, register, write_jsonl

__all__ = ["DATASETS", "Task", "make_dataset", "read_jsonl", "register", "write_jsonl"]
