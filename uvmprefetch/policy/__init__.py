"""decide: policies and their registry. One policy per file; the hook contract is in ``base.py``."""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from .base import Advice, Decision, LaunchInfo, Params, Policy, PolicyContext, ResidencyView, parse_params

# name -> "module:Class". Listed (not discovered) so that ``--help`` and errors can name every policy without
# importing them all; add a line when you add a policy file.
_REGISTRY: dict[str, str] = {
    "ideal": "ideal:IdealPolicy",
    "demand": "demand:DemandPolicy",
    "oracle": "oracle:OraclePolicy",
    "deepum": "deepum:DeepUMPolicy",
    "uvmprefetch": "uvmprefetch:UvmPrefetchPolicy",
    "vdnn": "vdnn:VdnnPolicy",
    "capuchin": "capuchin:CapuchinPolicy",
    "sentinel": "sentinel:SentinelPolicy",
    "autotm": "autotm:AutoTMPolicy",
    "swapadvisor": "swapadvisor:SwapAdvisorPolicy",
    "g10": "g10:G10Policy",
    "flashneuron": "flashneuron:FlashNeuronPolicy",
    "tmof": "tmof:TmofPolicy",
}
DEFAULT_POLICY = "uvmprefetch"


def available() -> list[str]:
    """Names of the registered policies whose module imports (a policy still being written is left out)."""
    out = []
    for name in _REGISTRY:
        try:
            policy_class(name)
        except ConfigError:
            continue
        out.append(name)
    return out


def policy_class(name: str) -> type[Policy]:
    """The class registered as ``name``.

    Raises
    ------
    ConfigError
        If ``name`` is unknown; the message lists the valid names.
    """
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ConfigError(f"unknown policy {name!r}; valid: {', '.join(_REGISTRY)}")
    mod, cls = spec.split(":")
    try:
        module = importlib.import_module(f"{__name__}.{mod}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{mod}":
            raise
        raise ConfigError(f"policy {name!r} is registered but its module {mod}.py is missing") from None
    return getattr(module, cls)


def make_policy(spec: str, **overrides) -> Policy:
    """``make_policy("uvmprefetch")`` or ``make_policy("uvmprefetch:window=16,prefetch=false")``."""
    name, _, params = spec.partition(":")
    cls = policy_class(name.strip())
    p = parse_params(cls.Params, params or None, owner=f"policy {name}")
    return cls(p, **overrides)


__all__ = ["Advice", "Decision", "LaunchInfo", "Params", "Policy", "PolicyContext", "ResidencyView",
           "available", "make_policy", "policy_class", "parse_params", "DEFAULT_POLICY"]
