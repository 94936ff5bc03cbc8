"""A document the search tool indexes: the search tool and the datasets that build its corpus share it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"doc_id": self.doc_id, "title": self.title, "text": self.text}
