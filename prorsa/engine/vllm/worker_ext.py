"""Methods vLLM adds to its worker (--worker-extension-cls), reached through /collective_rpc.

    prorsa_load_shared(manifest)    called by VllmEngine.load_shared, in the worker process: load
                                    the tensors a WeightManifest names (JSON; the dev-mode endpoint
                                    passes strings only) straight from the shared-memory region
                                    through vLLM's in-place reload (the same layerwise path as
                                    reload_weights from a directory, minus the file). Returns the
                                    tensors and bytes loaded.

A manifest that names changed tensors only is widened to whole vLLM layers with the model's own
packed_modules_mapping (shared_weights.py says why). Imported by vLLM's worker: nothing
here may import the rest of prorsa beyond shared_weights.
"""

from __future__ import annotations

from prorsa.shared_weights import DEFAULT_PACKED, WeightManifest, expand_to_groups, read_tensors


class SharedWeightsExtension:
    def prorsa_load_shared(self, manifest: str) -> dict:
        m = WeightManifest.from_json(manifest)
        names = [s.name for s in m.slots]
        if m.load is not None:
            packed = getattr(self.model_runner.get_model(), "packed_modules_mapping", None) or DEFAULT_PACKED
            names = expand_to_groups(m.load, names, packed)
        sizes = {s.name: s.nbytes for s in m.slots}
        if names:
            self.reload_weights(weights_iterator=read_tensors(m, names), is_checkpoint_format=True)
        return {"tensors": len(names), "bytes": sum(sizes[n] for n in names)}
