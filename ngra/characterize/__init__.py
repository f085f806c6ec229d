"""ngra.characterize: where time, FLOPs and bytes go, stage by stage, in ngra, PyG and DGL.

``characterize(CharacterizeConfig(...))`` (or ``ngra characterize``) runs a grid
of framework x model x dataset x mode, times each SAGA stage (Scatter,
ApplyEdge, Gather, ApplyVertex; ngra through its runtime probes, PyG and DGL
through ``torch.profiler``), adds analytic FLOPs and bytes, and writes
``runs.csv``, ``report.md``, ``stages.png`` and ``roofline.png`` to the output
folder, plus ``ceilings.json`` (this machine's measured bandwidth and FLOP
rate) and ``config.json``. When no run completes it writes no plots and raises
:class:`NoCompletedRunsError` (the CLI exits with status 2) naming what was missing.

Modules: :mod:`~ngra.characterize.stages` (what counts as which stage),
:mod:`~ngra.characterize.metrics` (analytic counts),
:mod:`~ngra.characterize.measure` (one run), :mod:`~ngra.characterize.runner`
(the grid, caps), :mod:`~ngra.characterize.report`, :mod:`~ngra.characterize.plots`.
"""

from ngra.characterize.api import NoCompletedRunsError, characterize, rebuild_outputs
from ngra.characterize.runner import CharacterizeConfig

__all__ = ["characterize", "rebuild_outputs", "CharacterizeConfig", "NoCompletedRunsError"]
