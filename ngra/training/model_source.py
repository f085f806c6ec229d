"""What a run trains: a zoo model's name, a factory, or a module, behind one interface.

:meth:`ModelSource.of` takes what a user hands :func:`ngra.fit` or ``ngra train --model``:

* a zoo name (``"gcn"``, ``ngra.models.MODELS``): the zoo's builder, graph preparation
  (self-loops, GCN's normalization, edge types), optimizer groups and paper defaults;
* ``"module:callable"`` (``"mypkg.layers:build_model"``) or a callable: a **factory**
  called ``factory(num_features, num_classes, **given)`` with the hyper-parameters the user
  gave (``hidden=32`` from ``--hidden 32``; a name the factory does not take is an error
  before training). A factory builds one model per run (``runs=K``) and per rank
  (``nprocs=K``: it must pickle, so a module-level function or ``module:callable``);
* an ``nn.Module``: trained in place (one run; each rank gets a pickled copy).

A user's model is called ``model(graph, x)`` on the dataset's graph as given (its SAGA
layers read the graph's edge weights as ``edge.data``); a zoo model ``model(graph, x,
edge_data)`` on its prepared graph. Without a given value, a user's model trains with
:data:`USER_DEFAULTS` (Adam, GCN's Planetoid learning rate and weight decay).

:meth:`ModelSource.record` is what a checkpoint keeps to rebuild the model
(:func:`ngra.load_model`): the zoo name or the factory's import path, and the
hyper-parameters it was called with.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ngra.distributed.shards import prep_key
from ngra.models import HYPER_PARAMETERS, MODELS, Hyper, build_model, hyper_parameters
from ngra.models import param_groups as zoo_param_groups
from ngra.models import prepare as zoo_prepare

__all__ = ["ModelSource", "USER_DEFAULTS", "call_model", "import_object"]

_USER_SOURCE = "ngra default for your own models (GCN's Planetoid optimizer)"
#: Optimizer defaults of a model that is not the zoo's (a value given overrides each).
USER_DEFAULTS = {"lr": Hyper(0.01, _USER_SOURCE), "weight_decay": Hyper(5e-4, _USER_SOURCE)}
_TASK_SOURCE = ("link and graph tasks: PyG's examples/link_pred.py and mutag_gin.py (no weight "
                "decay or dropout, 128 hidden)")
#: Defaults of link and graph tasks, over a model's node-classification ones (the zoo's
#: paper recipes are for node classification: Cora link prediction with GCN's 5e-4 weight
#: decay and 0.5 dropout reaches a test ROC-AUC of 0.80, without them 0.92, as PyG's).
TASK_DEFAULTS = {"hidden": Hyper(128, _TASK_SOURCE), "dropout": Hyper(0.0, _TASK_SOURCE),
                 "weight_decay": Hyper(0.0, _TASK_SOURCE), "lr": Hyper(0.01, _TASK_SOURCE)}


def import_object(path: str, what: str = "--model") -> Any:
    """The object ``path`` (``"package.module:attribute"``) names.

    Raises:
        ValueError: no ``:``, a module that does not import (its error quoted), or no such
            attribute (the module's public callables listed).
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} {path!r}: expected a zoo name ({', '.join(sorted(MODELS))}) "
                         "or module:callable (e.g. mypkg.layers:build_model).")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail in any way while importing
        raise ValueError(f"{what} {path}: module {module_name!r} does not import "
                         f"({type(exc).__name__}: {exc}). Is it on PYTHONPATH (or installed), "
                         "and does it import on its own?") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n, v in vars(module).items()
                            if callable(v) and not n.startswith("_"))
            raise ValueError(f"{what} {path}: module {module_name} has no {attr!r}; its "
                             f"callables are {', '.join(public) or 'none'}.")
        obj = getattr(obj, part)
    return obj


def _path_of(fn: Any) -> str | None:
    """``module:qualname`` when ``fn`` can be imported back by that name, else ``None``."""
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qual or "<" in qual or module == "__main__":
        return None
    try:
        return f"{module}:{qual}" if import_object(f"{module}:{qual}") is fn else None
    except ValueError:
        return None


