"""ngra.training: everything a training run is, behind :func:`fit` and ``ngra train``.

* :mod:`~ngra.training.api` -- :func:`fit` and its :class:`TrainResult`;
* :mod:`~ngra.training.config` -- :class:`TrainConfig`, one field per ``ngra train`` flag;
* :mod:`~ngra.training.model_source` -- a zoo name, factory or module as one model source;
* :mod:`~ngra.training.data` -- any data as a ``NodeDataset``, prepared for a run;
* :mod:`~ngra.training.run` -- one run: checks, one process or several, the outcome;
* :mod:`~ngra.training.loop` -- the epochs of one process or rank (:class:`Session`);
* :mod:`~ngra.training.ranks` -- several processes: shards, launch, a rank's session;
* :mod:`~ngra.training.checkpoint` -- checkpoint files (atomic, verified, weights-only);
* :mod:`~ngra.training.predict` -- :func:`load_model` and :class:`Predictor`;
* :mod:`~ngra.training.summary` -- the JSON summary's schema.
"""

from ngra.training.api import TrainResult, fit
from ngra.training.config import TrainConfig
from ngra.training.predict import Predictor, load_model
from ngra.training.summary import FIELDS, SCHEMA_VERSION

__all__ = ["FIELDS", "Predictor", "SCHEMA_VERSION", "TrainConfig", "TrainResult", "fit",
           "load_model"]
