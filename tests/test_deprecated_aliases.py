"""The names issue 87 renamed keep working for one release, each with a DeprecationWarning: the old module paths
import the new modules, the old names give the new objects."""

from __future__ import annotations

import subprocess
import sys

#: old module path, the module it is now, and a name both give
MODULES = [("metricsearch.train.heap", "metricsearch.train.glibc_heap", "kept_heap"),
           ("metricsearch.train.board", "metricsearch.train.tensorboard_log", "Board"),
           ("metricsearch.train.memory", "metricsearch.train.cross_batch_memory", "CrossBatchMemory"),
           ("metricsearch.train.runs", "metricsearch.train.checkpoint_data", "run_split"),
           ("metricsearch.train.sampling", "metricsearch.train.samplers", "build_sampler"),
           ("metricsearch.train.sampling", "metricsearch.train.miners", "MINERS"),
           ("metricsearch.train.sampling", "metricsearch.train.weightings", "build_weighting"),
           ("metricsearch.train.sampling.base", "metricsearch.train.samplers.base", "LabelBatchSampler"),
           ("metricsearch.train.sampling.group", "metricsearch.train.samplers.group", "q_group"),
           ("metricsearch.train.sampling.miners", "metricsearch.train.miners", "SemiHardMiner"),
           ("metricsearch.train.sampling.distance_weighted", "metricsearch.train.miners.distance_weighted",
            "log_sphere_distance_density"),
           ("metricsearch.train.sampling.importance", "metricsearch.train.weightings.importance",
            "ImportanceWeighting"),
           ("metricsearch.train.sampling.compat", "metricsearch.train.components", "check_compatible"),
           ("metricsearch.train.sampling.registry", "metricsearch.train.samplers", "SAMPLERS")]
#: module, old name, the new object's module and name
NAMES = [("metricsearch.train.losses.base", "Weighting", "metricsearch.train.weightings", "Weighting"),
         ("metricsearch.train.losses", "Weighting", "metricsearch.train.weightings", "Weighting"),
         ("metricsearch.train.device", "memory_format", "metricsearch.train.device", "tensor_layout"),
         ("metricsearch.train.trainer", "build_memory", "metricsearch.train.setup", "build_memory")]

CHECK = """
import importlib, warnings
warnings.simplefilter("always")
modules, names = {modules!r}, {names!r}
with warnings.catch_warnings(record=True) as caught:
    for old, new, name in modules:
        assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name), (old, name)
deprecated = {{str(w.message).split(" is deprecated")[0] for w in caught if w.category is DeprecationWarning}}
for old, _, _ in modules:  # an old package's modules warn with it, on its first import
    assert any(old == name or old.startswith(name + ".") for name in deprecated), (old, deprecated)
for module, old, new, name in names:
    with warnings.catch_warnings(record=True) as caught:
        value = getattr(importlib.import_module(module), old)
    assert value is getattr(importlib.import_module(new), name), (module, old)
    assert any(w.category is DeprecationWarning and f"{{module}}.{{old}} is deprecated" in str(w.message)
               for w in caught), old
print("ok")
"""


def test_old_module_paths_and_names_give_the_new_ones_with_a_deprecation_warning() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK.format(modules=MODULES, names=NAMES)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_trunk_caches_copies_keep_their_old_name_views_for_a_release() -> None:
    import pytest
    import torch

    from metricsearch.train.trunk_cache import TrunkCache

    cache = TrunkCache(torch.zeros(3, 5, 2))
    assert cache.copies == 3
    with pytest.warns(DeprecationWarning, match="TrunkCache.copies"):
        assert cache.views == 3
