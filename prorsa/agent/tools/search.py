"""The `search` tool: BM25 retrieval (bm25s) over a corpus of short documents.

    Document(doc_id, title, text)
    SearchTool(corpus=None, k=3, truncation=Truncation())   corpus None: the generated corpus of
                                                            the `search` dataset (seed 0)
    SearchTool.search(query, k) -> [(Document, score)]      best first, zero scores dropped
    await SearchTool().call({"query": "...", "k": 3}) -> ToolResult

The index is built once, when the tool is made; a query is a sparse lookup of a few ms, so it
runs inline on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from prorsa.agent.tools.base import ToolResult, ToolStatus
from prorsa.agent.tools.corpus import Document
from prorsa.agent.tools.registry import register
from prorsa.agent.tools.truncate import Truncation

MAX_K = 20


def _tokenize(texts: list[str]):
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", show_progress=False)


@register("search")
class SearchTool:
    name = "search"
    description = "Search the document collection; returns the best-matching documents."
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "keywords to look for"},
                       "k": {"type": "integer", "description": f"how many documents (1-{MAX_K})"}},
        "required": ["query"],
    }

    def __init__(self, corpus: Sequence[Document] | None = None, k: int = 3,
                 truncation: Truncation = Truncation()):
        import bm25s

        if corpus is None:
            from prorsa.agent.datasets.search import make_corpus

            corpus = make_corpus(seed=0)
        if not corpus:
            raise ValueError("the search corpus is empty")
        self.corpus = list(corpus)
        self.k = k
        self.truncation = truncation
        self._index = bm25s.BM25()
        self._index.index(_tokenize([f"{d.title} {d.text}" for d in self.corpus]), show_progress=False)

    def search(self, query: str, k: int | None = None) -> list[tuple[Document, float]]:
        k = max(1, min(k or self.k, MAX_K, len(self.corpus)))
        ids, scores = self._index.retrieve(_tokenize([query]), k=k, show_progress=False)
        return [(self.corpus[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]

    async def call(self, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> ToolResult:
        start = time.perf_counter()
        hits = self.search(str(arguments["query"]), arguments.get("k"))
        if not hits:
            return ToolResult("No documents matched.", ToolStatus.OK, time.perf_counter() - start)
        text = "\n".join(f"[{n}] {d.title} ({d.doc_id}): {d.text}" for n, (d, _) in enumerate(hits, 1))
        text, cut = self.truncation.apply(text)
        status = ToolStatus.TRUNCATED if cut else ToolStatus.OK
        return ToolResult(text, status, time.perf_counter() - start)