@dataclass(frozen=True)
class ModelSource:
    """One run's model, however it was given (module docstring).

    Attributes:
        kind: ``"zoo"``, ``"factory"`` or ``"module"``.
        name: the zoo name, the factory's ``module:callable`` (or its repr when it cannot
            be imported back), or the module's class.
        factory: the factory (``kind == "factory"``).
        module: the module (``kind == "module"``).
    """

    kind: str
    name: str
    factory: Callable[..., nn.Module] | None = field(default=None, compare=False)
    module: nn.Module | None = field(default=None, compare=False)

    @classmethod
    def of(cls, model: Any) -> ModelSource:
        """The source of ``model`` (a zoo name, ``module:callable``, a callable or a
        module). Raises ``ValueError``/``TypeError`` naming what was expected."""
        if isinstance(model, ModelSource):
            return model
        if isinstance(model, str):
            if model in MODELS:
                return cls("zoo", model)
            if ":" not in model:
                raise ValueError(f"unknown model {model!r}: expected a zoo model "
                                 f"({', '.join(sorted(MODELS))}) or module:callable, a "
                                 "factory of your own (e.g. mypkg.layers:build_model).")
            fn = import_object(model)
            if isinstance(fn, nn.Module):
                return cls("module", model, module=fn)
            if not callable(fn):
                raise TypeError(f"--model {model} names a {type(fn).__name__}, not a callable "
                                "that builds an nn.Module.")
            return cls("factory", model, factory=fn)
        if isinstance(model, nn.Module):
            return cls("module", f"{type(model).__module__}.{type(model).__qualname__}",
                       module=model)
        if callable(model):
            return cls("factory", _path_of(model) or repr(model), factory=model)
        raise TypeError(f"model must be a zoo name, 'module:callable', a callable that builds "
                        f"an nn.Module, or an nn.Module; got {type(model).__name__}.")

    @property
    def zoo(self) -> bool:
        return self.kind == "zoo"

    @property
    def importable(self) -> bool:
        """Whether :meth:`record` names something a later process can rebuild from."""
        return self.zoo or (self.kind == "factory" and ":" in self.name
                            and not self.name.startswith("<"))

    # -------------------------------------------------------------- hyper-parameters
    def hyper_parameters(self, given: dict[str, Any],
                         task: str = "node") -> dict[str, Hyper | None]:
        """``{name: Hyper(value, source) or None}``: the zoo's table for a zoo model;
        for a user's, the values given plus :data:`USER_DEFAULTS` (a setting neither
        gives is ``None``: the factory's own default applies). Link and graph tasks take
        :data:`TASK_DEFAULTS` for what was not given (a zoo model's settings only)."""
        if self.zoo:
            out = hyper_parameters(self.name, **given)
            if task != "node":
                out.update({k: h for k, h in TASK_DEFAULTS.items()
                            if out.get(k) is not None and out[k].source != "given"})
            return out
        unknown = sorted(set(given) - set(HYPER_PARAMETERS))
        if unknown:
            raise TypeError(f"unknown hyper-parameter(s) {unknown}; expected some of "
                            f"{list(HYPER_PARAMETERS)}.")
        out: dict[str, Hyper | None] = {}
        defaults = dict(USER_DEFAULTS)
        if task != "node":
            defaults.update({k: TASK_DEFAULTS[k] for k in ("lr", "weight_decay")})
        for k in HYPER_PARAMETERS:
            if given.get(k) is not None:
                out[k] = Hyper(given[k], "given")
            else:
                out[k] = defaults.get(k)
        return out

    def normalize_features(self) -> bool:
        """Whether features are row-normalized by default (the zoo's paper recipe)."""
        return MODELS[self.name].normalize_features if self.zoo else False

    def check_factory_args(self, kwargs: dict[str, Any]) -> None:
        """Fail before training when the factory cannot take ``kwargs``."""
        if self.kind != "factory" or not kwargs:
            return
        try:
            sig = inspect.signature(self.factory)
        except (TypeError, ValueError):
            return  # a builtin or C callable: its call will say
        params = sig.parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return
        names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        missing = sorted(set(kwargs) - names)
        if missing:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in missing)
            raise ValueError(f"model factory {self.name} takes no {', '.join(missing)} "
                             f"(given: {flags}); its parameters are "
                             f"({', '.join(p.name for p in sig.parameters.values())}). "
                             "Leave the setting out, or add the parameter to the factory.")

    # ------------------------------------------------------------------ building
    def build(self, num_features: int, num_classes: int, *, hyper: dict[str, Any],
              num_layers: int | None = None, num_edge_types: int = 1) -> nn.Module:
        """A fresh model for ``num_features`` inputs and ``num_classes`` outputs.

        ``hyper``: resolved hyper-parameter values (``None``: not set); for a factory only
        the model's settings (not ``lr``/``weight_decay``) that were given are passed, with
        ``num_layers`` when given.
        """
        if self.zoo:
            return build_model(self.name, num_features, num_classes, hidden=hyper.get("hidden"),
                               heads=hyper.get("heads"), num_layers=num_layers or 2,
                               num_edge_types=num_edge_types, dropout=hyper.get("dropout"),
                               attention_dropout=hyper.get("attention_dropout"))
        if self.kind == "module":
            return self.module
        kwargs = self.factory_kwargs(hyper, num_layers)
        self.check_factory_args(kwargs)
        model = self.factory(num_features, num_classes, **kwargs)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model factory {self.name} returned a {type(model).__name__}; it "
                            "must return a torch.nn.Module (built from ngra.SagaLayer layers).")
        return model

    @staticmethod
    def factory_kwargs(hyper: dict[str, Any], num_layers: int | None) -> dict[str, Any]:
        """What a factory is called with besides the feature and class counts."""
        kw = {k: hyper[k] for k in HYPER_PARAMETERS
              if k not in ("lr", "weight_decay") and hyper.get(k) is not None}
        if num_layers is not None:
            kw["num_layers"] = num_layers
        return kw

    def prepare(self, graph: Any, edge_type: torch.Tensor | None,
                num_edge_types: int) -> tuple[Any, Any]:
        """``(graph, edge_data)`` the model trains on (the zoo's preparation; a user's
        model gets the graph as given and no edge data)."""
        if self.zoo:
            return zoo_prepare(self.name, graph, edge_type, num_edge_types)
        return graph, None

    def prep_key(self) -> str:
        """What :meth:`prepare` depends on (shards are cached per key)."""
        return prep_key(self.name) if self.zoo else "raw"

    def param_groups(self, model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
        """Optimizer groups (GCN decays its first layer only, as its paper)."""
        if self.zoo:
            return zoo_param_groups(self.name, model, weight_decay)
        return [{"params": [p for p in model.parameters() if p.requires_grad],
                 "weight_decay": weight_decay}]

    def record(self) -> dict[str, Any]:
        """What a checkpoint keeps to name this model."""
        return {"kind": self.kind, "name": self.name, "importable": self.importable}


def call_model(model: Any, graph: Any, x: Any, edge_data: Any = None) -> torch.Tensor:
    """``model(graph, x, edge_data)``, or ``model(graph, x)`` when there is no edge data
    (a user's ``forward(graph, x)`` need not take it)."""
    if edge_data is not None:
        return model(graph, x, edge_data)
    return model(graph, x)
