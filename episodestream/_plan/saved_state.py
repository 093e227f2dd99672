"""A saved stream or mixture state where it enters: the checks every way of loading one shares.

A state reaches a source three ways (a trainer's state with ``batches_consumed``, a per-consumer
``state_dict()`` snapshot, a torchdata ``StatefulDataLoader`` state read back as a trainer's), for
a dataset or a mixture. Whichever, its identity (seed, shuffle, fingerprint, a mixture's components)
is compared with the loading source by ``refuse_mismatches`` (one table-driven loop; a field that is
not the type it must be is named as such, not read as missing), a trainer's state must carry what
the trainer knows (``require_trainer_fields``), and a per-consumer state's ``consumer`` must name the
state's own epoch (``check_consumer_epoch``). Plain data only: no torch, no files.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

TRAINER_FIELDS = ("batches_consumed", "batch_size", "num_workers")


def saved_mapping(state: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """``state[name]``, which must be a dict (a JSON object) when present; absent: empty."""
    value = state.get(name, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"state[{name!r}] must be a dict, got {type(value).__name__} {value!r:.200}.")
    return value


def require_trainer_fields(state: Mapping[str, Any]) -> None:
    """A trainer's state carries the batches it took, their size and the DataLoader's worker count."""
    for key in TRAINER_FIELDS:
        if key not in state:
            raise ValueError(f"The state lacks {key!r}: add what the trainer knows, e.g. "
                             f"stream_state(loader, batches_consumed) or {{**state, 'batches_consumed': n, "
                             f"'batch_size': b, 'num_workers': w}}.")


def identity_checks(state: Mapping[str, Any], *, seed: int, shuffle: bool,
                    fingerprint: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(field, saved, now)`` for a dataset's seed, shuffle and every fingerprint field; ``state`` is
    the saved state (or a mixture's saved component, named by ``prefix``)."""
    saved = saved_mapping(state, "fingerprint") if not prefix else _component_fingerprint(state, prefix)
    checks = [(f"{prefix}seed", state.get("seed"), seed), (f"{prefix}shuffle", state.get("shuffle"), shuffle)]
    return checks + [(f"{prefix}fingerprint.{k}", saved.get(k), v) for k, v in fingerprint.items()]


def _component_fingerprint(component: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    value = component.get("fingerprint", {})
    if not isinstance(value, Mapping):
        raise ValueError(f"state[{prefix.rstrip('.')!r}]['fingerprint'] must be a dict, got "
                         f"{type(value).__name__} {value!r:.200}.")
    return value


# How a refusal ends for a Python caller; a command line replaces it with what its user can do.
STRICT_HINT = " Pass strict=False to load it anyway."


def refuse_mismatches(checks: Sequence[tuple[str, Any, Any]], *, state: str, what: str, strict: bool,
                      stacklevel: int = 4) -> None:
    """Compare a saved state's fields with this source's (``(name, saved, now)``, as they survive a
    JSON round trip: tuples become lists, keys strings) and name every one that differs: a
    ValueError, or with ``strict=False`` a warning ``stacklevel`` frames up (the caller of
    ``load_state_dict``)."""
    mismatches = [f"{name}: saved {saved!r}, this {what} {now!r}" for name, saved, now in checks
                  if json.loads(json.dumps(saved)) != json.loads(json.dumps(now))]
    if not mismatches:
        return
    message = f"The {state} state does not match this {what}: " + "; ".join(mismatches) + "."
    if strict:
        raise ValueError(message + STRICT_HINT)
    warnings.warn(message + " Loading anyway (strict=False).", RuntimeWarning, stacklevel=stacklevel)


def check_consumer_epoch(state: Mapping[str, Any], consumer_epoch: int) -> None:
    """A per-consumer state's ``consumer`` section names the epoch the state itself names."""
    if consumer_epoch != state.get("epoch"):
        raise ValueError(f"state['consumer']['epoch']={consumer_epoch} differs from state['epoch']="
                         f"{state.get('epoch')!r}.")


def check_consumer_share(samples_yielded: int, share_left: int, *, epoch: int, who: str) -> None:
    """A per-consumer state cannot have yielded more than its share of the epoch held: it would
    load silently and stream nothing."""
    if samples_yielded > share_left:
        raise ValueError(f"state['consumer']['samples_yielded']={samples_yielded} is more than {who} streams of "
                         f"epoch {epoch} ({share_left} samples): the state is not one this consumer saved. A "
                         f"per-consumer state counts the samples its own iteration yielded.")
