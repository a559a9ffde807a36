"""What a search returns: hits (id, score, label, path), resolved against an immutable in-memory
catalog of the gallery at one committed version, so a search never sees half of a write."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, overload

import numpy as np

from .lmdb_store import ItemRecord

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: the item's id, its inner-product score (cosine), label and source path."""

    id: int
    score: float
    label: str | None
    path: str

    def to_dict(self) -> dict:
        """{"id", "score", "label", "path"} for JSON."""
        return {"id": self.id, "score": self.score, "label": self.label, "path": self.path}


@dataclass(frozen=True)
class Catalog:
    """Ids (sorted), label codes (-1: none) and paths of every item at one LMDB version; changes make a new one."""

    ids: np.ndarray
    codes: np.ndarray
    paths: np.ndarray
    names: tuple[str, ...]
    row_of: np.ndarray = field(init=False, repr=False)  # id -> row, -1 for none; its last slot serves id -1

    def __post_init__(self) -> None:
        row_of = np.full(int(self.ids[-1]) + 2 if len(self.ids) else 1, -1, dtype=np.int32)
        row_of[self.ids] = np.arange(len(self.ids))
        object.__setattr__(self, "row_of", row_of)

    @classmethod
    def of(cls, records: Iterable[tuple[int, ItemRecord]]) -> Catalog:
        """The catalog of (id, record) pairs."""
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, object), ()).added(records)

    def added(self, records: Iterable[tuple[int, ItemRecord]]) -> Catalog:
        """A catalog with `records` added."""
        pairs = list(records)
        if not pairs:
            return self
        names = list(self.names)
        code_of = {n: i for i, n in enumerate(names)}
        for _, r in pairs:
            if r.label is not None and r.label not in code_of:
                code_of[r.label] = len(names)
                names.append(r.label)
        ids = np.concatenate([self.ids, np.array([i for i, _ in pairs], np.int64)])
        codes = np.concatenate([self.codes, np.array([code_of.get(r.label, -1) for _, r in pairs], np.int32)])
        paths = np.concatenate([self.paths, np.array([r.path for _, r in pairs], object)])
        order = np.argsort(ids, kind="stable")
        return Catalog(ids[order], codes[order], paths[order], tuple(names))

    def removed(self, ids: np.ndarray) -> Catalog:
        """A catalog without `ids`."""
        if not len(ids):
            return self
        keep = ~np.isin(self.ids, ids)
        return Catalog(self.ids[keep], self.codes[keep], self.paths[keep], self.names)

    def __len__(self) -> int:
        return len(self.ids)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id (faiss's padding -1 included): -1 where the catalog has no such id."""
        try:
            return self.row_of[ids]
        except IndexError:  # an id past the largest one here
            ids = np.asarray(ids)
            return self.row_of[np.where(ids < len(self.row_of) - 1, ids, -1)]

    def label_ids(self, label: str) -> np.ndarray:
        """The ids of the items labelled `label` (ValueError if there are none)."""
        code = self.names.index(label) if label in self.names else -2
        ids = self.ids[self.codes == code]
        if not len(ids):
            known = ", ".join(self.labels()[:20]) or "none (the gallery has no labels)"
            raise ValueError(f"no item has label {label!r}; labels: {known}")
        return ids

    def labels(self) -> list[str]:
        """The labels that items carry, sorted."""
        return sorted(self.names[c] for c in np.unique(self.codes) if c >= 0)

    def label_of(self, row: int) -> str | None:
        """The label at a row (None: unlabelled)."""
        code = int(self.codes[row])
        return self.names[code] if code >= 0 else None

    def hits(self, scores: np.ndarray, ids: np.ndarray) -> SearchResults:
        """Per query, its hits: faiss's (scores, ids) rows, resolved against this catalog when read."""
        return SearchResults(self, ids, scores)


class _Lazy(Sequence[T]):
    """A sequence whose items are made when read, by `item(i)`; a slice gives a list."""

    __slots__ = ()

    @abstractmethod
    def item(self, i: int) -> T:
        """Item i (negative counts from the end; IndexError past either end)."""

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.item(j) for j in range(*i.indices(len(self)))]
        return self.item(i)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class Hits(_Lazy[Hit]):
    """One query's hits, nearest first: a sequence of Hit. It keeps faiss's raw result and the catalog
    of the version searched, and resolves labels and paths when first read (padding ids left out)."""

    __slots__ = ("catalog", "_ids", "_scores", "_rows")

    def __init__(self, catalog: Catalog, ids: np.ndarray, scores: np.ndarray) -> None:
        self.catalog, self._ids, self._scores, self._rows = catalog, ids, scores, None

    @property
    def rows(self) -> np.ndarray:
        """The hits' rows in the catalog."""
        if self._rows is None:
            rows = self.catalog.rows(self._ids)
            if rows.size and rows.min() < 0:
                keep = rows >= 0
                rows, self._scores = rows[keep], self._scores[keep]
            self._rows = rows
        return self._rows

    @property
    def scores(self) -> np.ndarray:
        """The hits' scores (inner products of unit vectors: cosine similarity)."""
        _ = self.rows
        return self._scores

    @property
    def ids(self) -> np.ndarray:
        """The hits' ids."""
        return self.catalog.ids[self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def item(self, i: int) -> Hit:
        """Hit i, its label and path resolved now."""
        row, c = int(self.rows[i]), self.catalog
        return Hit(int(c.ids[row]), float(self.scores[i]), c.label_of(row), c.paths[row])

    def to_list(self) -> list[dict]:
        """[{"id", "score", "label", "path"}, ...] for JSON."""
        return [h.to_dict() for h in self]


class SearchResults(_Lazy[Hits]):
    """The hits of a batch of queries, in query order: a sequence of Hits, each made when it is read,
    so a search whose caller reads few of its queries' hits (or none yet) pays for no more."""

    __slots__ = ("catalog", "_ids", "_scores")

    def __init__(self, catalog: Catalog, ids: np.ndarray, scores: np.ndarray) -> None:
        self.catalog, self._ids, self._scores = catalog, ids, scores

    def __len__(self) -> int:
        return len(self._ids)

    def item(self, i: int) -> Hits:
        """Query i's hits."""
        return Hits(self.catalog, self._ids[i], self._scores[i])
