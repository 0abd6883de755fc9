"""What the FAISS adapter asks of a store during an erasure: records excluded (hidden), their mappings
dropped, their vectors zeroed in place, the index rebuilt from the survivors (``compact``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import faiss
import numpy as np

from tombstone.faults import kill_point

from .generations import _zero_slots, flat_codes_offset
from .labels import label_array


class FaissErasing:
    """Mixin of :class:`~tombstone_adapters.faiss.store.FaissStore`: the erasure's operations."""

    def exclude(self, ids: Sequence[str]) -> int:
        with self.lock:
            return self._exclude(ids)

    def _exclude(self, ids: Sequence[str]) -> int:
        self.refresh()
        self.look_up(ids)
        labels = {self.side["labels"][i] for i in ids if i in self.side["labels"]}
        new = labels - self._excluded()
        if new:
            self.side["excluded"] = sorted(self._excluded() | new)
            self.commit(index_changed=False)
        return len(labels)

    def drop_mapping(self, ids: Sequence[str]) -> int:
        """What an app can do when ``remove_ids`` fails on HNSW: forget the id; the vector stays."""
        with self.lock:
            return self._drop_mapping(ids)

    def _drop_mapping(self, ids: Sequence[str]) -> int:
        self.refresh()
        dropped = 0
        for i in ids:
            dropped += self._drop(i)
        if dropped:
            self.commit(index_changed=False)
        return dropped

    def zero_in_place(self, erase: Sequence[str]) -> dict[str, Any]:
        """Erase without rebuilding: zero the erased vectors in the flat storage under the HNSW graph (and where
        they lie in the committed index file), drop their ids, documents and metadata (their lines blanked once
        the new generation is current), and commit a new generation. The graph keeps the slots (their links and
        their int64 labels, which name no id: structural traces that ``compact`` removes); the labels stay
        hidden on every query path. Cost: the erased slots and lines and a small state file, no graph build."""
        with self.lock:
            return self._zero_in_place(erase)

    def _zero_in_place(self, erase: Sequence[str]) -> dict[str, Any]:
        self.refresh()
        self._blank(sorted(self._dead))  # lines the current generation dropped and a crash left unblanked
        self.look_up(erase)
        erase_set = {i for i in erase if i in self.side["labels"]}
        labels = {self.side["labels"][i] for i in erase_set}
        storage = faiss.downcast_index(self.hnsw.storage)
        if not isinstance(storage, faiss.IndexFlat):  # another storage (quantised codes): rebuild instead
            return {"mechanism": "rebuild", **self._rebuild(sorted(erase_set))}
        # Vectors whose id the app already dropped (remove_ids cannot, on HNSW) are zeroed with them: no id
        # names them, so no erasure could ever ask for them by name.
        in_index = faiss.vector_to_array(self._index.id_map)
        mapped = label_array(self.side["labels"])
        known_zero = np.fromiter(self.side.get("zeroed", []), np.int64)
        orphans = set(in_index[~np.isin(in_index, mapped) & ~np.isin(in_index, known_zero)].tolist()) - labels
        labels |= orphans
        slots: list[int] = []
        offset = None
        d = storage.d
        on_disk = False
        if labels:
            slots = np.flatnonzero(np.isin(in_index, np.fromiter(labels, np.int64))).tolist()
            # where the committed file keeps the vectors, read before the copy in memory changes
            offset = flat_codes_offset(self.index_path, self._index)
            if self._mapped and offset is not None:
                # The vectors in memory are the file's, mapped: the zeros go into the file where those vectors
                # lie, and the mapping shows them (checked below; a mapping that does not is read in and zeroed).
                kill_point("reclaim:faiss:zeroed-in-memory")
                on_disk = _zero_slots(self.index_path, offset, slots, 4 * d)
                flat = faiss.rev_swig_ptr(faiss.downcast_index(self.hnsw.storage).get_xb(), self._index.ntotal * d)
                if on_disk and slots and flat[: self._index.ntotal * d].reshape(-1, d)[slots].any():
                    on_disk = False
            if not on_disk:
                self._own()
                storage = faiss.downcast_index(self.hnsw.storage)
                flat = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * d)  # a view: writes go to the index
                if slots:
                    flat.reshape(-1, d)[slots] = 0.0
                kill_point("reclaim:faiss:zeroed-in-memory")
                # The same zeros written into the committed index file where those vectors lie: the slots are
                # excluded from every read path already, so a crash midway leaves nothing visible, and the
                # next attempt writes the same zeros again. The next generation then links this file.
                on_disk = offset is not None and _zero_slots(self.index_path, offset, slots, 4 * d)
        zeroed = len(slots)
        if on_disk:
            kill_point("reclaim:faiss:zeroed-on-disk")
        for i in erase_set:
            self._drop(i)
        self.side["zeroed"] = sorted(set(self.side.get("zeroed", [])) | labels)
        self.side["excluded"] = sorted(self._excluded() - labels)
        if labels:
            self.commit(index_changed=not on_disk)
        return {"mechanism": "in-place", "vectors_zeroed": zeroed, "ids_dropped": len(erase_set),
                "index_file": "zeroed where it lies" if on_disk else "written anew",
                "orphans_zeroed": len(orphans),
                "zeroed_slots_total": len(self.side["zeroed"]), "vectors_in_index": self._index.ntotal}

    def compact(self) -> dict[str, Any]:
        """Rebuild the graph from the live records, dropping every zeroed slot and its links."""
        with self.lock:
            self.refresh()
            slots = len(self.side.get("zeroed", []))
            out = self._rebuild([])
            return {**out, "zeroed_slots_removed": slots}

    def rebuild(self, erase: Sequence[str]) -> dict[str, Any]:
        """Rebuild the index from the survivors with the same parameters; commit atomically."""
        with self.lock:
            return self._rebuild(erase)

    def _rebuild(self, erase: Sequence[str]) -> dict[str, Any]:
        self.refresh()
        erase_set = set(erase)
        erased_labels = {label for i, label in self.side["labels"].items() if i in erase_set}
        survivors = sorted((label, i) for i, label in self.side["labels"].items() if i not in erase_set)
        old = self.hnsw
        fresh = self._new_index(self._index.d, old.hnsw.nb_neighbors(1), old.hnsw.efConstruction,
                                old.hnsw.efSearch, old.metric_type)
        if survivors:
            labels = np.array([label for label, _ in survivors], dtype=np.int64)
            vectors = np.stack([self._index.reconstruct(int(label)) for label in labels])
            fresh.add_with_ids(vectors, labels)
        before = self._index.ntotal
        kill_point("reclaim:faiss:rebuilt-in-memory")
        self._index, self._mapped = fresh, False
        for i in erase_set:
            self._drop(i)
        # Labels no id maps to any more (the app dropped the mapping) are not survivors either.
        self.side["excluded"] = sorted(self._excluded() - erased_labels & set(self.side["labels"].values()))
        self.side["zeroed"] = []  # a rebuild keeps live records only
        self.commit()
        return {"vectors_before": before, "vectors_after": fresh.ntotal, "survivors": len(survivors)}
